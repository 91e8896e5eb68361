#!/usr/bin/env bash
# Build the collection tarball gpuenv.cluster with the gpuenv wheel inside it, so that the role
# gpu_env puts gpuenv on the nodes from what the collection carries (no checkout, no index).
#   scripts/build-collection.sh [OUTPUT_DIR]     (default dist/) -> OUTPUT_DIR/gpuenv-cluster-<version>.tar.gz
# Uses the Python it finds first: $PYTHON, else .venv/bin/python, else python3 (it needs pip,
# setuptools and ansible-core, as the controller extra installs them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
python=${PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=python3
wheels=$root/roles/gpu_env/files/wheel
# One wheel, the checkout's own: an older one left there would make the role refuse (two wheels).
rm -rf "$wheels"
mkdir -p "$wheels"
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$wheels" "$root"
galaxy=$(dirname "$python")/ansible-galaxy
[ -x "$galaxy" ] || galaxy=ansible-galaxy
"$galaxy" collection build --force --output-path "$out" "$root"
