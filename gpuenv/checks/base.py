"""The check contract: what every node check is, and what the engine gives it.

A check is a module (or any object) with these attributes, listed once in
``gpuenv.checks.REGISTRY``:

- ``NAME``, ``DESCRIPTION``: how it is called and what it proves, one line.
- ``PLACEMENT``: where its ranks run, which is all the engine (gpuenv.checks.session) knows of it:
  ``PROBE``: one process, first, before any other check; its ``node_info(payload)`` describes
  the node (GPUs, what the PCI bus shows) for every other check, and ``early_node(ctx)``
  guesses that answer from files so the launchers can start during the probe. ``GPU``: one
  rank per visible GPU, inside the shared GPU worker processes (gpuenv.checks.worker), one
  check after the other. ``LAUNCHER``: its own launcher (torchrun, mpirun) given by
  ``command``; its ranks run ``python -m <module>`` (the module's ``main(argv)``), read their
  context with ``ranklog.launched_rank`` and wait at the gate.
- ``OPTIONAL``: True when it runs only when asked (``--only``, or a profile that requires it).
- ``needed(node)``: whether a profile that requires it requires it on this node (NCCL needs two
  GPUs to prove anything); ``always_needed`` for a check that is needed wherever it is required.
- ``unavailable(ctx, node)``: None when it can run here, else why not (the SKIP's reason).
- ``world(ctx, node)``: how many ranks (GPU placement: one per visible GPU).
- ``rank_main(rank: RankContext) -> payload`` for PROBE and GPU placement: one rank's work.
- ``command(ctx, node, world)`` and ``environment(ctx, node)`` for LAUNCHER placement.
- ``judge(ctx, node, payloads, world) -> Result``: the verdict from every rank's payload.

Heavy libraries (cupy, torch, mpi4py, pynvml) are imported inside functions only, so that
listing, skipping and judging checks costs nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuenv.checks.ranklog import RankContext
from gpuenv.results import Measurement, Result, Status


class Placement(str, enum.Enum):
    PROBE = "probe"
    GPU = "gpu"
    LAUNCHER = "launcher"


@dataclass
class NodeInfo:
    """What the probe found: the GPUs the checks may use, and why there are none."""

    gpus: list[dict[str, Any]] = field(default_factory=list)  # visible GPUs, NVML's view
    no_gpu: str | None = None  # why no GPU can be used (None when there are GPUs)
    pci_gpus: list[str] = field(default_factory=list)  # NVIDIA GPUs on the PCI bus (addresses)
    nvml_gpus: int = 0  # GPUs NVML lists, whatever CUDA_VISIBLE_DEVICES hides
    visible_spec: str | None = None  # CUDA_VISIBLE_DEVICES as the run saw it (None: unset)
    rdma_ports: list[str] = field(default_factory=list)  # InfiniBand/RoCE ports (mlx5_0/1)
    rdma_invisible: list[str] = field(default_factory=list)  # RDMA adapters with no RDMA device

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def subset(self) -> str | None:
        """``1 of 8 GPUs visible: CUDA_VISIBLE_DEVICES=0`` when the run sees fewer GPUs than the
        node has (the PCI bus, or NVML where it lists more); None when it sees them all."""
        total = max(len(self.pci_gpus), self.nvml_gpus)
        if not self.gpus or len(self.gpus) >= total:
            return None
        spec = "unset" if self.visible_spec is None else repr(self.visible_spec).strip("'")
        return f"{len(self.gpus)} of {total} GPUs visible: CUDA_VISIBLE_DEVICES={spec}"


@dataclass
class Context:
    """What the parent knows when it starts the checks."""

    node: str
    profile: str = "quick"
    expect_gpus: int | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    specs: dict[str, Any] = field(default_factory=dict)
    deadline_override_s: float | None = None
    strict: bool = False  # a measurement without a threshold FAILs instead of SKIPping
    gpu_subset: bool = False  # --gpu-subset: the visible GPUs are all the run must verify
    # --mpi-host-staging: a GPU node whose MPI does not carry device buffers is accepted, with a
    # caveat on the verdict line (checks/mpi.py).
    mpi_host_staging: bool = False

    def deadline_s(self, check: str) -> float:
        if self.deadline_override_s is not None:
            return self.deadline_override_s
        spans = self.thresholds.get("deadlines_s", {})
        if check not in spans:
            raise KeyError(f"no deadline for check {check!r} in thresholds.yaml deadlines_s")
        return float(spans[check])

    def profile_params(self, check: str) -> dict[str, Any]:
        return dict(self.thresholds.get("profiles", {}).get(self.profile, {}).get(check, {}))


class Check(Protocol):
    """The contract (see the module docstring). Modules satisfy it with module-level names."""

    NAME: str
    DESCRIPTION: str
    PLACEMENT: Placement
    OPTIONAL: bool

    def needed(self, node: NodeInfo) -> bool: ...

    def unavailable(self, ctx: Context, node: NodeInfo) -> str | None: ...

    def world(self, ctx: Context, node: NodeInfo) -> int: ...

    def judge(
        self, ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
    ) -> Result: ...


class RankCheck(Check, Protocol):
    """PROBE and GPU placement: the engine calls ``rank_main`` in its own processes."""

    def rank_main(self, rank: RankContext) -> dict[str, Any]: ...


class ProbeCheck(RankCheck, Protocol):
    def node_info(self, payload: Mapping[str, Any] | None, why: str | None) -> NodeInfo: ...

    def early_node(self, ctx: Context) -> NodeInfo | None:
        """The probe's answer guessed from files in milliseconds, before the probe runs, so
        that the launchers (seconds to start) start during the probe; None when no guess is
        safe. A guess decides nothing: the engine keeps a launch started on it only when the
        probe's own answer gives the same command and environment."""
        ...


