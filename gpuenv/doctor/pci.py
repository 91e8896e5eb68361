"""PCI devices as the doctor sees them: the node floor's reader (gpuenv.floor.pci, the same
rules the collection's modules apply) over a ``System``'s root."""

from __future__ import annotations

from gpuenv.doctor.system import System
from gpuenv.floor import pci
from gpuenv.floor.pci import Device

__all__ = ["Device", "devices", "gpus"]


def devices(system: System) -> list[Device]:
    return pci.devices(str(system.root)) or []


def gpus(system: System) -> list[Device]:
    return pci.gpus(str(system.root)) or []
