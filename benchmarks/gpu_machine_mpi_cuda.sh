#!/usr/bin/env bash
# The CUDA-aware Open MPI on the GPU machine, against the machine's own (not CUDA-aware) one:
#   1. roles/mpi/files/build-openmpi-cuda.sh builds Debian's Open MPI source with CUDA into a .deb
#      (skipped when DEB names one built before), and dpkg installs it;
#   2. mpi4py built from its sdist against that build (MPICC), into a folder of its own;
#   3. the floor's transfer (module_utils/ompi.py) against each libmpi: one decides, by a device buffer;
#   4. the seed document's MPI + CuPy method, verbatim (benchmarks/seed/), with 1 rank (and with
#      2 ranks where there are two GPUs: it picks `cp.cuda.Device(rank)`), on each MPI;
#   MPI4PY_BUILD=0 skips step 2 and checks with the machine's own mpi4py on the build's libmpi;
#   5. EXTRA (optional): a command run with the build first on PATH (e.g. gpuenv check);
#   6. the examples, held to EXAMPLES_S seconds (default 900; 0: not run).
#
#   bash benchmarks/gpu_machine_mpi_cuda.sh
#
# Needs, carried: .cache/ompi/openmpi_4.1.4.orig.tar.xz (Debian's source, `apt-get source openmpi`
# or http://deb.debian.org/debian/pool/main/o/openmpi/), .cache/ompi/mpi4py-4.1.2.tar.gz and
# .cache/ompi/wheels (Cython, setuptools, build for the machine's Python: recipe in docs/benchmarks.md).
# Writes summary.txt, the .deb and logs.tgz to $OUT.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/gpuenv-out}
SRC=${SRC:-$PWD/.cache/ompi}
PREFIX=${PREFIX:-/opt/gpuenv/openmpi}
CUDA=${CUDA:-/usr/local/cuda}
VERSION=${VERSION:-4.1.4-3+gpuenv1.ab184ddc}  # the mpi role's version for its default prefix
SHA=ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263  # Debian's openmpi_4.1.4-3.dsc
LOG=$(mktemp -d /tmp/gpuenv-logs.XXXX)
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
say() { printf '\n== %s (%s)\n' "$*" "$(date +%T)" | tee -a "$SUMMARY"; }
timed() {  # timed LABEL COMMAND...: wall time and exit code in the summary, output in LABEL.log
  local label=$1; shift
  local t0=$SECONDS
  "$@" >"$LOG/$label.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-4s wall=%ss\n' "$label" "$rc" "$((SECONDS - t0))" | tee -a "$SUMMARY"
  tail -n "${TAIL:-4}" "$LOG/$label.log" | cut -c1-300 | sed 's/^/    /' | tee -a "$SUMMARY"
  return $rc
}

say "machine"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
gpus=$(nvidia-smi --list-gpus | wc -l)
python3 -c 'import sys, cupy, mpi4py; print(sys.version.split()[0], "cupy", cupy.__version__, "mpi4py", mpi4py.__version__)' | tee -a "$SUMMARY"
"$CUDA/bin/nvcc" --version | tail -n 2 | tee -a "$SUMMARY"
mpirun --version | head -n 1 | tee -a "$SUMMARY"

say "build (or reuse) the CUDA-aware Open MPI package"
deb=${DEB:-}
if [ -z "$deb" ]; then
  TAIL=2 timed build bash roles/mpi/files/build-openmpi-cuda.sh "$SRC/openmpi_4.1.4.orig.tar.xz" "$SHA" \
    "$CUDA" "$PREFIX" gpuenv-openmpi-cuda "$VERSION" /tmp/debs
  deb=$(find /tmp/debs -name '*.deb' 2>/dev/null | head -n 1)
  [ -n "$deb" ] && cp "$deb" "$OUT/"
