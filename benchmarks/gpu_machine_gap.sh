#!/usr/bin/env bash
# Where a DDP worker's start-up goes on the GPU machine, from its own Python and from a small
# venv with the same packages (benchmarks/python_gap.py), then `gpuenv check --profile quick`
# from both, RUNS times each (default 3), the JSON reports kept for their ddp timelines.
#
#   bash benchmarks/gpu_machine_gap.sh        # from the repository root, with the machine's python3
#
# The small venv links the machine's own torch, CuPy, numpy, mpi4py, nvidia-ml-py, rich, PyYAML
# and Jinja2 (and what they require) into /tmp/gpuenv-lean: the files and versions of the
# machine's environment, without the ~200 other distributions installed beside them.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
RUNS=${RUNS:-3}
REPO=$PWD
mkdir -p "$OUT"
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$REPO/benchmarks/stage_gpuenv.sh"
export PYTHONPATH=$GPUENV_LIB
machine=$(command -v python3)
lean=/tmp/gpuenv-lean
rm -rf "$lean" /tmp/gpuenv-pyc
python3 "$REPO/benchmarks/python_gap.py" lean "$lean" torch cupy-cuda13x numpy mpi4py \
  nvidia-ml-py rich pyyaml jinja2 packaging 2>&1 | tee "$OUT/gap.txt"
# A bytecode cache the run may write: one warm-up run fills it.
PYTHONPYCACHEPREFIX=/tmp/gpuenv-pyc PYTHONDONTWRITEBYTECODE= "$machine" -c 'import torch, torch._dynamo' \
  >/dev/null 2>&1
python3 "$REPO/benchmarks/python_gap.py" measure --runs "$RUNS" \
  --label "machine=$machine" --label "lean=$lean/bin/python" \
  --label "machine+pyc=$machine:PYTHONPYCACHEPREFIX=/tmp/gpuenv-pyc,PYTHONDONTWRITEBYTECODE=" \
  2>&1 | tee -a "$OUT/gap.txt"
for i in $(seq "$RUNS"); do
  for who in machine lean; do
    py=$machine
    [ "$who" = lean ] && py=$lean/bin/python
    t0=$(date +%s%N)
    "$py" -m gpuenv check --profile quick --json "$OUT/check-$who-$i.json" >"$OUT/check-$who-$i.log" 2>&1
    rc=$?
    t1=$(date +%s%N)
    printf 'check quick %-8s run %s rc=%s wall=%.2fs  %s\n' "$who" "$i" "$rc" \
      "$(( (t1 - t0) / 1000000 ))e-3" "$(tail -1 "$OUT/check-$who-$i.log")" | tee -a "$OUT/gap.txt"
  done
done
python3 - "$OUT" <<'PY' 2>&1 | tee -a "$OUT/gap.txt"
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/check-*.json")):
    report = json.load(open(path))
    took = {r["check"]: round(r.get("duration_s") or 0, 2) for r in report["results"]}
    ddp = next((r for r in report["results"] if r["check"] == "ddp"), {})
    print(path.rsplit("/", 1)[1], took, "ddp timeline:", ddp.get("details", {}).get("timeline_s"))
PY
tar -C "$OUT" -czf "$OUT/checks.tgz" --remove-files $(cd "$OUT" && ls check-*.json check-*.log)
