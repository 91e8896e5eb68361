"""`fabric`: the node's InfiniBand/RoCE rails against what NCCL loaded, and their error counters.

One process (launcher placement): it reads the RDMA ports and their error counters, opens a
one-rank NCCL communicator (CuPy) with ``NCCL_DEBUG=INFO`` so that NCCL says which NET devices and
settings it loaded, and reads the counters again. The rules are pure functions of what it read,
shared with the cluster judges (gpuenv.cluster.judge):

- a rail (a port ``NCCL_IB_HCA`` selects, from the environment or /etc/nccl.conf; without it
  the rails the ``rdma_fabric`` role's derivation selects, ``gpuenv.floor.fabric.derive``: never
  a storage or management port) that is not ACTIVE FAILs naming device, port, state and the
  likely cause; other ports are reported, not judged;
- the NCCL settings in force (``SETTINGS``, environment over /etc/nccl.conf) must be what NCCL
  reports it loaded, and the NET devices NCCL opened must be the active rails; they are also
  held against the derivation: ``NCCL_IB_GID_INDEX`` must be a RoCE v2 entry of every RoCE
  rail's GID table, ``NCCL_IB_HCA`` must not name a port the derivation left out;
- an error counter (``gpuenv.floor.net.ERROR_COUNTERS``) that grew between the two reads FAILs
  naming the port and the counters;
- across nodes (the cluster's busbw): a node with rails must not fall back to NET/Socket, must
  use every active rail, and must use GPUDirect RDMA where it can (``gdr_problems``).

Where there is no IB/RoCE port the check is not needed and SKIPs saying so.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuenv import proc
from gpuenv.checks import nccl_log, ranklog
from gpuenv.checks.base import Context, NodeInfo, Placement, has_module, verdict
from gpuenv.floor import fabric as floor_fabric
from gpuenv.floor import net
from gpuenv.results import Measurement, Result

NAME = "fabric"
DESCRIPTION = (
    "InfiniBand/RoCE rails: port state, NCCL settings against what NCCL loaded, error counters"
)
PLACEMENT = Placement.LAUNCHER
OPTIONAL = False
ROOT_ENV = "GPUENV_ROOT"
SETTINGS = net.NCCL_FABRIC_SETTINGS
# Why a port is in its state, as the IB specification's port states mean it.
STATE_CAUSES = {
    "INIT": "the link is up but no subnet manager has configured the port (start opensm or the"
    " switch's SM)",
    "ARMED": "the subnet manager has not activated the port yet",
    "DOWN": "no link: cable, transceiver or peer port",
}


def needed(node: NodeInfo) -> bool:
    """Required only where there is a fabric: IB/RoCE ports, or an RDMA-capable adapter on the
    PCI bus that has no RDMA device (it FAILs, naming the card and the cause)."""
    return bool(node.rdma_ports or node.rdma_invisible)


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    if not node.rdma_ports and not node.rdma_invisible:
        return (
            "no InfiniBand/RoCE port in /sys/class/infiniband and no RDMA-capable adapter on the"
            " PCI bus: no fabric to judge"
        )
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    return 1


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    argv = [sys.executable, "-m", "gpuenv.checks.fabric"]
    if node.has_gpu and has_module("cupy"):
        argv.append("--nccl")
    return argv


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    return {}


# ---------------------------------------------------------------- the facts, as data


@dataclass(frozen=True)
class GdrFacts:
    """What decides whether GPUDirect RDMA can work between a node's GPUs and NICs, from the
    fabric reader (gpuenv.floor.fabric: ``gdr()`` and the GPU-rail affinity)."""

    peermem: bool | None = None  # nvidia_peermem loaded (None: not read)
    dmabuf: bool | None = None  # the driver and NIC support dma-buf (None: not read)
    acs_bridges: tuple[str, ...] = ()  # bridges with ACS redirect between a GPU and its NIC
    far_pairs: tuple[str, ...] = ()  # "GPU0-mlx5_3: NUMA 0 and 1": a GPU without a near NIC


@dataclass
class NodeFabric:
    """One node's fabric: its ports, the NCCL settings in force and what NCCL loaded."""

    ports: list[net.Port]
    settings: dict[str, str] = field(default_factory=dict)  # in force: env over nccl.conf
    loaded: nccl_log.Transports | None = None  # NCCL's log; None: NCCL did not run
    why_no_log: str = ""
    before: dict[str, dict[str, int]] = field(default_factory=dict)  # port -> counters
    after: dict[str, dict[str, int]] = field(default_factory=dict)
    verbs: str | None = None  # libibverbs.so.1, where found
    gdr: GdrFacts = field(default_factory=GdrFacts)
    # The rdma_fabric role's derivation (gpuenv.floor.fabric.derive): its rails (mlx5_0:1) and
    # NCCL settings (NCCL_* -> value), the ports it left out and why; per port the RoCE v2
    # entries of its GID table (index -> type). None/empty: not read (an older probe).
    derived_rails: list[str] | None = None
    derived: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    gid_types: dict[str, dict[str, str]] = field(default_factory=dict)
    rail_gpu: dict[str, int] = field(default_factory=dict)  # rail -> index of the GPU nearest it
    # port -> {"gbps": what its card carries a port (None: not known), "card": its name}
    capability: dict[str, dict[str, Any]] = field(default_factory=dict)
    far_rails: dict[str, str] = field(default_factory=dict)  # rail -> why it is placed far
    problems: list[str] = field(default_factory=list)  # the derivation's (no RoCE v2 GID ...)
    invisible: list[str] = field(default_factory=list)  # RDMA adapters with no RDMA device
    lonely: list[str] = field(default_factory=list)  # GPUs without the rail their peers have

    @property
    def hca(self) -> net.HcaSpec | None:
        return net.hca_spec(self.settings.get("NCCL_IB_HCA"))

    @property
    def rails(self) -> list[net.Port]:
        """NCCL_IB_HCA's ports; without it the derivation's rails (storage ports stay out);
        without either every IB/RoCE port, as NCCL does."""
        if self.hca is None and self.derived_rails is not None:
            wanted = set(self.derived_rails)
            return [p for p in self.ports if f"{p.device}:{p.port}" in wanted]
        return net.rails(self.ports, self.hca)

    @property
    def chosen_by(self) -> str:
        if self.hca:
            return f"NCCL_IB_HCA={self.hca.text}"
        if self.derived_rails is not None:
            return "the rdma_fabric derivation (no NCCL_IB_HCA)"
        return "every IB/RoCE port (no NCCL_IB_HCA)"

    @property
    def active_rails(self) -> list[net.Port]:
        return [p for p in self.rails if p.active]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ports": [asdict(p) for p in self.ports],
            "settings": dict(self.settings),
            "loaded": self.loaded.to_dict() if self.loaded else None,
            "why_no_log": self.why_no_log,
            "before": self.before,
            "after": self.after,
            "verbs": self.verbs,
            "gdr": asdict(self.gdr),
            "derived_rails": self.derived_rails,
            "derived": dict(self.derived),
            "left_out": dict(self.left_out),
            "gid_types": dict(self.gid_types),
            "rail_gpu": dict(self.rail_gpu),
            "capability": dict(self.capability),
            "far_rails": dict(self.far_rails),
            "problems": list(self.problems),
            "invisible": list(self.invisible),
            "lonely": list(self.lonely),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeFabric:
        loaded = data.get("loaded")
        gdr = dict(data.get("gdr") or {})
        return cls(
            ports=[net.Port(**p) for p in data.get("ports", [])],
            settings=dict(data.get("settings", {})),
            loaded=nccl_log.merge([loaded]) if loaded else None,
            why_no_log=str(data.get("why_no_log", "")),
            before=dict(data.get("before", {})),
            after=dict(data.get("after", {})),
            verbs=data.get("verbs"),
            gdr=GdrFacts(
                peermem=gdr.get("peermem"),
                dmabuf=gdr.get("dmabuf"),
                acs_bridges=tuple(gdr.get("acs_bridges", ())),
                far_pairs=tuple(gdr.get("far_pairs", ())),
            ),
            derived_rails=data.get("derived_rails"),
            derived=dict(data.get("derived") or {}),
            left_out=dict(data.get("left_out") or {}),
            gid_types=dict(data.get("gid_types") or {}),
            rail_gpu=dict(data.get("rail_gpu") or {}),
            capability=dict(data.get("capability") or {}),
            far_rails=dict(data.get("far_rails") or {}),
            problems=list(data.get("problems") or []),
            invisible=list(data.get("invisible") or []),
            lonely=list(data.get("lonely") or []),
        )


