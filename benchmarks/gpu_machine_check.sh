#!/usr/bin/env bash
# `gpuenv check` on the GPU machine: wall times of the quick profile (RUNS runs, default 3, optionally
# interleaved with an older gpuenv for comparison), the full profile, and the bad-input and
# fault cases that need a GPU. Runs from the repository root with the machine's own python3
# (it carries torch, CuPy, mpi4py, nvidia-ml-py, rich, PyYAML); gpuenv itself comes from its wheel
# (benchmarks/stage_gpuenv.sh: .whl/gpuenv-*.whl) into a temporary folder.
#
#   bash benchmarks/gpu_machine_check.sh                 # this checkout
#   BASELINE=DIR bash benchmarks/gpu_machine_check.sh    # also DIR/gpuenv, e.g. from
#       mkdir -p bench-old && git archive a1fbbc4 gpuenv | tar -x -C bench-old   # (untracked: it travels)
#
# Writes a summary to $OUT (default /tmp/gpuenv-out) and packs the JSON reports and the logs
# into $OUT/runs.tgz (the device tool brings back at most 8 files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
say() { printf '\n== %s\n' "$*" | tee -a "$SUMMARY"; }
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$(dirname "$0")/stage_gpuenv.sh"
export PYTHONPATH=$GPUENV_LIB
timed() {  # timed LABEL PYTHONPATH ARGS...: one run, its wall time and exit code in the summary
  local label=$1 path=$2; shift 2
  local t0 t1 rc
  t0=$(date +%s%N)
  # From inside the folder: `python3 -m` puts the working folder first on sys.path.
  (cd "$path" && PYTHONPATH=$path python3 -m gpuenv check "$@") >"$OUT/$label.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  printf '%-14s rc=%s wall=%.2fs  %s\n' "$label" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" "$*" |
    tee -a "$SUMMARY"
  tail -3 "$OUT/$label.log" | sed 's/^/    /' | tee -a "$SUMMARY"
}

say "machine"
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv,noheader |
  tee -a "$SUMMARY"
python3 -c 'import sys, torch, cupy, mpi4py; print(sys.version.split()[0], torch.__version__, cupy.__version__, mpi4py.__version__)' |
  tee -a "$SUMMARY"

RUNS=${RUNS:-3}
say "quick profile, $RUNS runs (interleaved with BASELINE=${BASELINE:-none})"
for i in $(seq "$RUNS"); do
  timed "quick$i" "$GPUENV_LIB" --profile quick --json "$OUT/quick$i.json"
  if [ -n "${BASELINE:-}" ]; then
    timed "baseline$i" "$BASELINE" --profile quick
  fi
done

say "full profile"
timed full "$GPUENV_LIB" --profile full --json "$OUT/full.json"

say "bad input: one GPU named twice (exit 2, nothing run)"
CUDA_VISIBLE_DEVICES=0,0 timed dupes "$GPUENV_LIB" --profile quick

say "bad input: one GPU named by index and by UUID (exit 2, nothing run)"
uuid0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
CUDA_VISIBLE_DEVICES=0,$uuid0 timed dupes-uuid "$GPUENV_LIB" --profile quick

say "--only narrows what runs, never what a GPU node must prove (mpi alone: not OK; cupy: OK)"
timed only-mpi "$GPUENV_LIB" --only mpi
timed only-cupy "$GPUENV_LIB" --only cupy

say "a frozen MPI rank with CuPy buffers (rank 1 stopped inside bcast)"
GPUENV_FAULT=freeze:rank=1:check=mpi:stage=bcast \
  timed frozen "$GPUENV_LIB" --only mpi --deadline 20 --json "$OUT/frozen.json"

say "NCCL's own log read back, one GPU (no peer: the version, no connection lines)"
python3 - <<'PY' 2>&1 | tail -3 | tee -a "$SUMMARY"
import json, tempfile, time
from gpuenv.checks import nccl
from gpuenv.checks.ranklog import RankContext, RankLog
d = tempfile.mkdtemp()
rank = RankContext("nccl", 0, 1, {"sizes_mib": [64], "iters": 5, "warmup": 2}, RankLog(d, 0),
                 time.monotonic() + 60)
out = nccl.rank_main(rank)
print(json.dumps({"transport": out["transport"], "versions": out["versions"]}))
PY
say "the cluster worker's torch stage on one node, one GPU (NCCL; transport from its log)"
torchrun --standalone --nnodes 1 --nproc-per-node 1 -m gpuenv.cluster.worker torch \
  --sizes=1048576,67108864 --iters=5 --steps=5 --timeout=60 2>&1 | grep GPUENV_RESULT |
  cut -c1-600 | tee -a "$SUMMARY"

say "left over after the runs (must be empty)"
pgrep -af 'gpuenv|torch.distributed.run|mpirun' | grep -v pgrep | tee -a "$SUMMARY" || true

tar -C "$OUT" -czf "$OUT/runs.tgz" --remove-files $(cd "$OUT" && ls *.log *.json)
