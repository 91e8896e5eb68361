"""Transport truth: which transport NCCL actually used, read from NCCL's own log.

NCCL prints, at ``NCCL_DEBUG=INFO``, its version and one line per channel connection:

    NCCL INFO NCCL version 2.28.9+cuda13.0
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUDA IPC
    NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
    NCCL INFO Channel 00/0 : 1[1] -> 0[0] [receive] via NET/Socket/0
    NCCL INFO Channel 00/0 : 2[0] -> 0[0] [send] via NET/IB/0/GDRDMA

A bandwidth figure says how fast; only these lines say by which road. The rules judge them
against what the hardware should give: GPUs joined by NVLink must talk P2P (not SHM, not a
network), and nodes with an active InfiniBand/RoCE port must talk NET/IB (not Socket).
Pure functions of text: the readers of sysfs and the log files live with their callers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuenv.floor import net

VERSION_RE = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
# The local GPU of a channel line: the sender's on [send], the receiver's on [receive] (NCCL
# prints rank[device], the device a CUDA index or, in older releases, the GPU's bus id).
SIDE_RE = re.compile(r"Channel \d+/\d+ : \d+\[([^\]]*)\] -> \d+\[([^\]]*)\] \[(send|receive)\]")
VIA_RE = re.compile(r"Channel \d+/\d+ : (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\].*? via (\S+)")
# "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>": NCCL's NET devices,
# by the index its channel lines use ("via NET/IB/1", "via NET/IB/1(9)/GDRDMA" with PXN).
USING_RE = re.compile(r"NET/(IB|Socket) : Using (.*?)(?:;|$)")
DEVICE_RE = re.compile(r"\[(\d+)\]([^\s\[]+)")
NET_INDEX_RE = re.compile(r"^NET/(?:IB|Socket)/(\d+)")
# "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'" (github.com/NVIDIA/nccl/issues/1537),
# older: "GPU Direct RDMA Disabled for GPU ca000 / HCA 0 (distance 7 > 4)" (issues/1151).
GDR_RE = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for (?:GPU \S+ / )?HCA (\d+)(.*)")
# "NCCL_SOCKET_IFNAME set by environment to bond0" (github.com/NVIDIA/nccl/issues/1814); the
# values of /etc/nccl.conf are reported the same way (NCCL sets them in its environment).
SETTING_RE = re.compile(r"(NCCL_[A-Z0-9_]+) set by environment to (.*)$")

# Transport families, from the first words after "via".
P2P, SHM, NET_IB, NET_SOCKET, NET_OTHER, COLLNET, NVLS = (
    "P2P",
    "SHM",
    "NET/IB",
    "NET/Socket",
    "NET/other",
    "CollNet",
    "NVLS",
)


def family(via: str) -> str:
    """``P2P/CUDA IPC`` -> P2P, ``NET/IB/0/GDRDMA`` -> NET/IB, ``NET/Socket/1`` -> NET/Socket."""
    head = via.split("/")
    if head[0] == "P2P":
        return P2P
    if head[0] == "SHM":
        return SHM
    if head[0] == "NET":
        kind = head[1] if len(head) > 1 else ""
        if kind == "IB":
            return NET_IB
        if kind == "Socket":
            return NET_SOCKET
        return NET_OTHER
    if head[0].startswith("CollNet"):
        return COLLNET
    if head[0].startswith("NVLS"):
        return NVLS
    return via


@dataclass
class Transports:
    """What one run's NCCL log says."""

    version: str | None = None
    families: dict[str, int] = field(default_factory=dict)  # family -> connections
    gdrdma: bool = False  # a NET/IB connection with GPUDirect RDMA
    samples: list[str] = field(default_factory=list)  # one line per family, as evidence
    net_devices: dict[str, str] = field(default_factory=dict)  # "0" -> "mlx5_0:1/IB"
    net_used: list[int] = field(default_factory=list)  # NET device indexes channels went over
    gdr_lines: list[str] = field(default_factory=list)  # NCCL's GPU Direct RDMA verdicts
    # local GPU (as NCCL names it) -> [NET/IB channels with GPUDirect RDMA, without]
    ib_gpus: dict[str, list[int]] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)  # NCCL_X -> value NCCL loaded

    def used_devices(self) -> list[str]:
        """The NET devices (``mlx5_0:1``) NCCL's channels used, without the link layer."""
        named = [self.net_devices.get(str(i), f"NET device {i}") for i in self.net_used]
        return sorted({d.split("/")[0] for d in named})

    @property
    def seen(self) -> bool:
        return bool(self.families)

    def summary(self) -> str:
        if not self.families:
            return "no connection lines in NCCL's log"
        parts = [f"{f} x{n}" for f, n in sorted(self.families.items())]
        rdma = " (GPUDirect RDMA)" if self.gdrdma else ""
        return f"NCCL {self.version or '?'}: {', '.join(parts)}{rdma}"

    def to_dict(self) -> dict[str, object]:
        return {
            "nccl_version": self.version,
            "families": dict(self.families),
            "gdrdma": self.gdrdma,
            "evidence": list(self.samples),
            "net_devices": dict(self.net_devices),
            "net_used": list(self.net_used),
            "gdr_lines": list(self.gdr_lines),
            "ib_gpus": {k: list(v) for k, v in self.ib_gpus.items()},
            "settings": dict(self.settings),
        }


