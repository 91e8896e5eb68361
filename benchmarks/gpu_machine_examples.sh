#!/usr/bin/env bash
# The seed documents' methods (examples/, docs/examples.md) on the GPU machine, each started the
# way a user starts it (mpirun, torchrun, python3, horovodrun), then `gpuenv check --profile
# examples`, which starts them again and judges them. Runs from the repository root with the
# machine's own python3 (torch, CuPy, mpi4py, numpy); gpuenv comes from its wheel
# (benchmarks/stage_gpuenv.sh: .whl/gpuenv-*.whl, carried).
#
#   bash benchmarks/gpu_machine_examples.sh
#   MPI_PREFIX=/opt/gpuenv/openmpi MPI4PY_PATH=/tmp/mpi4py-cuda bash benchmarks/gpu_machine_examples.sh
#
# MPI_PREFIX: a CUDA-aware Open MPI's prefix, put first on PATH and LD_LIBRARY_PATH for every run
#   (the MPI examples hand CuPy device buffers to MPI: the machine's own Open MPI is not
#   CUDA-aware, and mpi_cupy.py dies with SIGSEGV on it, which this script then reports as such).
# MPI4PY_PATH: a folder holding an mpi4py built against that MPI, put first on PYTHONPATH.
# WHEELS: benchmarks/gpu_wheels.sh's folder (default .cache/gpu-wheels, carried): when it is there,
#   dask + distributed and pycuda are installed from it into LIB (benchmarks/frameworks_lib.sh);
#   without it, the Dask and PyCUDA examples are reported as not installed. TensorFlow and
#   Horovod cannot be brought (benchmarks/gpu_wheels.sh says why): their examples say so.
#
# Writes $OUT/summary.txt (default OUT=/tmp/gpuenv-out), $OUT/examples.json (the check's report)
# and $OUT/logs.tgz (every run's whole output). Each run's line in the summary: its exit code, its
# wall time, and its EXAMPLE-RESULT line (or its last lines when it printed none).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
WHEELS=${WHEELS:-$PWD/.cache/gpu-wheels}
LIB=${LIB:-/tmp/gpuenv-fw-lib}
CUDA=${CUDA_HOME:-/usr/local/cuda}
EX=$PWD/examples  # stage_gpuenv.sh leaves the checkout: absolute paths from here on
BENCH=$PWD/benchmarks
LOG=$(mktemp -d /tmp/gpuenv-examples-logs.XXXX)
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
say() { printf '\n== %s (%s)\n' "$*" "$(date +%T)" | tee -a "$SUMMARY"; }
timed() {  # timed LABEL COMMAND...: exit code, wall time, and the result line (or the tail)
  local label=$1; shift
  local t0 t1 rc
  t0=$(date +%s%N)
  "$@" >"$LOG/$label.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  printf '%-28s rc=%-4s wall=%.2fs  %s\n' "$label" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" "$*" |
    tee -a "$SUMMARY"
  if grep -q 'EXAMPLE-RESULT ' "$LOG/$label.log"; then
    grep 'EXAMPLE-RESULT ' "$LOG/$label.log" | tail -n 1 | cut -c1-600 | sed 's/^/    /' |
      tee -a "$SUMMARY"
  fi
  if [ "$rc" != 0 ]; then  # the example's own words first (a launcher's report follows them)
    grep -E 'FAILED|Error|error:|exited on signal|Signal:|NCCL WARN|GPU\(s\)' "$LOG/$label.log" |
      tail -n 4 | cut -c1-400 | sed 's/^/    ! /' | tee -a "$SUMMARY"
  fi
  if [ "$rc" != 0 ] || ! grep -q 'EXAMPLE-RESULT ' "$LOG/$label.log"; then
    tail -n "${TAIL:-6}" "$LOG/$label.log" | cut -c1-400 | sed 's/^/    /' | tee -a "$SUMMARY"
  fi
  return $rc
}
has() { python3 -c "import $1" >/dev/null 2>&1; }

say "machine"
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv,noheader |
  tee -a "$SUMMARY"
gpus=$(nvidia-smi --list-gpus | wc -l)
[ "$gpus" -ge 1 ] || { echo "no GPU: this script is for the GPU machine" | tee -a "$SUMMARY"; exit 2; }

