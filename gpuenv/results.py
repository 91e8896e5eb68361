"""The result type every check, cluster run and report shares, and its JSON schema.

A ``Result`` is one verdict of one check on one node. Reports (console, JSON, JUnit,
HTML) are all rendered from lists of Results, so this module is the single place
where their shape is defined. ``SCHEMA_VERSION`` changes whenever a field does.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 2
# The pseudo-node of the results that belong to the whole cluster (the cluster stages').
CLUSTER_NODE = "cluster"


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"

    @property
    def failed(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


@dataclass(frozen=True)
class Measurement:
    """One measured value with its unit, and the threshold it was judged against."""

    name: str
    value: float | int | str | bool
    unit: str = ""
    threshold: float | None = None
    # "min": value must be >= threshold; "max": value must be <= threshold.
    bound: str | None = None

    def ok(self) -> bool | None:
        """True/False when judged against a threshold, None when only reported."""
        if self.threshold is None or self.bound is None:
            return None
        if not isinstance(self.value, (int, float)) or isinstance(self.value, bool):
            return None
        if self.bound == "min":
            return self.value >= self.threshold
        if self.bound == "max":
            return self.value <= self.threshold
        raise ValueError(f"unknown bound {self.bound!r}: expected 'min' or 'max'")


@dataclass
class Result:
    check: str
    node: str
    status: Status
    reason: str = ""
    measurements: list[Measurement] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    # Free-form structured detail (per-size sweep, per-pair matrix, ranks that hung).
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status is Status.SKIP and not self.reason:
            raise ValueError(f"check {self.check!r} on {self.node!r}: a SKIP must say why")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        return cls(
            check=str(data["check"]),
            node=str(data["node"]),
            status=Status(data["status"]),
            reason=str(data.get("reason", "")),
            measurements=[Measurement(**m) for m in data.get("measurements", [])],
            versions={str(k): str(v) for k, v in data.get("versions", {}).items()},
            duration_s=float(data.get("duration_s", 0.0)),
            details=dict(data.get("details", {})),
        )


def any_failed(results: Iterable[Result]) -> bool:
    """True when a result failed or errored. Not the verdict: see RunVerdict (SKIPs count there)."""
    return any(r.status.failed for r in results)


@dataclass
class RunVerdict:
    """Whether a run is OK, by the rules of its profile (gpuenv.checks.profiles)."""

    ok: bool
    profile: str
    node_kind: str  # "gpu" or "cpu"; "" where the run does not classify nodes (doctor)
    required: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why it is not OK
    gpu_verified: bool = False
    gpus_note: str = ""  # "1 of 8 GPUs visible: CUDA_VISIBLE_DEVICES=0" where the run saw fewer
    # Checks this node run left to gpuenv cluster's launches (--left-to-cluster): its OK stands
    # only with the cluster's results for them, which the cluster's verdict requires.
    left_to_cluster: list[str] = field(default_factory=list)
    # What the run accepted on the user's word that users' code will meet (a result's
    # details["caveat"]): "mpi: ... MPI code that hands GPU arrays to MPI will crash on this node".
    caveats: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.ok and self.problems:
            raise ValueError("an OK verdict cannot list problems")
        if not self.ok and not self.problems:
            raise ValueError("a verdict that is not OK must say why")
        if self.node_kind not in ("gpu", "cpu", ""):
            raise ValueError(f"node_kind must be 'gpu', 'cpu' or '', not {self.node_kind!r}")

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunVerdict:
        return cls(
            ok=bool(data["ok"]),
            profile=str(data["profile"]),
            node_kind=str(data["node_kind"]),
            required=[str(n) for n in data.get("required", [])],
            problems=[str(p) for p in data.get("problems", [])],
            gpu_verified=bool(data.get("gpu_verified", False)),
            gpus_note=str(data.get("gpus_note", "")),
            left_to_cluster=[str(n) for n in data.get("left_to_cluster", [])],
            caveats=[str(c) for c in data.get("caveats", [])],
        )


def _refuse(data: Mapping[str, Any], kind: str) -> None:
    """A document of another kind or schema version is refused, naming what it is."""
    if data.get("kind") != kind:
        raise ValueError(f"not a {kind} report: kind is {data.get('kind')!r}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{kind} report schema_version {version!r} is not supported (expected {SCHEMA_VERSION})"
        )


# Identifies a document written by `gpuenv check --json`; readers refuse anything else.
REPORT_KIND = "gpuenv-check"


@dataclass
class RunReport:
    """One `gpuenv check` run on one node: the document `--json` writes (docs/checks.md).

    The cluster side runs `gpuenv check --json -` on each node and merges the
    ``results`` lists; every field needed to tell nodes apart is in each Result too.
    """

    node: str
    profile: str
    verdict: RunVerdict
    results: list[Result] = field(default_factory=list)
    started_at: str = ""
    duration_s: float = 0.0
    command: list[str] = field(default_factory=list)
    gpuenv_version: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": REPORT_KIND,
            "gpuenv_version": self.gpuenv_version,
            "node": self.node,
            "profile": self.profile,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "command": list(self.command),
            "ok": self.ok,
            "exit_code": self.verdict.exit_code,
            "verdict": self.verdict.to_dict(),
            "results": [r.to_dict() for r in self.results],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunReport:
        _refuse(data, REPORT_KIND)
        return cls(
            node=str(data["node"]),
            profile=str(data.get("profile", "")),
            verdict=RunVerdict.from_dict(data["verdict"]),
            results=[Result.from_dict(r) for r in data.get("results", [])],
            started_at=str(data.get("started_at", "")),
            duration_s=float(data.get("duration_s", 0.0)),
            command=[str(c) for c in data.get("command", [])],
            gpuenv_version=str(data.get("gpuenv_version", "")),
        )


CLUSTER_KIND = "gpuenv-cluster"


@dataclass
class ClusterReport:
    """One `gpuenv cluster` run: the document `--json` writes and the HTML report is drawn from.

    ``results`` holds the nodes' own check results and the cluster stages' (node
    ``CLUSTER_NODE``); ``node_reports`` each node's run report, its verdict included. The JSON
    document keeps each node's verdict (``node_verdicts``); its results are in ``results``.
    """

    hosts: list[str]
    profile: str = "quick"
    verdict: RunVerdict | None = None
    results: list[Result] = field(default_factory=list)
    node_reports: dict[str, RunReport] = field(default_factory=dict)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)
    # busbw against message size, per node (from the torchrun stage)
    sweeps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # GB/s per node pair (None: the pair's run failed)
    matrix: dict[tuple[str, str], float | None] = field(default_factory=dict)
    isolation: dict[str, Any] | None = None
    # What the bandwidths were judged against (plots draw these lines).
    thresholds: dict[str, float | None] = field(default_factory=dict)
    duration_s: float = 0.0
    started_at: str = ""
    command: list[str] = field(default_factory=list)
    gpuenv_version: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": CLUSTER_KIND,
            "gpuenv_version": self.gpuenv_version,
            "hosts": list(self.hosts),
            "profile": self.profile,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "command": list(self.command),
            "ok": self.ok,
            "exit_code": 0 if self.ok else 1,
            "verdict": self.verdict.to_dict() if self.verdict else None,
            "results": [r.to_dict() for r in self.results],
            "node_verdicts": {n: r.verdict.to_dict() for n, r in self.node_reports.items()},
            "facts": self.facts,
            "sweeps": self.sweeps,
            "matrix": [{"a": a, "b": b, "busbw_gbps": v} for (a, b), v in self.matrix.items()],
            "isolation": self.isolation,
            "thresholds": dict(self.thresholds),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterReport:
        _refuse(data, CLUSTER_KIND)
        results = [Result.from_dict(r) for r in data.get("results", [])]
        return cls(
            hosts=[str(h) for h in data["hosts"]],
            profile=str(data.get("profile", "")),
            verdict=RunVerdict.from_dict(data["verdict"]) if data.get("verdict") else None,
            results=results,
            node_reports={
                str(n): RunReport(
                    node=str(n),
                    profile=str(v.get("profile", "")),
                    verdict=RunVerdict.from_dict(v),
                    results=[r for r in results if r.node == n],
                )
                for n, v in data.get("node_verdicts", {}).items()
            },
            facts={str(k): dict(v) for k, v in data.get("facts", {}).items()},
            sweeps={str(k): list(v) for k, v in data.get("sweeps", {}).items()},
            matrix={(m["a"], m["b"]): m["busbw_gbps"] for m in data.get("matrix", [])},
            isolation=data.get("isolation"),
            thresholds=dict(data.get("thresholds", {})),
            duration_s=float(data.get("duration_s", 0.0)),
            started_at=str(data.get("started_at", "")),
            command=[str(c) for c in data.get("command", [])],
            gpuenv_version=str(data.get("gpuenv_version", "")),
        )
