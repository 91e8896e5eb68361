# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The node's fabric as sysfs tells it, and the NCCL settings that follow from it.

``read(root, run, ...)`` gives a :class:`Fabric`: per GPU its NUMA node, PCI path and NVLink
counts (NVML's, handed in by the caller: sysfs has none); the NVSwitches and Fabric Manager's
state; every InfiniBand/RoCE port with state, physical state, rate, link layer, GID table,
netdev, NUMA node and PCI path; GPU<->port affinity; GPUDirect RDMA; ACS on the bridges between
a GPU and a port. ``derive(fabric, ...)`` gives the NCCL settings the ``rdma_fabric`` role writes
(docs/roles/rdma_fabric.md holds the rules with their sources). A port's error counters are
``net.port_counters`` (one reader). Standard library only; ``root`` is ``/`` on a node, a
fixture tree in tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .net import (
    RDMA_CLASS,
    Port,
    default_route_interface,
    module_loaded,
    rdma_ports,
)
from .node import Run, read_under, resolve_under
from .pci import ACS_P2P_REDIRECT, Device, acs_control, devices, normal_bus_id

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
# systemctl answers at once; a hung D-Bus must not hold the reader.
SYSTEMCTL_TIMEOUT_S = 10

# GPU <-> port relations, nearest first (NCCL's PIX/PXB, then PHB/NODE, then SYS).
PCIE_SWITCH = "pcie-switch"  # they share a bridge below the root port
SAME_NUMA = "numa"  # different root ports, same NUMA node
NO_AFFINITY = "none"  # across the CPUs' interconnect

# GPUDirect RDMA modes.
PEERMEM = "peermem"
DMABUF = "dma-buf"
GDR_OFF = "off"
# dma-buf needs Linux 5.12 or later and NVIDIA's open kernel module (NVIDIA GPU Operator,
# "GPUDirect RDMA and GPUDirect Storage"; NCCL environment variables, NCCL_DMABUF_ENABLE).
DMABUF_MIN_KERNEL = (5, 12)
# The modules that give GPUDirect RDMA through peer memory: nvidia_peermem (the driver's, since
# R470) and nv_peer_mem (Mellanox's older out-of-tree module, same role).
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")

# NCCL_IB_TC and NCCL_IB_SL the role writes unless told otherwise. NCCL's own default is 0 for
# both (NCCL environment variables, NCCL_IB_TC / NCCL_IB_SL). 106 is DSCP 26 (26 << 2 = 104)
# plus ECN-capable transport (2): the lossless RoCE class of NVIDIA's RoCE configuration guides;
# on an InfiniBand link layer it is the GRH traffic class and harmless. SL 0 is the default SL.
DEFAULT_IB_TC = 106
DEFAULT_IB_SL = 0

ROCE_V2 = "RoCE v2"
_IPV4_MAPPED = re.compile(r"^0000:0000:0000:0000:0000:ffff:[0-9a-f]{4}:[0-9a-f]{4}$")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
_NVIDIA_VERSION = "/proc/driver/nvidia/version"
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# ---------------------------------------------------------------- RDMA-capable network adapters

MELLANOX_VENDOR = 0x15B3
AMAZON_VENDOR = 0x1D0F
# PCI class >> 8 of a network adapter: Ethernet, InfiniBand (pci.ids, class 02).
NETWORK_CLASSES = (0x0200, 0x0207)


@dataclass(frozen=True)
class NicModel:
    """An RDMA-capable adapter family: its name, the line rate its ASIC gives in all (Gb/s; None
    where it is not a property of the chip, as for a virtual function), and the kernel modules
    that drive it (``core`` binds the PCI function, ``rdma`` makes the /sys/class/infiniband
    device)."""

    name: str
    gbps: int | None
    core: str
    rdma: str


_MLX5 = ("mlx5_core", "mlx5_ib")
_MLX4 = ("mlx4_core", "mlx4_ib")
# Mellanox/NVIDIA: every network function of vendor 0x15b3 since ConnectX-3 is an RDMA adapter
# (mlx4/mlx5); the rates are the product briefs' maxima (ConnectX-3 56 Gb/s FDR, ConnectX-4/5
# 100 Gb/s EDR, ConnectX-6 200 Gb/s HDR, ConnectX-7 400 Gb/s NDR, ConnectX-8 800 Gb/s XDR; the
# Lx parts 50 Gb/s; BlueField-2 200, BlueField-3 400), ids from pci.ids. AWS EFA: the ids of the
# kernel's efa driver (drivers/infiniband/hw/efa/efa_main.c, EFA_DEV_ID...).
NIC_MODELS: dict[tuple[int, int], NicModel] = {
    (MELLANOX_VENDOR, 0x1003): NicModel("ConnectX-3", 56, *_MLX4),
    (MELLANOX_VENDOR, 0x1007): NicModel("ConnectX-3 Pro", 56, *_MLX4),
    (MELLANOX_VENDOR, 0x1013): NicModel("ConnectX-4", 100, *_MLX5),
    (MELLANOX_VENDOR, 0x1015): NicModel("ConnectX-4 Lx", 50, *_MLX5),
    (MELLANOX_VENDOR, 0x1017): NicModel("ConnectX-5", 100, *_MLX5),
    (MELLANOX_VENDOR, 0x1019): NicModel("ConnectX-5 Ex", 100, *_MLX5),
    (MELLANOX_VENDOR, 0x101B): NicModel("ConnectX-6", 200, *_MLX5),
    (MELLANOX_VENDOR, 0x101D): NicModel("ConnectX-6 Dx", 200, *_MLX5),
    (MELLANOX_VENDOR, 0x101F): NicModel("ConnectX-6 Lx", 50, *_MLX5),
    (MELLANOX_VENDOR, 0x1021): NicModel("ConnectX-7", 400, *_MLX5),
    (MELLANOX_VENDOR, 0x1023): NicModel("ConnectX-8", 800, *_MLX5),
    (MELLANOX_VENDOR, 0xA2D6): NicModel("BlueField-2", 200, *_MLX5),
    (MELLANOX_VENDOR, 0xA2DC): NicModel("BlueField-3", 400, *_MLX5),
    (MELLANOX_VENDOR, 0x1016): NicModel("ConnectX-4 Lx virtual function", None, *_MLX5),
    (MELLANOX_VENDOR, 0x1018): NicModel("ConnectX-5 virtual function", None, *_MLX5),
    (MELLANOX_VENDOR, 0x101A): NicModel("ConnectX-5 Ex virtual function", None, *_MLX5),
    (MELLANOX_VENDOR, 0x101C): NicModel("ConnectX-6 virtual function", None, *_MLX5),
    (MELLANOX_VENDOR, 0x101E): NicModel("ConnectX family virtual function", None, *_MLX5),
    (AMAZON_VENDOR, 0xEFA0): NicModel("Elastic Fabric Adapter", None, "efa", "efa"),
    (AMAZON_VENDOR, 0xEFA1): NicModel("Elastic Fabric Adapter", None, "efa", "efa"),
    (AMAZON_VENDOR, 0xEFA2): NicModel("Elastic Fabric Adapter", None, "efa", "efa"),
}


def nic_model(dev: Device) -> NicModel | None:
    """The RDMA-capable family of a PCI function; None when it is not one (any other network
    function of vendor 0x15b3 is an mlx5 part the table does not name yet)."""
    if dev.pci_class >> 8 not in NETWORK_CLASSES:
        return None
    known = NIC_MODELS.get((dev.vendor, dev.device))
    if known is None and dev.vendor == MELLANOX_VENDOR:
        return NicModel(f"Mellanox/NVIDIA device {dev.id}", None, *_MLX5)
    return known


@dataclass(frozen=True)
class Adapter:
    """An RDMA-capable network function on the PCI bus and what the kernel made of it."""

    bdf: str
    id: str  # 15b3:1021
    model: str  # ConnectX-7
    port_gbps: int | None  # what one of its ports can carry: the chip's rate over its ports
    driver: str  # the bound driver ("" when none)
    rdma_devices: tuple[str, ...]  # its /sys/class/infiniband devices
    netdevs: tuple[str, ...]
    numa_node: int | None
    pci_path: tuple[str, ...]
    management: bool  # it carries the default route (plain Ethernet is its job)
    cause: str  # why it has no RDMA device ("" when it has one)

    @property
    def name(self) -> str:
        """``ConnectX-7 (15b3:1021) at 0000:18:00.0``."""
        return f"{self.model} ({self.id}) at {self.bdf}"

    @property
    def invisible(self) -> bool:
        """On the bus, of an RDMA family, yet no RDMA device: NCCL cannot use it."""
        return not self.rdma_devices and not self.management


def _module_built(root: str, kernel: str, module: str) -> bool:
    """Whether the running kernel has ``module``: its modules.dep or modules.builtin lists it."""
    pattern = re.compile(rf"(^|/){re.escape(module)}\.ko(\.\w+)?(:|$)", re.MULTILINE)
    for name in ("modules.dep", "modules.builtin"):
        text = read_under(root, f"/lib/modules/{kernel}/{name}") if kernel else None
        if text and pattern.search(text):
            return True
    return False


def rdma_function(root: str, device: str) -> str:
    """The PCI function of an RDMA device: its ``device`` link, else the folder its class entry
    lies in (``/sys/devices/.../0000:18:00.0/infiniband/mlx5_0``)."""
    linked = os.path.basename(resolve_under(root, f"{RDMA_CLASS}/{device}/device"))
    if _BDF.match(linked):
        return linked
    parts = resolve_under(root, f"{RDMA_CLASS}/{device}").split("/")
    return parts[-3] if len(parts) >= 3 and parts[-2] == "infiniband" else linked


def adapter_cause(root: str, model: NicModel, driver: str, kernel: str) -> str:
    """Why an RDMA-capable function has no RDMA device, from the bound driver and the modules."""
    where = f"Linux {kernel or '?'}"
    if not driver:
        if not _module_built(root, kernel, model.core):
            return f"no driver bound: the running kernel ({where}) has no {model.core} module"
        return f"no driver bound: {model.core} is not loaded (modprobe {model.core})"
    if module_loaded(root, model.rdma):
        return f"{model.rdma} is loaded but made no RDMA device for it (dmesg | grep {driver})"
    if not _module_built(root, kernel, model.rdma):
        return (
            f"{driver} drives it but the running kernel ({where}) has no {model.rdma} module"
            " (install the kernel's extra modules or DOCA-OFED for this kernel)"
        )
    return f"{driver} drives it but {model.rdma} is not loaded (modprobe {model.rdma})"


def adapters(root: str, everything: list[Device] | None = None) -> tuple[Adapter, ...]:
    """Every RDMA-capable network function on the PCI bus (``nic_model``), with its RDMA
    devices; a function without one carries the cause (``adapter_cause``). Its port rate is the
    chip's rate shared over the card's physical functions (a dual-port ConnectX-7 gives 200 Gb/s
    a port): a bar never above what the card can carry."""
    found = devices(root) if everything is None else everything
    kernel = (read_under(root, "/proc/sys/kernel/osrelease") or "").strip()
    by_function: dict[str, list[str]] = {}
    for name in _listdir(root, RDMA_CLASS):
        by_function.setdefault(rdma_function(root, name), []).append(name)
    default = default_route_interface(root) or ""
    models = [(d, m) for d in found or [] if (m := nic_model(d)) is not None]
    out = []
    for dev, model in models:
        card = [d for d, _ in models if d.bdf[:-1] == dev.bdf[:-1] and d.device == dev.device]
        share = None if model.gbps is None else model.gbps // max(1, len(card))
        rdma = tuple(by_function.get(dev.bdf, ()))
        netdevs = tuple(_listdir(root, f"/sys/bus/pci/devices/{dev.bdf}/net"))
        management = not rdma and bool(default) and default in netdevs
        cause = "" if rdma or management else adapter_cause(root, model, dev.driver, kernel)
        out.append(
            Adapter(
                dev.bdf,
                dev.id,
                model.name,
                share,
                dev.driver,
                rdma,
                netdevs,
                numa_node(root, dev.bdf),
                dev.bridges,
                management,
                cause,
            )
        )
    return tuple(out)


def invisible_rdma_adapters(root: str) -> list[str]:
    """The RDMA-capable adapters on the PCI bus that have no RDMA device, each named with its
    cause (``ConnectX-7 (15b3:1021) at 0000:18:00.0: no RDMA device: mlx5_core drives it but
    mlx5_ib is not loaded (modprobe mlx5_ib)``); the one carrying the default route is left
    out (a management port has no RDMA to give). Empty when every one is visible. The one rule
    for the fabric check, ``system``, the doctor and ``gpuenv health``."""
    return invisible_named(adapters(root))


def invisible_named(found: tuple[Adapter, ...]) -> list[str]:
    return [f"{a.name}: no RDMA device: {a.cause}" for a in found if a.invisible]


@dataclass(frozen=True)
class Gpu:
    bdf: str
    device_id: str  # 0x2330
    numa_node: int | None
    pci_path: tuple[str, ...]  # the bridges above it, root port first
    nvlink_active: int | None  # from NVML, handed in; None: not told
    nvlink_total: int | None
    nvlink_expected: int | None  # the model's link count, handed in; None: not told
    visible: bool | None  # in CUDA_VISIBLE_DEVICES; None: the variable names UUIDs

    @property
    def nvlink_short(self) -> bool:
        """Fewer active links than the GPU has or than its model has."""
        if self.nvlink_active is None:
            return False
        want = max(self.nvlink_total or 0, self.nvlink_expected or 0)
        return self.nvlink_active < want


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str  # "RoCE v2", "IB/RoCE v1"; "" where sysfs does not say
    ndev: str  # the netdev it belongs to (RoCE)

    @property
    def ipv4_mapped(self) -> bool:
        return bool(_IPV4_MAPPED.match(self.gid))


@dataclass(frozen=True)
class RdmaPort(Port):
    """net.Port (device, port, state, phys_state, rate, link_layer) with what the fabric adds."""

    gids: tuple[Gid, ...] = ()
    netdev: str = ""  # the device's network interface ("" when it has none)
    numa_node: int | None = None
    bdf: str = ""  # the device's PCI function
    pci_path: tuple[str, ...] = ()

    @property
    def hca(self) -> str:
        """The port as NCCL_IB_HCA names it: ``mlx5_0:1``."""
        return f"{self.device}:{self.port}"

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"


@dataclass(frozen=True)
class Affinity:
    gpu: str  # BDF
    port: str  # mlx5_0:1 (RdmaPort.hca)
    relation: str  # PCIE_SWITCH, SAME_NUMA, NO_AFFINITY
    acs_redirect: tuple[str, ...]  # bridges on the path with ACS P2P redirection on
    acs_unread: tuple[str, ...]  # bridges whose ACS control could not be read


@dataclass(frozen=True)
class Gdr:
    mode: str  # PEERMEM, DMABUF, GDR_OFF
    peermem_loaded: bool
    peermem_module: bool  # nvidia-peermem.ko is in the running kernel's modules.dep
    dmabuf: bool
    kernel: str
    flavour: str  # open, proprietary, "" (no NVIDIA module loaded)
    why: str

    @property
    def available(self) -> bool:
        return self.mode != GDR_OFF


@dataclass(frozen=True)
class Fabric:
    gpus: tuple[Gpu, ...]
    nvswitches: tuple[str, ...]
    fabric_manager: str  # systemctl is-active's word, "not-needed" without NVSwitches
    ports: tuple[RdmaPort, ...]
    affinity: tuple[Affinity, ...]
    gdr: Gdr
    default_interface: str
    cuda_visible_devices: str | None
    adapters: tuple[Adapter, ...] = ()  # the RDMA-capable network functions on the bus

    def relation(self, gpu: str, port: str) -> str:
        for a in self.affinity:
            if a.gpu == gpu and a.port == port:
                return a.relation
        return NO_AFFINITY

    def as_dict(self) -> dict:
        found = asdict(self)
        for gpu, data in zip(self.gpus, found["gpus"], strict=False):
            data["nvlink_short"] = gpu.nvlink_short
        found["gdr"]["available"] = self.gdr.available
        found["visible_gpus"] = sum(1 for g in self.gpus if g.visible)
        return found


@dataclass(frozen=True)
class NcclSettings:
    """The NCCL settings of a node, each with where it came from."""

    ib_hca: str  # "=mlx5_0:1,mlx5_1:1"; "" when the node has no rail
    gid_index: int | None  # None: not set (InfiniBand link layer, or no RoCE v2 entry)
    tc: int
    sl: int
    socket_ifname: str
    rails: tuple[str, ...]
    left_out: dict[str, str] = field(default_factory=dict)  # port -> why it is not a rail
    far: dict[str, str] = field(default_factory=dict)  # rail -> the GPUs it is placed far from
    origin: dict[str, str] = field(default_factory=dict)  # setting -> "derived" or "override"
    problems: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)

    def conf(self) -> dict[str, str]:
        """The /etc/nccl.conf lines (key -> value); an unset setting is left out."""
        lines = {
            "NCCL_IB_HCA": self.ib_hca,
            "NCCL_IB_GID_INDEX": "" if self.gid_index is None else str(self.gid_index),
            "NCCL_IB_TC": str(self.tc),
            "NCCL_IB_SL": str(self.sl),
            "NCCL_SOCKET_IFNAME": self.socket_ifname,
        }
        return {k: v for k, v in lines.items() if v != ""}


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _listdir(root: str, path: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(root, path.lstrip("/"))), key=_natural)
    except OSError:
        return []


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def numa_node(root: str, bdf: str) -> int | None:
    """A PCI function's NUMA node; None where the kernel says -1 (unknown)."""
    value = _int(read_under(root, f"/sys/bus/pci/devices/{bdf}/numa_node"))
    return None if value is None or value < 0 else value