def from_links(links: Mapping[str, Any]) -> NodeFabric | None:
    """A node's fabric from the cluster probe's ``links`` (gpuenv.cluster.probe.links); None
    where the probe did not read it (an older gpuenv on the node)."""
    return _from_keys(links) if "ib.ports" in links else None


# What the fabric reader adds, by the name NodeFabric gives it (the probe's key is "ib." + it).
_TOPOLOGY = (
    "derived_rails",
    "derived",
    "left_out",
    "gid_types",
    "rail_gpu",
    "capability",
    "far_rails",
    "problems",
    "invisible",
    "lonely",
)


def _from_keys(links: Mapping[str, Any]) -> NodeFabric:
    return NodeFabric.from_dict(
        {
            "ports": links["ib.ports"],
            "settings": links.get("ib.settings", {}),
            "before": links.get("ib.counters", {}),
            "verbs": links.get("ib.verbs"),
            "gdr": {k.removeprefix("gdr."): v for k, v in links.items() if k.startswith("gdr.")},
            **{k: links[f"ib.{k}"] for k in _TOPOLOGY if f"ib.{k}" in links},
        }
    )


def read_fabric(root: str, environ: Mapping[str, str]) -> floor_fabric.Fabric:
    """The fabric reader on this node (NVLink counts are NVML's: the system check has them)."""
    return floor_fabric.read(
        root, proc.command_output, cuda_visible_devices=environ.get("CUDA_VISIBLE_DEVICES")
    )