if [ -n "${MPI_PREFIX:-}" ]; then
  [ -x "$MPI_PREFIX/bin/mpirun" ] || {
    echo "MPI_PREFIX=$MPI_PREFIX has no bin/mpirun" | tee -a "$SUMMARY"; exit 2; }
  export PATH="$MPI_PREFIX/bin:$PATH"
  export LD_LIBRARY_PATH="$MPI_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ -n "${MPI4PY_PATH:-}" ]; then
  [ -d "$MPI4PY_PATH/mpi4py" ] || {
    echo "MPI4PY_PATH=$MPI4PY_PATH has no mpi4py/" | tee -a "$SUMMARY"; exit 2; }
fi

say "install: gpuenv from its wheel; dask, distributed, pycuda from $WHEELS"
# shellcheck source=benchmarks/stage_gpuenv.sh
. "$BENCH/stage_gpuenv.sh"
mkdir -p "$LIB"
if [ -d "$WHEELS" ] && ! PYTHONPATH=$LIB has distributed; then
  # shellcheck source=benchmarks/frameworks_lib.sh
  . "$BENCH/frameworks_lib.sh"
elif [ ! -d "$WHEELS" ]; then
  echo "no $WHEELS (benchmarks/gpu_wheels.sh): dask and pycuda only where the machine has them" |
    tee -a "$SUMMARY"
fi
export PATH="$LIB/bin:$CUDA/bin:$PATH"
export PYTHONPATH="${MPI4PY_PATH:+$MPI4PY_PATH:}$LIB:$GPUENV_LIB"
TF_CPP_MIN_LOG_LEVEL=2 python3 - <<'PY' 2>/dev/null | tee -a "$SUMMARY"
import importlib, sys
print("python", sys.version.split()[0])
for name in ("cupy", "torch", "mpi4py", "numpy", "dask", "distributed", "pycuda", "tensorflow",
             "horovod"):
    try:
        module = importlib.import_module(name)
        where = getattr(module, "__file__", "") or ""
        print(f"  {name:12} {getattr(module, '__version__', getattr(module, 'VERSION_TEXT', '?'))}"
              f"  {where}")
    except Exception as exc:
        print(f"  {name:12} not importable: {type(exc).__name__}: {exc}")
PY
command -v mpirun | tee -a "$SUMMARY"
mpirun --version 2>&1 | head -n 1 | tee -a "$SUMMARY"
# What the build says (the examples decide by a transfer; this is only the label).
ompi_info --parsable --all 2>/dev/null |
  grep -E 'mpi_built_with_cuda_support:value|opal_cuda_support:value|ompi:version:full' |
  tee -a "$SUMMARY"
python3 -c 'from mpi4py import MPI; print("mpi4py links", MPI.Get_library_version().splitlines()[0])' \
  2>&1 | tr -d '\0' | tee -a "$SUMMARY"

# As a user who is root types it: Open MPI refuses root without the flag.
mpi=(mpirun)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
torchrun=(torchrun)
command -v torchrun >/dev/null 2>&1 || torchrun=(python3 -m torch.distributed.run)

say "1. MPI + CuPy (mpi_cupy.py): 1 rank, 2 ranks (on GPU 0 where there is one GPU), one per GPU"
timed mpi_cupy-1 "${mpi[@]}" -n 1 python3 "$EX/mpi_cupy.py"
timed mpi_cupy-2 "${mpi[@]}" --oversubscribe -n 2 python3 "$EX/mpi_cupy.py"
[ "$gpus" -gt 2 ] && timed "mpi_cupy-$gpus" "${mpi[@]}" -n "$gpus" python3 "$EX/mpi_cupy.py"
timed mpi_cupy-3-host "${mpi[@]}" --oversubscribe -n 3 python3 "$EX/mpi_cupy.py" --array numpy

say "2. NCCL through cupy.cuda.nccl, the id over MPI (nccl_cupy_mpi.py): one rank per GPU"
timed "nccl_cupy_mpi-$gpus" "${mpi[@]}" -n "$gpus" python3 "$EX/nccl_cupy_mpi.py"
timed nccl_cupy_mpi-too-many "${mpi[@]}" --oversubscribe -n $((gpus + 1)) python3 \
  "$EX/nccl_cupy_mpi.py"  # must refuse: two ranks on one GPU

