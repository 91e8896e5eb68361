"""The skip-the-write rule (module_utils/files.py, filter gpuenv.cluster.files_pending): a reading
module watches the files a role writes, and the role skips its gpuenv_files call when nothing is
pending. The rule must agree with the module itself: for each state below, the paths it calls
pending are exactly the paths gpuenv_files (check mode) would change, or fail on.
"""

from __future__ import annotations

import grp
import os
import pwd
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))

from ansible_collections.gpuenv.cluster.plugins.filter.files import files_pending  # noqa: E402
from ansible_collections.gpuenv.cluster.plugins.module_utils import files as mu  # noqa: E402
from ansible_collections.gpuenv.cluster.plugins.modules import gpuenv_files as gf  # noqa: E402

ME = pwd.getpwuid(os.getuid()).pw_name
MY_GROUP = grp.getgrgid(os.getgid()).gr_name
MARK = "# {mark} test role"


class CheckModule:
    check_mode = True
    _diff = False


def module_changes(request: dict) -> list[str]:
    """What gpuenv_files in check mode would change (a path it fails on counts as changed)."""
    files = gf.Files(CheckModule())
    changed: list[str] = []
    for kind, run in (("directories", files.directory), ("files", files.file),
                      ("blocks", files.block), ("links", files.link)):  # fmt: skip
        for entry in request.get(kind, []):
            defaults = {k: v.get("default") for k, v in gf._ENTRY_SPECS[kind].items()}
            try:
                run({**defaults, **entry})
            except gf.FilesError:
                changed.append(entry["path"])
    return files.changed_paths + changed


def watch(request: dict) -> list[dict]:
    found = [
        {"path": e["path"]} for k in ("directories", "files", "links") for e in request.get(k, [])
    ]
    return found + [
        {"path": e["path"], "marker": e.get("marker")} for e in request.get("blocks", [])
    ]


def request_in(tmp: Path) -> dict:
    return {
        "directories": [{"path": str(tmp / "d"), "mode": "0750", "owner": ME, "group": MY_GROUP}],
        "files": [
            {
                "path": str(tmp / "d" / "f.conf"),
                "content": "a=1\n",
                "mode": "0640",
                "owner": ME,
                "group": MY_GROUP,
            }
        ],
        "blocks": [{"path": str(tmp / "shared.conf"), "block": "x=1\ny=2", "marker": MARK}],
        "links": [{"path": str(tmp / "link"), "src": "/opt/target"}],
    }


def converge(tmp: Path, request: dict) -> None:
    files = gf.Files(type("M", (), {"check_mode": False, "_diff": False})())
    for kind, run in (("directories", files.directory), ("files", files.file),
                      ("blocks", files.block), ("links", files.link)):  # fmt: skip
        for entry in request[kind]:
            defaults = {k: v.get("default") for k, v in gf._ENTRY_SPECS[kind].items()}
            run({**defaults, **entry})


DRIFTS = {
    "converged": lambda t: None,
    "folder mode": lambda t: (t / "d").chmod(0o755),
    "file content": lambda t: (t / "d" / "f.conf").write_text("a=2\n"),
    "file mode": lambda t: (t / "d" / "f.conf").chmod(0o644),
    "file gone": lambda t: (t / "d" / "f.conf").unlink(),
    "file is a folder": lambda t: ((t / "d" / "f.conf").unlink(), (t / "d" / "f.conf").mkdir()),
    "block body": lambda t: (t / "shared.conf").write_text(
        (t / "shared.conf").read_text().replace("y=2", "y=3")
    ),
    "block without its end line's newline": lambda t: (t / "shared.conf").write_text(
        (t / "shared.conf").read_text().rstrip("\n")
    ),
    "text outside the block": lambda t: (t / "shared.conf").write_text(
        "own=1\n" + (t / "shared.conf").read_text() + "tail=2\n"
    ),
    "block removed": lambda t: (t / "shared.conf").write_text("own=1\n"),
    "shared file gone": lambda t: (t / "shared.conf").unlink(),
    "link elsewhere": lambda t: ((t / "link").unlink(), (t / "link").symlink_to("/elsewhere")),
    "link is a file": lambda t: ((t / "link").unlink(), (t / "link").write_text("x")),
    "not UTF-8": lambda t: (t / "d" / "f.conf").write_bytes(b"\xff\xfe"),
}


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_pending_is_what_the_module_would_change(tmp_path: Path, drift: str) -> None:
    request = request_in(tmp_path)
    converge(tmp_path, request)
    DRIFTS[drift](tmp_path)
    states = mu.file_states(watch(request))
    assert sorted(files_pending(request, states)) == sorted(module_changes(request))
    if drift == "converged":
        assert files_pending(request, states) == []
    elif drift != "text outside the block":
        assert files_pending(request, states), drift


def test_a_path_nobody_watched_is_pending(tmp_path: Path) -> None:
    request = request_in(tmp_path)
    converge(tmp_path, request)
    states = mu.file_states(watch(request)[1:])  # the folder left out of the watch
    assert files_pending(request, states) == [str(tmp_path / "d")]
    assert module_changes(request) == []


def test_a_file_and_a_block_in_it_are_separate_watches(tmp_path: Path) -> None:
    path = tmp_path / "both"
    path.write_text("# BEGIN test role\nx\n# END test role\n")
    states = mu.file_states([{"path": str(path)}, {"path": str(path), "marker": MARK}])
    assert set(states) == {str(path), f"{path}#{MARK}"}
    assert states[f"{path}#{MARK}"]["block"] == mu.digest(mu.managed("x", MARK))


def test_bad_requests_are_named() -> None:
    with pytest.raises(AnsibleFilterError, match="gpuenv_files' options"):
        files_pending({"file": []}, {})
    with pytest.raises(AnsibleFilterError, match="a probe's files"):
        files_pending({"files": []}, None)