def read_node(
    root: str, environ: Mapping[str, str], found: floor_fabric.Fabric | None = None
) -> NodeFabric:
    """The node's ports, settings, counters and verbs library (the floor's net readers), and
    from the fabric reader (``found``, read here when not given) GPUDirect RDMA and the
    derivation."""
    return _from_keys(
        {
            "ib.ports": [asdict(p) for p in net.rdma_ports(root)],
            "ib.settings": net.nccl_settings(root, environ, SETTINGS),
            "ib.counters": net.all_port_counters(root),
            "ib.verbs": net.verbs_library(root),
            **floor_fabric.topology_links(found or read_fabric(root, environ)),
        }
    )


# ---------------------------------------------------------------- the rules


def _port_words(p: net.Port) -> str:
    return f"{p.device} port {p.port} is {p.state or '?'} (physical {p.phys_state or '?'})"


def rail_problems(node: NodeFabric) -> tuple[list[str], list[str]]:
    """Rails that are not ACTIVE (problems, with the likely cause), rails whose readings are
    missing, rails placed far from their GPU, RDMA adapters with no RDMA device, and the other
    ports, which are reported, not judged (notes)."""
    rails = node.rails
    chosen = node.chosen_by
    problems = [f"RDMA adapter {a}" for a in node.invisible]
    problems += [
        f"rail {_port_words(p)}: {STATE_CAUSES.get(p.state, 'not usable by NCCL')}"
        for p in rails
        if not p.active
    ]
    problems += unread_problems(node)
    problems += [f"rail {hca} is {why}" for hca, why in sorted(node.far_rails.items())]
    problems += list(node.lonely)
    others = [p for p in node.ports if p not in rails]
    notes = [
        f"not a rail ({chosen}): {_port_words(p)}"
        + (f"; {node.left_out[hca]}" if (hca := f"{p.device}:{p.port}") in node.left_out else "")
        for p in others
    ]
    if node.ports and not rails:
        problems.append(f"no port is a rail: {chosen} selects none of " + ", ".join(
            p.name for p in node.ports))  # fmt: skip
    return problems, notes


# The readings of a port that a rail must answer (sysfs ports/N/<file>), by Port field.
PORT_READINGS = {
    "state": "state",
    "phys_state": "physical state",
    "link_layer": "link layer",
    "rate": "rate",
}


