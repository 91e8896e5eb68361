"""`gpuenv health -i`: the passive scan on every inventory node at once, gathered into a
node x signal table.

Each node runs ``<its python> -m gpuenv health --json - --node NAME`` over the fan-out
``gpuenv cluster`` and ``gpuenv doctor -i`` use (fabric with verified host keys, or local
process groups), under one deadline. Its JSON report is the one-node report (HealthReport's
``to_dict``); a node that gives none is an error naming why, never a healthy node.

As root (``--become``) the node's state file is read and written, as its timer does; otherwise
the scan is ``--no-state`` (a repeat does not escalate, and nothing is written on the node).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuenv.cluster.fanout import NodeAnswer, fan_out
from gpuenv.cluster.inventory import Host
from gpuenv.health.findings import ACTIONS, MUST_NOT_RUN_JOBS, VERDICT_WORDS, rank
from gpuenv.progress import Progress
from gpuenv.results import Result, Status

# How long each node gets to answer, unless --deadline says otherwise (a scan takes about 2 s).
DEADLINE_S = 60.0
# The check name of a node's health in a run report (`gpuenv cluster`'s health stage too).
CHECK = "health"
# `gpuenv cluster`'s line: a GPU that needs a reset (or more) is sick for a launch.
CLUSTER_FAIL_ON = MUST_NOT_RUN_JOBS


@dataclass
class FleetHealth:
    """Every node's one-node report (``to_dict`` form), or why there is none."""

    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    answers: dict[str, NodeAnswer] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return sorted([*self.reports, *self.errors])

    def worst(self, node: str) -> str:
        return str(self.reports[node]["worst_action"]) if node in self.reports else "none"

    def cells(self) -> dict[str, dict[str, str]]:
        """node -> signal -> the worst action of that signal's findings on the node."""
        table: dict[str, dict[str, str]] = {}
        for node, report in self.reports.items():
            row = table.setdefault(node, {})
            for f in report["findings"]:
                if rank(f["action"]) >= rank(row.get(f["signal"], "none")):
                    row[f["signal"]] = f["action"]
        return table

    def signals(self, verbose: bool = False) -> list[str]:
        """The table's columns: every signal read (verbose), or those with a finding above none."""
        rows = self.cells().values()
        return sorted({s for row in rows for s, a in row.items() if verbose or a != "none"})

    def failing(self, fail_on: str) -> bool:
        return bool(self.errors) or any(rank(self.worst(n)) >= rank(fail_on) for n in self.reports)

    def verdict(self, fail_on: str) -> str:
        """HEALTHY only when every node answered and none needs more than watching; otherwise
        the nodes by what they need (the worst action's word), whatever --fail-on says."""
        needs: dict[str, list[str]] = {}
        for node in self.reports:
            worst = self.worst(node)
            if rank(worst) >= rank(MUST_NOT_RUN_JOBS):
                needs.setdefault(VERDICT_WORDS[worst], []).append(node)
        if not needs and not self.errors:
            return f"HEALTHY: {len(self.nodes)} node(s) (fails on {fail_on} and above)"
        parts = [f"{word}: {', '.join(sorted(nodes))}" for word, nodes in sorted(needs.items())]
        if self.errors:
            parts.append(f"NO REPORT: {', '.join(sorted(self.errors))}")
        exit_word = (
            f"exit 1: fails on {fail_on} and above"
            if self.failing(fail_on)
            else f"exit 0 only because --fail-on {fail_on} accepts it"
        )
        return f"NOT HEALTHY: {'; '.join(parts)} ({exit_word})"

    def to_dict(self, fail_on: str) -> dict[str, Any]:
        return {
            "kind": "gpuenv.health.fleet",
            "schema_version": 1,
            "fail_on": fail_on,
            "nodes": self.nodes,
            "table": self.cells(),
            "errors": self.errors,
            "reports": self.reports,
        }


