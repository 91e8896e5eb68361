"""The wheel carries the node floor: built from the checkout, installed in a fresh virtual
environment, run from a folder outside the checkout, it imports gpuenv.floor and the package's
readers that stand on it."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_fresh_venv_with_the_wheel_imports_the_node_floor(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("gpuenv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("node", "pci", "boot", "ompi", "net", "nvidia_hw", "files"):
        assert f"gpuenv/floor/{module}.py" in names
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    probe = (
        "import gpuenv.floor.pci as p, gpuenv.floor.boot, gpuenv.floor.ompi, gpuenv.floor.net;"
        "import gpuenv.cluster.probe;"
        "print(p.__file__)"
    )
    done = subprocess.run(
        [python, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(env))
