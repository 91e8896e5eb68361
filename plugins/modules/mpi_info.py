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
  - Whether Open MPI carries CUDA device buffers is decided by a transfer on a node with an
    NVIDIA GPU on its PCI bus (module_utils/ompi.py, C(decide)), never by C(ompi_info)'s claim.
  - C(ompi_info --all) and the transfer take a second or more. Their answer is recorded in
    I(fact_file) (by the role) with a stamp of what decides it (ompi_info and the Open MPI
    libraries it loads, path, inode, size, mtime; the CUDA switches of the MCA files; the GPUs on
    the bus); while the stamp is unchanged the recorded answer is used, otherwise both run.
options:
  count_gpus:
    description: Count the GPUs C(nvidia-smi --list-gpus) lists.
    type: bool
    default: false
  fact_file:
    description: The local fact file holding the last recorded answer.
    type: path
    required: true
  prefix:
    description:
      - The prefix of the Open MPI to read (its C(bin/ompi_info)) where it holds one; otherwise,
        and when empty, the one on C(PATH).
    type: path
    default: ""
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
deb_versions:
  description: The packages of I(packages) that dpkg has installed, with their versions.
  type: dict
  returned: always
ompi_info:
  description: The ompi_info read (under I(prefix) where it holds one, else the one on PATH).
  type: str
  returned: always
gpus:
  description: The GPUs nvidia-smi lists (0 without nvidia-smi); null unless I(count_gpus).
  type: int
  returned: always
gpus_on_bus:
  description: The NVIDIA GPUs on the PCI bus (whether or not a driver is loaded).
  type: int
  returned: always
ompi:
  description:
    - Open MPI's version, whether a device transfer passed (C(cuda_aware)), whether one ran
      (C(cuda_tested)), the evidence, and the build stamp; null when ompi_info is missing or fails.
  type: dict
  returned: always
  sample:
    version: 4.1.4
    cuda_aware: true
    cuda_tested: true
    build: 0123456789abcdef
    cuda_evidence: >-
      a device buffer passed through MPI_Allreduce of /opt/gpuenv/openmpi/lib/libmpi.so.40 intact
"""

import hashlib
import json
import os
import re
import shutil
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import ompi as open_mpi
from ansible_collections.gpuenv.cluster.plugins.module_utils import pci
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    package_versions,
    read_text,
)

# Open MPI's system-wide parameter files: Debian's and a source build's default prefix.
MCA_PARAMS = ("/etc/openmpi/openmpi-mca-params.conf", "/usr/local/etc/openmpi-mca-params.conf")
CUDA_SWITCH = re.compile(rf"^\s*({'|'.join(open_mpi.SWITCHES)})\s*=")


def gpus(run: Run) -> int:
    rc, out = run(["nvidia-smi", "--list-gpus"])
    return sum(1 for line in out.splitlines() if re.match(r"GPU [0-9]+:", line)) if rc == 0 else 0


def ompi_info(prefix: str) -> str:
    """The ompi_info to ask: the prefix's where it holds one, else the one on PATH."""
    inside = os.path.join(prefix, "bin", "ompi_info") if prefix else ""
    return inside if inside and os.access(inside, os.X_OK) else "ompi_info"


def gpus_on_bus(root: str = "/") -> int:
    """NVIDIA GPUs on the PCI bus (the floor's reader): where a device transfer can run."""
    return len(pci.gpus(root) or [])


def build_stamp(run: Run, program: str, gpus_seen: int) -> str | None:
    """A digest of ompi_info's and the Open MPI libraries' identity; None when unknown."""
    found = program if "/" in program and os.path.exists(program) else shutil.which(program)
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
    own = os.path.join(os.path.dirname(os.path.dirname(exe)), "etc", "openmpi-mca-params.conf")
    for conf in dict.fromkeys([*MCA_PARAMS, own]):
        text = read_text(conf) or ""
        switches = [ln.strip() for ln in text.splitlines() if CUDA_SWITCH.match(ln)]
        parts.append(f"{conf}:{';'.join(switches)}")
    parts.append(f"gpus:{gpus_seen}")  # a GPU that came or went decides whether the transfer runs
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def recorded(fact_file: str) -> dict:
    try:
        with open(fact_file, encoding="utf-8") as handle:
            fact = json.load(handle)
    except (OSError, ValueError):
        return {}
    return fact if isinstance(fact, dict) else {}


ANSWER = ("version", "cuda_aware", "cuda_tested", "cuda_evidence")


def ompi(
    run: Run,
    fact_file: str,
    stamp: str | None,
    program: str = "ompi_info",
    gpus_seen: int = 0,
    python: str = sys.executable,
) -> dict | None:
    """Open MPI's answer: the recorded one while stamp matches it, else ompi_info's and the
    transfer's (open_mpi.decide)."""
    fact = recorded(fact_file)
    if stamp and fact.get("ompi_build") == stamp and all(key in fact for key in ANSWER):
        return {**{key: fact[key] for key in ANSWER}, "build": stamp}
    found = open_mpi.decide(run, python, gpus_seen > 0, program)
    if found is None:
        return None
    return {**found, "build": stamp or ""}


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    program = ompi_info(params["prefix"])
    listed = gpus(run) if params["count_gpus"] else None
    # A VM may hide the bus from sysfs: a GPU nvidia-smi lists counts too.
    seen = max(gpus_on_bus(), listed or 0)
    versions = package_versions(run, params["packages"])
    return {
        "debs": list(versions),
        "deb_versions": versions,
        "gpus": listed,
        "gpus_on_bus": seen,
        "ompi": ompi(run, params["fact_file"], build_stamp(run, program, seen), program, seen),
        "ompi_info": program,
    }


def main() -> None:
    spec = {
        "count_gpus": {"type": "bool", "default": False},
        "fact_file": {"type": "path", "required": True},
        "prefix": {"type": "path", "default": ""},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
