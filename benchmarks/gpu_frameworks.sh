#!/usr/bin/env bash
# The optional framework checks on the GPU machine (no network): installs what
# benchmarks/gpu_wheels.sh downloaded (dask + distributed; pycuda built here from its sdist with
# the machine's nvcc) into a folder on PYTHONPATH, over the machine's own Python stack (torch,
# CuPy, mpi4py, numpy), then runs, from the repository root:
#   1. gpuenv check --only system,streams,pycuda,dask,tensorflow,horovod (TensorFlow and Horovod
#      cannot be brought: their checks must SKIP naming what is missing);
#   2. gpuenv check --profile frameworks (the whole profile: not OK while two frameworks are
#      missing, which is the point: a profile that asks for them does not pass without them);
#   3. a dask client hung with its GPU workers up (GPUENV_FAULT): FAIL by the deadline, nothing left;
#   4. gpuenv cluster's dask stage across two nodes emulated on this host (one GPU each where
#      there are two or more, else both on GPU 0).
#
#   bash benchmarks/gpu_frameworks.sh        # WHEELS=.cache/gpu-wheels by default
#
# Writes the JSON reports and summary.txt to $OUT (default /tmp/gpuenv-out); the logs are packed
# into $OUT/logs.tgz (the device tool brings back at most 8 files).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
WHEELS=${WHEELS:-$PWD/.cache/gpu-wheels}
LIB=${LIB:-/tmp/gpuenv-fw-lib}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
say() { printf '\n== %s\n' "$*" | tee -a "$SUMMARY"; }
timed() {  # timed LABEL COMMAND...: its wall time and exit code in the summary, output in LABEL.log
  local label=$1; shift
  local t0 t1 rc
  t0=$(date +%s%N)
  "$@" >"$OUT/$label.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  printf '%-12s rc=%s wall=%.2fs  %s\n' "$label" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" "$*" |
    tee -a "$SUMMARY"
  tail -4 "$OUT/$label.log" | cut -c1-400 | sed 's/^/    /' | tee -a "$SUMMARY"
  return $rc
}

say "machine"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader | tee -a "$SUMMARY"
ls "$WHEELS" | tee -a "$SUMMARY"
du -sh "$WHEELS" | tee -a "$SUMMARY"

say "install (no index: the carried wheels only)"
# Into a folder on PYTHONPATH, over the machine's own Python stack (torch, CuPy, mpi4py, numpy sit
# in its user site, which a venv would not see).
CUDA=${CUDA_HOME:-/usr/local/cuda}
BENCH=$(cd "$(dirname "$0")" && pwd)  # stage_gpuenv.sh leaves the checkout
# gpuenv itself from its wheel (benchmarks/stage_gpuenv.sh).
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$BENCH/stage_gpuenv.sh"
export PYTHONPATH="$LIB:$GPUENV_LIB"
# shellcheck source=benchmarks/frameworks_lib.sh
. "$BENCH/frameworks_lib.sh"
python3 -c 'import dask, distributed, pycuda, cupy, torch; print("dask", dask.__version__, "distributed", distributed.__version__, "pycuda", pycuda.VERSION_TEXT, "cupy", cupy.__version__, "torch", torch.__version__)' 2>&1 |
  tee -a "$SUMMARY"

check() { python3 -m gpuenv check "$@"; }

say "1. the framework checks, asked by name"
timed only check --only system,streams,pycuda,dask,tensorflow,horovod --json "$OUT/only.json"

say "2. the frameworks profile (not OK while TensorFlow and Horovod are missing)"
timed profile check --profile frameworks --json "$OUT/frameworks.json"

say "3. a dask client hung with its GPU workers up: FAIL by the deadline, nothing left"
GPUENV_FAULT=hang:rank=0:check=dask:stage=compute \
  timed hung check --only dask --deadline 30 --json "$OUT/hung.json"
pgrep -af 'distributed[.]cli|spawn_main|gpuenv[.]check|gpuenv[.]cluster' | grep -v pgrep |
  tee -a "$SUMMARY" || true

say "4. gpuenv cluster's dask stage across two emulated nodes"
timed cluster python3 - <<'PY'
import json, os, sys
from gpuenv.cluster import pipeline
from gpuenv.cluster.inventory import Host

import cupy
gpus = cupy.cuda.runtime.getDeviceCount()
env = (lambda i: {"CUDA_VISIBLE_DEVICES": str(i)}) if gpus >= 2 else (lambda i: {})
hosts = [Host(n, n, "127.0.0.1", local=True, python=sys.executable, env=env(i))
         for i, n in enumerate(("a", "b"))]
opts = pipeline.Options(stages=("rendezvous", "dask"), port=29500, deadline_s=240)
run = pipeline.validate(hosts, opts)
for r in run.results:
    print(r.check, r.node, r.status.value, f"{r.duration_s:.1f}s", r.reason)
dask = next(r for r in run.results if r.check == "dask")
print(json.dumps(dask.to_dict())[:1500])
PY
pgrep -af 'distributed[.]cli|spawn_main|gpuenv[.]check|gpuenv[.]cluster' | grep -v pgrep |
  tee -a "$SUMMARY" || true

tar -C "$OUT" -czf "$OUT/logs.tgz" --remove-files $(cd "$OUT" && ls *.log)