fi
[ -n "$deb" ] || { echo "no package built" | tee -a "$SUMMARY"; tar -C "$LOG" -czf "$OUT/logs.tgz" .; exit 1; }
du -k "$deb" | tee -a "$SUMMARY"
dpkg-deb -f "$deb" Package Version Depends | tee -a "$SUMMARY"
if ! timed dpkg-install dpkg -i "$deb"; then
  # A package built on another release (DEB=, e.g. Debian 12's build on Ubuntu 24.04) may name
  # Depends this one calls otherwise (libevent-core-2.1-7 vs …t64): its files still run here.
  echo "dpkg -i refused $deb here (Depends of its build machine): unpacked with dpkg-deb -x" | tee -a "$SUMMARY"
  dpkg-deb -x "$deb" /
fi
"$PREFIX/bin/ompi_info" --parsable --all | grep -E 'ompi:version:full|mpi_built_with_cuda_support|opal_cuda_support' | tee -a "$SUMMARY"

say "the floor's transfer against each libmpi"
sys_lib=$(ldd "$(command -v ompi_info)" | sed -n 's/.*=> \(\/[^ ]*libmpi\.so[.0-9]*\) .*/\1/p')
new_lib=$PREFIX/lib/libmpi.so.40
for lib in "$sys_lib" "$new_lib"; do
  PYTHONPATH=$PWD python3 - "$lib" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import subprocess, sys, time
sys.path.insert(0, ".")
import importlib
ompi = importlib.import_module("plugins.module_utils.ompi")
def run(argv, timeout_s=60):
    done = subprocess.run(["timeout", "-k", "5", str(timeout_s), *argv], capture_output=True, text=True)
    return done.returncode, done.stdout
t = time.perf_counter()
print(sys.argv[1], ompi.transfer(run, sys.executable, sys.argv[1]), f"{time.perf_counter() - t:.2f}s")
EOF
done

say "the seed method, verbatim, with the machine's own mpi4py on the build's libmpi (LD_LIBRARY_PATH)"
# Same soname (libmpi.so.40) and Open MPI's ABI promise within 4.x: the quickest answer, before
# the mpi4py build below (the role's way) is done.
seed=benchmarks/seed/mpi_cupy_verbatim.py
root_ok=(--allow-run-as-root --oversubscribe)
sed 's/cp.cuda.Device(rank).use()/cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()/' "$seed" >/tmp/seed_shared.py
timed seed-ldpath-1rank "$PREFIX/bin/mpirun" "${root_ok[@]}" -x LD_LIBRARY_PATH="$PREFIX/lib" -n 1 python3 "$seed"
timed seed-shared-ldpath-2ranks "$PREFIX/bin/mpirun" "${root_ok[@]}" -x LD_LIBRARY_PATH="$PREFIX/lib" -n 2 python3 /tmp/seed_shared.py

# MPI4PY_BUILD=0: the machine's own mpi4py on the build's libmpi (LD_LIBRARY_PATH) from here on,
# no mpi4py build and no second round of the seed method (a short device budget).
if [ "${MPI4PY_BUILD:-1}" = 1 ]; then
  say "mpi4py from its sdist against $PREFIX/bin/mpicc"
  python3 -m pip install -q --no-index --find-links "$SRC/wheels" --target /tmp/buildtools cython setuptools build >"$LOG/tools.log" 2>&1
  TAIL=2 timed mpi4py-build env MPICC="$PREFIX/bin/mpicc" PYTHONPATH=/tmp/buildtools \
    python3 -m pip install --no-index --find-links "$SRC/wheels" --no-build-isolation --no-deps \
    --target /tmp/mpi4py-cuda "$SRC/mpi4py-4.1.2.tar.gz"
  PYTHONPATH=/tmp/mpi4py-cuda python3 -c 'import mpi4py, mpi4py.MPI as M; print(mpi4py.get_config()); print(M.Get_library_version().splitlines()[0])' 2>&1 | tee -a "$SUMMARY"

  say "the seed document's MPI + CuPy method, verbatim"
  seed=benchmarks/seed/mpi_cupy_verbatim.py
  root_ok=(--allow-run-as-root --oversubscribe)
  timed seed-debian-1rank mpirun "${root_ok[@]}" -n 1 python3 "$seed"
  timed seed-cuda-1rank env PYTHONPATH=/tmp/mpi4py-cuda "$PREFIX/bin/mpirun" "${root_ok[@]}" -n 1 python3 "$seed"
  if [ "$gpus" -ge 2 ]; then
    timed seed-debian-2ranks mpirun "${root_ok[@]}" -n 2 python3 "$seed"
    timed seed-cuda-2ranks env PYTHONPATH=/tmp/mpi4py-cuda "$PREFIX/bin/mpirun" "${root_ok[@]}" -n 2 python3 "$seed"
  else
    echo "one GPU: the verbatim method with 2 ranks asks for cp.cuda.Device(1), which this machine lacks" | tee -a "$SUMMARY"
  fi
  # Two ranks on the one GPU: the method with its device line fixed (rank % device count).
  sed 's/cp.cuda.Device(rank).use()/cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()/' "$seed" >/tmp/seed_shared.py
  timed seed-shared-debian-2ranks mpirun "${root_ok[@]}" -n 2 python3 /tmp/seed_shared.py
  timed seed-shared-cuda-2ranks env PYTHONPATH=/tmp/mpi4py-cuda "$PREFIX/bin/mpirun" "${root_ok[@]}" -n 2 python3 /tmp/seed_shared.py
  cuda_py=/tmp/mpi4py-cuda: cuda_ld=''
