#!/usr/bin/env bash
# Download, here, what the GPU machine lacks for the optional framework checks: the cp312
# manylinux wheels of dask + distributed and their dependencies, the pycuda sdist and what it
# needs to build and run (the GPU machine has no network). Packages the GPU machine already has
# (torch, cupy, numpy, mpi4py, rich, PyYAML, Jinja2 and theirs) are left out. TensorFlow (the
# tensorflow 2.21.0 cp312 wheel is 546 MiB before its CUDA libraries, tensorflow-cpu 261 MiB) and
# Horovod (it does not build for torch >= 2.1) cannot be brought: their checks SKIP there, saying so.
#
#   bash benchmarks/gpu_wheels.sh            # into .cache/gpu-wheels (git-ignored), prints its size
#
# Then the GPU machine: benchmarks/gpu_frameworks.sh, with .cache/gpu-wheels carried along.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.cache/gpu-wheels}
PY=${PY:-3.12}
DASK=2026.8.0
PYCUDA=2026.1
rm -rf "$DEST" && mkdir -p "$DEST"
target=(--only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --python-version "$PY" --implementation cp)
# numpy is the GPU machine's own (torch and CuPy are built against it): not brought again. The
# other small dependencies are brought even where the machine has them, because they are installed
# with pip --target, which does not look at what the machine has.
present='^(numpy)-'

# dask + distributed with their whole dependency closure, for that Python and platform.
pip download -q -d "$DEST" "${target[@]}" "dask==$DASK" "distributed==$DASK"
# pycuda: its sdist (built there with nvcc), its runtime dependencies, and the build backend
# (a Python 3.12 venv holds no setuptools; numpy comes from the machine's own site-packages).
pip download -q -d "$DEST" --no-deps --no-binary pycuda "pycuda==$PYCUDA"
pip download -q -d "$DEST" "${target[@]}" pytools mako platformdirs siphash24
pip download -q -d "$DEST" --no-deps setuptools wheel

for f in "$DEST"/*; do
  name=$(basename "$f" | tr 'A-Z' 'a-z')
  if [[ $name =~ $present ]]; then rm -f "$f"; fi
done
ls -1 "$DEST"
du -sh "$DEST"
