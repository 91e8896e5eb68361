#!/usr/bin/env bash
# Create or reuse .venv with the pinned tools. Reinstalls only when pyproject.toml or
# constraints.txt changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
stamp="$venv/.gpuenv-stamp"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ]; then
  echo "venv: creating $venv"
  python3 -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "venv: installing pinned tools (constraints.txt)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # torch 2.13.0 is the CPU build the dev machines carry (gloo DDP tests); mpi4py for MPI tests.
  "$venv/bin/python" -m pip install -q -c constraints.txt -e '.[dev,node]' torch mpi4py numpy
  echo "$want" >"$stamp"
fi