def _setup_line(out: Transports, line: str) -> bool:
    """NCCL's setup lines (NET devices, GPU Direct RDMA, settings); True when one was read."""
    m = USING_RE.search(line)
    if m:
        if m.group(1) == "IB" or not out.net_devices:
            out.net_devices = {i: d for i, d in DEVICE_RE.findall(m.group(2))}
        return True
    m = GDR_RE.search(line)
    if m:
        said = f"GPU Direct RDMA {m.group(1)} for HCA {m.group(2)}{m.group(3).rstrip()}"
        if said not in out.gdr_lines:
            out.gdr_lines.append(said)
        return True
    m = SETTING_RE.search(line)
    if m:
        out.settings.setdefault(m.group(1), m.group(2).strip().rstrip("."))
        return True
    return False


def parse(lines: Iterable[str]) -> Transports:
    out = Transports()
    for line in lines:
        if out.version is None:
            m = VERSION_RE.search(line)
            if m:
                out.version = m.group(1)
                continue
        m = VIA_RE.search(line)
        if not m:
            _setup_line(out, line)
            continue
        via = m.group(3)
        fam = family(via)
        if fam not in out.families:
            out.samples.append(line.strip()[-160:])
        out.families[fam] = out.families.get(fam, 0) + 1
        if fam == NET_IB and "GDRDMA" in via:
            out.gdrdma = True
        side = SIDE_RE.search(line)
        if fam == NET_IB and side:
            gpu = side.group(1) if side.group(3) == "send" else side.group(2)
            counts = out.ib_gpus.setdefault(gpu, [0, 0])
            counts[0 if "GDRDMA" in via else 1] += 1
        index = NET_INDEX_RE.match(via)
        if index and int(index.group(1)) not in out.net_used:
            out.net_used = sorted([*out.net_used, int(index.group(1))])
    return out


