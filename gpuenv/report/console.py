"""The console report: the summary after a run, SKIPs grouped by reason, the verdict line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuenv.results import CLUSTER_NODE, ClusterReport, Result, RunReport, RunVerdict, Status

STYLES = {
    Status.PASS: "bold green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.SKIP: "yellow",
}


def skips_by_reason(results: Sequence[Result]) -> dict[str, list[str]]:
    """SKIPs grouped by their reason: one line per reason, naming the checks (and nodes)."""
    groups: dict[str, list[str]] = {}
    nodes = {r.node for r in results}
    for r in results:
        if r.status is Status.SKIP:
            who = r.check if len(nodes) == 1 else f"{r.check}@{r.node}"
            groups.setdefault(r.reason, []).append(who)
    return groups


def verdict_line(verdict: RunVerdict, scope: str = "node") -> Text:
    """The last line of every run: OK or not, the profile, and whether a GPU was verified."""
    words = Text("OK", "bold green") if verdict.ok else Text("NOT OK", "bold red")
    gpu = (
        Text("GPUs verified", "green")
        if verdict.gpu_verified
        else Text("no GPU verified", "bold yellow")
    )
    where = f"profile {verdict.profile}, {verdict.node_kind} {scope}"
    note = f": {verdict.gpus_note}" if verdict.gpus_note else ""
    if verdict.left_to_cluster:
        note += f"; {', '.join(verdict.left_to_cluster)} left to gpuenv cluster's launches"
    caveats = [Text(f"; CAVEAT {c}", "bold yellow") for c in verdict.caveats]
    return Text.assemble("verdict: ", words, f"  ({where}; ", gpu, note, *caveats, ")")


def print_summary(report: RunReport, console: Console) -> None:
    results = report.results
    verdict = report.verdict
    failed = [r for r in results if r.status.failed]
    skipped = [r for r in results if r.status is Status.SKIP]
    passed = [r for r in results if r.status is Status.PASS]
    console.print()
    console.print(
        f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped"
        f" in {report.duration_s:.1f}s; required here: {', '.join(verdict.required) or 'none'}",
        markup=False,
        highlight=False,
    )
    for r in failed:
        console.print(
            f"  {r.check} {r.status.value}: {r.reason}",
            style=STYLES[r.status],
            markup=False,
            highlight=False,
        )
    for reason, checks in skips_by_reason(results).items():
        console.print(
            f"  SKIP {', '.join(checks)}: {reason}", style=STYLES[Status.SKIP], markup=False
        )
    for problem in verdict.problems:
        if not any(problem.startswith(f"{r.check} ") for r in failed):
            console.print(f"  not OK: {problem}", style="bold red", markup=False, highlight=False)
    console.print(verdict_line(verdict))


def print_check_list(registry: Mapping[str, Any]) -> None:
    """``gpuenv check --list``: every registered check, where it runs and what it proves."""
    console = Console()
    table = Table(show_header=True, box=None)
    for column in ("check", "runs", "when", "what it proves"):
        table.add_column(column)
    for name, check in registry.items():
        # Optional checks run when named by --only or required by the profile (frameworks).
        when = "on request" if check.OPTIONAL else "default"
        table.add_row(name, check.PLACEMENT.value, when, check.DESCRIPTION)
    console.print(table)


def print_cluster_summary(report: ClusterReport, console: Console) -> None:
    """The cluster's stages, every failure by node, the SKIPs grouped by reason, the verdict."""
    results = report.results
    for r in results:
        if r.node == CLUSTER_NODE and r.status is not Status.SKIP:
            console.print(
                f"{r.status.value:5} {CLUSTER_NODE} {r.check}: {r.reason}",
                style=STYLES[r.status], markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
    for r in results:
        if r.node != CLUSTER_NODE and r.status.failed:
            console.print(
                f"{r.status.value:5} {r.node} {r.check}: {r.reason}",
                style=STYLES[r.status], markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
    for reason, checks in skips_by_reason(results).items():
        console.print(f"SKIP  {', '.join(checks)}: {reason}", style=STYLES[Status.SKIP],
                      markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    verdict = report.verdict
    if verdict is None:
        return
    for problem in verdict.problems:
        if " FAIL: " not in problem and " ERROR: " not in problem:
            console.print(f"not OK: {problem}", style="bold red", markup=False, soft_wrap=True)
    counts = {st: sum(r.status is st for r in results) for st in Status}
    console.print(
        ", ".join(f"{n} {st.value}" for st, n in counts.items() if n)
        + f" on {len(report.hosts)} node(s) in {report.duration_s:.1f}s",
        markup=False,
        highlight=False,
    )
    console.print(verdict_line(verdict, "cluster"))
