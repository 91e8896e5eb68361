"""What a health scan finds: one Finding per signal and subject, with its action on the ladder.

The ladder orders actions by what they take from the cluster: ``none`` < ``watch`` (keep
running, look again) < ``reset`` (one GPU, its jobs stopped) < ``reboot`` (the node) < ``drain``
(out of the scheduler until someone repairs it) < ``replace`` (hardware). A finding's severity
follows from its action (SEVERITY_OF), so the two never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ACTIONS = ("none", "watch", "reset", "reboot", "drain", "replace")
# From this action up, the node must not take the next job: `gpuenv health` exits 1 by default
# (--fail-on), and the Slurm health check and prolog drain on it.
MUST_NOT_RUN_JOBS = "reset"
# The verdict word of each worst action: only a node whose worst is none or watch is HEALTHY.
VERDICT_WORDS = {
    "none": "HEALTHY",
    "watch": "HEALTHY, WATCH",
    "reset": "NEEDS RESET",
    "reboot": "NEEDS REBOOT",
    "drain": "NEEDS DRAIN",
    "replace": "NEEDS REPLACEMENT",
}
SEVERITY_OF = {
    "none": "ok",
    "watch": "warning",
    "reset": "critical",
    "reboot": "critical",
    "drain": "critical",
    "replace": "critical",
}
# Where the rules come from (docs/health.md cites the same pages).
NVML_API = "https://docs.nvidia.com/deploy/nvml-api/"
MEMORY_GUIDE = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/"
PAGE_RETIREMENT = "https://docs.nvidia.com/deploy/dynamic-page-retirement/"
XID_CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
FABRIC_MANAGER = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/"
PERSISTENCE = "https://docs.nvidia.com/deploy/driver-persistence/"
IB_SYSFS = "https://www.kernel.org/doc/Documentation/ABI/stable/sysfs-class-infiniband"
GPUENV = "gpuenv (docs/health.md)"


def rank(action: str) -> int:
    return ACTIONS.index(action)


def higher(a: str, b: str) -> str:
    return a if rank(a) >= rank(b) else b


@dataclass
class Finding:
    signal: str  # what was read: "xid", "row_remap.pending", "ib.state" (docs/health.md)
    action: str  # ACTIONS
    evidence: str  # what was seen, in words with the numbers
    source: str  # where the rule comes from
    gpu: int | None = None  # NVML index; None for the node's own signals
    uuid: str = ""
    subject: str = ""  # within the signal: an Xid code, a link, a port, a PCI address
    value: float | None = None  # the measured number, where there is one
    new: bool = False  # an occurrence: a new event, a grown counter, a condition newly present
    escalated_by: str = ""  # the escalation rule that raised the action (health_escalation.yaml)
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"finding {self.signal}: unknown action {self.action!r}")

    @property
    def severity(self) -> str:
        return SEVERITY_OF[self.action]

    @property
    def id(self) -> str:
        """Stable across scans: the signal, the GPU's UUID (or "node") and the subject."""
        return f"{self.signal}:{self.uuid or 'node'}:{self.subject}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(id=self.id, severity=self.severity)
        return data


@dataclass
class HealthReport:
    node: str
    findings: list[Finding]
    gpus: list[dict[str, Any]]  # index, uuid, name, bus_id of each GPU NVML saw
    kernel_log: str  # where the kernel log was read from ("" when it could not be)
    scan_s: float
    at_unix: float
    state: dict[str, Any]  # the state file's next content (history.py)
    # What was asked for and not tested, each a signal and the reason (--dcgm without DCGM, a
    # test DCGM skipped): a SKIP, never a pass.
    skipped: list[dict[str, str]] = field(default_factory=list)

    @property
    def worst(self) -> str:
        return max((f.action for f in self.findings), key=rank, default="none")

    def failing(self, fail_on: str) -> list[Finding]:
        return [f for f in self.findings if rank(f.action) >= rank(fail_on)]

    def verdict(self, fail_on: str) -> str:
        """The verdict line: the word of the worst action, naming its finding, and whether the
        run fails (``--fail-on``); a loosened --fail-on never turns a sick node HEALTHY."""
        return verdict_line(self.findings, fail_on)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "gpuenv.health",
            "schema_version": 1,
            "node": self.node,
            "at_unix": self.at_unix,
            "scan_s": round(self.scan_s, 4),
            "worst_action": self.worst,
            "kernel_log": self.kernel_log,
            "gpus": self.gpus,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": self.skipped,
        }


def describe(finding: Finding) -> str:
    where = f"GPU {finding.gpu}" if finding.gpu is not None else "node"
    subject = f" {finding.subject}" if finding.subject else ""
    return f"{finding.signal}{subject} on {where}: {finding.evidence}"


def verdict_line(findings: list[Finding], fail_on: str) -> str:
    """``NEEDS REBOOT: xid 79 on GPU 3: … (2 findings; exit 1: fails on reset and above)``."""
    worst = max((f.action for f in findings), key=rank, default="none")
    word = VERDICT_WORDS[worst]
    failing = [f for f in findings if rank(f.action) >= rank(fail_on)]
    if worst == "none":
        return f"{word} (no finding; fails on {fail_on} and above)"
    top = max(findings, key=lambda f: rank(f.action))
    acted = sum(1 for f in findings if f.action != "none")
    count = f"{acted} finding{'s' if acted != 1 else ''} above none"
    if failing:
        tail = f"{count}; exit 1: fails on {fail_on} and above"
    elif rank(worst) >= rank(MUST_NOT_RUN_JOBS):
        tail = (
            f"{count}; exit 0 only because --fail-on {fail_on} accepts {worst}: this node must"
            " not take the next job"
        )
    else:
        tail = f"{count}; fails on {fail_on} and above"
    return f"{word}: {describe(top)} ({tail})"
