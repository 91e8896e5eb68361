#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: read what the gpu_env role needs from a node, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_env_info
short_description: Read the OS packages, GPUs, CUDA home and cluster virtual environment of a node
description:
  - One look at the node for the C(gpu_env) role; changes nothing, so check mode is the same run.
options:
  count_gpus:
    description:
      - Count the NVIDIA GPUs on the PCI bus (the node floor's rule, module_utils/pci.py).
    type: bool
    default: false
  cuda_home:
    description:
      - The CUDA home; empty means the first of I(cuda_home_candidates) holding C(bin/nvcc).
    type: str
    default: ""
  cuda_home_candidates:
    description: Where to look for the CUDA home.
    type: list
    elements: str
    default: []
  read_nvcc:
    description: Ask the CUDA home's C(nvcc --version) for the CUDA major.
    type: bool
    default: false
  venv:
    description: The cluster virtual environment.
    type: path
    required: true
  marker:
    description: The file naming the gpuenv build the virtual environment holds.
    type: path
    required: true
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Look at the OS packages, the GPUs, the CUDA home and the virtual environment
  gpuenv.cluster.gpu_env_info:
    count_gpus: true
    cuda_home_candidates: [/usr/local/cuda, /usr/lib/nvidia-cuda-toolkit]
    read_nvcc: true
    venv: /opt/gpuenv
    marker: /opt/gpuenv/gpuenv-wheel.installed
    packages: [python3-venv]
  register: found
"""

RETURN = r"""
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
pci_gpus:
  description: NVIDIA display/3D controllers on the PCI bus; null unless I(count_gpus).
  type: int
  returned: always
cuda:
  description: The CUDA home (empty when none), whether it has lib64, the CUDA major nvcc reports.
  type: dict
  returned: always
  sample: {home: /usr/local/cuda, lib64: true, major: "12"}
venv:
  description: Whether the venv has bin/python, and its distributions (normalized name to version).
  type: dict
  returned: always
  sample: {python: true, dists: {numpy: 2.3.1}}
marker:
  description: The marker file's content, stripped; null when it is missing.
  type: str
  returned: always
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import pci
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    distributions,
    exit_with_reading,
    installed,
    read_text,
)


def cuda(run: Run, home: str, candidates: list[str], read_nvcc: bool) -> dict:
    if not home:
        home = next((c for c in candidates if os.path.lexists(c + "/bin/nvcc")), "")
    major = ""
    if home and read_nvcc:
        _, out = run([home + "/bin/nvcc", "--version"])
        found = re.search(r"release ([0-9]+)\.", out)
        major = found.group(1) if found else ""
    return {"home": home, "lib64": bool(home) and os.path.lexists(home + "/lib64"), "major": major}


def venv(path: str) -> dict:
    dists = {name: version for name, (version, _) in distributions(path).items()}
    return {"python": os.path.lexists(path + "/bin/python"), "dists": dists}


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    content = read_text(params["marker"])
    return {
        "debs": installed(run, params["packages"]),
        "pci_gpus": len(pci.gpus() or []) if params["count_gpus"] else None,
        "cuda": cuda(run, params["cuda_home"], params["cuda_home_candidates"], params["read_nvcc"]),
        "venv": venv(params["venv"]),
        "marker": content.strip() if content is not None else None,
    }


def main() -> None:
    spec = {
        "count_gpus": {"type": "bool", "default": False},
        "cuda_home": {"type": "str", "default": ""},
        "cuda_home_candidates": {"type": "list", "elements": "str", "default": []},
        "read_nvcc": {"type": "bool", "default": False},
        "venv": {"type": "path", "required": True},
        "marker": {"type": "path", "required": True},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
