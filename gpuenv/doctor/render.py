"""The console text of a doctor run: per finding, the node, class, cause, evidence and fix.

Plain lines (standard library only: rich may be missing on a node); the CLI prints them.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuenv.doctor.findings import BY_CHECK, from_result
from gpuenv.results import Result, Status


def _label(result: Result) -> str:
    known = BY_CHECK.get(result.check)
    return f"{known.number:>2} {known.name}" if known else result.check


def lines(results: Sequence[Result], wall_s: float, verbose: bool = False) -> list[str]:
    out: list[str] = []
    nodes = list(dict.fromkeys(r.node for r in results))
    for node in nodes:
        mine = [r for r in results if r.node == node]
        out.append(f"== {node}")
        for r in mine:
            if r.status is Status.PASS and not verbose:
                continue
            if r.status is not Status.FAIL:
                out.append(f"{r.status.value:5} {node} [{_label(r)}] {r.reason}".rstrip())
                continue
            reading = from_result(r)
            for f in reading.findings if reading else []:
                out.append(f"FAIL  {node} [{_label(r)}] {f.title}")
                out.append(f"      cause:    {f.cause}")
                out += [f"      evidence: {e}" for e in f.evidence]
                out += [f"      fix:      {x}" for x in f.fixes]
        passed = sum(r.status is Status.PASS for r in mine)
        out.append(f"   {passed} of {len(mine)} classes clean on {node}")
    failed = [r for r in results if r.status.failed]
    findings = sum(len(r.details.get("findings", [])) for r in failed if r.status is Status.FAIL)
    errors = sum(r.status is Status.ERROR for r in failed)
    verdict = "FINDINGS" if failed else "CLEAN"
    out.append(
        f"verdict: {verdict}  {findings} finding(s), {errors} error(s) on "
        f"{len({r.node for r in failed})} of {len(nodes)} node(s) in {wall_s:.1f}s"
    )
    return out
