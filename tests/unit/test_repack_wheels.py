"""scripts/repack_wheels.py: an installed distribution becomes a wheel pip installs offline."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("repack_wheels", ROOT / "scripts/repack_wheels.py")
assert spec and spec.loader
rw = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rw)


def test_repacked_wheel_installs_without_an_index(tmp_path: Path) -> None:
    wheels = tmp_path / "wh"
    assert rw.main([str(wheels), "--only", "PyYAML"]) == 0
    (made,) = wheels.glob("*.whl")
    assert made.name.startswith("PyYAML-") or made.name.startswith("pyyaml-")
    with zipfile.ZipFile(made) as wheel:
        names = wheel.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = wheel.read(record).decode().splitlines()
    assert "yaml/__init__.py" in names
    assert all(",sha256=" in row for row in rows if not row.startswith(record))
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            str(made),
        ],
        check=True,
    )
    assert (target / "yaml" / "__init__.py").is_file()


def test_unknown_distribution_is_bad_input(tmp_path: Path, capsys) -> None:
    assert rw.main([str(tmp_path), "--only", "no-such-dist-gpuenv"]) == 2
    assert "no-such-dist-gpuenv" in capsys.readouterr().err