def numa_nodes(root: str) -> int:
    return sum(1 for n in _listdir(root, "/sys/devices/system/node") if re.match(r"node\d+$", n))


def _gids(root: str, base: str) -> tuple[Gid, ...]:
    found = []
    for name in _listdir(root, f"{base}/gids"):
        gid = (read_under(root, f"{base}/gids/{name}") or "").strip().lower()
        if not name.isdigit() or not gid or gid == _ZERO_GID:
            continue
        kind = (read_under(root, f"{base}/gid_attrs/types/{name}") or "").strip()
        ndev = (read_under(root, f"{base}/gid_attrs/ndevs/{name}") or "").strip()
        found.append(Gid(int(name), gid, kind, ndev))
    return tuple(found)


def _port_pci(root: str, device: str, by_bdf: Mapping[str, Device]) -> tuple[str, tuple]:
    path = resolve_under(root, f"{RDMA_CLASS}/{device}/device")
    bdf = os.path.basename(path)
    if bdf in by_bdf:
        return bdf, by_bdf[bdf].bridges
    return bdf, ()


def ports(root: str, by_bdf: Mapping[str, Device]) -> tuple[RdmaPort, ...]:
    found = []
    for port in rdma_ports(root):
        base = f"{RDMA_CLASS}/{port.device}/ports/{port.port}"
        bdf, path = _port_pci(root, port.device, by_bdf)
        nets = _listdir(root, f"{RDMA_CLASS}/{port.device}/device/net")
        found.append(
            RdmaPort(
                **asdict(port),
                gids=_gids(root, base),
                netdev=nets[0] if nets else "",
                numa_node=numa_node(root, bdf),
                bdf=bdf,
                pci_path=path,
            )
        )
    return tuple(found)


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def relation(gpu: Gpu, port: RdmaPort, single_numa: bool) -> str:
    """PCIE_SWITCH when they share a bridge below the root port (the root port is path[0]);
    SAME_NUMA when on one NUMA node (every device is, on a node with one); else NO_AFFINITY."""
    if _shared(gpu.pci_path, port.pci_path) >= 2:
        return PCIE_SWITCH
    if single_numa or (gpu.numa_node is not None and gpu.numa_node == port.numa_node):
        return SAME_NUMA
    return NO_AFFINITY


