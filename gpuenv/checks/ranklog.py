"""The rank protocol: how a check's ranks and the parent talk, the whole of it.

Checks run in child processes (one per GPU in the worker, or under torchrun / mpirun). The
parent writes one **rank configuration** (JSON) and names it in ``GPUENV_RANK_CONFIG``: the world
size, the event directory, the gate, and per check its parameters and its deadline span. That
file is the only way a rank learns its deadline.

Each rank appends JSON lines to its own file in the event directory: ``mark`` events as it
passes stages, ``beat`` events while it waits, and one ``result`` per check. The parent reads
those files to show progress, to judge, and, when a deadline expires, to name the ranks that
fell behind. Files, not pipes, because mpirun and torchrun multiplex their children's stdout.

Launchers that are slow to start (torchrun, mpirun) are started early and wait at a **gate**
(a file that the parent creates when their turn comes), so their start-up overlaps other checks.

Names for time: ``*_s`` is a span in seconds, ``*_at`` a point on ``time.monotonic()``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

CONFIG_ENV = "GPUENV_RANK_CONFIG"
FAULT_ENV = "GPUENV_FAULT"

# How long before its deadline a rank gives up on its peers by itself (aborting its NCCL
# communicator), so that it can still report what it saw before the parent kills it.
RANK_MARGIN_S = 3.0
# A rank never gets less than this to finish once it starts, however late it started.
MIN_RANK_SPAN_S = 1.0
# A rank that waits (in a collective, for a peer) writes a heartbeat this often.
BEAT_EVERY_S = 0.5
# A rank whose last heartbeat is older than this, while its peers' are fresh, is frozen.
FROZEN_AFTER_S = 2.0
# How long a launched rank waits for its gate before giving up.
GATE_WAIT_S = 3600.0


@dataclass
class RankConfig:
    """What the parent tells every rank; written once, read by each rank."""

    world: int
    events: str
    checks: dict[str, dict[str, Any]]  # name -> {"params": {...}, "deadline_s": float}
    gate: str | None = None

    def write(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "world": self.world,
                    "events": self.events,
                    "gate": self.gate,
                    "checks": self.checks,
                }
            ),
            encoding="utf-8",
        )
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> RankConfig:
        where = path or os.environ.get(CONFIG_ENV)
        if not where:
            raise RuntimeError(f"{CONFIG_ENV} is not set: ranks are started by gpuenv check")
        with open(where, encoding="utf-8") as fh:
            data = json.load(fh)
        return cls(int(data["world"]), str(data["events"]), dict(data["checks"]), data.get("gate"))

    def deadline_s(self, check: str) -> float:
        return float(self.checks[check]["deadline_s"])

    def params(self, check: str) -> dict[str, Any]:
        return dict(self.checks[check].get("params", {}))


class RankLog:
    """Append-only event file of one rank."""

    def __init__(self, directory: str | os.PathLike[str], rank: int) -> None:
        self.rank = rank
        self.path = Path(directory) / f"rank{rank}.jsonl"
        self.stages: dict[str, str] = {}  # check -> the last stage marked
        self._lock = threading.Lock()

    def _write(self, event: Mapping[str, Any]) -> None:
        line = json.dumps({"rank": self.rank, "t": time.time(), **event}) + "\n"
        # One write call per line, opened in append mode: lines from one rank never interleave.
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()

    def mark(self, check: str, stage: str) -> None:
        self.stages[check] = stage
        self._write({"ev": "mark", "check": check, "stage": stage})

    def beat(self, check: str, stage: str) -> None:
        """This rank is alive and still inside ``stage`` (written while it waits)."""
        self._write({"ev": "beat", "check": check, "stage": stage})

    def result(self, check: str, payload: Mapping[str, Any]) -> None:
        self._write({"ev": "result", "check": check, **payload})


class Heartbeat:
    """Writes ``beat`` events from a thread while the main thread is inside a stage.

    A rank blocked in MPI or NCCL cannot write anything itself; its heartbeat thread can, as
    long as the process is alive and not stopped. A rank that stops beating while its peers
    beat is the frozen one, whatever stage it stopped in.
    """

    def __init__(self, log: RankLog, check: str) -> None:
        self.log = log
        self.check = check
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpuenv-beat")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_EVERY_S):
            self.log.beat(self.check, self.log.stages.get(self.check, "start"))


@dataclass
class RankContext:
    """What one rank of one check gets: who it is, its parameters, its log and its deadline."""

    check: str
    rank: int
    world: int
    params: dict[str, Any]
    log: RankLog
    deadline_at: float
    device: int = 0  # the GPU this rank uses, where it uses one

    @property
    def events(self) -> Path:
        return self.log.path.parent

    def mark(self, stage: str) -> None:
        """This rank reached ``stage`` (and the test fault switch may stop it there)."""
        self.log.mark(self.check, stage)
        fault_point(self.check, self.rank, stage)

    def remaining_s(self) -> float:
        return max(MIN_RANK_SPAN_S, self.deadline_at - time.monotonic())


def launched_rank(check: str, rank: int, world: int, device: int = 0) -> RankContext:
    """The context of a rank started by a launcher (torchrun, mpirun), after its gate opened.

    The parent's deadline runs from the moment it opened the gate (the gate file's mtime), so a
    rank that was slow to start has less time left, not a fresh deadline.
    """
    config = RankConfig.load()
    total_s = config.deadline_s(check)
    opened = (
        os.stat(config.gate).st_mtime
        if config.gate and os.path.exists(config.gate)
        else time.time()
    )
    left_s = opened + total_s - time.time() - RANK_MARGIN_S
    return RankContext(
        check,
        rank,
        world,
        config.params(check),
        RankLog(config.events, rank),
        time.monotonic() + max(MIN_RANK_SPAN_S, left_s),
        device,
    )


def report_uncaught(log: RankLog, check: str, abort: Callable[[int], object]) -> None:
    """From now on, an exception that ends this launched rank is posted as its result (the
    parent's verdict quotes it by rank) and printed, and then ``abort`` (MPI_Abort) ends the
    whole job: an uncaught exception in an mpi4py rank otherwise leaves mpirun running (the rank
    waits in MPI_Finalize, its peers in a collective with it) until the deadline."""

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        log.result(check, {
            "error": f"{kind.__name__}: {exc}",
            "traceback": "".join(traceback.format_exception(kind, exc, tb, limit=6)),
        })  # fmt: skip
        traceback.print_exception(kind, exc, tb)
        sys.stderr.flush()
        abort(1)

    sys.excepthook = hook


def wait_gate(timeout_s: float = GATE_WAIT_S) -> None:
    """Block until the parent opens this launch's gate (its file appears)."""
    gate = RankConfig.load().gate
    if not gate:
        return
    give_up_at = time.monotonic() + timeout_s
    while not os.path.exists(gate):
        if time.monotonic() > give_up_at:
            raise TimeoutError(f"gate {gate} was not opened within {timeout_s:.0f} s")
        time.sleep(0.02)


# ---------------------------------------------------------------- the parent's side


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


def rank_results(
    events: Mapping[int, list[dict[str, Any]]], check: str
) -> dict[int, dict[str, Any]]:
    return {
        rank: ev
        for rank, items in events.items()
        for ev in items
        if ev.get("ev") == "result" and ev.get("check") == check
    }


@dataclass
class Behind:
    """Which ranks of a check fell behind, and why they are called so."""

    ranks: list[int] = field(default_factory=list)
    last_stage: dict[int, str] = field(default_factory=dict)
    why: dict[int, str] = field(default_factory=dict)  # rank -> "stopped beating 7.2 s ago" ...


def ranks_behind(
    events: Mapping[int, list[dict[str, Any]]],
    check: str,
    world: int,
    now: float | None = None,
) -> Behind:
    """The ranks that did not get as far as the others in ``check``, or that froze.

    Two tests, the second only where the first names nobody:
    - progress: every rank passes the same sequence of marks, so a rank with fewer marks than
      the furthest one (a posted result counts as one more) stopped earlier;
    - liveness: while ranks wait they beat; with every rank as far as the others, a rank whose
      last event is more than FROZEN_AFTER_S older than the freshest rank's is frozen (stopped
      by a signal, stuck in the kernel) while its peers wait for it.
    ``now`` is wall-clock time (event times are wall clock: they come from other processes).
    """
    marks: dict[int, int] = {}
    last: dict[int, str] = {}
    seen_at: dict[int, float] = {}
    for rank in range(world):
        steps = [e for e in events.get(rank, []) if e.get("check") == check]
        progress = [e for e in steps if e.get("ev") in ("mark", "result")]
        marks[rank] = len(progress)
        last[rank] = (
            ("finished" if progress[-1].get("ev") == "result" else str(progress[-1]["stage"]))
            if progress
            else "not started"
        )
        seen_at[rank] = max((float(e.get("t", 0.0)) for e in steps), default=0.0)
    behind = Behind(last_stage=last)
    furthest = max(marks.values(), default=0)
    for rank in range(world):
        if marks[rank] < furthest:
            behind.why[rank] = f"last: {last[rank]}"
    freshest = max(seen_at.values(), default=0.0)
    beating = any(e.get("ev") == "beat" and e.get("check") == check
                  for items in events.values() for e in items)  # fmt: skip
    # Liveness decides only where progress cannot: every rank got equally far. A rank that fell
    # behind explains its peers' waiting, and a peer that gave up on it (a timeout) and died is
    # not the cause.
    if beating and freshest and not behind.why:
        for rank in range(world):
            if rank in behind.why or last[rank] == "finished":
                continue
            silent_s = freshest - seen_at[rank] if seen_at[rank] else None
            if silent_s is None:
                behind.why[rank] = "never started"
            elif silent_s > FROZEN_AFTER_S:
                behind.why[rank] = (
                    f"frozen in {last[rank]!r}: silent {silent_s:.1f} s while its peers waited"
                )
    behind.ranks = sorted(behind.why)
    return behind


def hang_reason(
    check: str, events: Mapping[int, list[dict[str, Any]]], world: int, how: str
) -> tuple[str, dict[str, Any]]:
    """One sentence naming the ranks that fell behind, and the details for the report."""
    behind = ranks_behind(events, check, world)
    if behind.ranks:
        who = ", ".join(f"rank {r} ({behind.why[r]})" for r in behind.ranks)
        text = f"{how}: {who} did not keep up"
    else:
        stage = behind.last_stage.get(0, "start")
        text = f"{how}: all {world} ranks stopped at {stage!r}, none fell behind the others"
    details = {
        "ranks_behind": behind.ranks,
        "why": {str(r): w for r, w in behind.why.items()},
        "last_stage": {str(r): s for r, s in behind.last_stage.items()},
    }
    return text, details


def timeline(
    events: Mapping[int, list[dict[str, Any]]], check: str, t0: float
) -> dict[str, list[list[Any]]]:
    """Each rank's stages of ``check`` with seconds since ``t0`` (wall clock): where time went."""
    return {
        str(rank): [
            [e.get("stage", "result"), round(float(e["t"]) - t0, 3)]
            for e in items
            if e.get("check") == check and "t" in e and e.get("ev") != "beat"
        ]
        for rank, items in sorted(events.items())
    }


def errors_of(payloads: Mapping[int, Mapping[str, Any]]) -> str | None:
    """The ranks' own errors (an exception in a rank), one sentence; None when there are none."""
    errors = [f"rank {r}: {p['error']}" for r, p in sorted(payloads.items()) if p.get("error")]
    return "; ".join(errors) if errors else None


# ---------------------------------------------------------------- the test fault switch


@dataclass(frozen=True)
class Fault:
    action: str  # "hang", "kill" or "freeze"
    rank: int
    check: str
    stage: str | None = None  # where; None: at the check's fault point


def parse_faults(spec: str | None) -> list[Fault]:
    """Parse GPUENV_FAULT, e.g. ``hang:rank=1:check=nccl;freeze:rank=1:check=mpi:stage=bcast``."""
    faults: list[Fault] = []
    for item in (spec or "").split(";"):
        item = item.strip()
        if not item:
            continue
        action, *pairs = item.split(":")
        fields = dict(p.split("=", 1) for p in pairs if "=" in p)
        if action not in ("hang", "kill", "freeze") or not {"rank", "check"} <= set(fields):
            raise ValueError(
                f"{FAULT_ENV}={spec!r}: expected ACTION:rank=N:check=NAME[:stage=S]"
                " with ACTION hang, kill or freeze"
            )
        faults.append(Fault(action, int(fields["rank"]), fields["check"], fields.get("stage")))
    return faults


def fault_point(check: str, rank: int, stage: str | None = None) -> None:
    """Test-only switch: make this rank hang, die or freeze here when GPUENV_FAULT says so.

    ``hang`` sleeps (its heartbeat thread goes on: a rank that never joins); ``freeze`` stops
    the whole process with SIGSTOP (no heartbeat: a rank stuck inside a collective); ``kill``
    dies with SIGKILL.
    """
    for fault in parse_faults(os.environ.get(FAULT_ENV)):
        if fault.check != check or fault.rank != rank or fault.stage != stage:
            continue
        if fault.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.action == "freeze":
            os.kill(os.getpid(), signal.SIGSTOP)
        while True:  # hang: never join, until the deadline kills the process group
            time.sleep(3600)
