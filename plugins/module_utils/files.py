# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The files a role owns on a node, in one place for the three that look at them.

- The module gpuenv_files writes them: whole files, managed blocks in shared files, folders, links.
- The reading modules (module_utils/node.py's ``watch`` option) report how they are now, in the
  same round trip as the rest of their reading.
- The filter gpuenv.cluster.files_pending (controller side) compares that report with the request
  gpuenv_files would get, so a converged node skips the write, one module run fewer.

The block rules live here only, so the comparison says "nothing to do" exactly when the module
would change nothing. Runs on the node (Python 3.10 and newer) and on the controller.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import stat
from typing import Any

BLOCK_MARKER = "# {mark} gpuenv managed block"


def digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def markers(marker: str) -> tuple[str, str]:
    return marker.replace("{mark}", "BEGIN"), marker.replace("{mark}", "END")


def managed(block: str, marker: str) -> str:
    """The block as written: its markers around its lines, each line ending in a newline."""
    begin, end = markers(marker)
    body = block if block.endswith("\n") or not block else block + "\n"
    return f"{begin}\n{body}{end}\n"


def _span(lines: list[str], marker: str) -> tuple[int, int] | None:
    """Where the managed block is: the indexes of its first and last marker lines."""
    begin, end = markers(marker)
    stripped = [line.rstrip("\r\n") for line in lines]
    if begin in stripped and end in stripped[stripped.index(begin) :]:
        first = stripped.index(begin)
        return first, stripped.index(end, first)
    return None


def render_block(existing: str, block: str, marker: str, position: str) -> str:
    """The file's text with the managed block in place: replaced where it is, else added."""
    text = managed(block, marker)
    lines = existing.splitlines(keepends=True)
    span = _span(lines, marker)
    if span:
        return "".join(lines[: span[0]]) + text + "".join(lines[span[1] + 1 :])
    if position == "top":
        return text + existing
    if existing and not existing.endswith("\n"):
        existing += "\n"
    return existing + text


def block_digest(text: str, marker: str) -> str | None:
    """The digest of the block as the file holds it, markers included; None without a block."""
    lines = text.splitlines(keepends=True)
    span = _span(lines, marker)
    return digest("".join(lines[span[0] : span[1] + 1])) if span else None


def outside_block(text: str, marker: str) -> list[str]:
    """The lines of text that are not inside the managed block (markers excluded)."""
    begin, end = markers(marker)
    kept: list[str] = []
    inside = False
    for line in text.splitlines():
        if line == begin:
            inside = True
        elif line == end and inside:
            inside = False
        elif not inside:
            kept.append(line)
    return kept


def _name(lookup: Any, ident: int) -> str:
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


def file_state(path: str, marker: str | None = None) -> dict[str, Any]:
    """How path is now: kind (missing, dir, link, file, other); mode, owner and group of a folder
    or file; a file's digest, or with marker the digest of its managed block (None: no block)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"kind": "missing"}
    if stat.S_ISLNK(st.st_mode):
        return {"kind": "link", "target": os.readlink(path)}
    owned = {
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "owner": _name(pwd.getpwuid, st.st_uid),
        "group": _name(grp.getgrgid, st.st_gid),
    }
    if stat.S_ISDIR(st.st_mode):
        return {"kind": "dir", **owned}
    if not stat.S_ISREG(st.st_mode):
        return {"kind": "other"}
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError):
        return {"kind": "other"}
    if marker is not None:
        return {"kind": "file", **owned, "block": block_digest(text, marker)}
    return {"kind": "file", **owned, "digest": digest(text)}


def file_states(watch: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """file_state of each watched entry ({path, marker}), keyed by path and marker."""
    return {
        watch_key(w["path"], w.get("marker")): file_state(w["path"], w.get("marker")) for w in watch
    }


def watch_key(path: str, marker: str | None) -> str:
    """A block's state is its own entry: one file may hold a block and be watched whole."""
    return path if marker is None else f"{path}#{marker}"


def _owned_differs(entry: dict[str, Any], state: dict[str, Any], mode: str) -> bool:
    want = int(str(entry.get("mode") or mode), 8)
    return (
        int(state["mode"], 8) != want
        or state["owner"] != (entry.get("owner") or "root")
        or state["group"] != (entry.get("group") or "root")
    )


def pending(
    request: dict[str, list[dict[str, Any]]], states: dict[str, dict[str, Any]]
) -> list[str]:
    """The paths a gpuenv_files call with request would change (or fail on), judged from states;
    a path nobody watched is pending, so a missing watch costs a write, never a skipped one."""
    out: list[str] = []
    for entry in request.get("directories") or []:
        state = states.get(watch_key(entry["path"], None), {"kind": "unwatched"})
        if state["kind"] != "dir" or _owned_differs(entry, state, "0755"):
            out.append(entry["path"])
    for entry in request.get("files") or []:
        state = states.get(watch_key(entry["path"], None), {"kind": "unwatched"})
        if (
            state["kind"] != "file"
            or state.get("digest") != digest(entry["content"])
            or _owned_differs(entry, state, "0644")
        ):
            out.append(entry["path"])
    for entry in request.get("blocks") or []:
        marker = entry.get("marker") or BLOCK_MARKER
        state = states.get(watch_key(entry["path"], marker), {"kind": "unwatched"})
        if state["kind"] != "file" or state.get("block") != digest(managed(entry["block"], marker)):
            out.append(entry["path"])
    for entry in request.get("links") or []:
        state = states.get(watch_key(entry["path"], None), {"kind": "unwatched"})
        if state["kind"] != "link" or state["target"] != entry["src"]:
            out.append(entry["path"])
    return out
