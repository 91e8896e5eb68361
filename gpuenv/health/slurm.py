"""The health scan's verdict in Slurm (docs/slurm.md): drain a node whose scan finds a fault, with
a reason that starts ``gpuenv:``, and resume only nodes gpuenv itself drained.

Reason-owned: a drain whose reason does not start with ``gpuenv:`` is someone else's (an
administrator's, slurmd's "Prolog error"), and so is the rolling upgrade's (``gpuenv: upgrade``):
never lifted nor overwritten here. ``decide`` is the one rule; the HealthCheckProgram script
(roles/slurm/templates/gpuenv-slurm-health.sh.j2) repeats it in sh only for when gpuenv cannot
start at all, and tests/unit/test_slurm_health_wrapper.py runs both on one table.

Fail-closed: a scan that could not run is a problem like a fault ("gpuenv: health scan failed:
..."). The script trusts only a verdict: exit 0 or 1 with ``verdict_line`` as the last line of
stdout. Anything else (a traceback, a signal, its deadline) makes it call ``gpuenv health --slurm
--scan-failed=WHY``, which drains through the same rule without scanning. Every slurmctld call is
``scontrol`` through the injected ``run`` (the node floor's contract: exit status and stdout under
a deadline; gpuenv.proc.command_output on a node).

The prolog's quick check reads the last verdict from a small cache file instead of scanning and
never calls slurmctld: a fresh healthy verdict passes, anything else (stale, missing, unhealthy,
unreadable) makes it scan or fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv.health.findings import Finding, HealthReport, rank

Run = Callable[..., tuple[int, str]]

PREFIX = "gpuenv:"
# The rolling upgrade's drains (playbooks/upgrade.yml, docs/upgrade.md): the upgrade resumes them
# once the node is validated; the health check neither resumes nor rewrites them.
UPGRADE_PREFIX = "gpuenv: upgrade"
REASON_MAX = 200  # characters of a drain reason; sinfo -R shows the start, scontrol the whole
SCONTROL_DEADLINE_S = 20.0  # one scontrol call (slurmctld answers in well under a second)
CACHE_S = 300.0  # how long the prolog trusts the last healthy verdict
CACHE_FILE = "/run/gpuenv/health-verdict.json"
# The health-check script's last stdout line when gpuenv itself decided and told Slurm; the script
# takes nothing else for a verdict (roles/slurm's __slurm_verdict_mark is the same text).
VERDICT_MARK = "gpuenv-slurm-verdict:"
# slurmd kills its HealthCheckProgram after 60 s (slurm.conf(5), HealthCheckProgram), so the
# script's every step has a deadline: the scan at most SCAN_DEADLINE_MAX_S (+2 s to die), the
# record of a failed scan FALLBACK_DEADLINE_S (+1), the script's own two scontrol calls 5 s each.
SLURMD_HEALTH_KILL_S = 60
SCAN_DEADLINE_MAX_S = 30
FALLBACK_DEADLINE_S = 10

DRAIN = "drain"
RESUME = "resume"
KEEP = "keep"


@dataclass(frozen=True)
class NodeState:
    """What slurmctld says of one node: its state flags and its reason ("" when none)."""

    name: str
    state: str  # e.g. IDLE, IDLE+DRAIN, DOWN+DRAIN, MIXED
    reason: str

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state.upper().split("+")

    @property
    def ours(self) -> bool:
        return self.reason.startswith(PREFIX) and not self.reason.startswith(UPGRADE_PREFIX)


@dataclass(frozen=True)
class Decision:
    verb: str  # DRAIN, RESUME or KEEP
    reason: str  # the reason to set (DRAIN), else ""
    why: str  # in words, for the log


_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_STAMP = re.compile(r"^(.*?)\s+\[[^\]\s]+@[^\]\s]+\]")  # "text [root@2026-12-01T00:10:00]"


def parse_node(name: str, text: str) -> NodeState:
    """One node of `scontrol show node -o NAME`. Reason= runs to the end of the line (its text
    has spaces) but for the "[user@time]" slurmctld appends."""
    state = _STATE.search(text)
    if state is None:
        raise ValueError(f"scontrol show node {name}: no State= in {text.strip()[:120]!r}")
    reason = ""
    at = text.find(" Reason=")
    if at >= 0:
        rest = text[at + len(" Reason=") :].strip()
        stamp = _STAMP.match(rest)
        reason = stamp.group(1) if stamp else rest
    return NodeState(name=name, state=state.group(1), reason=reason.strip())


def read_node(name: str, run: Run) -> NodeState:
    rc, out = run(["scontrol", "show", "node", "-o", name], SCONTROL_DEADLINE_S)
    if rc != 0:
        raise RuntimeError(f"scontrol show node {name}: {_exit_words(rc)}")
    return parse_node(name, out)


def _exit_words(rc: int) -> str:
    if rc == 124:
        return f"no answer within {SCONTROL_DEADLINE_S:g} s"
    if rc == 127:
        return "scontrol not found"
    return f"exit {rc}"


def reason_of(finding: Finding) -> str:
    """The drain reason for a finding: what and where, then the evidence, cut to REASON_MAX."""
    where = f" gpu{finding.gpu}" if finding.gpu is not None else ""
    subject = f" {finding.subject}" if finding.subject else ""
    return _clip(f"{PREFIX} {finding.signal}{where}{subject}: {finding.evidence}")


def scan_failed(what: str) -> str:
    return _clip(f"{PREFIX} health scan failed: {what}")


def _clip(text: str) -> str:
    # One line: slurmctld keeps the reason as given and sinfo prints it on one.
    flat = " ".join(text.split())
    return flat if len(flat) <= REASON_MAX else flat[: REASON_MAX - 3] + "..."


def problem_of(report: HealthReport, fail_on: str) -> str | None:
    """The drain reason of the report's top finding at or above ``fail_on``; None when healthy.
    Ties keep the scan's order."""
    failing = report.failing(fail_on)
    if not failing:
        return None
    top = max(failing, key=lambda f: rank(f.action))
    more = len(failing) - 1
    reason = reason_of(top)
    return _clip(f"{reason} (+{more} more)") if more and len(reason) < REASON_MAX - 12 else reason


