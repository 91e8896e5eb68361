"""Class 7: GPUDirect RDMA must be available on every node that has RDMA NICs, and every RDMA
NIC on the PCI bus must be an RDMA device.

An adapter of an RDMA-capable family (ConnectX, BlueField, EFA: the floor's table,
``gpuenv.floor.fabric.NIC_MODELS``) on the PCI bus with no entry under /sys/class/infiniband
(its driver not loaded, or no module for the running kernel) is invisible to NCCL, which then
falls back to TCP sockets: a finding naming the card, its PCI address and the cause
(``gpuenv.floor.fabric.invisible_rdma_adapters``, the rule ``system`` and ``fabric`` use).

NCCL moves GPU buffers straight to the NIC when the NIC driver can map GPU memory: either
through the ``nvidia_peermem`` module (any driver flavour) or through dma-buf (the open
kernel module on Linux 5.12 or later). Without either, every inter-node transfer is staged
through host memory. A node that lacks it while its peers have it drags collectives down to
its speed, so the modes are compared across nodes.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuenv.doctor import pci
from gpuenv.doctor.driver import loaded_module
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor import fabric, net

_FIXES = (
    "modprobe nvidia-peermem && echo nvidia-peermem > /etc/modules-load.d/nvidia-peermem.conf",
    "or use dma-buf: the open NVIDIA kernel module on Linux >= 5.12 (NCCL_DMABUF_ENABLE=1)",
)


def rdma_mode(system: System) -> tuple[str, list[str]]:
    """The floor's GPUDirect RDMA rule (``gpuenv.floor.fabric.gdr``): peermem, dma-buf or off,
    with its reason as evidence."""
    found = fabric.gdr(str(system.root))
    return found.mode, [f"GPUDirect RDMA {found.mode}: {found.why}"]


def invisible_finding(hidden: list[str]) -> Finding:
    """The finding for RDMA adapters that have no RDMA device."""
    return Finding(
        7,
        f"{len(hidden)} RDMA adapter(s) on the PCI bus with no RDMA device",
        "NCCL sees no InfiniBand/RoCE port for them and falls back to TCP sockets over the"
        " management network: the whole job runs at its speed",
        tuple(hidden),
        (
            "load the module the evidence names (modprobe mlx5_ib; for mlx5_core: modprobe"
            " mlx5_core), and make it load at boot (/etc/modules-load.d/)",
            "no module for the running kernel: install the kernel's extra modules"
            " (linux-modules-extra-$(uname -r)) or DOCA-OFED built for it",
            "ibv_devices; ls /sys/class/infiniband",
        ),
    )


def gpudirect_rdma(system: System) -> ClassReading:
    hcas = net.rdma_devices(str(system.root))
    hidden = fabric.invisible_rdma_adapters(str(system.root))
    if not hcas and not hidden:
        # a fact for the comparison: on a cluster whose other nodes have RDMA, it is a fault
        return skipped(7, "no RDMA device (/sys/class/infiniband is empty)", mode="no-device")
    if not pci.gpus(system):
        return skipped(7, "no NVIDIA GPU on the PCI bus")
    if not hcas:
        reading = ClassReading(7, facts={"mode": "no-device", "rdma_devices": hcas})
    elif loaded_module(system) is None:
        reading = ClassReading(7, skip="no NVIDIA kernel module loaded")
    else:
        mode, evidence = rdma_mode(system)
        reading = ClassReading(7, facts={"mode": mode, "rdma_devices": hcas})
        if mode == fabric.GDR_OFF:
            reading.findings.append(
                Finding(
                    7,
                    "GPUDirect RDMA is off (no nvidia_peermem, no dma-buf)",
                    "NCCL stages every inter-node transfer through host memory: lower"
                    " bandwidth, more CPU load",
                    (f"RDMA devices: {', '.join(hcas)}", *evidence),
                    _FIXES,
                )
            )
    if hidden:
        reading.skip = ""
        reading.facts["invisible"] = hidden
        reading.findings.insert(0, invisible_finding(hidden))
    return reading


def compare(readings: Mapping[str, ClassReading]) -> None:
    """Name, on each node without GPUDirect RDMA (or without any RDMA device), the nodes that
    have it."""
    modes = {n: v.facts.get("mode") for n, v in readings.items()}
    on = sorted(n for n, m in modes.items() if m in (fabric.PEERMEM, fabric.DMABUF))
    if not on:
        return
    peers = ", ".join(f"{n} ({modes[n]})" for n in on)
    for node, mode in modes.items():
        v = readings[node]
        if mode == fabric.GDR_OFF:
            v.findings = [
                Finding(
                    7,
                    f"GPUDirect RDMA is off on {node} but on on {', '.join(on)}",
                    f.cause + f"; the whole job runs at {node}'s speed",
                    (*f.evidence, f"on the other nodes: {peers}"),
                    f.fixes,
                )
                if f.cls == 7
                else f
                for f in v.findings
            ]
        elif mode == "no-device":
            v.skip = ""
            v.findings.append(
                Finding(
                    7,
                    f"no RDMA device on {node} but GPUDirect RDMA on {', '.join(on)}",
                    f"{node} talks to the other nodes over TCP: the whole job runs at its "
                    "speed",
                    ("/sys/class/infiniband is empty", f"on the other nodes: {peers}"),
                    ("check the NIC and its driver: lspci | grep -i -e mellanox -e infiniband; "
                     "modprobe mlx5_ib; ibv_devices",),
                )
            )  # fmt: skip