def path_bridges(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """The bridges whose ACS settings decide the peer-to-peer path between two devices: those
    below the last bridge both paths share (a switch's upstream port forwards between its
    downstream ports; ACS redirect on those ports sends the traffic up instead). Devices that
    share no bridge meet in the root complex, where their traffic goes anyway: none."""
    shared = _shared(a, b)
    if shared == 0:
        return ()
    return tuple(dict.fromkeys(a[shared:] + b[shared:]))


def _affinity(root: str, gpus: tuple[Gpu, ...], found: tuple[RdmaPort, ...]) -> tuple:
    single = numa_nodes(root) <= 1
    acs: dict[str, int | None] = {}
    pairs = []
    for gpu in gpus:
        for port in found:
            bridges = path_bridges(gpu.pci_path, port.pci_path) if port.pci_path else ()
            for bdf in bridges:
                if bdf not in acs:
                    acs[bdf] = acs_control(root, bdf)
            redirect = tuple(b for b in bridges if (acs[b] or 0) & ACS_P2P_REDIRECT)
            unread = tuple(b for b in bridges if acs[b] is None)
            pairs.append(Affinity(gpu.bdf, port.hca, relation(gpu, port, single), redirect, unread))
    return tuple(pairs)


def _kernel_major_minor(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release)[:2])