class LaunchedCheck(Check, Protocol):
    """LAUNCHER placement: the engine starts ``command``; the ranks run the check's module."""

    def command(self, ctx: Context, node: NodeInfo, world: int) -> list[str]: ...

    def environment(self, ctx: Context, node: NodeInfo) -> dict[str, str]: ...

    def main(self, argv: Sequence[str]) -> int:
        """A rank's process (``python -m`` of the check's module): set up, wait at the gate,
        do the work under ``ranklog.launched_rank``, post the payload."""
        ...


def always_needed(node: NodeInfo) -> bool:
    """``needed`` of a check that a profile requires on every node it requires it on."""
    return True


def measurement(
    name: str,
    value: float | int | str | bool,
    unit: str = "",
    threshold: float | None = None,
    bound: str | None = None,
) -> dict[str, Any]:
    """A Measurement as a plain dict, the form ranks write to their event files."""
    return {"name": name, "value": value, "unit": unit, "threshold": threshold, "bound": bound}


def module_version(name: str) -> str | None:
    """Version of an installed distribution without importing it (cheap in the parent)."""
    from importlib import metadata

    dists = {
        "cupy": ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"),
        "nvidia-ml-py": ("nvidia-ml-py",),
    }.get(name, (name,))
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def has_module(module: str) -> bool:
    """True when ``module`` can be imported here (found, not imported)."""
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def rank_problems(
    payloads: Mapping[int, Mapping[str, Any]], world: int, min_ranks: int, what: str
) -> list[str]:
    """The first rule of a collective's judge: every rank's own ``errors``, by rank, and a world
    too small for ``what`` (a collective with itself) to prove anything."""
    found = [f"rank {r}: {e}" for r, p in sorted(payloads.items()) for e in p.get("errors", [])]
    if world < min_ranks:
        found.append(f"{world} rank(s): {what} with itself proves nothing")
    return found


# details key of a check that ran and measured, with nothing to judge a measurement by.
NOT_JUDGED = "not_judged"
# details key of a result that passed on something the user accepted and users' code will meet
# (the run verdict's caveats, gpuenv.checks.profiles).
CAVEAT = "caveat"


def verdict(
    ctx: Context,
    check: str,
    problems: list[str],
    unjudged: list[str],
    passed: str,
    measurements: list[Measurement],
    versions: Mapping[str, str] | None = None,
    details: Mapping[str, Any] | None = None,
) -> Result:
    """The one rule of every judge: any problem FAILs; a measurement without a threshold is
    never a PASS (SKIP naming what is missing, FAIL under ``--strict``); else PASS."""
    common = {
        "measurements": measurements,
        "versions": dict(versions or {}),
        "details": dict(details or {}),
    }
    if problems:
        return Result(check, ctx.node, Status.FAIL, "; ".join(problems), **common)
    if unjudged:
        status = Status.FAIL if ctx.strict else Status.SKIP
        why = f"{passed}; NOT JUDGED: {'; '.join(unjudged)}"
        if ctx.strict:
            why += " (--strict: a measurement without a threshold fails)"
        # It ran: the run verdict says so, not "did not run" (see profiles.skipped).
        common["details"][NOT_JUDGED] = list(unjudged)
        return Result(check, ctx.node, status, why, **common)
    return Result(check, ctx.node, Status.PASS, passed, **common)


# mpirun --version answers in well under a second; past this it is not Open MPI's.
MPIRUN_VERSION_DEADLINE_S = 20.0


def is_open_mpi() -> bool:
    """Whether the mpirun on PATH is Open MPI's (its flags below mean nothing to another MPI)."""
    from gpuenv import proc

    try:
        done = proc.capture(["mpirun", "--version"], MPIRUN_VERSION_DEADLINE_S)
    except OSError:
        return False
    said = done.stdout + done.stderr
    return done.returncode is not None and ("Open MPI" in said or "OpenRTE" in said)


def mpirun_flags(open_mpi: bool) -> list[str]:
    """What a user of Open MPI adds: more ranks than cores, and root's explicit consent."""
    import os

    if not open_mpi:
        return []
    return ["--oversubscribe", *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