def node_argv(host: Host, become: bool, extra: Sequence[str] = ()) -> list[str]:
    argv = [host.python, "-m", "gpuenv", "health", "--json", "-", "--node", host.name]
    return argv + ([] if become else ["--no-state"]) + list(extra)


def node_command(host: Host, become: bool) -> str:
    command = shlex.join(node_argv(host, become))
    # As root in a login shell: the state file under /var/lib/gpuenv, the login's python3.
    return shlex.join(["sudo", "-n", "-H", "bash", "-lc", command]) if become else command


def parse(answer: NodeAnswer) -> dict[str, Any]:
    """The node's report; ValueError saying why when there is none (exit 2 is bad input)."""
    if answer.rc not in (0, 1):
        raise ValueError(answer.why())
    data = answer.json()
    if not isinstance(data, dict) or data.get("kind") != "gpuenv.health":
        raise ValueError(f"not a gpuenv health report ({answer.why()})")
    for key in ("node", "worst_action", "findings", "gpus"):
        if key not in data:
            raise ValueError(f"the report has no {key!r}")
    if data["worst_action"] not in ACTIONS:
        raise ValueError(f"unknown action {data['worst_action']!r}")
    return data


def gather(answers: Mapping[str, NodeAnswer]) -> FleetHealth:
    fleet = FleetHealth(answers=dict(answers))
    for name, answer in answers.items():
        try:
            fleet.reports[name] = parse(answer)
        except (ValueError, KeyError, TypeError) as exc:
            fleet.errors[name] = str(exc)
    return fleet


def scan_fleet(
    hosts: Sequence[Host],
    deadline_s: float = DEADLINE_S,
    become: bool = False,
    progress: Progress | None = None,
    command: Callable[[Host], str] | None = None,
) -> FleetHealth:
    # Like the doctor, the scan reads the node as the connection's user (root with --become),
    # not in the cluster user's login the validation stages use.
    answers = fan_out(
        [replace(h, become_user=None) for h in hosts],
        command or (lambda h: node_command(h, become)),
        deadline_s,
        label="health",
        progress=progress,
    )
    return gather(answers)


def node_result(node: str, report: Mapping[str, Any] | None, why: str, fail_on: str) -> Result:
    """One node's health as a Result: FAIL naming each GPU and finding at or above ``fail_on``,
    ERROR when the node gave no report, PASS (with the watch-level ones named) otherwise."""
    if report is None:
        return Result(CHECK, node, Status.ERROR, f"no health report: {why}")
    at_or_above = [f for f in report["findings"] if rank(f["action"]) >= rank(fail_on)]
    watch = [f for f in report["findings"] if 0 < rank(f["action"]) < rank(fail_on)]

    def named(f: Mapping[str, Any]) -> str:
        where = "node" if f.get("gpu") is None else f"GPU {f['gpu']}"
        subject = f" {f['subject']}" if f.get("subject") else ""
        return f"{where} {f['signal']}{subject}: {f['action']} ({f['evidence']})"

    details = {"worst_action": report["worst_action"], "gpus": len(report["gpus"]),
               "findings": [f for f in report["findings"] if f["action"] != "none"]}  # fmt: skip
    if at_or_above:
        reason = "sick: " + "; ".join(named(f) for f in at_or_above)
        return Result(CHECK, node, Status.FAIL, reason, details=details)
    reason = f"{len(report['gpus'])} GPUs, no finding at {fail_on} or above"
    if watch:
        reason += "; " + "; ".join(named(f) for f in watch)
    return Result(CHECK, node, Status.PASS, reason, details=details)


def results(fleet: FleetHealth, fail_on: str) -> list[Result]:
    out = []
    for node in fleet.nodes:
        result = node_result(node, fleet.reports.get(node), fleet.errors.get(node, ""), fail_on)
        answer = fleet.answers.get(node)
        result.duration_s = answer.duration_s if answer is not None else 0.0
        out.append(result)
    return out