def module_flavour(root: str) -> str:
    """The loaded NVIDIA module's flavour from /proc/driver/nvidia/version ("NVIDIA UNIX Open
    Kernel Module" is the open one); "" when no NVIDIA module is loaded."""
    text = read_under(root, _NVIDIA_VERSION)
    if text:
        return "open" if "Open Kernel Module" in text else "proprietary"
    if read_under(root, "/sys/module/nvidia/version") is not None:
        # taint P: a proprietary module is loaded (the open module taints O only)
        return (
            "proprietary" if "P" in (read_under(root, "/sys/module/nvidia/taint") or "") else "open"
        )
    return ""


def gdr(root: str) -> Gdr:
    """GPUDirect RDMA: nvidia_peermem loaded, else dma-buf (the open module on Linux >= 5.12),
    else off. ``peermem_module``: the running kernel can load nvidia-peermem (modules.dep)."""
    kernel = (read_under(root, "/proc/sys/kernel/osrelease") or "").strip()
    peer = [m for m in PEERMEM_MODULES if module_loaded(root, m)]
    loaded = bool(peer)
    deps = read_under(root, f"/lib/modules/{kernel}/modules.dep") if kernel else None
    present = bool(deps and re.search(r"/nvidia[-_]peermem\.ko", deps))
    flavour = module_flavour(root)
    dmabuf = flavour == "open" and _kernel_major_minor(kernel) >= DMABUF_MIN_KERNEL
    if loaded:
        mode, why = PEERMEM, f"{peer[0]} is loaded"
    elif dmabuf:
        mode, why = DMABUF, f"open NVIDIA kernel module on Linux {kernel}"
    else:
        mode = GDR_OFF
        module = f"{flavour} NVIDIA kernel module" if flavour else "no NVIDIA kernel module"
        why = f"nvidia_peermem not loaded; no dma-buf: {module} on Linux {kernel or '?'}"
        why += " (needs the open module and Linux >= 5.12)"
    return Gdr(mode, loaded, present, dmabuf, kernel, flavour, why)


