"""What `gpuenv doctor` concludes: a Finding names a cause, its evidence and the fix commands.

Each diagnosis class (the table ``CLASSES``) gives one ``ClassReading`` per node: its findings, or
the reason it does not apply or could not be read (``skip``), and the facts it read (the
cross-node comparison and the JSON report use them). ``to_result`` maps a ClassReading to the one
``Result`` per class and node that every report writer understands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuenv.results import Result, Status


@dataclass(frozen=True)
class DiagnosisClass:
    number: int
    name: str  # the Result's check name is "doctor.<name>"
    title: str


CLASSES: tuple[DiagnosisClass, ...] = (
    DiagnosisClass(1, "driver-version", "driver library matches the loaded kernel module"),
    DiagnosisClass(2, "fabric-manager", "Fabric Manager matches the driver and the fabric is up"),
    DiagnosisClass(3, "module-flavour", "kernel module flavour (open/proprietary) fits the GPUs"),
    DiagnosisClass(4, "secure-boot", "Secure Boot accepts the NVIDIA module"),
    DiagnosisClass(5, "next-boot-module", "the next-boot kernel has an NVIDIA module"),
    DiagnosisClass(6, "pcie-acs", "no PCIe ACS redirect between GPUs and NICs; IOMMU mode"),
    DiagnosisClass(7, "gpudirect-rdma", "GPUDirect RDMA (nvidia-peermem or dma-buf) available"),
    DiagnosisClass(8, "nccl-socket-ifname", "NCCL_SOCKET_IFNAME selects the inventory address"),
    DiagnosisClass(9, "nccl-libraries", "one NCCL per node, the same on every node"),
    DiagnosisClass(10, "stray-env", "no global NCCL_*/CUDA_* setting forcing a slow path"),
    DiagnosisClass(
        11, "driver-bound", "every NVIDIA GPU on the bus is driven by the NVIDIA driver"
    ),
    DiagnosisClass(12, "nccl-known-bad", "no NCCL version known to hang or corrupt data"),
    DiagnosisClass(13, "mpi-device-buffers", "the Open MPI on PATH carries CUDA device buffers"),
)
BY_NUMBER = {c.number: c for c in CLASSES}
BY_CHECK = {f"doctor.{c.name}": c for c in CLASSES}


@dataclass(frozen=True)
class Finding:
    cls: int
    title: str  # one line: what is wrong
    cause: str  # why it happened / what it breaks
    evidence: tuple[str, ...]
    fixes: tuple[str, ...]  # commands or steps, each on its own
    severity: str = "error"

    def __post_init__(self) -> None:
        if self.cls not in BY_NUMBER:
            raise ValueError(f"unknown diagnosis class {self.cls}")
        if not self.evidence or not self.fixes:
            raise ValueError(f"finding {self.title!r}: evidence and a fix are required")

    def to_dict(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "title": self.title,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "fixes": list(self.fixes),
            "severity": self.severity,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        return cls(
            cls=int(data["class"]),
            title=str(data["title"]),
            cause=str(data.get("cause", "")),
            evidence=tuple(str(e) for e in data.get("evidence", [])),
            fixes=tuple(str(f) for f in data.get("fixes", [])),
            severity=str(data.get("severity", "error")),
        )


@dataclass
class ClassReading:
    cls: int
    findings: list[Finding] = field(default_factory=list)
    skip: str = ""  # why the class does not apply or could not be read
    error: str = ""  # the reader itself failed (a bug or an unexpected system): ERROR
    facts: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def __post_init__(self) -> None:
        if self.skip and self.findings:
            raise ValueError(f"class {self.cls}: a skipped class has no findings")

    @property
    def name(self) -> str:
        return BY_NUMBER[self.cls].name


def skipped(cls: int, why: str, **facts: Any) -> ClassReading:
    return ClassReading(cls, skip=why, facts=dict(facts))


def to_result(node: str, reading: ClassReading) -> Result:
    check = f"doctor.{reading.name}"
    details: dict[str, Any] = {
        "class": reading.cls,
        "findings": [f.to_dict() for f in reading.findings],
        "facts": reading.facts,
    }
    if reading.error:
        status, reason = Status.ERROR, reading.error
    elif reading.skip:
        status, reason = Status.SKIP, reading.skip
    elif reading.findings:
        status = Status.FAIL
        reason = "; ".join(f.title for f in reading.findings)
    else:
        status, reason = Status.PASS, ""
    return Result(
        check=check,
        node=node,
        status=status,
        reason=reason,
        duration_s=round(reading.duration_s, 3),
        details=details,
    )


def from_result(result: Result) -> ClassReading | None:
    """The ClassReading a node's Result carries (None: not a doctor result)."""
    known = BY_CHECK.get(result.check)
    if known is None:
        return None
    findings = [Finding.from_dict(f) for f in result.details.get("findings", [])]
    skip = result.reason if result.status is Status.SKIP else ""
    error = result.reason if result.status is Status.ERROR else ""
    return ClassReading(
        known.number,
        findings=[] if skip else findings,
        skip=skip,
        error=error,
        facts=dict(result.details.get("facts", {})),
        duration_s=result.duration_s,
    )
