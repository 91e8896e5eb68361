"""The verdict rules of a node run: which checks a profile requires, and when a run is OK.

A run is OK only when nothing FAILed or ERRORed, every check the profile requires for this kind
of node PASSed, something was verified at all, and, on a GPU node, its GPUs were verified
(``gpu_proof``) whatever ``--only`` selected. A SKIP is never a silent pass: a required check
that skipped makes the run not OK, and the console groups every SKIP by its reason. On a cluster
(``assess_cluster``) the checks that need two nodes are excused on a one-node cluster, and the
excused SKIP says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuenv.checks.base import CAVEAT, NOT_JUDGED, Check, NodeInfo, Placement
from gpuenv.errors import BadInput
from gpuenv.results import CLUSTER_NODE, ClusterReport, Result, RunVerdict, Status


def skipped(name: str, result: Result) -> str:
    """Why a required check that SKIPped proves nothing: it did not run, or it ran and measured
    with nothing to judge the measurement by (a GPU missing from the spec table)."""
    if result.details.get(NOT_JUDGED):
        return f"required check {name} ran but was not judged: {result.reason}"
    return f"required check {name} did not run: {result.reason}"


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


def with_probe(registry: Mapping[str, Check], names: Sequence[str]) -> list[str]:
    """``names`` and the probe, in registry order: the probe runs first in every run anyway, and
    its verdict (the GPUs the bus shows, all seen by the driver) counts whatever ``--only`` says."""
    return [n for n, c in registry.items() if n in names or c.PLACEMENT is Placement.PROBE]


def gpu_proof(
    node: NodeInfo,
    results: Sequence[Result],
    registry: Mapping[str, Check],
    gpu_subset: bool = False,
) -> str | None:
    """Why the GPUs of a GPU node were not verified by this run; None when they were.

    ``--only`` (and ``--expect-gpus``) narrow what runs, never what a GPU node must prove: the
    probe PASSed (the driver sees every GPU the bus shows, or ``--expect-gpus`` says), and a check
    that runs one rank on every visible GPU (GPU placement) PASSed. NVML listing a GPU is not the
    GPU computing. A run that sees fewer GPUs than the node has (``CUDA_VISIBLE_DEVICES``) has
    not verified the node's GPUs, unless the user asked for that subset (``--gpu-subset``).
    """
    by_name = {r.check: r for r in results}
    probe = next((n for n, c in registry.items() if c.PLACEMENT is Placement.PROBE), None)
    seen = by_name.get(probe) if probe else None
    if seen is None:
        return f"GPU node ({_node_words(node)}): GPUs not verified: the probe ({probe}) did not run"
    if seen.status is not Status.PASS:
        return (
            f"GPU node ({_node_words(node)}): GPUs not verified:"
            f" {probe} {seen.status.value}: {seen.reason}"
        )
    if node.subset and not gpu_subset:
        return (
            f"GPU node ({_node_words(node)}): GPUs not verified: {node.subset}; the others were"
            " never exercised (give --gpu-subset to verify only the visible ones)"
        )
    on_gpus = [n for n, c in registry.items() if c.PLACEMENT is Placement.GPU]
    if any(by_name[n].status is Status.PASS for n in on_gpus if n in by_name):
        return None
    ran = [n for n in on_gpus if n in by_name]
    why = "none of them passed" if ran else "none of them was selected (--only)"
    return (
        f"GPU node ({_node_words(node)}): GPUs not verified: no check that runs on every GPU"
        f" ({', '.join(on_gpus)}) passed; {why}"
    )


# The start of a node verdict's problem naming the checks it left to gpuenv cluster's launches.
LEFT_TO_CLUSTER = "left to gpuenv cluster's launches: "


def _stands_for(report: ClusterReport, node: str, problem: str) -> bool:
    """Whether the cluster's own results stand for every check ``problem`` says ``node`` left
    to them (each named in a result's details.node_checks_left_here, and not skipped)."""
    left = problem[len(LEFT_TO_CLUSTER) :].split(" (--left-to-cluster)")[0].split(", ")
    covering = {
        r.check
        for r in report.results
        if r.node == CLUSTER_NODE
        and node in r.details.get("node_checks_left_here", [])
        and r.status is not Status.SKIP
    }
    return all(check in covering for check in left)


def assess(
    thresholds: Mapping[str, Any],
    profile: str,
    node: NodeInfo,
    results: Sequence[Result],
    registry: Mapping[str, Check],
    expect_gpus: int | None = None,
    gpu_subset: bool = False,
    left_to_cluster: Sequence[str] = (),
) -> RunVerdict:
    """Apply the rules to one node's results. Checks ``left_to_cluster`` (gpuenv cluster runs
    them across the nodes and requires them there) are not required here, and a run that left
    some counts as verifying something even when none of its own checks passed (a CPU node whose
    only passing checks are the ddp and mpi its cluster runs)."""
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
                problems.append(skipped(name, result))
    if not any(r.status is Status.PASS for r in results) and not left_to_cluster:
        problems.append("nothing was verified: no check passed")
    if left_to_cluster:
        # Alone, the node run has not verified them: gpuenv cluster's verdict drops this problem
        # where its own results stand for them (assess_cluster).
        problems.append(
            f"{LEFT_TO_CLUSTER}{', '.join(left_to_cluster)} (--left-to-cluster): this run did not"
            " verify them; only a gpuenv cluster report whose launches ran them makes it OK"
        )
    unverified = (
        gpu_proof(node, results, registry, gpu_subset) if node.gpus or gpu_node else "no GPU"
    )
    if gpu_node and unverified and not any(unverified.endswith(p) for p in problems):
        problems.append(unverified)
    gpu_verified = bool(node.gpus) and unverified is None
    return RunVerdict(
        ok=not problems,
        profile=profile,
        node_kind=kind,
        required=required,
        problems=problems,
        gpu_verified=gpu_verified,
        gpus_note=node.subset or "",
        left_to_cluster=list(left_to_cluster),
        caveats=[
            f"{r.check}: {r.details[CAVEAT]}"
            for r in results
            if r.status is Status.PASS and r.details.get(CAVEAT)
        ],
    )


def _node_words(node: NodeInfo) -> str:
    if node.gpus:
        return f"{len(node.gpus)} GPU(s) visible"
    if node.pci_gpus:
        return f"{len(node.pci_gpus)} NVIDIA GPU(s) on the PCI bus, none usable"
    return "no NVIDIA GPU on the PCI bus or through NVML"


# What the verdict appends to the reason of a SKIP it excuses, so that every report says so.
EXCUSED_ONE_NODE = "excused: not required on a one-node cluster"


def _needs_two_nodes(result: Result) -> bool:
    """A cluster check that cannot mean anything on one node: one that compares nodes (it says so
    with ``details.needs_nodes``) or a multi-node run the pipeline did not start."""
    needs = int(result.details.get("needs_nodes", 1))
    return needs >= 2 or "multi-node runs need 2" in result.reason


def _gpu_count(facts: Mapping[str, Any]) -> int:
    """GPUs the cluster probe saw on a node (nvidia-smi, as CUDA_VISIBLE_DEVICES narrows it)."""
    try:
        return int(facts.get("gpu.count") or 0)
    except ValueError:
        return 0


def _unchecked_gpu_nodes(report: ClusterReport) -> list[str]:
    """Nodes with GPUs that have no `gpuenv check` report: the stages narrow what runs across
    the nodes (``--skip check``), never what a GPU node must prove (``gpu_proof``)."""
    ran = {r.node for r in report.results if r.check == "check"}  # its own ERROR says why
    return [
        f"{node}: GPU node ({_gpu_count(facts)} GPU(s) seen by nvidia-smi): GPUs not verified:"
        " no gpuenv check ran there (the check stage was left out)"
        for node, facts in report.facts.items()
        if _gpu_count(facts) and node not in report.node_reports and node not in ran
    ]


def assess_cluster(
    thresholds: Mapping[str, Any], profile: str, report: ClusterReport
) -> RunVerdict:
    """The rules for a whole cluster: every node's own verdict, and the cluster-wide checks the
    profile requires (those of the stages that ran: not the ones left out).

    A cluster of one node (``--limit node1``) is judged by the checks that make sense for one
    node: a SKIP of a check that needs two nodes (consistency, the multi-node runs, the pair
    matrix) is excused there, and its reason says so (``EXCUSED_ONE_NODE``). On a cluster of
    several nodes of which only one answered, it is not: those nodes were meant to be compared.
    """
    problems = [
        f"{r.node} {r.check} {r.status.value}: {r.reason}"
        for r in report.results
        if r.status.failed
    ]
    for node, run in report.node_reports.items():
        # In this report the cluster's results stand for what the node left to them: the node's
        # verdict here (node_verdicts) is the node run's, that problem settled.
        settled = [
            p for p in run.verdict.problems
            if p.startswith(LEFT_TO_CLUSTER) and _stands_for(report, node, p)
        ]  # fmt: skip
        if settled:
            rest = [p for p in run.verdict.problems if p not in settled]
            run.verdict = replace(run.verdict, ok=not rest, problems=rest)
        problems += [
            f"{node}: {p}"
            for p in run.verdict.problems
            if " FAIL: " not in p and " ERROR: " not in p
        ]
    one_node = len(report.hosts) == 1
    for result in report.results:
        if (
            one_node
            and result.node == CLUSTER_NODE
            and result.status is Status.SKIP
            and _needs_two_nodes(result)
            and EXCUSED_ONE_NODE not in result.reason
        ):
            result.reason = f"{result.reason} ({EXCUSED_ONE_NODE})"
    problems += _unchecked_gpu_nodes(report)
    kinds = {run.verdict.node_kind for run in report.node_reports.values()}
    gpu = "gpu" in kinds or any(_gpu_count(f) for f in report.facts.values())
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
            if result.status is Status.SKIP and EXCUSED_ONE_NODE in result.reason:
                continue
            required.append(name)
            if result.status is Status.SKIP:
                problems.append(skipped(name, result))
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
        caveats=[
            f"{node}: {caveat}"
            for node, run in report.node_reports.items()
            for caveat in run.verdict.caveats
        ],
    )
