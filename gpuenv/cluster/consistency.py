"""Consistency: every node must run the same stack. Any disagreement fails, naming nodes and values.

Compared per node: the facts the node probe reports (driver, CUDA, NCCL, Open MPI, Python and
its packages, GPU model and count, NCCL environment) merged with the ``versions`` that
``gpuenv check`` reported there. A fact present on some nodes and absent on others is a
disagreement too: a node missing a package runs a different stack.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuenv.results import CLUSTER_NODE, Measurement, Result, Status

ABSENT = "<absent>"
# Facts that legitimately differ between nodes.
IGNORED = frozenset({"hostname"})
# The NCCL settings the rdma_fabric role derives from a node's topology (its /etc/nccl.conf, as the
# node probe reads it): nodes of one type (GPU model and count) must agree on them; nodes of two
# types may differ (other NICs, other GID tables, other interface names). NCCL_IB_TC and NCCL_IB_SL
# are not here: traffic class and service level must match across the whole fabric.
PER_TYPE = frozenset(
    {
        "nccl.conf.NCCL_IB_HCA",
        "nccl.conf.NCCL_IB_GID_INDEX",
        "nccl.conf.NCCL_SOCKET_IFNAME",
    }
)
TYPE_KEYS = ("gpu.model", "gpu.count")


@dataclass(frozen=True)
class Disagreement:
    key: str
    # value -> the nodes that have it
    values: dict[str, list[str]]

    def describe(self) -> str:
        parts = [f"{v} on {', '.join(nodes)}" for v, nodes in self.values.items()]
        return f"{self.key}: " + "; ".join(parts)


def node_facts(probe: Mapping[str, str], checks: Iterable[Result]) -> dict[str, str]:
    """One flat fact table for a node: probe facts plus the versions its checks reported."""
    merged = dict(probe)
    for result in checks:
        for key, value in result.versions.items():
            merged.setdefault(f"versions.{key}", value)
    return merged


def node_type(table: Mapping[str, str]) -> str:
    """A node's type for the fabric settings: its GPU model and count (``NVIDIA H200 x8``)."""
    return " x".join(table.get(k, ABSENT) for k in TYPE_KEYS)


def _disagreement(key: str, facts: Mapping[str, Mapping[str, str]], fact: str) -> list:
    values: dict[str, list[str]] = {}
    for node, table in facts.items():
        values.setdefault(table.get(fact, ABSENT), []).append(node)
    if len(values) < 2:
        return []
    # Largest group first: the odd ones out read last.
    return [Disagreement(key, dict(sorted(values.items(), key=lambda kv: (-len(kv[1]), kv[0]))))]


def compare(facts: Mapping[str, Mapping[str, str]]) -> list[Disagreement]:
    """The facts on which the nodes do not all agree, in key order; the fabric settings
    (PER_TYPE) among the nodes of each type, named ``key (type)``."""
    keys = sorted({k for table in facts.values() for k in table} - IGNORED)
    types: dict[str, dict[str, Mapping[str, str]]] = {}
    for node, table in facts.items():
        types.setdefault(node_type(table), {})[node] = table
    found: list[Disagreement] = []
    for key in keys:
        if key not in PER_TYPE:
            found += _disagreement(key, facts, key)
            continue
        for kind, members in sorted(types.items()):
            found += _disagreement(f"{key} ({kind})" if len(types) > 1 else key, members, key)
    return found


def odd_nodes(disagreements: Iterable[Disagreement]) -> list[str]:
    """Nodes outside the majority value of at least one fact (all nodes of a tie)."""
    odd: set[str] = set()
    for d in disagreements:
        groups = list(d.values.values())
        majority = len(groups[0])
        tie = sum(1 for g in groups if len(g) == majority) > 1
        for group in groups if tie else groups[1:]:
            odd.update(group)
    return sorted(odd)


def consistency_result(facts: Mapping[str, Mapping[str, str]], duration_s: float = 0.0) -> Result:
    if len(facts) < 2:
        # needs_nodes: the verdict excuses this SKIP on a one-node cluster, and only there.
        return Result(
            check="consistency",
            node=CLUSTER_NODE,
            status=Status.SKIP,
            reason=f"{len(facts)} node(s) answered: nothing to compare",
            duration_s=duration_s,
            details={"needs_nodes": 2},
        )
    found = compare(facts)
    compared = len({k for t in facts.values() for k in t} - IGNORED)
    measurements = [
        Measurement("nodes", len(facts)),
        Measurement("facts_compared", compared),
        Measurement("disagreements", len(found), threshold=0, bound="max"),
    ]
    details = {
        "disagreements": [{"key": d.key, "values": d.values} for d in found],
        "odd_nodes": odd_nodes(found),
    }
    if found:
        return Result(
            check="consistency",
            node=CLUSTER_NODE,
            status=Status.FAIL,
            reason="nodes disagree: " + " | ".join(d.describe() for d in found),
            measurements=measurements,
            duration_s=duration_s,
            details=details,
        )
    return Result(
        check="consistency",
        node=CLUSTER_NODE,
        status=Status.PASS,
        reason=f"{len(facts)} nodes agree on {compared} facts",
        measurements=measurements,
        duration_s=duration_s,
        details=details,
    )
