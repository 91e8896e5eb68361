"""What every check shares: the run context, the per-rank event log, the test fault switch.

Checks run in child processes (one per GPU, or under torchrun / mpirun). Each rank appends
JSON lines to its own file in an event directory: progress marks while it works and one
result per check. The parent (gpuenv.runner) reads those files to show progress, to
judge, and to name the ranks that fell behind when a deadline expires. Files, not pipes,
because mpirun and torchrun multiplex their children's stdout.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_DIR_ENV = "GPUENV_EVENT_DIR"
GATE_ENV = "GPUENV_GATE"
DEADLINE_ENV = "GPUENV_DEADLINE_S"
FAULT_ENV = "GPUENV_FAULT"

# How long before its deadline a rank gives up on its peers by itself (aborting its NCCL
# communicator), so that it can still report what it saw before the parent kills it.
RANK_MARGIN_S = 3.0


@dataclass
class Context:
    """What the parent knows when it starts the checks."""

    node: str
    profile: str = "quick"
    expect_gpus: int | None = None
    thresholds: dict[str, Any] = field(default_factory=dict)
    specs: dict[str, Any] = field(default_factory=dict)
    deadline_override: float | None = None

    def deadline(self, check: str) -> float:
        if self.deadline_override is not None:
            return self.deadline_override
        return float(self.thresholds["deadlines_s"][check])

    def profile_params(self, check: str) -> dict[str, Any]:
        return dict(self.thresholds.get("profiles", {}).get(self.profile, {}).get(check, {}))


class RankLog:
    """Append-only event file of one rank."""

    def __init__(self, directory: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        self.path = Path(directory) / f"rank{rank}.jsonl"

    def _write(self, event: Mapping[str, Any]) -> None:
        line = json.dumps({"rank": self.rank, "t": time.time(), **event}) + "\n"
        # One write call per line, opened in append mode: lines from one rank never interleave.
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()

    def mark(self, check: str, stage: str) -> None:
        self._write({"ev": "mark", "check": check, "stage": stage})

    def result(self, check: str, payload: Mapping[str, Any]) -> None:
        self._write({"ev": "result", "check": check, **payload})


def read_events(directory: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """All events by rank; a torn last line (rank killed mid-write) is ignored."""
    events: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(directory).glob("rank*.jsonl")):
        rank = int(path.stem[4:])
        items = events.setdefault(rank, [])
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def rank_results(events: Mapping[int, list[dict[str, Any]]], check: str) -> dict[int, dict]:
    return {
        rank: ev
        for rank, items in events.items()
        for ev in items
        if ev.get("ev") == "result" and ev.get("check") == check
    }


def ranks_behind(
    events: Mapping[int, list[dict[str, Any]]], check: str, world: int
) -> tuple[list[int], dict[int, str]]:
    """Ranks that did not get as far as the others in ``check``, and each rank's last stage.

    Every rank of a check passes the same sequence of marks, so a rank with fewer marks
    than the furthest one stopped earlier: it is the one that never joined.
    """
    counts: dict[int, int] = {}
    last: dict[int, str] = {}
    for rank in range(world):
        steps = [e for e in events.get(rank, []) if e.get("check") == check]
        # A posted result is one more step: that rank got further than one still working.
        counts[rank] = len(steps)
        last[rank] = (
            ("finished" if steps[-1].get("ev") == "result" else steps[-1]["stage"])
            if steps
            else "not started"
        )
    furthest = max(counts.values(), default=0)
    behind = [r for r in range(world) if counts[r] < furthest]
    return behind, last


def timeline(
    events: Mapping[int, list[dict[str, Any]]], check: str, t0: float
) -> dict[str, list[list[Any]]]:
    """Each rank's stages of ``check`` with seconds since ``t0`` (wall clock): where time went."""
    return {
        str(rank): [
            [e.get("stage", "result"), round(float(e["t"]) - t0, 3)]
            for e in items
            if e.get("check") == check and "t" in e
        ]
        for rank, items in sorted(events.items())
    }


@dataclass(frozen=True)
class Fault:
    action: str  # "hang" or "kill"
    rank: int
    check: str


def parse_faults(spec: str | None) -> list[Fault]:
    """Parse GPUENV_FAULT, e.g. ``hang:rank=1:check=nccl;kill:rank=0:check=ddp``."""
    faults: list[Fault] = []
    for item in (spec or "").split(";"):
        item = item.strip()
        if not item:
            continue
        action, *pairs = item.split(":")
        fields = dict(p.split("=", 1) for p in pairs if "=" in p)
        if action not in ("hang", "kill") or "rank" not in fields or "check" not in fields:
            raise ValueError(
                f"{FAULT_ENV}={spec!r}: expected ACTION:rank=N:check=NAME with ACTION hang or kill"
            )
        faults.append(Fault(action, int(fields["rank"]), fields["check"]))
    return faults


def fault_point(check: str, rank: int) -> None:
    """Test-only switch: make this rank hang or die here when GPUENV_FAULT says so."""
    for fault in parse_faults(os.environ.get(FAULT_ENV)):
        if fault.check != check or fault.rank != rank:
            continue
        if fault.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang: never join, until the deadline kills the process group
            time.sleep(3600)


def wait_gate(timeout_s: float = 3600.0) -> None:
    """Block until the parent opens this launch's gate (a file appears).

    Launchers that are slow to start (torchrun, mpirun: Python, torch, MPI_Init) are
    started early and wait here, so their start-up overlaps the GPU checks without their
    GPU work disturbing the GPU checks' measurements.
    """
    gate = os.environ.get(GATE_ENV)
    if not gate:
        return
    end = time.monotonic() + timeout_s
    while not os.path.exists(gate):
        if time.monotonic() > end:
            raise TimeoutError(f"gate {gate} was not opened within {timeout_s:.0f} s")
        time.sleep(0.02)


def rank_deadline() -> float:
    """Monotonic time at which a rank stops waiting for its peers by itself.

    The parent's deadline runs from the moment it opened the gate (the gate file's
    mtime), so a rank that was slow to start has less time left, not a fresh deadline.
    """
    total = float(os.environ.get(DEADLINE_ENV, "60"))
    gate = os.environ.get(GATE_ENV)
    opened = os.stat(gate).st_mtime if gate and os.path.exists(gate) else time.time()
    remaining = opened + total - time.time() - RANK_MARGIN_S
    return time.monotonic() + max(1.0, remaining)


def measurement(
    name: str,
    value: float | int | str | bool,
    unit: str = "",
    threshold: float | None = None,
    bound: str | None = None,
) -> dict[str, Any]:
    """A Measurement as a plain dict, the form ranks write to their event files."""
    return {"name": name, "value": value, "unit": unit, "threshold": threshold, "bound": bound}


def module_version(name: str) -> str | None:
    """Version of an installed distribution without importing it (cheap in the parent)."""
    from importlib import metadata

    dists = {
        "cupy": ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"),
        "nvidia-ml-py": ("nvidia-ml-py",),
    }.get(name, (name,))
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None
