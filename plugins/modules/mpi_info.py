#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: read what the mpi role needs from a node, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mpi_info
short_description: Read the Open MPI packages, the GPUs and how Open MPI was built
description:
  - One look at the node for the C(mpi) role; changes nothing, so check mode is the same run.
  - C(ompi_info --all) takes a quarter of a second or more. Its answer is recorded in I(fact_file)
    (by the role) with a stamp of the files that decide it (ompi_info and the Open MPI libraries
    it loads, path, inode, size, mtime); while the stamp is unchanged the recorded answer is used,
    otherwise ompi_info runs.
options:
  count_gpus:
    description: Count the GPUs C(nvidia-smi --list-gpus) lists.
    type: bool
    default: false
  fact_file:
    description: The local fact file holding the last recorded answer.
    type: path
    required: true
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Look at the Open MPI packages, the GPUs and Open MPI's build
  gpuenv.cluster.mpi_info:
    count_gpus: true
    fact_file: /etc/ansible/facts.d/gpuenv_mpi.fact
    packages: [openmpi-bin, libopenmpi-dev]
  register: found
"""

RETURN = r"""
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
gpus:
  description: The GPUs nvidia-smi lists (0 without nvidia-smi); null unless I(count_gpus).
  type: int
  returned: always
ompi:
  description:
    - Open MPI's version, CUDA awareness and build stamp; null when ompi_info is missing or fails.
  type: dict
  returned: always
  sample: {version: 5.0.7, cuda_aware: false, build: 0123456789abcdef}
"""

import hashlib
import json
import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import ompi as open_mpi
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    installed,
    read_text,
)

# Open MPI's system-wide parameter files: Debian's and a source build's default prefix.
MCA_PARAMS = ("/etc/openmpi/openmpi-mca-params.conf", "/usr/local/etc/openmpi-mca-params.conf")
CUDA_SWITCH = re.compile(rf"^\s*({'|'.join(open_mpi.SWITCHES)})\s*=")


def gpus(run: Run) -> int:
    rc, out = run(["nvidia-smi", "--list-gpus"])
    return sum(1 for line in out.splitlines() if re.match(r"GPU [0-9]+:", line)) if rc == 0 else 0


def build_stamp(run: Run) -> str | None:
    """A digest of ompi_info's and the Open MPI libraries' identity; None when unknown."""
    found = shutil.which("ompi_info")
    if not found:
        return None
    exe = os.path.realpath(found)
    rc, out = run(["ldd", exe])
    libs = set(re.findall(r"=> (/\S*lib(?:mpi|open-pal|open-rte)\.\S*)", out))
    if rc != 0 or not libs:
        return None
    parts = []
    for path in [exe, *sorted(os.path.realpath(lib) for lib in libs)]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        parts.append(f"{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    # The system-wide MCA parameters can switch CUDA support off (module_utils/ompi.py's rule):
    # the stamp holds those settings, not the files' identity, which the mpi role's own writes
    # to them (its MCA settings) would change on every converge.
    for conf in MCA_PARAMS:
        text = read_text(conf) or ""
        switches = [ln.strip() for ln in text.splitlines() if CUDA_SWITCH.match(ln)]
        parts.append(f"{conf}:{';'.join(switches)}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def recorded(fact_file: str) -> dict:
    try:
        with open(fact_file, encoding="utf-8") as handle:
            fact = json.load(handle)
    except (OSError, ValueError):
        return {}
    return fact if isinstance(fact, dict) else {}


def ompi(run: Run, fact_file: str, stamp: str | None) -> dict | None:
    """Open MPI's answer: the recorded one while stamp matches it, else ompi_info's."""
    fact = recorded(fact_file)
    if stamp and fact.get("ompi_build") == stamp and fact.get("version"):
        return {
            "version": fact["version"],
            "cuda_aware": fact.get("cuda_aware") is True,
            "build": stamp,
        }
    found = open_mpi.read(run)
    if found is None:
        return None
    return {"version": found["version"], "cuda_aware": found["cuda_aware"], "build": stamp or ""}


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    return {
        "debs": installed(run, params["packages"]),
        "gpus": gpus(run) if params["count_gpus"] else None,
        "ompi": ompi(run, params["fact_file"], build_stamp(run)),
    }


def main() -> None:
    spec = {
        "count_gpus": {"type": "bool", "default": False},
        "fact_file": {"type": "path", "required": True},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
