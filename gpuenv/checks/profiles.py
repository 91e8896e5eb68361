"""The verdict rules of a node run: which checks a profile requires, and when a run is OK.

A run is OK only when nothing FAILed or ERRORed, every check the profile requires for this kind
of node PASSed, and something was verified at all. A SKIP is never a silent pass: a required
check that skipped makes the run not OK, and the console groups every SKIP by its reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.checks.base import Check, NodeInfo, Placement
from gpuenv.errors import BadInput
from gpuenv.results import CLUSTER_NODE, ClusterReport, Result, RunVerdict, Status


def profile_names(thresholds: Mapping[str, Any]) -> list[str]:
    return list(thresholds.get("profiles", {}))


def requirements(
    thresholds: Mapping[str, Any], profile: str, gpu_node: bool, scope: str = "node"
) -> list[str] | None:
    """The checks ``profile`` requires on this kind of node (``scope`` node) or on a cluster of
    such nodes (``scope`` cluster); None: the profile is not for it."""
    profiles = thresholds.get("profiles", {})
    if profile not in profiles:
        raise BadInput(f"--profile {profile}: unknown profile; known: {', '.join(profiles)}")
    requires = profiles[profile].get("requires", {})
    names = requires.get(f"{'gpu' if gpu_node else 'cpu'}_{scope}")
    return None if names is None else [str(n) for n in names]


def is_optional(check: Check) -> bool:
    """An optional check (``OPTIONAL = True``) runs only when asked for."""
    return check.OPTIONAL


def default_names(
    registry: Mapping[str, Check], thresholds: Mapping[str, Any], profile: str
) -> list[str]:
    """The checks a run without ``--only`` runs: every check that is not optional, and the
    optional ones the profile requires on either kind of node (``frameworks``)."""
    wanted = set()
    for gpu_node in (True, False):
        wanted.update(requirements(thresholds, profile, gpu_node) or [])
    return [n for n, c in registry.items() if not is_optional(c) or n in wanted]


def assess(
    thresholds: Mapping[str, Any],
    profile: str,
    node: NodeInfo,
    results: Sequence[Result],
    registry: Mapping[str, Check],
    expect_gpus: int | None = None,
) -> RunVerdict:
    """Apply the rules to one node's results."""
    # The user's count wins over what the bus shows (a lab container sees its host's bus).
    gpu_node = expect_gpus > 0 if expect_gpus is not None else bool(node.gpus or node.pci_gpus)
    kind = "gpu" if gpu_node else "cpu"
    by_name = {r.check: r for r in results}
    problems = [f"{r.check} {r.status.value}: {r.reason}" for r in results if r.status.failed]
    wanted = requirements(thresholds, profile, gpu_node)
    required: list[str] = []
    if wanted is None:
        other = "GPU" if not gpu_node else "CPU-only"
        problems.append(
            f"profile {profile!r} is for {other} nodes and this is a {kind.upper()} node"
            f" ({_node_words(node)}): nothing it requires could be verified here"
        )
    else:
        for name in wanted:
            check = registry.get(name)
            if check is None or name not in by_name:
                continue  # not selected (--only) or not a known check
            if not check.needed(node):
                continue
            required.append(name)
            result = by_name[name]
            if result.status is Status.SKIP:
                problems.append(f"required check {name} did not run: {result.reason}")
    passed = [r for r in results if r.status is Status.PASS]
    if not passed:
        problems.append("nothing was verified: no check passed")
    probe = next((n for n, c in registry.items() if c.PLACEMENT is Placement.PROBE), None)
    # A GPU is verified when a check other than the probe passed on a node with GPUs to use:
    # NVML listing a GPU is not the GPU computing.
    gpu_verified = bool(node.gpus) and any(r.check != probe for r in passed)
    return RunVerdict(
        ok=not problems,
        profile=profile,
        node_kind=kind,
        required=required,
        problems=problems,
        gpu_verified=gpu_verified,
    )


def _node_words(node: NodeInfo) -> str:
    if node.gpus:
        return f"{len(node.gpus)} GPU(s) visible"
    if node.pci_gpus:
        return f"{len(node.pci_gpus)} NVIDIA GPU(s) on the PCI bus, none usable"
    return "no NVIDIA GPU on the PCI bus or through NVML"


def assess_cluster(
    thresholds: Mapping[str, Any], profile: str, report: ClusterReport
) -> RunVerdict:
    """The rules for a whole cluster: every node's own verdict, and the cluster-wide checks the
    profile requires (those of the stages that ran: not the ones left out, nor multi-node runs
    of a one-node cluster)."""
    problems = [
        f"{r.node} {r.check} {r.status.value}: {r.reason}"
        for r in report.results
        if r.status.failed
    ]
    for node, run in report.node_reports.items():
        problems += [f"{node}: {p}" for p in run.verdict.problems if " FAIL: " not in p
                     and " ERROR: " not in p]  # fmt: skip
    kinds = {run.verdict.node_kind for run in report.node_reports.values()}
    gpu = "gpu" in kinds
    cluster = {r.check: r for r in report.results if r.node == CLUSTER_NODE}
    wanted = requirements(thresholds, profile, gpu, "cluster")
    required: list[str] = []
    if wanted is None:
        problems.append(
            f"profile {profile!r} is not for a cluster of {'GPU' if gpu else 'CPU-only'} nodes"
        )
    else:
        for name in wanted:
            result = cluster.get(name)
            if result is None:
                continue  # its stage was left out
            if result.status is Status.SKIP and "multi-node runs need 2" in result.reason:
                continue
            required.append(name)
            if result.status is Status.SKIP:
                problems.append(f"required check {name} did not run: {result.reason}")
    if not any(r.status is Status.PASS for r in report.results if r.check != "reach"):
        problems.append("nothing was verified: no check passed")
    gpu_verified = any(run.verdict.gpu_verified for run in report.node_reports.values())
    return RunVerdict(
        ok=not problems,
        profile=profile,
        node_kind="gpu" if gpu else "cpu",
        required=required,
        problems=problems,
        gpu_verified=gpu_verified,
    )