else
  cuda_py='' cuda_ld=$PREFIX/lib
fi

say "gpuenv check --only system,mpi on each MPI (gpuenv from .whl, benchmarks/stage_gpuenv.sh)"
here=$PWD
# shellcheck source=benchmarks/stage_gpuenv.sh disable=SC1091
(. benchmarks/stage_gpuenv.sh
 check() {  # check LABEL PATH-PREFIX PYTHONPATH-PREFIX ARGS... (LD: LD_LIBRARY_PATH)
   local label=$1 bin=$2 lib=$3; shift 3
   TAIL=3 timed "$label" env PATH="$bin$PATH" PYTHONPATH="$lib$GPUENV_LIB" ${LD:+LD_LIBRARY_PATH=$LD} \
     python3 -m gpuenv check --only system,mpi --json "$LOG/$label.json" "$@"
   python3 -c "import json, sys; r = json.load(open(sys.argv[1]))
print('   ', r['verdict'].get('caveats'))
for x in r['results']:
    print('   ', x['check'], x['status'], x['reason'][:400])" "$LOG/$label.json" | tee -a "$SUMMARY"
 }
 LD=$cuda_ld check check-cuda "$PREFIX/bin:" "$cuda_py"
 check check-debian "" ""
 [ "${MPI4PY_BUILD:-1}" = 1 ] && check check-debian-host-staging "" "" --mpi-host-staging
 TAIL=12 timed doctor-cuda env PATH="$PREFIX/bin:$PATH" PYTHONPATH="$GPUENV_LIB" python3 -m gpuenv doctor --only 13
 TAIL=12 timed doctor-debian env PYTHONPATH="$GPUENV_LIB" python3 -m gpuenv doctor --only 13)
cd "$here" || exit 1

if [ -n "${EXTRA:-}" ]; then
  say "extra: $EXTRA"
  TAIL=30 timed extra env PATH="$PREFIX/bin:$PATH" PYTHONPATH="/tmp/mpi4py-cuda${PYTHONPATH:+:$PYTHONPATH}" bash -c "$EXTRA"
fi

# Last, and held to EXAMPLES_S seconds, so that the logs are packed within the caller's limit.
if [ "${EXAMPLES_S:-900}" -gt 0 ]; then  # 0: not run
  say "the examples (benchmarks/gpu_machine_examples.sh) with the CUDA-aware build"
  OUT=$OUT/ex MPI_PREFIX=$PREFIX MPI4PY_PATH=/tmp/mpi4py-cuda timeout -k 5 "${EXAMPLES_S:-900}" \
    bash benchmarks/gpu_machine_examples.sh >"$LOG/examples.log" 2>&1
  echo "examples rc=$? (124: stopped at EXAMPLES_S=${EXAMPLES_S:-900} s)" | tee -a "$SUMMARY"
fi
tar -C "$LOG" -czf "$OUT/logs.tgz" .
