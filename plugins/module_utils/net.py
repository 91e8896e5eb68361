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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .node import read_under

RDMA_CLASS = "/sys/class/infiniband"
NET_CLASS = "/sys/class/net"
_RATE = re.compile(r"([\d.]+)\s*Gb/sec")
_WIDTH = re.compile(r"\((\d+)X\b")


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


def rate_gbits(rate_text: str) -> float | None:
    """``200 Gb/sec (4X HDR)`` -> 200.0 (Gb/s, as the port states it); junk -> None."""
    found = _RATE.search(rate_text)
    return float(found.group(1)) if found else None


def rate_width(rate_text: str) -> int | None:
    """The link width of a port's rate: ``200 Gb/sec (2X NDR)`` -> 2; not said -> None."""
    found = _WIDTH.search(rate_text)
    return int(found.group(1)) if found else None


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


# ---------------------------------------------------------------- what NCCL may use as rails

# The port error counters that grow when a link is bad (sysfs ports/N/counters/, as
# infiniband-diags' perfquery names them: SymbolErrorCounter, LinkDownedCounter, PortRcvErrors,
# ExcessiveBufferOverrunErrors).
ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "port_rcv_errors",
    "excessive_buffer_overrun_errors",
)
# Where Debian/Ubuntu (multiarch) and Red Hat put the verbs library NCCL's IB transport opens.
VERBS_LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
)
NCCL_CONF = "/etc/nccl.conf"
# The NCCL settings of a fabric that must reach NCCL as written (the rdma_fabric role writes
# them into /etc/nccl.conf; a user may set them in the environment; NCCL_IB_DISABLE turns IB off).
NCCL_FABRIC_SETTINGS = (
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_DISABLE",
)


@dataclass(frozen=True)
class HcaSpec:
    """NCCL_IB_HCA as NCCL reads it (NCCL's environment variable documentation): a comma list
    of ``device[:port]``; ``^`` first excludes them instead; ``=`` (after any ``^``) makes the
    names exact, else each is a prefix (``mlx5`` selects mlx5_0, mlx5_1 ...)."""

    text: str
    exclude: bool
    exact: bool
    entries: tuple[tuple[str, str | None], ...]

    def selects(self, device: str, port: str) -> bool:
        hit = any(
            (device == name if self.exact else device.startswith(name))
            and (want is None or want == port)
            for name, want in self.entries
        )
        return not hit if self.exclude else hit


def hca_spec(text: str | None) -> HcaSpec | None:
    """Parse NCCL_IB_HCA; None when unset or empty (NCCL then uses every IB/RoCE port)."""
    rest = (text or "").strip()
    if not rest:
        return None
    exclude = rest.startswith("^")
    rest = rest[1:] if exclude else rest
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    entries = []
    for item in (i.strip() for i in rest.split(",")):
        if item:
            name, _, port = item.partition(":")
            entries.append((name, port or None))
    return HcaSpec(text.strip() if text else "", exclude, exact, tuple(entries))


def rails(ports: list[Port], spec: HcaSpec | None) -> list[Port]:
    """The ports NCCL may use as rails: InfiniBand or RoCE (Ethernet link layer) ports that
    NCCL_IB_HCA selects; every such port without it."""
    rdma = [p for p in ports if p.link_layer in ("InfiniBand", "Ethernet")]
    return [p for p in rdma if spec is None or spec.selects(p.device, p.port)]


def port_counters(
    root: str, device: str, port: str | int, names: tuple[str, ...] = ERROR_COUNTERS
) -> dict[str, int]:
    """The counters ``names`` of one port (missing or unreadable ones are left out)."""
    found = {}
    for name in names:
        text = _field(root, f"{RDMA_CLASS}/{device}/ports/{port}/counters/{name}")
        if text.isdigit():
            found[name] = int(text)
    return found


def all_port_counters(root: str = "/") -> dict[str, dict[str, int]]:
    """``mlx5_0/1`` -> its error counters, for every RDMA port."""
    return {p.name: port_counters(root, p.device, p.port) for p in rdma_ports(root)}


def verbs_library(root: str = "/") -> str | None:
    """The path of libibverbs.so.1 (rdma-core) where NCCL would find it; None when missing."""
    for folder in VERBS_LIBRARY_DIRS:
        path = f"{folder}/libibverbs.so.1"
        if os.path.exists(os.path.join(root, path.lstrip("/"))):
            return path
    return None


def nccl_conf(root: str = "/") -> dict[str, str]:
    """NCCL_* settings of /etc/nccl.conf (``KEY=VALUE`` lines; NCCL keeps a key's first value
    and lets the environment win over the file)."""
    found: dict[str, str] = {}
    for line in (read_under(root, NCCL_CONF) or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            found.setdefault(key.strip(), value.strip())
    return found


def nccl_settings(
    root: str, environ: Mapping[str, str], keys: Iterable[str] | None = None
) -> dict[str, str]:
    """The NCCL settings NCCL will see: the environment wins over /etc/nccl.conf (NCCL sets the
    file's values only where the environment has none). ``keys``: only these; None: all NCCL_."""
    conf = nccl_conf(root)
    names = (
        set(keys) if keys is not None else {k for k in (*environ, *conf) if k.startswith("NCCL_")}
    )
    return {k: environ[k] if k in environ else conf[k] for k in sorted(names)
            if k in environ or k in conf}  # fmt: skip


def module_loaded(root: str, module: str) -> bool:
    """Whether a kernel module is loaded: /sys/module/NAME, or its line in /proc/modules (the
    same kernel list; a node or fixture may show one of the two)."""
    if os.path.isdir(os.path.join(root, "sys/module", module)):
        return True
    listed = (read_under(root, "/proc/modules") or "").splitlines()
    return any(line.split(" ", 1)[0] == module for line in listed)