def judged_ports(node: NodeFabric) -> list[net.Port]:
    """The rails, and the derivation's rails that NCCL_IB_HCA's syntax drops for a missing
    reading (a port whose link layer cannot be read is neither InfiniBand nor Ethernet)."""
    rails = node.rails
    wanted = set(node.derived_rails or ())
    return rails + [p for p in node.ports if f"{p.device}:{p.port}" in wanted and p not in rails]


def unread_problems(node: NodeFabric) -> list[str]:
    """A rail whose state, physical state, link layer or rate cannot be read FAILs naming the
    reading: a missing answer is not a pass."""
    found = []
    for p in judged_ports(node):
        missing = [said for key, said in PORT_READINGS.items() if not getattr(p, key)]
        if p.rate and net.rate_gbits(p.rate) is None:
            missing.append(f"rate ({p.rate!r} is not a rate)")
        if missing:
            found.append(
                f"rail {p.device}:{p.port}: its {', '.join(missing)} could not be read"
                f" ({net.RDMA_CLASS}/{p.device}/ports/{p.port}/)"
            )
    return found


def _majority(values: Sequence[float]) -> float | None:
    """The value most rails share (a tie goes to the higher)."""
    if not values:
        return None
    return max(set(values), key=lambda v: (values.count(v), v))


def expected_rate(
    node: NodeFabric, hca: str, peers_gbps: float | None, peers_said: str
) -> tuple[float | None, str]:
    """What a rail should run at (Gb/s) and why: the higher of what its card carries a port
    (``capability``, the floor's adapter table) and the rate most of its peers run at. Never
    the rail's own rate: a degraded rail must not lower its own bar."""
    cap = node.capability.get(hca, {})
    known = []
    if cap.get("gbps"):
        known.append(
            (float(cap["gbps"]), f"its card, {cap.get('card')}, carries {cap['gbps']} Gb/s")
        )
    if peers_gbps:
        known.append((peers_gbps, peers_said))
    if not known:
        return None, ""
    best = max(v for v, _ in known)
    return best, "; ".join(why for v, why in known if v == best)


def rate_problems(node: NodeFabric, across_gbps: float | None = None) -> list[str]:
    """Every ACTIVE rail whose rate is below what it should carry (``expected_rate``: its card's
    capability and the majority of its peers on the node, and across nodes where
    ``across_gbps`` is given), or whose width is narrower than its peers' (down-trained),
    FAILs naming the rail, its rate and what it should be."""
    active = [p for p in node.active_rails if net.rate_gbits(p.rate) is not None]
    rates = [net.rate_gbits(p.rate) or 0.0 for p in active]
    widths = [w for p in active if (w := net.rate_width(p.rate))]
    peers = _majority(rates)
    width = _majority([float(w) for w in widths])
    said = (
        f"{rates.count(peers)} of {len(rates)} rails on the node run at {peers:g} Gb/s"
        if peers is not None
        else ""
    )
    found = []
    for p, rate in zip(active, rates, strict=True):
        hca = f"{p.device}:{p.port}"
        want, why = expected_rate(node, hca, peers, said)
        if across_gbps and (want is None or across_gbps > want):
            want, why = across_gbps, f"the rails of the other nodes run at {across_gbps:g} Gb/s"
        if want is not None and rate < want:
            found.append(f"rail {hca} runs at {p.rate}, below {want:g} Gb/s ({why})")
        w = net.rate_width(p.rate)
        if w and width and w < width:
            found.append(
                f"rail {hca} trained at width {w}X, its peers at {width:g}X (down-trained)"
            )
    return found


def node_gdr_problems(node: NodeFabric, required: bool = True) -> list[str]:
    """On the node: GPUs with a rail (``rail_gpu``, the GPU nearest each rail) and GPUDirect
    RDMA off (no nvidia_peermem, no dma-buf) FAIL naming those GPUs, unless GPUDirect RDMA is
    not required (thresholds' ``fabric.gdr_required``)."""
    gpus = sorted(set(node.rail_gpu.values()))
    if not required or not gpus or node.gdr.peermem is not False or node.gdr.dmabuf:
        return []
    return [
        f"GPUDirect RDMA is off for GPU(s) {', '.join(map(str, gpus))}, which have a rail:"
        " nvidia_peermem is not loaded (modprobe nvidia-peermem) and no dma-buf (the open NVIDIA"
        " kernel module on Linux >= 5.12): NCCL stages every transfer through host memory"
    ]


