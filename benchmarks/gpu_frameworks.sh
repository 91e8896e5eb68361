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
# gpuenv itself from its wheel (benchmarks/stage_gpuenv.sh).
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$(dirname "$0")/stage_gpuenv.sh"
export CUDA_HOME=$CUDA PATH="$LIB/bin:$CUDA/bin:$PATH" PYTHONPATH="$LIB:$GPUENV_LIB"
pip() { python3 -m pip --disable-pip-version-check "$@"; }
timed pip-dask pip install --no-index --find-links "$WHEELS" --target "$LIB" dask distributed
timed pip-pycuda-deps pip install --no-index --find-links "$WHEELS" --target "$LIB" setuptools \
  wheel pytools mako platformdirs
# pycuda's C++ extension, against this machine's CUDA (nvcc on PATH gives CUDA_ROOT). Its CURAND
# wrapper needs curand.h, which a toolkit without the math libraries lacks (seen on the development
# machine's CUDA 13.0): pycuda's own setting (~/.aksetup-defaults.py) turns it off then.
cfg=$(mktemp -d)
if [ ! -e "$CUDA/include/curand.h" ]; then
  echo 'CUDA_ENABLE_CURAND = False' >"$cfg/.aksetup-defaults.py"
  echo "no $CUDA/include/curand.h: pycuda built without its CURAND wrapper" | tee -a "$SUMMARY"
fi
# It links with -lcuda: the toolkit's stub, or else the driver's own library by that name.
if [ ! -e "$CUDA/lib64/stubs/libcuda.so" ] && [ ! -e "$CUDA/lib64/libcuda.so" ] &&
  ! ldconfig -p | grep -q 'libcuda\.so '; then
  driver=$(ldconfig -p | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
  [ -n "$driver" ] || echo "no libcuda.so.1 in the loader's cache: the link will fail" | tee -a "$SUMMARY"
  mkdir -p "$cfg/lib" && ln -sf "${driver:-/nonexistent}" "$cfg/lib/libcuda.so"
  export LIBRARY_PATH="$cfg/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  echo "no libcuda.so stub under $CUDA/lib64: linking against $driver" | tee -a "$SUMMARY"
fi
# Its dependencies are in place already; --no-deps keeps pip from bringing a second numpy.
HOME=$cfg timed pip-pycuda pip install --no-index --find-links "$WHEELS" --target "$LIB" \
  --no-build-isolation --no-deps pycuda
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
