"""PCI devices from sysfs: what they are and which bridges lie above them.

``/sys/bus/pci/devices/<BDF>`` links to the device's folder under ``/sys/devices/pci<D>:<B>/``,
whose path holds every bridge between the root complex and the device, in order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuenv.doctor.system import System

NVIDIA = 0x10DE
MELLANOX = 0x15B3
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class Device:
    bdf: str
    vendor: int
    device: int
    pci_class: int  # 24 bits: class, subclass, programming interface
    bridges: tuple[str, ...]  # BDFs of the bridges above it, root port first

    @property
    def is_gpu(self) -> bool:
        # 0x0300 VGA controller, 0x0302 3D controller
        return self.vendor == NVIDIA and self.pci_class >> 8 in (0x0300, 0x0302)

    @property
    def is_nvswitch(self) -> bool:
        # NVSwitch enumerates as "Bridge: NVIDIA Corporation" with class 0x0680 (other bridge).
        return self.vendor == NVIDIA and self.pci_class >> 8 == 0x0680

    @property
    def is_nic(self) -> bool:
        # 0x0200 Ethernet, 0x0207 InfiniBand
        return self.pci_class >> 8 in (0x0200, 0x0207)


def _hex(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def devices(system: System) -> list[Device]:
    found = []
    for link in system.glob("/sys/bus/pci/devices/*"):
        bdf = link.rsplit("/", 1)[-1]
        vendor = _hex(system.read(f"{link}/vendor"))
        device = _hex(system.read(f"{link}/device"))
        pci_class = _hex(system.read(f"{link}/class"))
        if vendor is None or device is None or pci_class is None:
            continue
        parts = system.resolve(link).split("/")
        bridges = tuple(p for p in parts if _BDF.match(p) and p != bdf)
        found.append(Device(bdf, vendor, device, pci_class, bridges))
    return found


def gpus(system: System) -> list[Device]:
    return [d for d in devices(system) if d.is_gpu]
