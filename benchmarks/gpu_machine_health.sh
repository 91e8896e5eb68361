#!/usr/bin/env bash
# `gpuenv health` on a real GPU node, from a copy of the repository, with the node's python3:
# RUNS scans (default 5) each of the console form, --json and --prometheus, all sharing one state
# file under $OUT (so the second and later scans judge counters on their growth, as a timer
# would). Prints each run's wall time and the scan's own time (scan_s in the JSON), their spread,
# and the cost per GPU; the last lines say whether the clean node gave no finding above "none"
# (the issue's expectation for a healthy machine) and exit 0 when it did.
#
#   OUT=/tmp/health-out RUNS=5 benchmarks/gpu_machine_health.sh
#
# nvidia-ml-py: the node's own, else a wheel under .whl/ (pip download nvidia-ml-py -d .whl on
# the controller, then carry .whl with the device tool).
set -u
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-$PWD/health-gpu-out}
RUNS=${RUNS:-5}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
NVML_WHEEL=$(find "$PWD/.whl" -name 'nvidia_ml_py-*.whl' 2>/dev/null | sort | tail -1)
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$(dirname "$0")/stage_gpuenv.sh"
export PYTHONPATH=$GPUENV_LIB${PYTHONPATH:+:$PYTHONPATH}
if ! "$PY" -c 'import pynvml' 2>/dev/null; then
  if [ -n "$NVML_WHEEL" ]; then
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$GPUENV_LIB" \
      "$NVML_WHEEL" >&2 || exit 2
  else
    echo "gpu_machine_health: no pynvml here and no .whl/nvidia_ml_py-*.whl" >&2
    exit 2
  fi
fi
STATE=$OUT/health-state.json
rm -f "$STATE"
{ uname -r; nvidia-smi --query-gpu=name,driver_version,pci.bus_id --format=csv,noheader 2>&1
  "$PY" -V; "$PY" -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))'
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
: >"$OUT/times.txt"

for i in $(seq 1 "$RUNS"); do
  for form in console json prometheus; do
    case $form in
      console) extra=(-v) ;;
      json) extra=(--json "$OUT/run$i.json") ;;
      prometheus) extra=(--prometheus "$OUT/run$i.prom" --json "$OUT/run$i-prom.json") ;;
    esac
    t0=$(date +%s.%N)
    "$PY" -m gpuenv health --state "$STATE" "${extra[@]}" >"$OUT/run$i-$form.txt" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    scan_s=-
    gpus=-
    json_file=$OUT/run$i.json
    [ "$form" = prometheus ] && json_file=$OUT/run$i-prom.json
    if [ "$form" != console ] && [ -f "$json_file" ]; then
      read -r scan_s gpus < <("$PY" -c 'import json, sys
d = json.load(open(sys.argv[1])); print(d["scan_s"], len(d["gpus"]))' "$json_file")
    fi
    printf '%s %s %s %s %s\n' "$form" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" "$scan_s" "$gpus" \
      >>"$OUT/times.txt"
  done
done
cat "$OUT/run1-console.txt"
head -20 "$OUT/run1.prom"

"$PY" - "$OUT" <<'EOF2'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
rows = [line.split() for line in (out / "times.txt").read_text().splitlines()]
walls = [float(r[2]) for r in rows]
scans = [float(r[3]) for r in rows if r[3] != "-"]
gpus = max((int(r[4]) for r in rows if r[4] != "-"), default=0)
rcs = sorted({r[1] for r in rows})
def spread(xs):
    return f"min {min(xs):.3f} s, median {statistics.median(xs):.3f} s, max {max(xs):.3f} s (n={len(xs)})"
print("RESULT wall per command (python start, NVML init, scan, output):", spread(walls))
if scans:
    print("RESULT scan_s (the scan itself):", spread(scans))
    if gpus:
        print(f"RESULT per GPU: {statistics.median(scans) / gpus * 1000:.1f} ms of scan for {gpus} GPU(s)")
data = json.loads((out / "run1.json").read_text())
above = [f for f in data["findings"] if f["action"] != "none"]
print("RESULT exit codes:", ",".join(rcs))
print(f"RESULT signals read: {len({f['signal'] for f in data['findings']})},"
      f" findings above none: {len(above)}")
for f in above:
    print("  ", f["signal"], f.get("gpu"), f["action"], f["evidence"])
sys.exit(0 if not above and rcs == ["0"] else 1)
EOF2
