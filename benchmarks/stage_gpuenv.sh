# Sourced by the GPU machine's scripts: installs this checkout's gpuenv (the package and its node
# floor, plugins/module_utils as gpuenv.floor) from its wheel into a temporary folder and exports
# GPUENV_LIB, the folder to put on PYTHONPATH. A checkout on PYTHONPATH is not enough: the floor
# is mapped into the package by pyproject.toml, which only a build applies.
#
# The wheel: .whl/gpuenv-*.whl, made on the controller (the GPU machine's setuptools may be older
# than the build needs, and it has no network):
#   python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl .
# then carry .whl with the device tool.
wheel=$(ls "$PWD"/.whl/gpuenv-*.whl 2>/dev/null | tail -1)
if [ -z "$wheel" ]; then
  python3 -m pip wheel -q --no-deps --no-build-isolation -w .whl . >&2 || {
    echo "stage_gpuenv: no .whl/gpuenv-*.whl and no build here: make it on the controller" >&2
    exit 2
  }
  wheel=$(ls "$PWD"/.whl/gpuenv-*.whl | tail -1)
fi
GPUENV_LIB=$(mktemp -d /tmp/gpuenv-lib.XXXXXX)
python3 -m pip install -q --disable-pip-version-check --no-deps --no-index --target "$GPUENV_LIB" \
  "$wheel" >&2 || exit 2
export GPUENV_LIB
# `python3 -m` puts the working folder first on sys.path: from the checkout, its gpuenv/ (without
# the floor) would shadow the staged one.
cd "$GPUENV_LIB" || exit 2