def derivation_problems(node: NodeFabric) -> tuple[list[str], list[str]]:
    """The settings in force held against the fabric's GID tables and the role's derivation:
    a ``NCCL_IB_GID_INDEX`` that is not a RoCE v2 entry on a RoCE rail FAILs naming the entry
    (NCCL then speaks RoCE v1 or an IPv6 link-local GID to peers that speak v2: the connection
    times out); ``NCCL_IB_HCA`` naming a port the derivation left out (a storage or management
    port) FAILs with why it was left out; any other difference is a note (an override)."""
    problems, notes = [f"{p} (RoCE v2 is what NCCL speaks across subnets)" if "RoCE v2" in p
                       else p for p in node.problems], []  # fmt: skip
    gid = node.settings.get("NCCL_IB_GID_INDEX")
    roce = [f"{p.device}:{p.port}" for p in node.rails if p.link_layer == "Ethernet"]
    if gid is not None and roce:
        for hca in roce:
            table = node.gid_types.get(hca)
            if table is None:
                continue
            v2 = sorted(int(i) for i, kind in table.items() if kind == floor_fabric.ROCE_V2)
            kind = table.get(gid.strip())
            if kind != floor_fabric.ROCE_V2:
                entry = f"the {kind} entry" if kind else "no entry"
                problems.append(
                    f"NCCL_IB_GID_INDEX={gid} is {entry} on {hca}, not RoCE v2 (RoCE v2 entries:"
                    f" {', '.join(map(str, v2)) or 'none'}): NCCL connections time out"
                )
    elif gid is None and roce and node.derived.get("NCCL_IB_GID_INDEX"):
        notes.append(
            f"NCCL_IB_GID_INDEX not set on RoCE rails; the GID table's RoCE v2 entry is"
            f" {node.derived['NCCL_IB_GID_INDEX']} (set it, or run the rdma_fabric role)"
        )
    spec = node.hca
    if spec is not None and spec.exact and not spec.exclude:
        for name, port in spec.entries:
            if not any(p.device == name and port in (None, p.port) for p in node.ports):
                named = f"{name}:{port}" if port else name
                problems.append(
                    f"NCCL_IB_HCA={spec.text} names {named}, which is not on the node (its card"
                    " is gone from the PCI bus or its RDMA driver is not loaded)"
                )
    if spec is not None and node.derived_rails is not None:
        picked = [f"{p.device}:{p.port}" for p in net.rails(node.ports, spec)]
        for hca in picked:
            if hca in node.left_out:
                why = node.left_out[hca]
                problems.append(f"NCCL_IB_HCA={spec.text} selects {hca}, not a rail: {why}")
    for key, want in sorted(node.derived.items()):
        have = node.settings.get(key)
        if have is not None and have != want and key != "NCCL_IB_HCA":
            notes.append(f"{key}={have} in force; the derivation gives {want}")
    return problems, notes


def settings_problems(node: NodeFabric) -> tuple[list[str], list[str]]:
    """The settings in force against the derivation and the GID tables (``derivation_problems``)
    and against what NCCL reports it loaded, and the NET devices NCCL opened against the active
    rails. No NCCL log: a note, the loaded settings not judged."""
    problems, notes = derivation_problems(node)
    t = node.loaded
    if t is None:
        notes.append(f"NCCL's loaded settings not compared: {node.why_no_log or 'no NCCL log'}")
        return problems, notes
    for key, want in sorted(node.settings.items()):
        got = t.settings.get(key)
        if got is None:
            problems.append(f"{key}={want} is set but NCCL did not report loading it")
        elif got != want:
            problems.append(f"{key}: set to {want!r}, NCCL loaded {got!r}")
    opened = sorted({d.split("/")[0] for d in t.net_devices.values()})
    wanted = sorted(f"{p.device}:{p.port}" for p in node.active_rails)
    is_ib = any("/" in d and d.split("/")[1] in ("IB", "RoCE") for d in t.net_devices.values())
    if is_ib and opened != wanted:
        extra = [d for d in opened if d not in wanted]
        missing = [d for d in wanted if d not in opened]
        problems.append(
            "NCCL opened "
            + (f"{', '.join(extra)}, which are not active rails" if extra else "")
            + ("; " if extra and missing else "")
            + (f"not the active rail(s) {', '.join(missing)}" if missing else "")
        )
    elif not t.net_devices:
        notes.append("NCCL's log names no NET device (it may open the network only across nodes)")
    return problems, notes