def fabric_manager(run: Run, nvswitches: tuple[str, ...]) -> str:
    if not nvswitches:
        return "not-needed"
    rc, out = run(["systemctl", "is-active", FABRIC_MANAGER_UNIT], timeout_s=SYSTEMCTL_TIMEOUT_S)
    word = out.strip().splitlines()[0] if out.strip() else ""
    if rc in (124, 127) or not word:
        return "unknown"
    return word


def visible_indexes(value: str | None, count: int) -> set[int] | None:
    """The GPU indexes CUDA_VISIBLE_DEVICES leaves visible (PCI bus order); None when it names
    UUIDs or MIG devices, which sysfs cannot map. Unset: all; CUDA stops at the first invalid."""
    if value is None:
        return set(range(count))
    shown: set[int] = set()
    for item in value.split(","):
        item = item.strip()
        if not item:
            break
        if not item.lstrip("-").isdigit():
            return None
        index = int(item)
        if index < 0 or index >= count:
            break
        shown.add(index)
    return shown


def read(
    root: str,
    run: Run,
    nvlink: Mapping[str, tuple[int, int]] | None = None,
    model_links: Mapping[str, int] | None = None,
    cuda_visible_devices: str | None = None,
) -> Fabric:
    """The node's fabric. ``nvlink``: NVML's (active, total) links by GPU bus id; ``model_links``:
    the link count of each model by PCI device id ("0x2330"), from the caller's spec table;
    ``cuda_visible_devices``: the variable as the job sees it (None: unset)."""
    everything = devices(root) or []
    by_bdf = {d.bdf: d for d in everything}
    links = {normal_bus_id(k): v for k, v in (nvlink or {}).items()}
    expected = {k.lower(): v for k, v in (model_links or {}).items()}
    pci_gpus = [d for d in everything if d.is_gpu]
    shown = visible_indexes(cuda_visible_devices, len(pci_gpus))
    gpus = []
    for index, d in enumerate(pci_gpus):
        active, total = links.get(d.bdf, (None, None))
        gpus.append(
            Gpu(
                d.bdf,
                f"0x{d.device:04x}",
                numa_node(root, d.bdf),
                d.bridges,
                active,
                total,
                expected.get(f"0x{d.device:04x}"),
                None if shown is None else index in shown,
            )
        )
    switches = tuple(d.bdf for d in everything if d.is_nvswitch)
    found = ports(root, by_bdf)
    return Fabric(
        tuple(gpus),
        switches,
        fabric_manager(run, switches),
        found,
        _affinity(root, tuple(gpus), found),
        gdr(root),
        default_route_interface(root) or "",
        cuda_visible_devices,
        adapters(root, everything),
    )


