#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: the node's fabric and the NCCL settings that follow from it, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rdma_fabric_info
short_description: Read the GPUs, RDMA ports and GPUDirect RDMA; derive NCCL's settings
description:
  - One read-only look at the node for the C(rdma_fabric) role, through the node floor's fabric
    reader (C(module_utils/fabric.py)); changes nothing, so check mode is the same run.
  - Per GPU its NUMA node and PCI path; the NVSwitches and Fabric Manager's state
    (C(systemctl is-active nvidia-fabricmanager), only where NVSwitches are); every
    InfiniBand/RoCE port with state, physical state, rate, link layer, GID table, netdev, NUMA
    node and PCI path; GPU-port affinity and ACS on the bridges between them; GPUDirect RDMA
    (nvidia_peermem loaded, or dma-buf).
  - The NCCL settings the role writes (NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_IB_TC, NCCL_IB_SL,
    NCCL_SOCKET_IFNAME), each derived unless its option gives a value (docs/roles/rdma_fabric.md).
options:
  root:
    description: Read the system under this folder (tests point it at a fixture tree).
    type: path
    default: /
  nvlink:
    description: NVML's NVLink counts by GPU bus id, C([active, total]); sysfs has none.
    type: dict
    default: {}
  model_links:
    description:
      - The NVLink count of each GPU model by PCI device id (C(0x2330)).
      - The caller supplies it, because the spec table that holds it (C(nvlink_links) of the
        gpuenv package's gpu_specs.yaml) does not ship in the collection and the module cannot
        read it on the node. The gpuenv package passes C(gpuenv.checks.thresholds.model_links).
    type: dict
    default: {}
  ib_hca:
    description: NCCL_IB_HCA to write instead of the derived one.
    type: str
    default: ""
  gid_index:
    description: NCCL_IB_GID_INDEX to write instead of the derived one.
    type: str
    default: ""
  tc:
    description: NCCL_IB_TC to write instead of the default (106).
    type: str
    default: ""
  sl:
    description: NCCL_IB_SL to write instead of the default (0).
    type: str
    default: ""
  socket_ifname:
    description: NCCL_SOCKET_IFNAME to write instead of the default route's interface.
    type: str
    default: ""
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Read the fabric and derive the NCCL settings
  gpuenv.cluster.rdma_fabric_info:
    tc: "{{ rdma_fabric_nccl_ib_tc }}"
  register: found
"""

RETURN = r"""
rdma:
  description: The node has at least one InfiniBand or RoCE port.
  type: bool
  returned: always
invisible:
  description:
    - The RDMA-capable network adapters on the PCI bus (ConnectX, BlueField, EFA) that have no
      RDMA device, each named with its PCI address and the cause (driver not loaded, no module for
      the running kernel). NCCL cannot use them; C(gpuenv check) and C(gpuenv doctor) FAIL on them.
  type: list
  elements: str
  returned: always
  sample:
    - "ConnectX-7 (15b3:1021) at 0000:18:00.0: no RDMA device: mlx5_core drives it but mlx5_ib
      is not loaded (modprobe mlx5_ib)"
fabric:
  description: The reader's facts (gpus, nvswitches, fabric_manager, ports, affinity, gdr ...).
  type: dict
  returned: always
nccl:
  description: The derived settings, the rails, the ports left out and why, each setting's origin.
  type: dict
  returned: always
nccl_conf:
  description: The /etc/nccl.conf lines, setting name to value; an unset setting is absent.
  type: dict
  returned: always
  sample: {NCCL_IB_HCA: "=mlx5_0:1", NCCL_IB_TC: "106", NCCL_IB_SL: "0", NCCL_SOCKET_IFNAME: eno1}
peermem:
  description:
    - C(load) is true when GDR is off (no dma-buf) and nvidia-peermem is built for the running
      kernel.
  type: dict
  returned: always
  sample: {loaded: false, module: true, load: true}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import fabric as fabric_reader
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    installed,
)

OVERRIDES = ("ib_hca", "gid_index", "tc", "sl", "socket_ifname")


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters (every reading is the node floor's)."""
    nvlink = {k: tuple(v) for k, v in (params["nvlink"] or {}).items()}
    found = fabric_reader.read(params["root"], run, nvlink, params["model_links"] or {})
    settings = fabric_reader.derive(found, {k: params[k] for k in OVERRIDES})
    gdr = found.gdr
    return {
        "rdma": bool(found.ports),
        "invisible": fabric_reader.invisible_named(found.adapters),
        "fabric": found.as_dict(),
        "nccl": settings.as_dict(),
        "nccl_conf": settings.conf(),
        "peermem": {
            "loaded": gdr.peermem_loaded,
            "module": gdr.peermem_module,
            "load": not gdr.available and gdr.peermem_module,
        },
        "debs": installed(run, params["packages"]),
    }


def main() -> None:
    spec = {
        "root": {"type": "path", "default": "/"},
        "nvlink": {"type": "dict", "default": {}},
        "model_links": {"type": "dict", "default": {}},
        **{name: {"type": "str", "default": ""} for name in OVERRIDES},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