def read(path: str | os.PathLike[str]) -> dict[str, object]:
    """One process's NCCL debug file, parsed, as a rank posts it; an error when unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse(fh.read().splitlines()).to_dict()
    except OSError as exc:
        return {"error": f"NCCL's log {path} cannot be read: {exc}"}


def merge(posted: Iterable[Mapping[str, Any]]) -> Transports:
    """Several processes' posted views (``read``'s dicts) added up: each logs its own links."""
    out = Transports()
    for t in posted:
        out.version = out.version or t.get("nccl_version")
        for fam, n in dict(t.get("families", {})).items():
            out.families[fam] = out.families.get(fam, 0) + int(n)
        out.gdrdma = out.gdrdma or bool(t.get("gdrdma"))
        out.samples += [e for e in t.get("evidence", []) if e not in out.samples]
        # The processes of one node list the same NET devices; indexes are theirs.
        out.net_devices = out.net_devices or dict(t.get("net_devices", {}))
        out.net_used = sorted({*out.net_used, *(int(i) for i in t.get("net_used", []))})
        out.gdr_lines += [g for g in t.get("gdr_lines", []) if g not in out.gdr_lines]
        for gpu, (on, off) in dict(t.get("ib_gpus", {})).items():
            counts = out.ib_gpus.setdefault(gpu, [0, 0])
            counts[0] += int(on)
            counts[1] += int(off)
        for key, value in dict(t.get("settings", {})).items():
            out.settings.setdefault(key, value)
    return out


def intra_node_problems(t: Transports, nvlink: bool) -> list[str]:
    """Between the GPUs of one node: NVLink-joined GPUs must use P2P."""
    if not t.seen:
        return ["NCCL's log shows no connection (NCCL_DEBUG=INFO lines missing): transport unknown"]
    if nvlink:
        slow = [f for f in (SHM, NET_SOCKET, NET_IB, NET_OTHER) if f in t.families]
        if slow:
            return [
                f"GPUs joined by NVLink talk over {', '.join(slow)} instead of P2P"
                f" ({t.summary()}); look for NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, or ACS/IOMMU"
            ]
    elif NET_SOCKET in t.families or NET_IB in t.families:
        return [
            f"GPUs of one node talk over the network ({t.summary()}) instead of P2P or SHM;"
            " look for NCCL_P2P_DISABLE=1 and NCCL_SHM_DISABLE=1"
        ]
    return []


def inter_node_problems(t: Transports, active_ib_ports: Mapping[str, list[str]]) -> list[str]:
    """Across nodes, where the nodes' rails are not known port by port (gpuenv.checks.fabric
    judges those): when any node has an active InfiniBand/RoCE port, NET/Socket is a fallback.

    ``active_ib_ports``: node -> its active ports (``mlx5_0/1``), from /sys/class/infiniband.
    """
    if not t.seen:
        return ["NCCL's log shows no connection (NCCL_DEBUG=INFO lines missing): transport unknown"]
    with_ib = [n for n, ports in active_ib_ports.items() if ports]
    if with_ib and NET_SOCKET in t.families:
        ports = ", ".join(f"{n}: {active_ib_ports[n][0]}" for n in with_ib)
        return [
            f"NCCL fell back to TCP sockets ({t.summary()}) although nodes have an active"
            f" InfiniBand/RoCE port ({ports});"
            " look for NCCL_IB_DISABLE=1, a missing libibverbs/rdma-core, or NCCL_NET"
        ]
    return []


# Bandwidth floors by transport, per direction, as a fraction of the link the nodes have.
# Socket transport over Ethernet reaches far less of the NIC than IB verbs; both floors sit well
# under what healthy links give, so that only a fallback or a broken link falls below them.
NET_EFFICIENCY = {NET_IB: 0.5, NET_SOCKET: 0.25, NET_OTHER: 0.25}


def floor_gbps(t: Transports, link_gbps: float | None) -> float | None:
    """The least busbw (GB/s) a multi-node all-reduce over ``t`` must reach on that link."""
    if link_gbps is None or not t.seen:
        return None
    nets = [f for f in (NET_IB, NET_SOCKET, NET_OTHER) if f in t.families]
    if not nets:
        return None
    return min(NET_EFFICIENCY[f] for f in nets) * link_gbps


# The rates' parsers are the node floor's (gpuenv.floor.net), named here as the judges use them.
ib_rate_gbps = net.rate_gbytes
nic_speed_gbps = net.speed_gbytes
