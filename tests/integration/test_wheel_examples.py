"""The wheel carries the examples: installed from it into a folder outside the checkout, the
`examples` check finds them there (gpuenv.examples), not in a checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from gpuenv.checks.examples import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_wheel_finds_its_own_examples(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(ROOT)],
        check=True, timeout=300, capture_output=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("gpuenv-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for example in EXAMPLES:
        assert f"gpuenv/examples/{example.name}.py" in names
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