def counter_problems(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]
) -> list[str]:
    """Every port whose error counters grew between two reads, naming the counters."""
    found = []
    for port, now in sorted(after.items()):
        was = before.get(port, {})
        grew = [f"{k} {was[k]} -> {v}" for k, v in sorted(now.items()) if k in was and v > was[k]]
        if grew:
            found.append(f"{port}: error counters grew during the run: {', '.join(grew)}")
    return found


def fallback_problems(nodes: Mapping[str, NodeFabric], t: nccl_log.Transports) -> list[str]:
    """Across nodes: when any node has IB/RoCE rails, NET/Socket is a fallback, named with its
    likely cause on every node that has rails."""
    with_rails = {n: f for n, f in nodes.items() if f.rails or f.invisible}
    if not with_rails or nccl_log.NET_SOCKET not in t.families:
        return []
    causes = []
    for name, f in sorted(with_rails.items()):
        down = [p for p in f.rails if not p.active]
        if f.invisible:
            causes += [f"{name}: RDMA adapter {a}" for a in f.invisible]
        if down:
            causes += [
                f"{name}: rail {_port_words(p)}: {STATE_CAUSES.get(p.state, 'not usable')}"
                for p in down
            ]
        elif f.invisible:
            pass
        elif f.verbs is None:
            causes.append(f"{name}: libibverbs.so.1 not found (install rdma-core / libibverbs1)")
        elif (f.loaded and f.loaded.settings.get("NCCL_IB_DISABLE", "0") != "0") or (
            f.settings.get("NCCL_IB_DISABLE", "0") != "0"
        ):
            causes.append(f"{name}: NCCL_IB_DISABLE is set")
        else:
            causes.append(
                f"{name}: rails active and libibverbs present: look for NCCL_NET, a net plugin,"
                " or NCCL_IB_HCA naming no active port"
            )
    return [
        f"NCCL fell back to TCP sockets across nodes ({t.summary()}) although"
        f" {', '.join(sorted(with_rails))} ha{'s' if len(with_rails) == 1 else 've'}"
        f" InfiniBand/RoCE rails or adapters; likely cause: {'; '.join(causes)}"
    ]


def rail_use_problems(
    nodes: Mapping[str, NodeFabric], used: Mapping[str, nccl_log.Transports]
) -> list[str]:
    """A node whose NCCL channels went over fewer NET devices than its active rails FAILs,
    naming the idle rails (NCCL's per-channel lines, from every local rank's log)."""
    found = []
    for name, f in sorted(nodes.items()):
        t = used.get(name)
        active = sorted(f"{p.device}:{p.port}" for p in f.active_rails)
        if t is None or nccl_log.NET_IB not in t.families or len(active) < 2:
            continue
        idle = [r for r in active if r not in t.used_devices()]
        if idle:
            found.append(
                f"{name}: NCCL used {len(active) - len(idle)} of {len(active)} rails; idle:"
                f" {', '.join(idle)}"
            )
    return found


def across_rate(nodes: Mapping[str, NodeFabric]) -> float | None:
    """The rate (Gb/s) most ACTIVE rails of all the nodes run at: the bar across nodes."""
    rates = [
        r
        for f in nodes.values()
        for p in f.active_rails
        if (r := net.rate_gbits(p.rate)) is not None
    ]
    return _majority(rates)


def rate_problems_across(nodes: Mapping[str, NodeFabric]) -> list[str]:
    """Across nodes: every node's rails against their card, their peers on the node and the
    majority of the rails of all nodes (``rate_problems``), named by node."""
    bar = across_rate(nodes) if len(nodes) > 1 else None
    return [f"{name}: {p}" for name, f in sorted(nodes.items()) for p in rate_problems(f, bar)]


