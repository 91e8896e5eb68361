#!/usr/bin/env bash
# `gpuenv doctor` on a real GPU node, from a copy of the repository, with the node's python3:
#   1. clean: the node as it is must give no finding (exit 0);
#   2. NCCL_P2P_DISABLE=1 in /etc/environment: a copy of /etc with the line added, seen through
#      an overlay root (links to every other top-level folder; the real commands run);
#   3. the same variable in the environment doctor runs in;
#   4. a second libnccl: a copy of the NCCL torch loads, in a folder put on LD_LIBRARY_PATH.
# Each run's console text, JSON and JUnit go under $OUT; the last lines say which expectation
# held. Nothing on the node is changed (the copies live under a temporary folder).
#
#   OUT=/tmp/doctor-out benchmarks/gpu_machine_doctor.sh        (exit 0: every expectation held)
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/doctor-gpu-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$(dirname "$0")/stage_gpuenv.sh"
export PYTHONPATH=$GPUENV_LIB${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ADDR=$(hostname -I 2>/dev/null | awk '{print $1}')
ADDR=${ADDR:-127.0.0.1}
NODE=$(hostname -s 2>/dev/null || echo gpu-node)
failed=0

run() { # NAME EXPECTED_RC CHECK_THAT_MUST_FAIL(or -) -- command...
  local name=$1 want=$2 check=$3
  shift 4
  local t0 t1 rc
  t0=$(date +%s.%N)
  "$@" --address "$ADDR" --node "$NODE" -v \
    --json "$OUT/$name.json" --junit "$OUT/$name.xml" >"$OUT/$name.txt" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  cat "$OUT/$name.txt"
  local got
  got=$("$PY" - "$OUT/$name.json" "$check" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
failed = sorted(r["check"] for r in data["results"] if r["status"] in ("FAIL", "ERROR"))
print(",".join(failed) or "-")
EOF
)
  local verdict=ok
  if [ "$rc" != "$want" ] || [ "$got" != "$check" ]; then
    verdict=UNEXPECTED
    failed=1
  fi
  printf 'RESULT %-16s exit %s (want %s)  failing: %s (want %s)  %.1f s  %s\n' \
    "$name" "$rc" "$want" "$got" "$check" "$(awk "BEGIN{print $t1 - $t0}")" "$verdict" | tee -a "$OUT/summary.txt"
}

: >"$OUT/summary.txt"
{ uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1; "$PY" -V; } \
  >"$OUT/machine.txt"

run clean 0 - -- "$PY" -m gpuenv doctor

# 2: overlay root: etc/ is a copy with the stray line, everything else links to the real folder
mkdir -p "$WORK/root"
for entry in /*; do
  name=${entry#/}
  [ "$name" = etc ] || ln -s "$entry" "$WORK/root/$name"
done
cp -a /etc "$WORK/root/etc" 2>/dev/null || true # sockets and unreadable files are left out
echo 'NCCL_P2P_DISABLE=1' >>"$WORK/root/etc/environment"
run stray-etc-env 1 doctor.stray-env -- "$PY" -m gpuenv doctor --root "$WORK/root" --run-commands

run stray-process-env 1 doctor.stray-env -- env NCCL_P2P_DISABLE=1 "$PY" -m gpuenv doctor

# 4: a copy of the libnccl torch loads, first on LD_LIBRARY_PATH
lib=$("$PY" -m gpuenv.doctor.nccl_probe torch | "$PY" -c 'import json, sys
paths = json.loads(sys.stdin.read().strip().splitlines()[-1]).get("paths", [])
print(paths[0] if paths else "")')
if [ -n "$lib" ]; then
  mkdir -p "$WORK/nccl2"
  cp "$lib" "$WORK/nccl2/libnccl.so.2"
  run second-libnccl 1 doctor.nccl-libraries -- \
    env LD_LIBRARY_PATH="$WORK/nccl2${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PY" -m gpuenv doctor
else
  echo "RESULT second-libnccl    not run: torch loads no libnccl here" | tee -a "$OUT/summary.txt"
  failed=1
fi

echo
cat "$OUT/summary.txt"
exit $failed
