# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""What NVIDIA hardware needs, by PCI id: the one table the roles (through the collection's
modules) and ``gpuenv doctor`` both read.

The file lives in the collection (plugins/module_utils, shipped to the node with the modules);
``gpuenv/doctor/nvidia_hw.py`` is a symbolic link to it, so the gpuenv package carries the same
file (a wheel holds its content). Standard library only, Python 3.10 and newer.

Sources of the ids: the PCI ID database (pci.ids, github.com/pciutils/pciids, vendor 10de), lines
such as "22a3  GH100 [H100 NVSwitch]", "2342  GH100 [GH200 120GB / 480GB]", "2901  GB100 [B200]",
"1db1  GV100GL [Tesla V100 SXM2 16GB]", "1e02  TU102 [TITAN RTX]"; and NVIDIA's
open-gpu-kernel-modules README (github.com/NVIDIA/open-gpu-kernel-modules): the open kernel
modules drive Turing and later GPUs only, and Grace Hopper and Blackwell platforms require them.
"""

from __future__ import annotations

NVIDIA_VENDOR = 0x10DE
# PCI class >> 8: VGA controller, 3D controller.
GPU_CLASSES = (0x0300, 0x0302)
# NVSwitches enumerate as NVIDIA bridges of class 0x0680 ("Bridge: other bridge device").
NVSWITCH_CLASS = 0x0680
# The NVSwitch ids pci.ids names (used for naming only: any NVIDIA class-0x0680 device counts).
NVSWITCH_IDS = {
    0x1AF1: "GA100 [A100 NVSwitch]",
    0x22A3: "GH100 [H100 NVSwitch]",
}

OPEN = "open"
PROPRIETARY = "proprietary"

# (first PCI device id, generation, kernel-module flavours that drive it), ascending. Turing
# starts at TU102 (0x1e02; the last Volta id, GV100GL 0x1df6, lies below 0x1e00), Blackwell at
# GB100 (0x2900); everything after (GB10x, GB20x, GB110) is Blackwell or newer.
GENERATIONS: tuple[tuple[int, str, frozenset[str]], ...] = (
    (0x0000, "pre-Turing (Maxwell, Pascal, Volta)", frozenset({PROPRIETARY})),
    (0x1E00, "Turing, Ampere, Ada or Hopper", frozenset({OPEN, PROPRIETARY})),
    (0x2900, "Blackwell", frozenset({OPEN})),
)
# Hopper GPUs of the Grace Hopper superchip: open modules only, unlike the rest of Hopper.
OPEN_ONLY_IDS = {
    0x2342: "Grace Hopper (GH200 120GB / 480GB)",
    0x2348: "Grace Hopper (GH200 144G HBM3e)",
}


def generation(device_id: int) -> tuple[str, frozenset[str]]:
    """The GPU generation of a PCI device id and the module flavours that drive it."""
    if device_id in OPEN_ONLY_IDS:
        return OPEN_ONLY_IDS[device_id], frozenset({OPEN})
    name, flavours = GENERATIONS[0][1], GENERATIONS[0][2]
    for first, gen, allowed in GENERATIONS:
        if device_id >= first:
            name, flavours = gen, allowed
    return name, flavours


def fabric_states(text: str) -> list[tuple[str, str, str]]:
    """(GPU bus id, fabric State, fabric Status) for each GPU of ``nvidia-smi -q``'s output."""
    states = []
    gpu = ""
    in_fabric = False
    state = ""
    for line in text.splitlines():
        if line.startswith("GPU "):
            gpu, in_fabric = line.split()[1], False
            continue
        stripped = line.strip()
        key, _, value = (s.strip() for s in stripped.partition(":"))
        if stripped == "Fabric":
            in_fabric, state = True, ""
        elif in_fabric and key == "State":
            state = value
        elif in_fabric and key == "Status":
            states.append((gpu, state, value))
            in_fabric = False
    return states


def fabric_unhealthy(states: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The GPUs whose fabric is not trained (State Completed, Status Success)."""
    return [s for s in states if s[1] != "Completed" or s[2] != "Success"]