def _expected_gbytes(f: NodeFabric, device: str, bar: float | None) -> float | None:
    """What a rail NCCL used should carry, in GB/s: its expected rate (card, peers, the nodes'
    majority), never below its own rate; None when nothing says."""
    port = next((p for p in f.ports if f"{p.device}:{p.port}" == device), None)
    if port is None:
        return None
    rates = [net.rate_gbits(p.rate) or 0.0 for p in f.active_rails]
    peers = _majority([r for r in rates if r])
    want, _ = expected_rate(f, device, peers, "")
    known = [v for v in (want, bar, net.rate_gbits(port.rate)) if v]
    return max(known) / 8.0 if known else None


def rails_floor(
    nodes: Mapping[str, NodeFabric], used: Mapping[str, nccl_log.Transports]
) -> tuple[float | None, str]:
    """The cross-node busbw floor from the rails NCCL used:
    ``NET_EFFICIENCY[NET/IB] x min over nodes (sum of the expected rates of the rails NCCL used
    there)``; a rail's expected rate is what its card and its peers say it should carry
    (``expected_rate``) and the majority across nodes, never the degraded rate it reads. None
    (and why) where a node's rails or their rates are unknown."""
    sums = {}
    bar = across_rate(nodes)
    for name, f in nodes.items():
        t = used.get(name)
        if t is None or not t.net_used:
            return None, f"{name}: NCCL's log names no NET device its channels used"
        rates = [_expected_gbytes(f, d, bar) for d in t.used_devices()]
        if not rates or any(r is None for r in rates):
            return None, f"{name}: no rate for the rail(s) {', '.join(t.used_devices())}"
        sums[name] = sum(r for r in rates if r is not None)
    if not sums:
        return None, "no node"
    slowest = min(sums, key=lambda n: sums[n])
    eff = nccl_log.NET_EFFICIENCY[nccl_log.NET_IB]
    count = len(used[slowest].used_devices())
    return eff * sums[slowest], (
        f"{eff} x {count} rail(s) NCCL used on {slowest} x their rate = {eff} x"
        f" {sums[slowest]:g} GB/s"
    )


def one_rail_problems(
    nodes: Mapping[str, NodeFabric], busbw_gbps: float
) -> list[str]:  # fmt: skip
    """A node with several active rails whose run reached no more than one rail's rate."""
    found = []
    for name, f in sorted(nodes.items()):
        rails = f.active_rails
        rates = [p.rate_gbytes for p in rails if p.rate_gbytes]
        if len(rails) > 1 and rates and busbw_gbps <= max(rates):
            found.append(
                f"{name}: busbw {busbw_gbps:.1f} GB/s is one rail's worth ({max(rates):g} GB/s)"
                f" with {len(rails)} active rails: the others sat idle in effect"
            )
    return found


GDR_CHANNEL = "/GDRDMA"


def gdr_problems(name: str, node: NodeFabric, t: nccl_log.Transports, has_gpu: bool) -> list[str]:
    """Where a node's GPUs talk over IB/RoCE, NCCL must use GPUDirect RDMA (``/GDRDMA``) on
    every channel of every GPU that has one (a GPU with a rail): a GPU whose IB/RoCE channels
    go without it FAILs, named, even while the others use it; else FAIL naming why, from what
    is known."""
    if not has_gpu or nccl_log.NET_IB not in t.families:
        return []
    plain = sorted((g for g, (_, off) in t.ib_gpus.items() if off), key=_gpu_order)
    if t.gdrdma and plain:
        with_it = sorted((g for g, (on, _) in t.ib_gpus.items() if on), key=_gpu_order)
        return [
            f"{name}: GPU(s) {', '.join(plain)} send over IB/RoCE without GPUDirect RDMA"
            f" (channels without {GDR_CHANNEL}; with it: {', '.join(with_it) or 'none'}):"
            f" {'; '.join(_gdr_causes(node, t))}"
        ]
    if t.gdrdma:
        return []
    why = "; ".join(_gdr_causes(node, t))
    return [f"{name}: NCCL's channels over IB/RoCE show no {GDR_CHANNEL}: {why}"]


def _gpu_order(gpu: str) -> tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)


