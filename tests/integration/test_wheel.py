"""The wheel, built once from the checkout: it carries the node floor and the examples, and
setuptools builds it without a package it would have ignored. Installed outside the checkout,
gpuenv.floor, the package's readers on it and the examples check's folder are found there."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from gpuenv.checks.examples import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel and what the build said."""
    wheels = tmp_path_factory.mktemp("wheels")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("gpuenv-*.whl")
    return wheel, done.stdout + done.stderr


def test_every_folder_of_the_package_is_declared(built):
    # setuptools warns about an importable folder missing from `packages` (its files would be
    # left out by a future setuptools): the data folders are declared packages.
    _, said = built
    assert "is absent from the `packages` configuration" not in said, said[-3000:]


def test_a_fresh_venv_with_the_wheel_imports_the_node_floor(built, tmp_path):
    wheel, _ = built
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


def test_the_installed_wheel_finds_its_own_examples(built, tmp_path):
    wheel, _ = built
    names = zipfile.ZipFile(wheel).namelist()
    for example in EXAMPLES:
        assert f"gpuenv/examples/{example.name}.py" in names
    for data in ("gpuenv/data/thresholds.yaml", "gpuenv/cloud/templates/user-data.yaml.j2"):
        assert data in names
    lib = tmp_path / "lib"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--target", str(lib), str(wheel)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    probe = "from gpuenv.checks.examples import examples_dir; print(examples_dir())"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(lib), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == lib / "gpuenv" / "examples"