def decide(node: NodeState, problem: str | None) -> Decision:
    """What to do with ``node`` given the scan's ``problem`` (a reason, None when healthy)."""
    if problem is not None:
        if node.drained and not node.ours:
            return Decision(KEEP, "", f"drained by someone else ({node.reason or 'no reason'})")
        if node.drained and node.reason == problem:
            return Decision(KEEP, "", "already drained for this")
        return Decision(DRAIN, problem, "unhealthy")
    if node.drained and node.ours:
        return Decision(RESUME, "", f"healthy again (was: {node.reason})")
    if node.drained:
        return Decision(KEEP, "", f"healthy, but drained by someone else ({node.reason or '-'})")
    return Decision(KEEP, "", "healthy")


def apply(name: str, decision: Decision, run: Run) -> None:
    if decision.verb == KEEP:
        return
    argv = ["scontrol", "update", f"nodename={name}"]
    if decision.verb == DRAIN:
        argv += ["state=drain", f"reason={decision.reason}"]
    else:
        argv += ["state=resume"]
    rc, _ = run(argv, SCONTROL_DEADLINE_S)
    if rc != 0:
        raise RuntimeError(
            f"scontrol update nodename={name} state={decision.verb}: {_exit_words(rc)}"
        )


def enforce(name: str, problem: str | None, run: Run) -> Decision:
    """Read the node, decide, act. A node slurmctld does not answer for raises RuntimeError."""
    decision = decide(read_node(name, run), problem)
    apply(name, decision, run)
    return decision


@dataclass(frozen=True)
class Outcome:
    """One health check: the problem (None: healthy) and what Slurm was told (None: it could not
    be told, ``error`` says why; exit 3)."""

    node: str
    problem: str | None
    decision: Decision | None
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        if self.decision is None:
            return 3
        return 0 if self.problem is None else 1

    def lines(self) -> list[str]:
        """What the CLI prints; the last line is ``verdict_line`` (the script reads it)."""
        if self.decision is None:
            told = f"Slurm not told: {self.error}"
            return [*self.notes, f"{self.node}: {self.problem or 'healthy'}; {told}",
                    verdict_line(self.problem, told)]  # fmt: skip
        what = f"{self.decision.verb}: {self.problem or self.decision.why}"
        return [*self.notes, f"{self.node}: {self.decision.verb}: {self.decision.why}",
                verdict_line(self.problem, what)]  # fmt: skip


def verdict_line(problem: str | None, what: str) -> str:
    """The scan's verdict, and what Slurm was told (exit 0 or 1), or why it was not (exit 3: the
    verdict is in the prolog's cache, and no one can tell slurmctld now)."""
    return f"{VERDICT_MARK} {'healthy' if problem is None else 'unhealthy'} ({what})"


def health_check(
    node: str,
    scan: Callable[[], str | None],
    cache: str,
    run: Run,
    clock: Callable[[], float],
) -> Outcome:
    """The HealthCheckProgram's work: ``scan`` (the problem, None when healthy; whatever it raises
    is a failed scan), its verdict into the prolog's ``cache`` (a verdict that cannot be written
    is a failed scan too: the prolog would trust an older one), then Slurm told by ``decide``."""
    notes: list[str] = []
    try:
        problem = scan()
    # Fail-closed: whatever stopped the scan (a crash, a missing reader) drains the node, named.
    except Exception as exc:
        problem = scan_failed(f"{type(exc).__name__}: {exc}")
    try:
        write_verdict(cache, problem, clock())
    except OSError as exc:
        notes.append(f"verdict cache {cache} not written: {exc}")
        forget_verdict(cache)
        why = exc.strerror or type(exc).__name__
        problem = problem or scan_failed(f"cannot write the verdict cache {cache}: {why}")
    try:
        decision = enforce(node, problem, run)
    except (RuntimeError, ValueError) as exc:
        return Outcome(node, problem, None, str(exc), notes)
    return Outcome(node, problem, decision, "", notes)


# The prolog's cache: the last verdict, written by every scan of --slurm or --prolog.


def write_verdict(path: str, problem: str | None, at_unix: float) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"at_unix": at_unix, "problem": problem}), encoding="utf-8")
    tmp.chmod(0o644)
    tmp.replace(target)


def forget_verdict(path: str) -> None:
    """Drop a verdict that no longer stands (best effort: a cache that cannot be written may not
    be removable either; the node is drained then, and the prolog does not run on it)."""
    with contextlib.suppress(OSError):
        Path(path).unlink(missing_ok=True)


def cached_verdict(path: str, max_age_s: float, now_unix: float) -> tuple[bool, str | None]:
    """(usable, problem): usable only when the file is there, readable, and younger than
    ``max_age_s``; a verdict from the future (clock stepped back) is not usable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        at_unix = float(data["at_unix"])
        problem = data["problem"]
    except (OSError, ValueError, KeyError, TypeError):
        return False, None
    if problem is not None and not isinstance(problem, str):
        return False, None
    if not 0 <= now_unix - at_unix <= max_age_s:
        return False, None
    return True, problem
