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


def _install(wheel: Path, target: Path) -> None:
    """pip installs the wheel into target with no index at all."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
         "--target", str(target), str(wheel)],
        check=True,
    )  # fmt: skip


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
    _install(made, target)
    assert (target / "yaml" / "__init__.py").is_file()


def test_unknown_distribution_is_bad_input(tmp_path: Path, capsys) -> None:
    assert rw.main([str(tmp_path), "--only", "no-such-dist-gpuenv"]) == 2
    assert "no-such-dist-gpuenv" in capsys.readouterr().err


class _Dist:
    def __init__(self, wheel: str) -> None:
        self._wheel = wheel

    def read_text(self, name: str) -> str:
        return self._wheel


def test_wheel_tag_keeps_every_tag() -> None:
    # A py2.py3 wheel must not become py2-only (pip on Python 3 would ignore it).
    both = "Wheel-Version: 1.0\nTag: py2-none-any\nTag: py3-none-any\n"
    assert rw.wheel_tag(_Dist(both)) == "py2.py3-none-any"
    many = "Tag: cp312-cp312-manylinux_2_17_x86_64\nTag: cp312-cp312-manylinux2014_x86_64\n"
    assert rw.wheel_tag(_Dist(many)) == "cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64"
    assert rw.wheel_tag(_Dist("")) == "py3-none-any"


def test_vendored_dist_info_stays_a_plain_file(tmp_path: Path) -> None:
    # setuptools vendors packages with their own .dist-info/RECORD inside its tree.
    wheels = tmp_path / "wh"
    assert rw.main([str(wheels), "--only", "setuptools"]) == 0
    (made,) = wheels.glob("setuptools-*.whl")
    with zipfile.ZipFile(made) as wheel:
        names = wheel.namelist()
    records = [n for n in names if n.endswith("RECORD")]
    own = [n for n in records if n.count("/") == 1]
    assert len(own) == 1 and own[0].startswith("setuptools-"), records
    _install(made, tmp_path / "site")
