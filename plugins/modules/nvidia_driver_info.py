#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: find the NVIDIA GPUs and the running driver of a node, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_driver_info
short_description: Find the NVIDIA GPUs on the PCI bus and the driver the node runs
description:
  - One look at the node for the C(nvidia_driver) role, which leaves a node alone when the driver it
    runs already matches the request.
  - Counts the NVIDIA GPUs on the PCI bus (the node floor's rule, module_utils/pci.py), reads the
    loaded kernel module's version from C(/sys/module/nvidia/version), and, where there is no such
    module (a container that sees the GPU through an injected driver), asks C(nvidia-smi).
options:
  smi_timeout:
    description: Seconds C(nvidia-smi) gets (it can hang on a GPU in a bad state).
    type: int
    default: 30
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Look for NVIDIA GPUs and the running driver
  gpuenv.cluster.nvidia_driver_info:
  register: found
"""

RETURN = r"""
gpus:
  description: NVIDIA display/3D controllers on the PCI bus.
  type: int
  returned: always
module:
  description: The loaded kernel module's version; empty when no module is loaded.
  type: str
  returned: always
smi:
  description: The driver version nvidia-smi reports when no module is loaded; empty otherwise.
  type: str
  returned: always
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import pci
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    installed,
    read_text,
)

MODULE_VERSION = "/sys/module/nvidia/version"


def driver(run: Run, smi_timeout_s: float, module_version: str = MODULE_VERSION) -> dict:
    """The loaded module's version, else nvidia-smi's answer (127 when it is missing: empty)."""
    loaded = (read_text(module_version) or "").strip()
    if loaded:
        return {"module": loaded, "smi": ""}
    argv = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    rc, out = run(argv, timeout_s=smi_timeout_s)
    lines = out.strip().splitlines() if rc == 0 else []
    return {"module": "", "smi": lines[0].strip() if lines else ""}


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    return {
        "gpus": len(pci.gpus() or []),
        **driver(run, params["smi_timeout"]),
        "debs": installed(run, params["packages"]),
    }


def main() -> None:
    spec = {"smi_timeout": {"type": "int", "default": 30}}
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