def _gdr_causes(node: NodeFabric, t: nccl_log.Transports) -> list[str]:
    """Why GPUDirect RDMA is off, from NCCL's own lines and the fabric reader's facts."""
    why = [line for line in t.gdr_lines if "Disabled" in line][:2]
    if node.gdr.peermem is False and not node.gdr.dmabuf:
        why.append("nvidia_peermem is not loaded (modprobe nvidia-peermem) and no dma-buf")
    why += [f"ACS redirect on {b} (peer-to-peer goes through the root complex)"
            for b in node.gdr.acs_bridges]  # fmt: skip
    why += [f"GPU and NIC far apart: {p}" for p in node.gdr.far_pairs]
    why += [f"rail {hca} is {far}" for hca, far in sorted(node.far_rails.items())]
    if not why:
        why.append(
            "cause not read here: look at NCCL_NET_GDR_LEVEL, the GPU-NIC PCI distance and ACS"
        )
    return why


# ---------------------------------------------------------------- perftest (ib_write_bw)

# perftest's summary row under the header
# " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
# (github.com/linux-rdma/perftest/issues/273; with MB/sec units without --report_gbits,
# issues/234).
_PERF_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(Gb|MB)/sec\]\s+BW average\[(Gb|MB)/sec\]"
)
_PERF_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def parse_ib_write_bw(text: str) -> dict[str, float] | None:
    """The last summary row of ib_write_bw: bytes, iterations, peak and average in GB/s
    (decimal: Gb/sec / 8, MB/sec / 1000); None when there is none."""
    unit = None
    found = None
    for line in text.splitlines():
        head = _PERF_HEADER.search(line)
        if head:
            unit = head.group(2)
            continue
        row = _PERF_ROW.match(line)
        if row and unit:
            scale = 1 / 8 if unit == "Gb" else 1 / 1000
            found = {
                "bytes": float(row.group(1)),
                "iterations": float(row.group(2)),
                "peak_gbps": float(row.group(3)) * scale,
                "average_gbps": float(row.group(4)) * scale,
            }
    return found


# ---------------------------------------------------------------- the node check


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.fabric")
    parser.add_argument("--nccl", action="store_true", help="open a one-rank NCCL communicator")
    args = parser.parse_args(argv)
    root = os.environ.get(ROOT_ENV, "/")
    log = ranklog.RankLog(ranklog.RankConfig.load().events, 0)
    log.mark(NAME, "start")
    node = read_node(root, os.environ)
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, 0, 1)
    with ranklog.Heartbeat(log, NAME):
        rank.mark("nccl")
        if args.nccl:
            loaded = _nccl_loaded(rank)
            if "error" in loaded:
                node.why_no_log = str(loaded["error"])
            else:
                node.loaded = nccl_log.merge([loaded])
        else:
            node.why_no_log = "no GPU with CuPy here: NCCL was not started"
        node.after = net.all_port_counters(root)
        rank.mark("done")
    rank.log.result(NAME, node.to_dict())
    return 0


def _nccl_loaded(rank: ranklog.RankContext) -> dict[str, object]:
    """A one-rank NCCL communicator, for NCCL's own word on the settings and NET devices."""
    debug_file = rank.events / "nccl-fabric.log"
    os.environ.update(
        NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,NET", NCCL_DEBUG_FILE=str(debug_file)
    )
    try:
        import cupy as cp
        from cupy.cuda import nccl
    except ImportError as exc:
        return {"error": f"cupy cannot be imported: {exc}"}
    cp.cuda.Device(0).use()
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    comm.destroy()
    return nccl_log.read(debug_file)


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    facts = NodeFabric.from_dict(payloads[0])
    found, notes = rail_problems(facts)
    more, said = settings_problems(facts)
    found += rate_problems(facts) + more + counter_problems(facts.before, facts.after)
    required = bool(ctx.thresholds.get("fabric", {}).get("gdr_required", True))
    found += node_gdr_problems(facts, required)
    notes += said
    rails = facts.rails
    ms = [
        Measurement("rails", len(rails)),
        Measurement("rails_active", len(facts.active_rails), "", float(len(rails)), "min"),
    ]
    names = ", ".join(f"{p.device}:{p.port} {p.state} {p.rate}" for p in rails) or "none"
    passed = f"rails active: {names}" + (f"; {'; '.join(notes)}" if notes else "")
    details = {"node": facts.to_dict(), "notes": notes}
    return verdict(ctx, NAME, found, [], passed, ms, {}, details)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
