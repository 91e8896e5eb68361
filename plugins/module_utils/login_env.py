# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Where a login's job variables come from: the files an SSH login on a node reads (pam_env's
``/etc/environment`` and ``/etc/security/pam_env.conf``, the login profile ``/etc/profile``,
``/etc/profile.d/*.sh``, the user's ``~/.profile`` and its kin) and which of them set a variable
a GPU job depends on (``LD_LIBRARY_PATH``, ``CUDA_VISIBLE_DEVICES``, ``NCCL_*`` ...).

A check that fails in the login environment names these, so the user sees the file to mend.
What gpuenv's roles write (an ``Ansible managed`` file, a block between ``BEGIN``/``END gpuenv``
markers) is theirs and is left out: the roles' values are checked elsewhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .node import read_under

# The variables a user's GPU job reads at start: the loader's, CUDA's, NCCL's, gloo's and the
# MPI's (Open MPI's own, and its PMIx and PRRTE runtimes' in Open MPI 5).
JOB_VARIABLE = re.compile(
    r"^(LD_LIBRARY_PATH|LD_PRELOAD|PYTHONPATH|PYTHONHOME|CUDA_[A-Z0-9_]+|NCCL_[A-Z0-9_]+"
    r"|OMPI_[A-Z0-9_]+|OMPI_MCA_[a-z0-9_]+|PMIX_[A-Za-z0-9_]+|PRTE_[A-Za-z0-9_]+|UCX_[A-Z0-9_]+"
    r"|GLOO_[A-Z0-9_]+|MASTER_ADDR|MASTER_PORT)$"
)
SYSTEM_FILES = (
    "/etc/environment",
    "/etc/security/pam_env.conf",
    "/etc/profile",
    "/etc/bash.bashrc",
)
USER_FILES = (".pam_environment", ".profile", ".bash_profile", ".bash_login", ".bashrc")
_MANAGED_HEAD_LINES = 5


def login_files(root: str, home: str) -> list[str]:
    """The node paths a login reads, in the order it reads them (user files from ``home``)."""
    profile_d = os.path.join(root, "etc/profile.d")
    try:
        scripts = sorted(n for n in os.listdir(profile_d) if n.endswith(".sh"))
    except OSError:
        scripts = []
    return [
        *SYSTEM_FILES[:3],
        *(f"/etc/profile.d/{n}" for n in scripts),
        SYSTEM_FILES[3],
        *(os.path.join(home, n) for n in USER_FILES),
    ]


def _own_lines(text: str) -> list[str]:
    """The lines of a file that are not gpuenv's (a managed file has none)."""
    lines = text.splitlines()
    if any("Ansible managed" in ln for ln in lines[:_MANAGED_HEAD_LINES]):
        return []
    out: list[str] = []
    inside = False
    for line in lines:
        if re.match(r"^#\s*BEGIN\b.*\bgpuenv\b", line):
            inside = True
        elif re.match(r"^#\s*END\b.*\bgpuenv\b", line):
            inside = False
        elif not inside:
            out.append(line)
    return out


def _sets(line: str, name: str, pam_conf: bool) -> bool:
    line = line.strip()
    if line.startswith("#"):
        return False
    if pam_conf:
        return re.match(rf"^{re.escape(name)}\s+(DEFAULT|OVERRIDE)=", line) is not None
    # NAME=, export NAME=, a; NAME+= ... : an assignment anywhere on the line.
    return re.search(rf"(^|[\s;&|]){re.escape(name)}\+?=", line) is not None


def job_variables(root: str, home: str, environ: Mapping[str, str]) -> dict[str, dict[str, object]]:
    """Each job variable of ``environ`` (the login's environment) that a login file other than
    gpuenv's sets: ``{NAME: {"value": ..., "set_in": [node paths]}}``."""
    names = sorted(k for k in environ if JOB_VARIABLE.match(k))
    found: dict[str, dict[str, object]] = {}
    if not names:
        return found
    for path in login_files(root, home):
        text = read_under(root, path)
        if text is None:
            continue
        lines = _own_lines(text)
        pam_conf = path == "/etc/security/pam_env.conf"
        for name in names:
            if any(_sets(line, name, pam_conf) for line in lines):
                entry = found.setdefault(name, {"value": environ[name], "set_in": []})
                entry["set_in"].append(path)  # type: ignore[union-attr]
    return found


def describe(found: Mapping[str, Mapping[str, object]]) -> str:
    """One line: ``LD_LIBRARY_PATH='/opt/x' (set in /etc/environment)``; empty when none."""
    parts = []
    for name, entry in sorted(found.items()):
        where = ", ".join(str(p) for p in entry.get("set_in", []))  # type: ignore[union-attr]
        parts.append(f"{name}={str(entry.get('value', ''))!r} (set in {where})")
    return "; ".join(parts)