@dataclass(frozen=True)
class RailChoice:
    chosen: tuple[str, ...]
    left_out: dict[str, str]
    far: dict[str, str]  # rail -> why it is a rail placed far from its GPU


def _kind(fabric: Fabric, port: RdmaPort) -> tuple[str, str]:
    """What makes ports peers: link layer and rate (a storage port differs in one or both)."""
    return port.link_layer, port.rate


def choose_rails(fabric: Fabric) -> RailChoice:
    """The ports that are rails, why each other port is not, and the rails placed far.

    A rail is an InfiniBand or RoCE port (or one whose link layer cannot be read), not
    administratively disabled, whose device sits next to a GPU. Next to: where any port shares a
    PCIe switch with a GPU (the HGX/DGX design, one NIC under each GPU's switch), only ports
    that share a PCIe switch with a GPU; on a node where none does, ports on a GPU's NUMA node.
    A port in INIT or DOWN stays a rail: NCCL skips it, and the verdict names it. On a switched
    node a port outside every GPU's switch is a rail placed far (``far``) when a GPU has no rail
    under its switch and the port is a peer of the rails (same link layer and rate, same card
    model where both are known): a compute NIC in the wrong slot, named as such. Other ports
    hang off root ports without a GPU beside them: storage or management, never rails.
    """
    if not fabric.gpus:
        return RailChoice((), {p.hca: "no GPU on the node" for p in fabric.ports}, {})
    switched = any(a.relation == PCIE_SWITCH for a in fabric.affinity)
    wanted = (PCIE_SWITCH,) if switched else (PCIE_SWITCH, SAME_NUMA)
    chosen: list[str] = []
    left_out: dict[str, str] = {}
    far: dict[str, str] = {}
    away = []
    for port in fabric.ports:
        near = [a.gpu for a in fabric.affinity if a.port == port.hca and a.relation in wanted]
        if port.link_layer not in ("InfiniBand", "Ethernet", ""):
            left_out[port.hca] = f"link layer {port.link_layer}"
        elif port.phys_state == "Disabled":
            left_out[port.hca] = "physical state Disabled"
        elif not near:
            away.append(port)
        else:
            chosen.append(port.hca)
    by_hca = {p.hca: p for p in fabric.ports}
    model = {a.bdf: a.id for a in fabric.adapters}
    kinds = [_kind(fabric, by_hca[h]) for h in chosen]
    common = max(set(kinds), key=kinds.count) if kinds else None
    models = {model.get(by_hca[h].bdf, "") for h in chosen} - {""}
    index = {g.bdf: i for i, g in enumerate(fabric.gpus)}
    for port in away:
        lonely = [
            g for g in fabric.gpus
            if not any(fabric.relation(g.bdf, h) == PCIE_SWITCH for h in chosen)
        ]  # fmt: skip
        mine = model.get(port.bdf, "")
        peer = _kind(fabric, port) == common and (not mine or not models or mine in models)
        if switched and lonely and peer:
            chosen.append(port.hca)
            gpus = ", ".join(f"GPU{index[g.bdf]} ({g.bdf})" for g in lonely)
            relation = (
                "same NUMA node"
                if any(fabric.relation(g.bdf, port.hca) == SAME_NUMA for g in lonely)
                else "another NUMA node"
            )
            far[port.hca] = (
                f"a compute NIC placed far from {gpus}: it shares no PCIe switch with"
                f" {'it' if len(lonely) == 1 else 'them'} ({relation}); GPUDirect RDMA crosses"
                " the root complex: move the card into the slot under that GPU's PCIe switch"
            )
        else:
            where = "shares no PCIe switch with a GPU" if switched else "on no GPU's NUMA node"
            left_out[port.hca] = f"{where} (storage or management)"
    return RailChoice(tuple(sorted(chosen, key=_natural)), left_out, far)


