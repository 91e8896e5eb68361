#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: ensure many small files, managed blocks, folders and links in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpuenv_files
short_description: Ensure several folders, files, managed blocks and symlinks in one call
description:
  - One task, one round trip to the node, for the configuration files of a role.
    A converged node is only read, never written, so a re-run reports changed=0 quickly.
  - Work is done in this order, so that a file may live in a folder of the same call,
    I(directories), I(files), I(blocks), I(links).
  - Files are written atomically (a temporary file in the same folder, then rename).
  - Supports check mode and diff mode.
options:
  directories:
    description: Folders to create (with parents) and whose mode and owner to set.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      mode: {description: Octal mode as a string., type: str, default: "0755"}
      owner: {description: Owner name., type: str, default: root}
      group: {description: Group name., type: str, default: root}
  files:
    description: Whole files owned by the role.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      content: {description: The file's full text., type: str, required: true}
      mode: {description: Octal mode as a string., type: str, default: "0644"}
      owner: {description: Owner name., type: str, default: root}
      group: {description: Group name., type: str, default: root}
      backup:
        description:
          - Keep the previous content beside the file (C(<path>.<time>.gpuenv~)) when it is
            replaced.
        type: bool
        default: false
  blocks:
    description:
      - Text between two marker lines inside a file the role shares with others (the rest of the
        file is kept).
      - The file is created when missing.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      block: {description: The lines between the markers., type: str, required: true}
      marker:
        description: Marker line; C({mark}) becomes BEGIN or END.
        type: str
        default: "# {mark} gpuenv managed block"
      position:
        description:
          - Where a new block goes (C(top) when the first setting read wins, C(bottom) otherwise).
        type: str
        choices: [top, bottom]
        default: bottom
      mode: {description: Mode when the file is created., type: str, default: "0644"}
      owner: {description: Owner when the file is created., type: str, default: root}
      group: {description: Group when the file is created., type: str, default: root}
  links:
    description:
      - Symbolic links. An existing real file or folder at I(path) is never replaced (the task
        fails).
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path of the link., type: path, required: true}
      src: {description: Link target., type: str, required: true}
author: gpuenv
"""

EXAMPLES = r"""
- name: Write the MCA settings and the hostfile
  gpuenv.cluster.gpuenv_files:
    directories:
      - path: /etc/gpuenv
    files:
      - path: /etc/gpuenv/mpi-hostfile
        content: "{{ lookup('ansible.builtin.template', 'hostfile.j2') }}"
    blocks:
      - path: /etc/openmpi/openmpi-mca-params.conf
        marker: "# {mark} gpuenv mpi role"
        block: |
          btl_tcp_if_include = eth0
  register: written
"""

RETURN = r"""
changed_paths:
  description: Paths created or modified, in the order they were handled.
  type: list
  elements: str
  returned: always
backups:
  description: For each replaced file with I(backup), where its previous content was kept.
  type: dict
  returned: always
