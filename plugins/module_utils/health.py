# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""What `gpuenv health` reads of a node besides NVML: the kernel log's Xid and SXid events, the
loaded NVIDIA module's version, the boot id and uptime, InfiniBand port states and error counters,
and whether NVIDIA Fabric Manager runs.

The kernel log is read once per scan, through the injected ``run``: ``journalctl -k -b -o
short-monotonic`` first (the whole boot, not the ring buffer's last few hundred KiB), ``dmesg``
where journald is missing or refuses (a container, a node without systemd). Both print the
monotonic seconds since boot in brackets, which is what the scan keeps to know what it saw.
Standard library only; ``root`` is ``/`` on a node and a fixture tree in tests.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .net import port_counters, rdma_ports
from .node import Run, read_under

JOURNAL_ARGV = ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"]
DMESG_ARGV = ["dmesg"]
# The kernel log is one read; on a node with years of uptime it is still a few MiB.
KERNEL_LOG_TIMEOUT_S = 10
MODULE_VERSION = "/sys/module/nvidia/version"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
UPTIME = "/proc/uptime"
RDMA_CLASS = "/sys/class/infiniband"
FABRIC_MANAGER_COMMS = ("nv-fabricmanager",)
# The port counters that say a link is sick (IBTA names, as the kernel's sysfs spells them).
IB_ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)

_STAMP = re.compile(r"^\s*\[\s*(\d+(?:\.\d+)?)\]")
# NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.
_XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+),\s*(.*)"
)
# nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 18 egress non-posted PRIV error
_SXID = re.compile(r"(nvidia-nvswitch\d*): SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")


@dataclass(frozen=True)
class KernelEvent:
    kind: str  # "xid" (a GPU's) or "sxid" (an NVSwitch's)
    code: int
    bus: str  # 0000:3b:00 for a GPU (as NVRM prints it), the switch's full BDF for an SXid
    since_boot_s: float  # the line's monotonic stamp; -1.0 when it had none
    text: str  # the rest of the line after the code


@dataclass
class KernelLog:
    source: str  # "journalctl", "dmesg", or "" when neither could be read
    events: list[KernelEvent] = field(default_factory=list)
    reason: str = ""  # why it could not be read


def parse_kernel_log(text: str) -> list[KernelEvent]:
    """Every Xid and SXid line of a kernel log (journalctl short-monotonic or dmesg)."""
    events = []
    for line in text.splitlines():
        if "Xid" not in line:
            continue
        stamp = _STAMP.match(line)
        since_boot_s = float(stamp.group(1)) if stamp else -1.0
        xid = _XID.search(line)
        if xid:
            bus, code, rest = xid.groups()
            events.append(KernelEvent("xid", int(code), bus.lower(), since_boot_s, rest.strip()))
            continue
        sxid = _SXID.search(line)
        if sxid:
            _switch, bus, code, rest = sxid.groups()
            events.append(KernelEvent("sxid", int(code), bus.lower(), since_boot_s, rest.strip()))
    return events


def kernel_log(run: Run) -> KernelLog:
    """The Xid and SXid events of this boot, from journald or else dmesg; read once."""
    reasons = []
    for source, argv in (("journalctl", JOURNAL_ARGV), ("dmesg", DMESG_ARGV)):
        rc, out = run(argv, timeout_s=KERNEL_LOG_TIMEOUT_S)
        if rc == 0 and out.strip():
            return KernelLog(source, parse_kernel_log(out))
        reasons.append(f"{source}: " + ("not installed" if rc == 127 else f"exit {rc}"))
    return KernelLog("", reason="; ".join(reasons))


def module_version(root: str) -> str | None:
    """The loaded nvidia kernel module's version; None when the module is not loaded."""
    text = read_under(root, MODULE_VERSION)
    return text.strip() if text and text.strip() else None


def boot_id(root: str) -> str:
    return (read_under(root, BOOT_ID) or "").strip()


def uptime_s(root: str) -> float | None:
    text = read_under(root, UPTIME) or ""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        return None


def running(root: str, comms: tuple[str, ...] = FABRIC_MANAGER_COMMS) -> bool:
    """Whether a process of one of these command names runs (``/proc/<pid>/comm``)."""
    proc = os.path.join(root, "proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return False
    return any((read_under(root, f"/proc/{pid}/comm") or "").strip() in comms for pid in pids)


@dataclass(frozen=True)
class IbPort:
    device: str
    port: str
    state: str  # "ACTIVE", "DOWN", "INIT" ... (the word after "N: ")
    phys_state: str  # "LinkUp", "Polling", "Disabled" ...
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    counters: dict[str, int]

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


def ib_ports(root: str) -> list[IbPort]:
    """Each RDMA port (net.rdma_ports) with the error counters of IB_ERROR_COUNTERS it has."""
    return [
        IbPort(
            p.device,
            p.port,
            p.state,
            p.phys_state,
            p.link_layer,
            port_counters(root, p.device, p.port, IB_ERROR_COUNTERS),
        )
        for p in rdma_ports(root)
    ]
