"""Class 12: no NCCL on the node is a version known to hang or corrupt data.

The versions are the rows of gpuenv/data/nccl_known_bad.yaml (gpuenv.known_issues), each with
its source and the version that fixed it. The libraries are the ones class 9 finds (ld cache,
LD_LIBRARY_PATH, the nvidia-nccl wheels and torch/lib in every site-packages). A row that
breaks any use is a finding; a row that needs particular conditions (NVLS, symmetric memory) is
named in the class's facts (``conditional``) and is no finding: the node may never meet them.
"""

from __future__ import annotations

from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.nccl import find_libraries
from gpuenv.doctor.system import System


def nccl_known_bad(system: System) -> ClassReading:
    from gpuenv.known_issues import nccl_findings, nccl_issues

    try:
        nccl_issues()  # the table is YAML: pyyaml is the one library this class needs
    except ImportError as exc:
        return skipped(12, f"cannot read the known-bad NCCL table: {exc}")
    libs = [lib for lib in find_libraries(system) if lib["version"] != "unknown"]
    if not libs:
        return skipped(12, "no NCCL of a known version on this node")
    reading = ClassReading(12, facts={"versions": sorted({lib["version"] for lib in libs})})
    conditional: list[str] = []
    by_issue: dict[tuple[str, str], list[str]] = {}
    for lib in libs:
        for issue in nccl_findings(lib["version"]):
            if issue.severity != "error":
                conditional.append(f"{lib['file']}: {issue.describe(lib['version'])}")
                continue
            by_issue.setdefault((issue.id, lib["version"]), []).append(
                f"{lib['file']} (NCCL {lib['version']}, via {lib['via']})"
            )
    reading.facts["conditional"] = conditional
    for (issue_id, version), where in by_issue.items():
        issue = next(i for i in nccl_findings(version) if i.id == issue_id)
        fix = (
            f"install NCCL {issue.fixed} or newer: "
            f"pip install -U 'nvidia-nccl-cu12>={issue.fixed}' (or -cu13), "
            f"or nccl_version >= {issue.fixed} for the nccl role"
            if issue.fixed
            else "move to a version no row names (docs/doctor.md, class 12)"
        )
        reading.findings.append(
            Finding(
                12,
                f"NCCL {version} is known to "
                f"{issue.effect if issue.effect == 'hang' else 'cause ' + issue.effect}: "
                f"fixed in {issue.fixed or 'no release yet'}",
                f"{issue.when} ({issue.source})",
                tuple(where),
                (fix,),
            )
        )
    return reading