outside:
  description: For each file of I(blocks), its lines outside the managed block (others' lines).
  type: dict
  returned: always
"""

import datetime
import grp
import os
import pwd
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils.files import (
    BLOCK_MARKER,
    outside_block,
    render_block,
)

_PATH = {"path": {"type": "path", "required": True}}


def _owned(mode: str) -> dict:
    """Mode, owner and group options with their defaults."""
    return {
        "mode": {"type": "str", "default": mode},
        "owner": {"type": "str", "default": "root"},
        "group": {"type": "str", "default": "root"},
    }


_ENTRY_SPECS = {
    "directories": {**_PATH, **_owned("0755")},
    "files": {
        **_PATH,
        "content": {"type": "str", "required": True},
        **_owned("0644"),
        "backup": {"type": "bool", "default": False},
    },
    "blocks": {
        **_PATH,
        "block": {"type": "str", "required": True},
        "marker": {"type": "str", "default": BLOCK_MARKER},
        "position": {"type": "str", "default": "bottom", "choices": ["top", "bottom"]},
        **_owned("0644"),
    },
    "links": {**_PATH, "src": {"type": "str", "required": True}},
}


class FilesError(Exception):
    """A request that cannot be carried out; the message names the path."""


def parse_mode(path: str, mode: str) -> int:
    try:
        value = int(mode, 8)
    except ValueError:
        raise FilesError(f"{path}: mode {mode!r} is not an octal mode such as '0644'") from None
    if not 0 <= value <= 0o7777:
        raise FilesError(f"{path}: mode {mode!r} is out of range")
    return value


def ids(path: str, owner: str, group: str) -> tuple[int, int]:
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise FilesError(f"{path}: owner {owner!r} does not exist on this node") from None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise FilesError(f"{path}: group {group!r} does not exist on this node") from None
    return uid, gid


class Files:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.check = module.check_mode
        self.changed_paths: list[str] = []
        self.backups: dict[str, str] = {}
        self.diffs: list[dict[str, str]] = []
        self.outside: dict[str, list[str]] = {}

    def _mark(self, path: str, before: str = "", after: str = "") -> None:
        if path not in self.changed_paths:
            self.changed_paths.append(path)
        if self.module._diff and (before or after):
            self.diffs.append(
                {"before_header": path, "after_header": path, "before": before, "after": after}
            )

    def _attributes(self, path: str, mode: int, uid: int, gid: int) -> None:
        st = os.lstat(path)
        if stat.S_IMODE(st.st_mode) != mode or st.st_uid != uid or st.st_gid != gid:
            before = f"mode {oct(stat.S_IMODE(st.st_mode))} uid {st.st_uid} gid {st.st_gid}\n"
            after = f"mode {oct(mode)} uid {uid} gid {gid}\n"
            self._mark(path, before, after)
            if not self.check:
                os.chown(path, uid, gid)
                os.chmod(path, mode)

    def directory(self, entry: dict) -> None:
        path = entry["path"]
        mode = parse_mode(path, entry["mode"])
        uid, gid = ids(path, entry["owner"], entry["group"])
        if os.path.lexists(path):
            if not os.path.isdir(path):
                raise FilesError(f"{path}: exists and is not a folder")
            self._attributes(path, mode, uid, gid)
            return
        self._mark(path, "", "(folder)\n")
        if not self.check:
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
            os.chmod(path, mode)

    def _write(self, path: str, text: str, mode: int, uid: int, gid: int) -> None:
        folder = os.path.dirname(path)
        if not os.path.isdir(folder):
            if self.check:
                return
            raise FilesError(f"{path}: folder {folder} does not exist")
        fd, tmp = tempfile.mkstemp(prefix=".gpuenv.", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chown(tmp, uid, gid)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _read(self, path: str) -> str | None:
        if not os.path.lexists(path):
            return None
        if os.path.islink(path) or not os.path.isfile(path):
            raise FilesError(f"{path}: exists and is not a regular file")
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except UnicodeDecodeError:
            raise FilesError(f"{path}: is not a UTF-8 text file") from None

    def _ensure_text(self, path: str, text: str, entry: dict, backup: bool, keep: bool) -> None:
        """Write text to path when it differs; keep: an existing file keeps its mode and owner."""
        current = self._read(path)
        if keep and current is not None:
            st = os.stat(path)
            mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        else:
            mode = parse_mode(path, entry["mode"])
            uid, gid = ids(path, entry["owner"], entry["group"])
        if current == text:
            if not keep:
                self._attributes(path, mode, uid, gid)
            return
        self._mark(path, current or "", text)
        if self.check:
            return
        if backup and current is not None:
            stamp = datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")
            kept = f"{path}.{stamp}.gpuenv~"
            shutil.copy2(path, kept)
            self.backups[path] = kept
        self._write(path, text, mode, uid, gid)

    def file(self, entry: dict) -> None:
        self._ensure_text(entry["path"], entry["content"], entry, entry["backup"], keep=False)

    def block(self, entry: dict) -> None:
        path, marker = entry["path"], entry["marker"]
        if "{mark}" not in marker:
            raise FilesError(f"{path}: marker {marker!r} must contain {{mark}}")
        # A shared file: when it exists, its owner and mode belong to its package, not to us.
        text = render_block(self._read(path) or "", entry["block"], marker, entry["position"])
        self.outside[path] = outside_block(text, marker)
        self._ensure_text(path, text, entry, False, keep=True)

    def link(self, entry: dict) -> None:
        path, src = entry["path"], entry["src"]
        if os.path.islink(path):
            current = os.readlink(path)
            if current == src:
                return
            self._mark(path, f"-> {current}\n", f"-> {src}\n")
            if not self.check:
                tmp = f"{path}.gpuenv-tmp"
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                os.symlink(src, tmp)
                os.replace(tmp, path)
            return
        if os.path.lexists(path):
            raise FilesError(f"{path}: exists and is not a symbolic link; not replaced")
        self._mark(path, "", f"-> {src}\n")
        if not self.check:
            os.symlink(src, path)


def main() -> None:
    argument_spec = {
        kind: {"type": "list", "elements": "dict", "default": [], "options": options}
        for kind, options in _ENTRY_SPECS.items()
    }
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    files = Files(module)
    try:
        for entry in module.params["directories"]:
            files.directory(entry)
        for entry in module.params["files"]:
            files.file(entry)
        for entry in module.params["blocks"]:
            files.block(entry)
        for entry in module.params["links"]:
            files.link(entry)
    except (FilesError, OSError) as exc:
        module.fail_json(msg=str(exc), changed_paths=files.changed_paths, backups=files.backups)
    result = {
        "changed": bool(files.changed_paths),
        "changed_paths": files.changed_paths,
        "backups": files.backups,
        "outside": files.outside,
    }
    if module._diff:
        result["diff"] = files.diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
