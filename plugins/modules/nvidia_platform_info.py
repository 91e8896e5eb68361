#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: what the node's hardware and boot ask of the NVIDIA driver, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_platform_info
short_description: Read what the GPUs, NVSwitches, Secure Boot and the next boot ask of the driver
description:
  - One read-only look at the node for the C(nvidia_driver) role's preflight and its reboot.
  - The NVIDIA GPUs on the PCI bus with their generation and the kernel-module flavours that drive
    them (table C(module_utils/nvidia_hw.py), shared with C(gpuenv doctor)), and the flavour to
    install for the requested one, or why the request cannot work.
  - The NVSwitches (NVIDIA bridges of PCI class 0x0680): such a node needs Fabric Manager.
  - The Secure Boot state (the EFI variable C(SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c),
    else C(mokutil --sb-state)).
  - The kernel the next boot starts (GRUB's saved entry when C(GRUB_DEFAULT=saved), else the
    newest C(/boot/vmlinuz-*)) and the C(nvidia.ko) built for it and for the running kernel.
  - Optionally the NVSwitch fabric state of every GPU (C(nvidia-smi -q)).
options:
  root:
    description: Read the system under this folder (tests point it at a fixture tree).
    type: path
    default: /
  flavour:
    description: The requested kernel-module flavour; C(auto) chooses from the GPUs and I(branch).
    type: str
    choices: [auto, open, proprietary]
    default: auto
  flavour_variable:
    description: The caller's variable holding I(flavour); error messages name it.
    type: str
    default: flavour
  branch:
    description: The driver branch (three digits); from 560 on NVIDIA's default flavour is open.
    type: str
    default: ""
  fabric:
    description: Also ask C(nvidia-smi -q) for the fabric state of every GPU.
    type: bool
    default: false
  driver_package:
    description: The driver package Fabric Manager must match.
    type: str
    default: ""
  fabricmanager_package:
    description:
      - The Fabric Manager package; when set, C(fabricmanager_error) says whether it is installed
        at the upstream version of I(driver_package).
    type: str
    default: ""
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Read the GPUs, NVSwitches, Secure Boot and the next boot
  gpuenv.cluster.nvidia_platform_info:
    flavour: "{{ nvidia_driver_module_flavour }}"
    flavour_variable: nvidia_driver_module_flavour
    branch: "{{ nvidia_driver_branch }}"
  register: platform
"""

RETURN = r"""
gpus:
  description: NVIDIA GPUs (bdf, device id, generation, flavours that drive it).
  type: list
  elements: dict
  returned: always
flavour:
  description: The flavour to install (open, proprietary); an explicit I(flavour) even if it fails.
  type: str
  returned: always
flavour_error:
  description: Why the requested flavour cannot drive the GPUs, naming one and the fix; else empty.
  type: str
  returned: always
nvswitches:
  description: NVSwitches on the PCI bus (bdf, device id, name from pci.ids).
  type: list
  elements: dict
  returned: always
secure_boot:
  description: Secure Boot on (true), off (false), or not known (null).
  type: bool
  returned: always
secure_boot_evidence:
  description: Where the state was read.
  type: str
  returned: always
running_kernel:
  description: The running kernel's release.
  type: str
  returned: always
boot_kernel:
  description: The kernel release the next boot starts; empty when not found.
  type: str
  returned: always
boot_kernel_evidence:
  description: How the next boot's kernel was found.
  type: str
  returned: always
modules:
  description: >-
    Kernel release -> path of the NVIDIA module built for it (empty when none), for the running
    kernel and the next boot's.
  type: dict
  returned: always
fabric:
  description: With I(fabric), (GPU, State, Status) for each GPU from nvidia-smi -q.
  type: list
  elements: list
  returned: always
fabric_error:
  description: With I(fabric), why the fabric is not healthy; empty when all are Completed/Success.
  type: str
  returned: always
fabricmanager_error:
  description: >-
    With I(fabricmanager_package), why Fabric Manager does not match the driver (missing, or
    another upstream version than I(driver_package)); empty when it matches.
  type: str
  returned: always
versions:
  description: Installed version of each package of I(packages) that dpkg has installed.
  type: dict
  returned: always
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import boot, pci
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    package_versions,
)
from ansible_collections.gpuenv.cluster.plugins.module_utils.nvidia_hw import (
    OPEN,
    PROPRIETARY,
    fabric_states,
    fabric_unhealthy,
)

# From this branch on NVIDIA installs the open modules by default (driver 560 release notes).
OPEN_DEFAULT_BRANCH = 560


def _describe(gpu: dict) -> str:
    return f"GPU {gpu['bdf']} (10de:{gpu['device'][2:]}, {gpu['generation']})"


