# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""PCI devices from sysfs: what they are and which bridges lie above them.

``/sys/bus/pci/devices/<BDF>`` links to the device's folder under ``/sys/devices/pci<D>:<B>/``,
whose path holds every bridge between the root complex and the device, in order. What counts as
a GPU, an NVSwitch or a NIC is decided here and nowhere else (classes from nvidia_hw).
Standard library only; ``root`` is ``/`` on a node and a fixture tree in tests.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .node import read_under, resolve_under
from .nvidia_hw import GPU_CLASSES, NVIDIA_VENDOR, NVSWITCH_CLASS, NVSWITCH_IDS, generation

DEVICES = "/sys/bus/pci/devices"
MELLANOX_VENDOR = 0x15B3
# PCI class >> 8: Ethernet controller, InfiniBand controller (pci.ids, class 02).
NIC_CLASSES = (0x0200, 0x0207)
# PCI class >> 16: bridge devices (class 06): host, PCI-to-PCI (a switch port), other.
BRIDGE_BASE_CLASS = 0x06
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class Device:
    bdf: str
    vendor: int
    device: int
    pci_class: int  # 24 bits: class, subclass, programming interface
    bridges: tuple[str, ...]  # BDFs of the bridges above it, root port first
    driver: str = ""  # the kernel driver bound to it (its ``driver`` link): nvidia, nouveau ...

    @property
    def is_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class >> 8 in GPU_CLASSES

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.pci_class >> 8 == NVSWITCH_CLASS

    @property
    def is_nic(self) -> bool:
        return self.pci_class >> 8 in NIC_CLASSES

    @property
    def is_bridge(self) -> bool:
        return self.pci_class >> 16 == BRIDGE_BASE_CLASS and not self.is_nvswitch

    @property
    def id(self) -> str:
        """``10de:2330``, as lspci -n prints it."""
        return f"{self.vendor:04x}:{self.device:04x}"

    def describe(self) -> dict:
        """What a module returns for a GPU or an NVSwitch (plain data, JSON-ready)."""
        found = {"bdf": self.bdf, "device": f"0x{self.device:04x}"}
        if self.is_gpu:
            name, flavours = generation(self.device)
            found.update(generation=name, flavours=sorted(flavours))
        elif self.is_nvswitch:
            found["name"] = NVSWITCH_IDS.get(self.device, "NVSwitch")
        return found


def _hex(text: str | None) -> int | None:
    try:
        return int((text or "").strip(), 16)
    except ValueError:
        return None


def devices(root: str = "/") -> list[Device] | None:
    """Every PCI function, in bus order; None when the bus cannot be read (no sysfs)."""
    folder = os.path.join(root, DEVICES.lstrip("/"))
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    found = []
    for bdf in names:
        link = f"{DEVICES}/{bdf}"
        vendor = _hex(read_under(root, f"{link}/vendor"))
        device = _hex(read_under(root, f"{link}/device"))
        pci_class = _hex(read_under(root, f"{link}/class"))
        if vendor is None or device is None or pci_class is None:
            continue
        parts = resolve_under(root, link).split("/")
        bridges = tuple(p for p in parts if _BDF.match(p) and p != bdf)
        try:
            driver = os.path.basename(os.readlink(os.path.join(root, link.lstrip("/"), "driver")))
        except OSError:
            driver = ""
        found.append(Device(bdf, vendor, device, pci_class, bridges, driver))
    return found


def gpus(root: str = "/") -> list[Device] | None:
    """The NVIDIA GPUs on the bus (VGA or 3D controller class); None: bus unreadable."""
    found = devices(root)
    return None if found is None else [d for d in found if d.is_gpu]


def nvswitches(root: str = "/") -> list[Device]:
    return [d for d in devices(root) or [] if d.is_nvswitch]


def nics(root: str = "/") -> list[Device]:
    return [d for d in devices(root) or [] if d.is_nic]


def normal_bus_id(bus_id: str) -> str:
    """``00000000:17:00.0`` (NVML) and ``0000:17:00.0`` (sysfs) both become ``0000:17:00.0``."""
    text = bus_id.strip().lower()
    domain, _, rest = text.partition(":")
    if not rest:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


# Extended configuration space (PCIe base specification, "PCI Express Extended Capabilities"):
# the first extended capability header sits at 0x100; each header is 32 bits, little endian:
# capability id (bits 0-15), version (16-19), offset of the next header (20-31). Access Control
# Services is id 0x000D; its 16-bit ACS Control register is at the capability's offset + 6.
EXTENDED_CONFIG_START = 0x100
ACS_CAPABILITY_ID = 0x000D
ACS_CONTROL_OFFSET = 6
# ACS Control bits that send peer-to-peer traffic up to the root complex (lspci's ReqRedir+ and
# CmpltRedir+): with either set, GPU<->NIC traffic below a switch no longer stays in the switch.
ACS_P2P_REDIRECT = 0x0004 | 0x0008


# ACS Source Validation (bit 0, lspci's SrcValid+) is on the doctor's list too: with it on, some
# switches check every peer request's requester id and send it up (NCCL troubleshooting, ACS).
ACS_SOURCE_VALIDATION = 0x0001
ACS_FLAG_NAMES = {0x0001: "SrcValid", 0x0004: "ReqRedir", 0x0008: "CmpltRedir"}


def acs_flags(control: int) -> list[str]:
    """The ACS Control bits that matter for peer-to-peer, as lspci names them (``ReqRedir``)."""
    return [name for bit, name in ACS_FLAG_NAMES.items() if control & bit]


def config_readable(root: str, bdf: str) -> bool:
    """Whether the extended configuration space (past 256 bytes) of a function can be read: sysfs
    ``config`` gives a user other than root only the first 64 bytes, so ACS needs root."""
    try:
        with open(os.path.join(root, DEVICES.lstrip("/"), bdf, "config"), "rb") as handle:
            return len(handle.read(EXTENDED_CONFIG_START + 8)) > EXTENDED_CONFIG_START
    except OSError:
        return False


def acs_control(root: str, bdf: str) -> int | None:
    """A bridge's ACS Control register from its sysfs ``config``; None when the extended
    configuration space cannot be read (not root: sysfs shows only 64 bytes) or the bridge has
    no ACS capability."""
    try:
        with open(os.path.join(root, DEVICES.lstrip("/"), bdf, "config"), "rb") as handle:
            config = handle.read(4096)
    except OSError:
        return None
    offset, seen = EXTENDED_CONFIG_START, set()
    while EXTENDED_CONFIG_START <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(config[offset : offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_CAPABILITY_ID:
            at = offset + ACS_CONTROL_OFFSET
            return int.from_bytes(config[at : at + 2], "little")
        offset = (header >> 20) & 0xFFC
    return None