say "3. Dask + CuPy (dask_cupy.py): a local cluster, then a scheduler and workers by hand"
if has distributed && has cupy; then
  timed dask_cupy-local python3 "$EX/dask_cupy.py" --n 4096 --chunk 1024
  # Across "nodes" as docs/examples.md tells users: a scheduler, a worker per GPU, the address.
  port=8786
  timeout 300 python3 -m distributed.cli.dask_scheduler --port "$port" --no-dashboard \
    >"$LOG/dask-scheduler.log" 2>&1 &
  sched=$!
  workers=()
  for i in $(seq 0 $(( (gpus > 1 ? gpus : 2) - 1 ))); do
    CUDA_VISIBLE_DEVICES=$((i % gpus)) timeout 300 python3 -m distributed.cli.dask_worker \
      "tcp://127.0.0.1:$port" --nthreads 1 --no-dashboard >"$LOG/dask-worker$i.log" 2>&1 &
    workers+=($!)
  done
  sleep 5
  timed dask_cupy-scheduler python3 "$EX/dask_cupy.py" "tcp://127.0.0.1:$port" --n 4096 \
    --chunk 1024
  kill "${workers[@]}" "$sched" 2>/dev/null
  wait "${workers[@]}" "$sched" 2>/dev/null
else
  echo "dask_cupy: not run: distributed or cupy not importable" | tee -a "$SUMMARY"
fi

say "4. PyTorch DDP under torchrun (ddp_torchrun.py)"
timed "ddp_torchrun-$gpus" "${torchrun[@]}" --standalone --nproc-per-node "$gpus" \
  "$EX/ddp_torchrun.py"
timed ddp_torchrun-2-shared "${torchrun[@]}" --standalone --nproc-per-node $((gpus + 1)) \
  "$EX/ddp_torchrun.py"  # more ranks than GPUs: gloo on shared GPUs

say "5. TensorFlow MirroredStrategy (tf_mirrored.py)"
if has tensorflow; then
  timed tf_mirrored python3 "$EX/tf_mirrored.py"
else
  echo "tf_mirrored: not run: tensorflow not installed (cannot be brought here)" | tee -a "$SUMMARY"
fi

say "6. Horovod + CuPy (horovod_cupy.py)"
if has horovod.tensorflow && command -v horovodrun >/dev/null 2>&1; then
  timed horovod_cupy horovodrun -np 2 -H localhost:2 python3 "$EX/horovod_cupy.py"
else
  echo "horovod_cupy: not run: horovod (with TensorFlow) not installed" | tee -a "$SUMMARY"
fi

say "7. PyCUDA kernel and stream (pycuda_kernel.py)"
if has pycuda; then
  timed pycuda_kernel python3 "$EX/pycuda_kernel.py"
else
  echo "pycuda_kernel: not run: pycuda not installed" | tee -a "$SUMMARY"
fi

say "8. gpuenv check --profile examples (runs and judges them all again)"
TAIL=40 timed check-examples python3 -m gpuenv check --profile examples --json "$OUT/examples.json"
python3 - "$OUT/examples.json" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
report = json.load(open(sys.argv[1]))
for r in report["results"]:
    print(f"{r['check']:10} {r['status']:5} {r['reason'][:300]}")
ex = next((r for r in report["results"] if r["check"] == "examples"), None)
for name, e in ((ex or {}).get("details", {}).get("examples") or {}).items():
    print(f"  {name:14} {e['status']:4} {e.get('elapsed_s', '-')!s:>7}s  {e['reason'][:200]}")
print("verdict:", "OK" if report["verdict"]["ok"] else "NOT OK", report["verdict"]["problems"])
PY

say "left over after the runs (must be empty)"
pgrep -af 'examples/|gpuenv[.]check|distributed[.]cli|torch.distributed.run|mpirun' |
  grep -v pgrep | tee -a "$SUMMARY" || true

tar -C "$LOG" -czf "$OUT/logs.tgz" .
echo "summary: $SUMMARY; report: $OUT/examples.json; logs: $OUT/logs.tgz" | tee -a "$SUMMARY"
