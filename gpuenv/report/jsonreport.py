"""The JSON documents: a node's run report (docs/checks.md), a cluster report (docs/cluster.md)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from gpuenv.results import CLUSTER_KIND, ClusterReport, RunReport


def _finite(value: Any) -> Any:
    """JSON has no NaN or Infinity: write null instead of an invalid document."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def dumps(report: RunReport | ClusterReport) -> str:
    return json.dumps(_finite(report.to_dict()), indent=2, allow_nan=False) + "\n"


def write(report: RunReport | ClusterReport, target: str) -> None:
    """Write to ``target``, a path, or ``-`` for stdout (the caller checked the path first)."""
    text = dumps(report)
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(target)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def load(path: str | Path) -> RunReport | ClusterReport:
    """Either document, by its kind; anything else is refused."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if isinstance(data, dict) and data.get("kind") == CLUSTER_KIND:
        return ClusterReport.from_dict(data)
    return RunReport.from_dict(data)