def rails(fabric: Fabric) -> tuple[tuple[str, ...], dict[str, str]]:
    """The ports that are rails, and why each other port is not (``choose_rails``)."""
    choice = choose_rails(fabric)
    return choice.chosen, choice.left_out


_NEARNESS = {PCIE_SWITCH: 0, SAME_NUMA: 1, NO_AFFINITY: 2}


def nearest_rails(fabric: Fabric, rails: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Per GPU (BDF): its nearest rail and their relation (a shared PCIe switch first, then the
    same NUMA node, then neither; ties go to the rail first in ``rails``). Empty without rails."""
    found = {}
    for gpu in fabric.gpus:
        near = sorted((_NEARNESS[fabric.relation(gpu.bdf, r)], i, r) for i, r in enumerate(rails))
        if near:
            rail = near[0][2]
            found[gpu.bdf] = (rail, fabric.relation(gpu.bdf, rail))
    return found


def rail_gpus(fabric: Fabric, rails: tuple[str, ...]) -> dict[str, int]:
    """Per rail: the index (PCI bus order, CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID) of the GPU
    nearest to it, for a GPU-memory test of that rail (``ib_write_bw --use_cuda``)."""
    found: dict[str, int] = {}
    for rail in rails:
        near = sorted(
            (_NEARNESS[fabric.relation(g.bdf, rail)], i) for i, g in enumerate(fabric.gpus)
        )
        if near:
            found[rail] = near[0][1]
    return found


def gid_index(chosen: list[RdmaPort]) -> tuple[int | None, list[str]]:
    """NCCL_IB_GID_INDEX for the RoCE rails: the RoCE v2 entry holding an IPv4-mapped address
    (::ffff:a.b.c.d), else the first RoCE v2 entry that is not link-local; one index for all
    rails (NCCL takes one), the lowest that every RoCE rail has. None on InfiniBand."""
    roce = [p for p in chosen if p.roce]
    if not roce:
        return None, []
    per_port = []
    for port in roce:
        v2 = [g for g in port.gids if g.type == ROCE_V2]
        best = [g.index for g in v2 if g.ipv4_mapped] or [
            g.index for g in v2 if not g.gid.startswith("fe80")
        ]
        per_port.append((port.hca, best))
    missing = [name for name, best in per_port if not best]
    if missing:
        return None, [f"no RoCE v2 GID with an address on {', '.join(missing)}"]
    common = set.intersection(*(set(best) for _, best in per_port))
    if common:
        return min(common), []
    first = per_port[0][1][0]
    return first, [
        f"RoCE rails disagree on the RoCE v2 GID index; {first} taken from {roce[0].hca}"
    ]


def derive(fabric: Fabric, overrides: Mapping[str, object] | None = None) -> NcclSettings:
    """The NCCL settings for the node; ``overrides`` (ib_hca, gid_index, tc, sl, socket_ifname)
    replace the derived value of each key they hold with a value other than None or ""."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None and v != ""}
    choice = choose_rails(fabric)
    chosen, left_out = choice.chosen, choice.left_out
    by_name = {p.hca: p for p in fabric.ports}
    index, problems = gid_index([by_name[n] for n in chosen])
    derived: dict[str, object] = {
        "ib_hca": "=" + ",".join(chosen) if chosen else "",
        "gid_index": index,
        "tc": DEFAULT_IB_TC,
        "sl": DEFAULT_IB_SL,
        "socket_ifname": fabric.default_interface,
    }
    origin = {k: "override" if k in given else "derived" for k in derived}
    value = {**derived, **given}
    return NcclSettings(
        ib_hca=str(value["ib_hca"]),
        gid_index=None if value["gid_index"] is None else int(str(value["gid_index"])),
        tc=int(str(value["tc"])),
        sl=int(str(value["sl"])),
        socket_ifname=str(value["socket_ifname"]),
        rails=chosen,
        left_out=left_out,
        far=dict(choice.far),
        origin=origin,
        problems=tuple(problems),
    )


def topology_links(found: Fabric) -> dict[str, Any]:
    """What the fabric rules take from the fabric reader, as the probe's ``links`` keys (the
    node check reads the same through ``read_node``): GPUDirect RDMA (peermem, dma-buf, ACS
    redirect between a GPU and the rail under its PCIe switch, GPUs with no rail near them) and
    the derivation (its rails, NCCL settings and the ports it left out), the GID tables."""
    settings = derive(found)
    nearest = nearest_rails(found, settings.rails)
    index = {g.bdf: i for i, g in enumerate(found.gpus)}
    by_hca = {p.hca: p for p in found.ports}
    far = []
    for gpu in found.gpus:
        rail, relation = nearest.get(gpu.bdf, ("", ""))
        if rail and relation == NO_AFFINITY:
            far.append(
                f"GPU{index[gpu.bdf]} ({gpu.bdf}, NUMA {gpu.numa_node}) has no rail on its PCIe"
                f" switch or NUMA node; nearest {rail} is on NUMA {by_hca[rail].numa_node}"
            )
    lonely = [] if settings.far else lonely_gpus(found, settings.rails)
    acs = sorted({b for a in found.affinity if a.relation == PCIE_SWITCH
                  and a.port in settings.rails for b in a.acs_redirect})  # fmt: skip
    return {
        "gdr.peermem": found.gdr.peermem_loaded,
        "gdr.dmabuf": found.gdr.dmabuf,
        "gdr.acs_bridges": acs,
        "gdr.far_pairs": far,
        "ib.derived_rails": list(settings.rails),
        "ib.derived": settings.conf(),
        "ib.left_out": dict(settings.left_out),
        "ib.rail_gpu": rail_gpus(found, settings.rails),
        "ib.gid_types": {
            p.hca: {str(g.index): g.type for g in p.gids} for p in found.ports if p.roce
        },
        "ib.capability": port_capability(found),
        "ib.far_rails": dict(settings.far),
        "ib.problems": list(settings.problems),
        "ib.invisible": invisible_named(found.adapters),
        "ib.lonely": lonely,
    }


def lonely_gpus(found: Fabric, rails: tuple[str, ...]) -> list[str]:
    """On a node whose GPUs share PCIe switches with their rails: each GPU that has no rail under
    its switch (its card gone from the bus, or never fitted), named with how many GPUs have one.
    Empty on a node where no GPU shares a switch with a rail."""
    index = {g.bdf: i for i, g in enumerate(found.gpus)}
    near = {
        g.bdf for g in found.gpus if any(found.relation(g.bdf, r) == PCIE_SWITCH for r in rails)
    }
    if not near:
        return []
    return [
        f"GPU{index[g.bdf]} ({g.bdf}) has no rail under its PCIe switch, as {len(near)} of"
        f" {len(found.gpus)} GPUs have: its card is gone from the PCI bus or was never fitted"
        for g in found.gpus
        if g.bdf not in near
    ]


def port_capability(found: Fabric) -> dict[str, dict[str, Any]]:
    """Per port (``mlx5_0:1``): what its card can carry (``gbps``, Gb/s; None where the model
    does not say) and the card's name, from the adapter table (``NIC_MODELS``)."""
    by_bdf = {a.bdf: a for a in found.adapters}
    return {
        p.hca: {"gbps": by_bdf[p.bdf].port_gbps, "card": by_bdf[p.bdf].name}
        for p in found.ports
        if p.bdf in by_bdf
    }