def choose_flavour(found: list[dict], requested: str, branch: str, variable: str) -> dict:
    """The flavour to install, and why it cannot drive the GPUs (naming one and the flavour it
    needs), empty when it can.

    auto: the flavour every GPU needs; where both drive all of them (or there is no GPU),
    NVIDIA's default for the branch (open from 560 on, proprietary before). An explicit request
    is what gets installed, error or not (the caller stops on the error unless told otherwise).
    """
    default = OPEN if branch.isdigit() and int(branch) >= OPEN_DEFAULT_BRANCH else PROPRIETARY
    fallback = default if requested == "auto" else requested
    only_open = [g for g in found if g["flavours"] == [OPEN]]
    only_proprietary = [g for g in found if g["flavours"] == [PROPRIETARY]]
    if only_open and only_proprietary:
        error = (
            f"{_describe(only_open[0])} needs the open kernel module and "
            f"{_describe(only_proprietary[0])} the proprietary one: no one module drives both; "
            "move one of them to another node"
        )
        return {"flavour": fallback, "flavour_error": error}
    needed = OPEN if only_open else PROPRIETARY if only_proprietary else ""
    if requested == "auto":
        return {"flavour": needed or default, "flavour_error": ""}
    if needed and requested != needed:
        gpu = (only_open or only_proprietary)[0]
        error = (
            f"{variable}={requested} cannot drive {_describe(gpu)}: it needs the {needed} "
            f"kernel module; set {variable}={needed} (or auto)"
        )
        return {"flavour": requested, "flavour_error": error}
    return {"flavour": requested, "flavour_error": ""}


def upstream(version: str) -> str:
    """The NVIDIA version inside a Debian version: 550.163.01 of 1:550.163.01-2ubuntu1."""
    return re.sub(r"-[^-]*$", "", re.sub(r"^[0-9]+:", "", version))


def fabricmanager_error(versions: dict[str, str], driver: str, manager: str) -> str:
    """Fabric Manager must be the driver package's upstream version exactly."""
    if not manager:
        return ""
    if manager not in versions:
        return f"{manager} is not installed"
    if driver not in versions:
        return f"the driver package {driver} is not installed"
    if upstream(versions[manager]) != upstream(versions[driver]):
        return (
            f"{manager} {versions[manager]} is not the driver's version "
            f"({driver} {versions[driver]}): Fabric Manager refuses to run against another driver"
        )
    return ""


def fabric(run: Run) -> dict:
    rc, out = run(["nvidia-smi", "-q"], timeout_s=60)
    if rc != 0:
        return {"fabric": [], "fabric_error": f"nvidia-smi -q failed (exit status {rc})"}
    states = fabric_states(out)
    if not states:
        return {"fabric": [], "fabric_error": "nvidia-smi -q shows no fabric section for any GPU"}
    bad = fabric_unhealthy(states)
    error = "; ".join(f"GPU {g}: fabric State {st}, Status {su}" for g, st, su in bad)
    return {"fabric": [list(s) for s in states], "fabric_error": error}


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters (every reading is the node floor's)."""
    root = params["root"]
    devices = pci.devices(root) or []
    found = [d.describe() for d in devices if d.is_gpu]
    sb = boot.secure_boot(root, run)
    running = boot.running_kernel(root)
    nxt, nxt_evidence = boot.next_boot_kernel(root)
    files = {k: boot.module_files(root, k) for k in {running, nxt} if k}
    versions = package_versions(run, params["packages"])
    return {
        "gpus": found,
        **choose_flavour(found, params["flavour"], params["branch"], params["flavour_variable"]),
        "nvswitches": [d.describe() for d in devices if d.is_nvswitch],
        "secure_boot": sb.enabled,
        "secure_boot_evidence": sb.evidence,
        "running_kernel": running,
        "boot_kernel": nxt,
        "boot_kernel_evidence": nxt_evidence,
        "modules": {k: v[0] if v else "" for k, v in files.items()},
        **(fabric(run) if params["fabric"] else {"fabric": [], "fabric_error": ""}),
        "fabricmanager_error": fabricmanager_error(
            versions, params["driver_package"], params["fabricmanager_package"]
        ),
        "versions": versions,
        "debs": sorted(versions),
    }


def main() -> None:
    spec = {
        "root": {"type": "path", "default": "/"},
        "flavour": {
            "type": "str",
            "choices": ["auto", OPEN, PROPRIETARY],
            "default": "auto",
        },
        "flavour_variable": {"type": "str", "default": "flavour"},
        "branch": {"type": "str", "default": ""},
        "fabric": {"type": "bool", "default": False},
        "driver_package": {"type": "str", "default": ""},
        "fabricmanager_package": {"type": "str", "default": ""},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
