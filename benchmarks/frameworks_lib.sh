# Sourced by the GPU machine's scripts (gpu_frameworks.sh, gpu_machine_examples.sh): installs what
# benchmarks/gpu_wheels.sh downloaded into the folder LIB with pip --target (no index: the carried
# wheels only), over the machine's own Python stack (torch, CuPy, mpi4py, numpy sit in its user
# site, which a venv would not see): dask + distributed, and pycuda built from its sdist against
# the machine's CUDA. Needs WHEELS (absolute), LIB, CUDA and the caller's `timed LABEL COMMAND...`
# and SUMMARY; puts LIB/bin and CUDA/bin first on PATH (PYTHONPATH is the caller's to set).
export CUDA_HOME=$CUDA PATH="$LIB/bin:$CUDA/bin:$PATH"
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
