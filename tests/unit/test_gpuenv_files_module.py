"""plugins/modules/gpuenv_files.py, the batched files module, in a temporary folder."""

from __future__ import annotations

import grp
import importlib.util
import os
import pwd
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE_PATH = ROOT / "plugins/modules/gpuenv_files.py"
# The module imports its block rules as the collection gpuenv.cluster (module_utils/files.py).
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuenv_files", MODULE_PATH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpuenv_files"] = module
    spec.loader.exec_module(module)
    return module


gf = _load()
ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name


class FakeModule:
    def __init__(self, check: bool = False, diff: bool = False) -> None:
        self.check_mode = check
        self._diff = diff


def entry(kind: str, **values: object) -> dict:
    """An entry with the module's defaults filled in, owned by the test user."""
    defaults = {k: v.get("default") for k, v in gf._ENTRY_SPECS[kind].items()}
    if "owner" in defaults:
        defaults.update(owner=ME, group=MY_GROUP)
    return {**defaults, **values}


def test_file_written_then_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "a.conf"
    files = gf.Files(FakeModule())
    files.file(entry("files", path=str(target), content="x=1\n", mode="0640"))
    assert target.read_text() == "x=1\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert files.changed_paths == [str(target)]

    again = gf.Files(FakeModule())
    again.file(entry("files", path=str(target), content="x=1\n", mode="0640"))
    assert again.changed_paths == []


def test_mode_drift_is_repaired(tmp_path: Path) -> None:
    target = tmp_path / "a.conf"
    target.write_text("x\n")
    target.chmod(0o600)
    files = gf.Files(FakeModule())
    files.file(entry("files", path=str(target), content="x\n", mode="0644"))
    assert files.changed_paths == [str(target)]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_check_mode_reports_and_writes_nothing(tmp_path: Path) -> None:
    files = gf.Files(FakeModule(check=True, diff=True))
    files.directory(entry("directories", path=str(tmp_path / "d")))
    files.file(entry("files", path=str(tmp_path / "d" / "f"), content="new\n"))
    files.link(entry("links", path=str(tmp_path / "l"), src="/nowhere"))
    assert files.changed_paths == [str(tmp_path / p) for p in ("d", "d/f", "l")]
    assert list(tmp_path.iterdir()) == []
    assert files.diffs[1]["after"] == "new\n"


def test_backup_keeps_the_previous_content(tmp_path: Path) -> None:
    target = tmp_path / "nccl.conf"
    target.write_text("OLD=1\n")
    files = gf.Files(FakeModule())
    files.file(entry("files", path=str(target), content="NEW=1\n", backup=True))
    kept = Path(files.backups[str(target)])
    assert kept.read_text() == "OLD=1\n" and target.read_text() == "NEW=1\n"


def test_block_added_at_top_then_replaced_in_place(tmp_path: Path) -> None:
    target = tmp_path / "nccl.conf"
    target.write_text("NCCL_NVLS_ENABLE=0\n")
    target.chmod(0o600)
    files = gf.Files(FakeModule())
    files.block(entry("blocks", path=str(target), block="NCCL_DEBUG=WARN", position="top"))
    assert target.read_text() == (
        "# BEGIN gpuenv managed block\nNCCL_DEBUG=WARN\n"
        "# END gpuenv managed block\nNCCL_NVLS_ENABLE=0\n"
    )
    # the file keeps its own mode
    assert stat.S_IMODE(target.stat().st_mode) == 0o600

    files = gf.Files(FakeModule())
    files.block(entry("blocks", path=str(target), block="NCCL_DEBUG=INFO\n", position="bottom"))
    assert target.read_text().splitlines() == [
        "# BEGIN gpuenv managed block",
        "NCCL_DEBUG=INFO",
        "# END gpuenv managed block",
        "NCCL_NVLS_ENABLE=0",
    ]
    files = gf.Files(FakeModule())
    files.block(entry("blocks", path=str(target), block="NCCL_DEBUG=INFO\n"))
    assert files.changed_paths == []


def test_block_appended_to_a_file_without_final_newline() -> None:
    assert gf.render_block("a=1", "b=2", "# {mark} x", "bottom") == "a=1\n# BEGIN x\nb=2\n# END x\n"


def test_link_created_retargeted_and_real_file_refused(tmp_path: Path) -> None:
    link = tmp_path / "cuda"
    files = gf.Files(FakeModule())
    files.link(entry("links", path=str(link), src="cuda-12.4"))
    files.link(entry("links", path=str(link), src="cuda-12.4"))
    assert files.changed_paths == [str(link)]
    files = gf.Files(FakeModule())
    files.link(entry("links", path=str(link), src="cuda-13.0"))
    assert os.readlink(link) == "cuda-13.0" and files.changed_paths == [str(link)]
    real = tmp_path / "real"
    real.mkdir()
    with pytest.raises(gf.FilesError, match="not a symbolic link"):
        files.link(entry("links", path=str(real), src="x"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "rw-r--r--"}, "not an octal mode"),
        ({"mode": "17777"}, "out of range"),
        ({"owner": "no-such-user-gpuenv"}, "owner 'no-such-user-gpuenv' does not exist"),
        ({"group": "no-such-group-gpuenv"}, "group 'no-such-group-gpuenv' does not exist"),
    ],
)
def test_bad_entries_name_the_path(tmp_path: Path, values: dict, message: str) -> None:
    target = tmp_path / "f"
    with pytest.raises(gf.FilesError, match=message) as raised:
        gf.Files(FakeModule()).file(entry("files", path=str(target), content="x", **values))
    assert str(target) in str(raised.value)
    assert not target.exists()


def test_folder_where_a_file_is_expected_is_refused(tmp_path: Path) -> None:
    with pytest.raises(gf.FilesError, match="not a regular file"):
        gf.Files(FakeModule()).file(entry("files", path=str(tmp_path), content="x"))


def test_lines_outside_the_block_are_reported(tmp_path: Path) -> None:
    target = tmp_path / "nccl.conf"
    target.write_text("NCCL_DEBUG=INFO\nNCCL_NVLS_ENABLE=0\n")
    files = gf.Files(FakeModule())
    files.block(entry("blocks", path=str(target), block="NCCL_DEBUG=WARN\n", position="top"))
    assert files.outside[str(target)] == ["NCCL_DEBUG=INFO", "NCCL_NVLS_ENABLE=0"]
