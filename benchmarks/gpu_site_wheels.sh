#!/usr/bin/env bash
# Download, here, the wheels benchmarks/gpu_machine_site.sh installs on the GPU machine, which
# reaches no index: cp312 manylinux wheels (the machine runs Ubuntu 24.04's Python 3.12).
#   .whl/gs-ansible  ansible-core at the version constraints.txt pins, and its dependencies
#   .whl/gpu-node    what the cluster venv and the node suite add to the machine's own Python
#                    stack (gpuenv's and its checks' dependencies, pytest, testinfra)
#
#   bash benchmarks/gpu_site_wheels.sh     # both folders (git-ignored), then prints their sizes
#
# Then, with the device tool: carry .whl and run `bash benchmarks/gpu_machine_site.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-3.12}
core=$(grep -E '^ansible-core==' constraints.txt)
target=(--only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --python-version "$PY" --implementation cp)
rm -rf .whl/gs-ansible .whl/gpu-node && mkdir -p .whl/gs-ansible .whl/gpu-node
python3 -m pip download -q "${target[@]}" -d .whl/gs-ansible "$core" setuptools wheel
python3 -m pip download -q "${target[@]}" -d .whl/gpu-node -c constraints.txt \
  'pyyaml>=6' 'jinja2>=3.1' 'rich>=13' 'nvidia-ml-py>=12' 'setuptools>=77' wheel pytest pytest-testinfra
du -sh .whl/gs-ansible .whl/gpu-node
