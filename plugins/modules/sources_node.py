#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: the sources role's look at a node, and its changes there, in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sources_node
short_description: Remove what the sources role no longer wants, point base apt sources at a mirror
description:
  - One call for the C(sources) role. On a converged node it only reads, so a re-run costs one
    module run.
  - Removes the files of I(absent) (paths or shell patterns) that are not in I(keep).
  - Points the node's base apt sources (I(apt_sources), less I(apt_exclude)) at a mirror by the
    rules of I(apt_rules), keeping the rest of each line. What each file held before is recorded
    in I(record). With fewer rules (none when the mirror is turned off), a file the module changed
    is put back as it was, unless someone changed it since (a warning names it, and it is left as
    it is).
  - When a sources file changed, C(apt-get update) runs at once, so that a later
    C(cache_valid_time) does not keep lists read from the old sources, each attempt under a
    deadline of 300 s. When it fails, the files and the record are put back as they were and the
    task fails with apt's message.
  - Supports check mode and diff mode.
options:
  absent:
    description: Paths or shell patterns of files to remove.
    type: list
    elements: str
    default: []
  keep:
    description: Paths among I(absent) that stay.
    type: list
    elements: str
    default: []
  ini_absent:
    description:
      - Keys to remove from the C([global]) section of an INI file (pip's C(/etc/pip.conf)), the
        rest of the file kept as written; a missing file is left missing.
    type: dict
    suboptions:
      path: {description: The file., type: path, required: true}
      section: {description: The section., type: str, default: global}
      keys: {description: The keys., type: list, elements: str, required: true}
  ca_dir:
    description:
      - The folder of the site's CA certificates; when a file in it is removed,
        C(update-ca-certificates --fresh) rebuilds the system bundle without it.
    type: path
  apt_rules:
    description:
      - Upstream archive roots to point elsewhere, in order; the first that matches a URL wins.
      - Empty puts every file recorded in I(record) back as it was.
    type: list
    elements: dict
    default: []
    suboptions:
      match:
        description:
          - A regular expression for an archive root (C(https?://deb\.debian\.org/debian)); it
            matches where a C(/), a blank or the end of the line follows.
        type: str
        required: true
      url: {description: The root that replaces it., type: str, required: true}
  apt_sources:
    description: Shell patterns of the base apt sources files.
    type: list
    elements: str
    default:
      - /etc/apt/sources.list
      - /etc/apt/sources.list.d/*.list
      - /etc/apt/sources.list.d/*.sources
  apt_exclude:
    description: Shell patterns of file names (not paths) among I(apt_sources) never changed.
    type: list
    elements: str
    default: []
  record:
    description: Where the files' content before the change is kept (JSON, removed when empty).
    type: path
    required: true
  update_cache:
    description: Run C(apt-get update) after a sources file changed.
    type: bool
    default: true
  update_retries:
    description: Retries of a failed C(apt-get update).
    type: int
    default: 3
  update_delay:
    description: Seconds between those retries.
    type: int
    default: 5
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Remove what is no longer wanted, point the base apt sources at the mirror
  gpuenv.cluster.sources_node:
    absent:
      - /etc/apt/apt.conf.d/80gpuenv-site-cache
      - /usr/local/share/ca-certificates/gpuenv-site/site-*.crt
    keep: [/usr/local/share/ca-certificates/gpuenv-site/site-000.crt]
    apt_rules:
      - {match: 'https?://(deb|security)\.debian\.org/debian-security', url: http://apt.site/debian-security}
      - {match: 'https?://deb\.debian\.org/debian', url: http://apt.site/debian}
    apt_exclude: [gpuenv-*, nvidia-cuda.*]
    record: /var/lib/gpuenv/sources/apt-base.json
  register: done
"""

RETURN = r"""
removed:
  description: Files removed (or that would be, in check mode).
  type: list
  elements: str
  returned: always
ini_cleaned:
  description: Whether keys of I(ini_absent) were removed (or would be, in check mode).
  type: bool
  returned: always
repointed:
  description: Base apt sources files changed (pointed at the mirror or put back).
  type: list
  elements: str
  returned: always
recorded:
  description: The base apt sources files the record holds after this run.
  type: list
  elements: str
  returned: always
updated:
  description: Whether C(apt-get update) ran.
  type: bool
  returned: always
ca_rebuilt:
  description: Whether C(update-ca-certificates) ran.
  type: bool
  returned: always
"""

import fnmatch
import glob
import json
import os
import re
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import KILL_AFTER_S
from ansible_collections.gpuenv.cluster.plugins.module_utils.sources import (
    SourcesError,
    compile_rules,
    repoint,
    without_keys,
)

# apt-get update gets this long per attempt (a mirror that accepts the connection and then sends
# nothing would otherwise hold the run); coreutils' timeout stops it, exit status 124.
APT_UPDATE_TIMEOUT_S = 300


def matching(patterns: list[str], exclude: list[str] = ()) -> list[str]:
    """Regular files (links followed) matching the patterns, less the excluded names, sorted."""
    found: set[str] = set()
    for pattern in patterns:
        found.update(glob.glob(pattern))
    return sorted(
        p
        for p in found
        if os.path.isfile(p) and not any(fnmatch.fnmatch(os.path.basename(p), x) for x in exclude)
    )


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise SourcesError(f"{path}: is not a UTF-8 text file") from None


def write_text(module: AnsibleModule, path: str, text: str) -> None:
    """Write atomically; an existing file keeps its mode, owner and context (atomic_move)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gpuenv.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    module.atomic_move(tmp, path)


def load_record(path: str) -> dict[str, dict[str, str]]:
    text = read_text(path)
    if text is None:
        return {}
    try:
        data = json.loads(text)
        files = data["files"]
        if not all(isinstance(v.get("original"), str) and isinstance(v.get("written"), str)
                   for v in files.values()):  # fmt: skip
            raise TypeError
        return files
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SourcesError(f"{path}: is not a record this module wrote; move it away") from None


def plan(
    current: dict[str, str | None], record: dict[str, dict[str, str]], rules: list
) -> tuple[dict[str, str], dict[str, dict[str, str]], list[str]]:
    """What to write (path: text), the new record, and warnings.

    A file the record holds and nobody changed since is worked out from its recorded original,
    so a new mirror or none replaces the old one; a file changed by someone else since is taken
    as it is now (its record dropped, with a warning)."""
    writes: dict[str, str] = {}
    new_record: dict[str, dict[str, str]] = {}
    warnings: list[str] = []
    for path in sorted(set(current) | set(record)):
        text = current.get(path)
        entry = record.get(path)
        if text is None:
            continue  # gone: nothing to point anywhere, nothing to put back
        base = text
        if entry is not None:
            if text == entry["written"]:
                base = entry["original"]
            else:
                warnings.append(
                    f"{path} was changed after gpuenv pointed it at a mirror; it is taken as it is "
                    "now (gpuenv's record of it is dropped)"
                )
        wanted = repoint(base, rules)
        if wanted != text:
            writes[path] = wanted
        if wanted != base:
            new_record[path] = {"original": base, "written": wanted}
    return writes, new_record, warnings


class Node:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.check = module.check_mode
        self.diffs: list[dict[str, str]] = []

    def _diff(self, path: str, before: str, after: str) -> None:
        if self.module._diff:
            self.diffs.append(
                {"before_header": path, "after_header": path, "before": before, "after": after}
            )

    def remove(self, absent: list[str], keep: list[str]) -> list[str]:
        removed = [p for p in matching(absent) if p not in keep]
        for path in removed:
            self._diff(path, "(file)\n", "")
            if not self.check:
                os.unlink(path)
        return removed

    def update(self, retries: int, delay: int) -> str:
        """apt-get update; '' when it worked, else the end of what apt said."""
        timeout = self.module.get_bin_path("timeout", required=True)
        argv = [timeout, "-k", str(KILL_AFTER_S), str(APT_UPDATE_TIMEOUT_S)]
        argv += ["apt-get", "-o", "DPkg::Lock::Timeout=120", "update"]
        error = ""
        for attempt in range(retries + 1):
            rc, out, err = self.module.run_command(argv)
            # apt-get update exits 0 on a failed fetch; "E:" and "W: Failed to fetch" say so.
            failed = rc != 0 or re.search(r"^(E:|W: Failed to fetch|Err:)", out + err, re.M)
            if not failed:
                return ""
            error = (
                f"it did not finish within {APT_UPDATE_TIMEOUT_S} s"
                if rc in (124, 137)
                else " ".join((err or out).strip().splitlines()[-3:])
            )
            if attempt < retries:
                time.sleep(delay)
        return error or "apt-get update failed"


def main() -> None:
    run(
        AnsibleModule(
            argument_spec={
                "absent": {"type": "list", "elements": "str", "default": []},
                "keep": {"type": "list", "elements": "str", "default": []},
                "ca_dir": {"type": "path"},
                "ini_absent": {
                    "type": "dict",
                    "options": {
                        "path": {"type": "path", "required": True},
                        "section": {"type": "str", "default": "global"},
                        "keys": {"type": "list", "elements": "str", "required": True},
                    },
                },
                "apt_rules": {
                    "type": "list",
                    "elements": "dict",
                    "default": [],
                    "options": {
                        "match": {"type": "str", "required": True},
                        "url": {"type": "str", "required": True},
                    },
                },
                "apt_sources": {
                    "type": "list",
                    "elements": "str",
                    "default": [
                        "/etc/apt/sources.list",
                        "/etc/apt/sources.list.d/*.list",
                        "/etc/apt/sources.list.d/*.sources",
                    ],
                },
                "apt_exclude": {"type": "list", "elements": "str", "default": []},
                "record": {"type": "path", "required": True},
                "update_cache": {"type": "bool", "default": True},
                "update_retries": {"type": "int", "default": 3},
                "update_delay": {"type": "int", "default": 5},
            },
            supports_check_mode=True,
        )
    )


def run(module: AnsibleModule) -> None:
    """The module's work; ends with exit_json or fail_json."""
    params = module.params
    node = Node(module)
    try:
        rules = compile_rules(params["apt_rules"])
        removed = node.remove(params["absent"], params["keep"])
        record = load_record(params["record"])
        paths = set(matching(params["apt_sources"], params["apt_exclude"])) | set(record)
        current = {p: read_text(p) for p in sorted(paths)}
        writes, new_record, warnings = plan(current, record, rules)
        ini = params["ini_absent"]
        ini_text = read_text(ini["path"]) if ini else None
        ini_wanted = without_keys(ini_text, ini["section"], ini["keys"]) if ini_text else None
    except (SourcesError, OSError) as exc:
        module.fail_json(msg=str(exc))
    ini_changed = ini_wanted is not None and ini_wanted != ini_text
    if ini_changed:
        node._diff(ini["path"], ini_text or "", ini_wanted or "")
        if not module.check_mode:
            try:
                write_text(module, ini["path"], ini_wanted or "")
            except OSError as exc:
                module.fail_json(msg=str(exc))
    for warning in warnings:
        module.warn(warning)
    for path, text in writes.items():
        node._diff(path, current[path] or "", text)
    record_changed = new_record != record
    updated = ca_rebuilt = False
    ca_dir = params["ca_dir"]
    if ca_dir and not module.check_mode and any(os.path.dirname(p) == ca_dir for p in removed):
        rc, out, err = module.run_command(["update-ca-certificates", "--fresh"])
        if rc != 0:
            module.fail_json(
                msg=f"update-ca-certificates failed: {(err or out).strip()}", removed=removed
            )
        ca_rebuilt = True
    if not module.check_mode and (writes or record_changed):
        try:
            for path, text in writes.items():
                write_text(module, path, text)
            if writes and params["update_cache"]:
                error = node.update(params["update_retries"], params["update_delay"])
                if error:
                    # Back as it was, and apt's lists read from those sources again (the failed
                    # update dropped the lists of sources it no longer saw).
                    for path in writes:
                        write_text(module, path, current[path] or "")
                    node.update(0, 0)
                    module.fail_json(
                        msg=f"apt-get update failed after pointing {', '.join(writes)} at "
                        f"{sorted({r['url'] for r in params['apt_rules']}) or 'their upstream'}: "
                        f"{error}; the files were put back as they were",
                        removed=removed,
                    )
                updated = True
            if new_record:
                body = json.dumps({"files": new_record}, indent=1, sort_keys=True) + "\n"
                write_text(module, params["record"], body)
            elif os.path.exists(params["record"]):
                os.unlink(params["record"])
        except OSError as exc:
            module.fail_json(msg=str(exc), removed=removed)
    result = {
        "changed": bool(removed or writes or record_changed or ini_changed),
        "removed": removed,
        "ini_cleaned": ini_changed,
        "repointed": sorted(writes),
        "recorded": sorted(new_record),
        "updated": updated,
        "ca_rebuilt": ca_rebuilt,
    }
    if module._diff:
        result["diff"] = node.diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
