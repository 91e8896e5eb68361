"""NCCL versions known to hang or corrupt data (gpuenv/data/nccl_known_bad.yaml), and the one
rule that says whether a version is one of them. The cluster's preflight and the doctor's
class 12 name them with the version that fixed each."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parent / "data" / "nccl_known_bad.yaml"
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class KnownIssue:
    id: str
    effect: str  # hang, silent data corruption
    when: str
    severity: str  # error: any use; warning: under the conditions in `when`
    fixed: str | None
    source: str
    versions: tuple[str, ...] = ()
    first: str | None = None  # affected from this version below `fixed`

    def affects(self, version: str) -> bool:
        v = version_key(version)
        if v is None:
            return False
        if any(version_key(x) == v for x in self.versions):
            return True
        low, high = version_key(self.first or ""), version_key(self.fixed or "")
        return low is not None and high is not None and low <= v < high

    def describe(self, version: str) -> str:
        fix = f"fixed in {self.fixed}" if self.fixed else "no fixed release known"
        return f"NCCL {version}: {self.effect} ({self.when}; {fix}; {self.source})"


def version_key(text: str) -> tuple[int, int, int] | None:
    """2.29.2, 2.29.2-1, 2.29.2+cuda12.8 -> (2, 29, 2); None when it is no NCCL version."""
    m = _VERSION_RE.match(str(text).strip())
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _row(data: Mapping[str, Any]) -> KnownIssue:
    return KnownIssue(
        id=str(data["id"]),
        effect=str(data["effect"]),
        when=str(data["when"]),
        severity=str(data["severity"]),
        fixed=str(data["fixed"]) if data.get("fixed") else None,
        source=str(data["source"]),
        versions=tuple(str(v) for v in data.get("versions", [])),
        first=str(data["from"]) if data.get("from") else None,
    )


@lru_cache(maxsize=1)
def nccl_issues() -> tuple[KnownIssue, ...]:
    import yaml  # the doctor runs on bare nodes: only this reader needs it

    data = yaml.safe_load(TABLE.read_text(encoding="utf-8"))
    return tuple(_row(row) for row in data["nccl"])


def nccl_findings(version: str) -> list[KnownIssue]:
    """The known issues of NCCL ``version`` (none for a version no row names)."""
    return [issue for issue in nccl_issues() if issue.affects(version)]
