"""JUnit XML: one <testsuite> per node, one <testcase> per check (CI systems read this)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuenv.results import Result, RunVerdict, Status


def verdict_case(node: str, verdict: RunVerdict) -> Result:
    """The run's verdict as one more test case, so that CI fails on a required SKIP too."""
    gpu = "GPUs verified" if verdict.gpu_verified else "no GPU verified"
    if verdict.ok:
        return Result("verdict", node, Status.PASS, f"OK: profile {verdict.profile}, {gpu}")
    return Result("verdict", node, Status.FAIL, "; ".join(verdict.problems))


def to_xml(
    results: Sequence[Result],
    suite_name: str = "gpuenv.check",
    verdicts: Mapping[str, RunVerdict] | None = None,
) -> ET.Element:
    root = ET.Element("testsuites", name=suite_name)
    nodes: dict[str, list[Result]] = {}
    for r in results:
        nodes.setdefault(r.node, []).append(r)
    for node, verdict in (verdicts or {}).items():
        nodes.setdefault(node, []).append(verdict_case(node, verdict))
    for node, items in nodes.items():
        suite = ET.SubElement(
            root, "testsuite",
            name=f"{suite_name}.{node}",
            tests=str(len(items)),
            failures=str(sum(r.status is Status.FAIL for r in items)),
            errors=str(sum(r.status is Status.ERROR for r in items)),
            skipped=str(sum(r.status is Status.SKIP for r in items)),
            time=f"{sum(r.duration_s for r in items):.3f}",
            hostname=node,
        )  # fmt: skip
        for r in items:
            case = ET.SubElement(
                suite, "testcase", classname=f"{suite_name}.{node}", name=r.check,
                time=f"{r.duration_s:.3f}",
            )  # fmt: skip
            if r.measurements or r.versions:
                props = ET.SubElement(case, "properties")
                for m in r.measurements:
                    text = f"{m.value}{(' ' + m.unit) if m.unit else ''}"
                    if m.threshold is not None and m.bound:
                        text += f" ({m.bound} {m.threshold:g})"
                    ET.SubElement(props, "property", name=m.name, value=text)
                for lib, version in r.versions.items():
                    ET.SubElement(props, "property", name=f"version.{lib}", value=version)
            if r.status is Status.FAIL:
                ET.SubElement(case, "failure", message=r.reason, type="FAIL").text = r.reason
            elif r.status is Status.ERROR:
                ET.SubElement(case, "error", message=r.reason, type="ERROR").text = r.reason
            elif r.status is Status.SKIP:
                ET.SubElement(case, "skipped", message=r.reason)
            if r.details:
                ET.SubElement(case, "system-out").text = json.dumps(
                    r.details, indent=1, default=str
                )
    return root


def write(
    results: Sequence[Result],
    path: str | Path,
    suite_name: str = "gpuenv.check",
    verdicts: Mapping[str, RunVerdict] | None = None,
) -> None:
    tree = ET.ElementTree(to_xml(results, suite_name, verdicts))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
