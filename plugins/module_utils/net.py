# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The node's network as sysfs and procfs tell it: RDMA (InfiniBand/RoCE) ports with their state
and rate, network interfaces with their speed, the interface of the default route.

Bandwidth floors across nodes, the cluster probe and ``gpuenv doctor`` read these; the fabric
and health readers build on them. Standard library only; ``root`` is ``/`` on a node, a fixture
tree in tests.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

from .node import read_under

RDMA_CLASS = "/sys/class/infiniband"
NET_CLASS = "/sys/class/net"
_RATE = re.compile(r"([\d.]+)\s*Gb/sec")


def _listdir(root: str, path: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(root, path.lstrip("/"))))
    except OSError:
        return []


def _field(root: str, path: str) -> str:
    return (read_under(root, path) or "").strip()


def rate_gbytes(rate_text: str) -> float | None:
    """``200 Gb/sec (4X HDR)`` (sysfs ports/N/rate) -> 25.0 GB/s; junk -> None."""
    found = _RATE.search(rate_text)
    return float(found.group(1)) / 8.0 if found else None


def speed_gbytes(speed_text: str) -> float | None:
    """/sys/class/net/IF/speed in Mb/s (``100000``) -> 12.5 GB/s; -1 or junk -> None."""
    try:
        mbps = int(speed_text.strip())
    except ValueError:
        return None
    return mbps / 8000.0 if mbps > 0 else None


@dataclass(frozen=True)
class Port:
    device: str  # mlx5_0
    port: str  # 1
    state: str  # ACTIVE, INIT, DOWN ... (sysfs "4: ACTIVE" without the number)
    phys_state: str  # LinkUp, Polling, Disabled ...
    rate: str  # as sysfs says it: "400 Gb/sec (4X NDR)"
    link_layer: str  # InfiniBand or Ethernet (RoCE)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def rate_gbytes(self) -> float | None:
        return rate_gbytes(self.rate)


def _after_colon(text: str) -> str:
    return text.partition(":")[2].strip() if ":" in text else text.strip()


def rdma_devices(root: str = "/") -> list[str]:
    """The RDMA devices (mlx5_0 ...), in name order."""
    return _listdir(root, RDMA_CLASS)


def rdma_ports(root: str = "/") -> list[Port]:
    """Every port of every RDMA device, in name order."""
    found = []
    for device in rdma_devices(root):
        ports = f"{RDMA_CLASS}/{device}/ports"
        for port in _listdir(root, ports):
            base = f"{ports}/{port}"
            found.append(
                Port(
                    device=device,
                    port=port,
                    state=_after_colon(_field(root, f"{base}/state")),
                    phys_state=_after_colon(_field(root, f"{base}/phys_state")),
                    rate=_field(root, f"{base}/rate"),
                    link_layer=_field(root, f"{base}/link_layer"),
                )
            )
    return found


def interfaces(root: str = "/") -> list[str]:
    return _listdir(root, NET_CLASS)


def interface_speed(root: str, name: str) -> float | None:
    """An interface's link speed in GB/s; None when the driver does not say (virtual NICs)."""
    return speed_gbytes(_field(root, f"{NET_CLASS}/{name}/speed"))


def default_route_interface(root: str = "/") -> str | None:
    """The interface of the default route (/proc/net/route): it carries the bootstrap."""
    for line in (read_under(root, "/proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) > 1 and fields[1] == "00000000":
            return fields[0]
    return None


def _route_table(root: str) -> list[tuple[str, int, int]]:
    """(interface, destination, mask) of /proc/net/route's rows, as integers in host order."""
    rows = []
    for line in (read_under(root, "/proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8:
            try:
                dest = int.from_bytes(bytes.fromhex(fields[1]), "little")
                mask = int.from_bytes(bytes.fromhex(fields[7]), "little")
            except ValueError:
                continue
            rows.append((fields[0], dest, mask))
    return rows


def addresses(root: str = "/") -> list[tuple[str, str]]:
    """(interface, address) pairs from procfs, for nodes without iproute2: IPv4 local addresses
    of /proc/net/fib_trie placed on the interface of the most specific route that holds them
    (/proc/net/route), IPv6 addresses from /proc/net/if_inet6."""
    local, last = [], ""
    for line in (read_under(root, "/proc/net/fib_trie") or "").splitlines():
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif text.startswith("/32 host LOCAL") and last and last not in local:
            local.append(last)
    routes = _route_table(root)
    pairs = []
    for address in local:
        value = int.from_bytes(bytes(int(p) for p in address.split(".")), "big")
        if address.startswith("127."):
            pairs.append(("lo", address))
            continue
        held = [(mask, iface) for iface, dest, mask in routes if mask and value & mask == dest]
        if held:
            pairs.append((max(held)[1], address))
    for line in (read_under(root, "/proc/net/if_inet6") or "").splitlines():
        fields = line.split()
        if len(fields) == 6 and len(fields[0]) == 32:
            groups = [fields[0][i : i + 4] for i in range(0, 32, 4)]
            pairs.append((fields[5], str(ipaddress.ip_address(":".join(groups)))))
    return pairs
