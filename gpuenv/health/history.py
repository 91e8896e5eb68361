"""The health state file: what earlier scans saw, so that a repeat escalates (docs/health.md,
"History and escalation"), and what `gpuenv health --clear` recorded after a repair.

The file is small JSON, written atomically (a temporary file in the same folder, then rename):
a scan killed half-way leaves the previous state. Times are Unix seconds (``*_unix``): the
history outlives boots, which monotonic time does not.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpuenv.errors import BadInput
from gpuenv.health.findings import ACTIONS, Finding, higher, rank

DEFAULT_STATE = "/var/lib/gpuenv/health.json"
SCHEMA_VERSION = 1
# Occurrences older than this are forgotten (longer than any rule's window).
KEEP_S = 30 * 24 * 3600
KEEP_CLEARS = 100
# Signals whose findings are events (a kernel line, a grown counter): each scan that sees one new
# counts. The others are conditions: they count when they appear, not on every scan they last.
EVENT_SIGNALS = frozenset(
    {
        "xid",
        "sxid",
        "ecc.volatile_uncorrected",
        "pcie.replay",
        "nvlink.errors",
        "ib.errors",
        "throttle.duration",
    }
)
RULE_KEYS = {"id", "signal", "subject", "count", "within_h", "after_clear", "action", "why"}


@dataclass(frozen=True)
class Rule:
    id: str
    signal: str
    action: str
    why: str
    subject: str | None = None
    count: int | None = None
    within_h: float | None = None
    after_clear: bool = False

    def matches(self, finding: Finding) -> bool:
        return finding.signal == self.signal and self.subject in (None, finding.subject)


def parse_rules(data: Any, source: str) -> list[Rule]:
    """The escalation rules of health_escalation.yaml's shape; bad input names what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise BadInput(f"{source}: expected a mapping with a list under 'rules'")
    rules = []
    for i, row in enumerate(data["rules"]):
        where = f"{source}: rules[{i}]"
        if not isinstance(row, dict):
            raise BadInput(f"{where} must be a mapping")
        unknown = sorted(set(map(str, row)) - RULE_KEYS)
        if unknown:
            raise BadInput(f"{where}: unknown key(s) {', '.join(unknown)}")
        if row.get("action") not in ACTIONS:
            raise BadInput(f"{where}.action must be one of {', '.join(ACTIONS)}")
        counted = row.get("count") is not None
        if counted == bool(row.get("after_clear")):
            raise BadInput(f"{where}: give either count + within_h or after_clear: true")
        if counted and not (
            isinstance(row["count"], int) and row["count"] > 0 and row.get("within_h", 0) > 0
        ):
            raise BadInput(f"{where}: count must be an integer > 0 and within_h a number > 0")
        for key in ("id", "signal", "why"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise BadInput(f"{where}.{key} must be a non-empty string")
        subject = row.get("subject")
        rules.append(
            Rule(
                row["id"],
                row["signal"],
                row["action"],
                row["why"],
                None if subject is None else str(subject),
                row.get("count"),
                row.get("within_h"),
                bool(row.get("after_clear")),
            )
        )
    return rules


@lru_cache(maxsize=1)
def shipped_rules() -> tuple[Rule, ...]:
    from gpuenv.checks.thresholds import DATA_DIR
    from gpuenv.health.expect import data_table  # libyaml where there is one: a scan's own time

    path = DATA_DIR / "health_escalation.yaml"
    return tuple(parse_rules(data_table(path.name), str(path)))


def empty_state() -> dict[str, Any]:
    return {
        "kind": "gpuenv.health.state",
        "schema_version": SCHEMA_VERSION,
        "boot_id": "",
        "kernel_log_s": -1.0,
        "last_scan_unix": None,
        "counters": {},
        "active": [],
        "occurrences": {},
        "cleared": {},
        "clears": [],
    }


def load(path: str | Path) -> dict[str, Any]:
    """The state file's content; a fresh state when it does not exist yet."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return empty_state()
    except OSError as exc:
        raise BadInput(f"--state {p}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"--state {p}: not JSON ({exc}); move it aside to start afresh") from exc
    if not isinstance(data, dict) or data.get("kind") != "gpuenv.health.state":
        raise BadInput(f"--state {p}: not a gpuenv health state file")
    return {**empty_state(), **data}


def write_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename (node-exporter and the next scan never see
    half a file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(path: str | Path, state: Mapping[str, Any]) -> None:
    write_atomic(path, json.dumps(state, indent=1, sort_keys=True) + "\n")


def clear(state: dict[str, Any], finding_id: str | None, by: str, now_unix: float) -> list[str]:
    """Record a repair: the finding (or every one) forgets its occurrences, and coming back
    afterwards is what after_clear rules look for. Returns the ids cleared."""
    known = set(state["active"]) | set(state["occurrences"])
    if finding_id is not None and finding_id not in known:
        names = ", ".join(sorted(known)) or "(none)"
        raise BadInput(f"--finding {finding_id}: not in the state file; known: {names}")
    ids = [finding_id] if finding_id is not None else sorted(known)
    for fid in ids:
        state["occurrences"].pop(fid, None)
        state["cleared"][fid] = now_unix
    state["clears"] = [
        *state["clears"],
        {"finding": finding_id or "*", "ids": ids, "by": by, "at_unix": now_unix},
    ][-KEEP_CLEARS:]
    return ids


def last_clear_unix(state: Mapping[str, Any], finding_id: str) -> float | None:
    return state["cleared"].get(finding_id)


def escalate(
    findings: list[Finding],
    state: Mapping[str, Any],
    now_unix: float,
    rules: tuple[Rule, ...] | list[Rule] | None = None,
) -> dict[str, Any]:
    """Apply the rules to this scan's findings (raising their actions in place) and return the
    next state: occurrences recorded, conditions that went away no longer marked cleared."""
    rules = shipped_rules() if rules is None else rules
    previously_active = set(state["active"])
    occurrences = {
        fid: [t for t in times if now_unix - t <= KEEP_S]
        for fid, times in state["occurrences"].items()
    }
    cleared = dict(state["cleared"])
    present = set()
    for f in findings:
        if f.action == "none":
            continue
        present.add(f.id)
        if f.signal not in EVENT_SIGNALS:
            f.new = f.id not in previously_active
        if f.new:
            # Three Xid lines in one scan are three occurrences, not one.
            times = max(1, int(f.detail.get("fresh", 1)))
            occurrences.setdefault(f.id, []).extend([now_unix] * times)
        for rule in rules:
            if not rule.matches(f) or rank(rule.action) <= rank(f.action):
                continue
            if rule.after_clear:
                hit = f.id in cleared
                why = f"{rule.why} (cleared, and seen again)"
            else:
                window_s = float(rule.within_h or 0) * 3600
                seen = [t for t in occurrences.get(f.id, []) if now_unix - t <= window_s]
                hit = len(seen) >= int(rule.count or 0)
                why = f"{rule.why} ({len(seen)} times in {rule.within_h:g} h)"
            if hit:
                f.action = higher(rule.action, f.action)
                f.escalated_by = rule.id
                f.evidence += f"; escalated to {rule.action}: {why}"
    # A cleared condition that is gone now was repaired: forget the clear.
    for fid in list(cleared):
        if fid not in present:
            del cleared[fid]
    occurrences = {fid: times for fid, times in occurrences.items() if times}
    return {
        **state,
        "active": sorted(present),
        "occurrences": occurrences,
        "cleared": cleared,
        "last_scan_unix": now_unix,
    }
