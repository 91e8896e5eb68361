"""Runs checks in child processes under deadlines; kills whole sessions; never hangs.

Every launch (a GPU rank, torchrun, mpirun) starts in a new session, so it and all its
descendants share one session and process group id. On a deadline the runner kills that
process group, every process of the session, and any descendant that moved elsewhere:
SIGTERM first, SIGKILL after a grace period. Then it names the ranks that fell behind
from the ranks' event files (gpuenv.checks.base).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.checks import CHECKS, gpu_checks
from gpuenv.checks import base as B
from gpuenv.results import Result, Status

Progress = Callable[[str, "str | Result"], None]
KILL_GRACE_S = 2.0
TEARDOWN_S = 0.5  # how long a launcher may take to exit once all its ranks reported
POLL_S = 0.05


# ---------------------------------------------------------------- processes


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) for every process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z":
            continue  # a zombie holds nothing; its parent reaps it
        table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def session_members(leader: int) -> set[int]:
    """Processes in the leader's session or group, and all descendants of the leader."""
    if not os.path.isdir("/proc"):
        return {leader}
    table = _proc_table()
    members = {p for p, (_, pgid, sid) in table.items() if sid == leader or pgid == leader}
    members.add(leader)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in table.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    members.discard(os.getpid())
    return {p for p in members if p in table or p == leader}


def processes_with_env(key: str, value: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``key=value``: leftovers."""
    needle = f"{key}={value}".encode()
    found = []
    table = _proc_table()
    for pid in table:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(pid)
    return found


def kill_session(leader: int, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM then SIGKILL the leader's process group, session and descendants."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        targets = session_members(leader)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, sig)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig is signal.SIGKILL:
            break
        end = time.monotonic() + grace_s
        while time.monotonic() < end and _alive(session_members(leader)):
            time.sleep(0.05)


def _alive(pids: set[int]) -> bool:
    table = _proc_table() if os.path.isdir("/proc") else {}
    return any(p in table for p in pids)


@dataclass
class Launch:
    """One child started in its own session; its output goes to ``log``."""

    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    def start(self) -> Launch:
        self.started = time.monotonic()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def kill(self, grace_s: float = KILL_GRACE_S) -> None:
        if self.proc is None:
            return
        kill_session(self.proc.pid, grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        # Descendants reparented away from the leader can survive the group kill; sweep them.
        kill_session(self.proc.pid, grace_s=0.5)

    def tail(self, lines: int = 12) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class Outcome:
    returncode: int | None
    timed_out: bool
    elapsed_s: float
    stopped: bool = False  # ended by the caller's ``tick`` (its work was complete)


def run_with_deadline(
    argv: Sequence[str], deadline_s: float, log: Path, env: Mapping[str, str] | None = None
) -> Outcome:
    """Run ``argv`` in a new session; at the deadline kill everything it started."""
    launch = Launch(list(argv), log, dict(env) if env is not None else None).start()
    return wait(launch, deadline_s)


def wait(launch: Launch, deadline_s: float, tick: Callable[[], bool] | None = None) -> Outcome:
    """Wait for ``launch`` until ``deadline_s`` after now; ``tick`` returning True stops early."""
    start = time.monotonic()
    end = start + deadline_s
    try:
        while True:
            rc = launch.poll()
            if rc is not None:
                # The leader is done; leftovers of its session (daemonised helpers) go too.
                if _alive(session_members(launch.pid) - {launch.pid}):
                    kill_session(launch.pid, grace_s=0.5)
                return Outcome(rc, False, time.monotonic() - start)
            if tick is not None and tick():
                launch.kill(grace_s=0.0)  # its work is done: nothing to let it finish
                return Outcome(launch.poll(), False, time.monotonic() - start, stopped=True)
            if time.monotonic() >= end:
                launch.kill()
                return Outcome(launch.poll(), True, time.monotonic() - start)
            time.sleep(POLL_S)
    except BaseException:
        launch.kill()
        raise


# ---------------------------------------------------------------- orchestration


@dataclass
class _Run:
    ctx: B.Context
    workdir: Path
    progress: Progress
    launches: list[Launch] = field(default_factory=list)

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        # gpuenv must be importable by the children exactly as it is by this process.
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return env

    def launch(self, argv: list[str], name: str, extra: Mapping[str, str] | None = None) -> Launch:
        item = Launch(argv, self.workdir / f"{name}.log", self.env(extra)).start()
        self.launches.append(item)
        return item


def _skip(ctx: B.Context, name: str, reason: str) -> Result:
    return Result(name, ctx.node, Status.SKIP, reason=reason)


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _hang_reason(
    name: str, events: Mapping[int, list[dict[str, Any]]], world: int, deadline: float, how: str
) -> tuple[str, dict[str, Any]]:
    behind, last = B.ranks_behind(events, name, world)
    if behind:
        who = ", ".join(f"rank {r} (last: {last[r]})" for r in behind)
        text = f"{how}: {who} did not join"
    else:
        text = f"{how}: all {world} ranks stopped at {last.get(0, 'start')!r}"
    return text, {"ranks_behind": behind, "last_stage": {str(r): s for r, s in last.items()}}


def _error_from(payloads: Mapping[int, Mapping[str, Any]]) -> str | None:
    errors = [f"rank {r}: {p['error']}" for r, p in sorted(payloads.items()) if p.get("error")]
    return "; ".join(errors) if errors else None


def _gpu_stage(
    run: _Run, names: list[str], gpus: list[dict[str, Any]], world: int, results: dict[str, Result]
) -> None:
    """cupy, streams, nccl in one process per GPU, each check under its own deadline."""
    ctx = run.ctx
    events_dir = run.workdir / "gpu"
    events_dir.mkdir()
    config = {
        "world": world,
        "checks": names,
        "events": str(events_dir),
        "params": {n: ctx.profile_params(n) for n in names},
        "deadlines": {n: ctx.deadline(n) for n in names},
    }
    if os.environ.get("GPUENV_NCCL_PAIRS") == "1":  # exercise the pair matrix on 2 GPUs
        config["params"].setdefault("nccl", {})["pairs"] = True
    cfg_path = run.workdir / "gpu.json"
    cfg_path.write_text(json.dumps(config), encoding="utf-8")
    ranks = [
        run.launch([sys.executable, "-m", "gpuenv.checks.worker", str(cfg_path), str(r)], f"gpu{r}")
        for r in range(world)
    ]
    started: dict[str, float] = {}
    stage_t0 = time.time()
    pending = list(names)
    while pending:
        name = pending[0]
        events = B.read_events(events_dir)
        payloads = B.rank_results(events, name)
        if name not in started:
            # The clock of a check starts when the one before it ended (or at launch).
            started[name] = time.monotonic()
            run.progress(name, "running")
        if len(payloads) == world:
            duration = time.monotonic() - started.get(name, time.monotonic())
            results[name] = _judge_gpu(ctx, name, gpus, payloads, world, duration)
            results[name].details["timeline_s"] = B.timeline(events, name, stage_t0)
            run.progress(name, results[name])
            pending.pop(0)
            continue
        dead = {
            r: x.poll() for r, x in enumerate(ranks) if x.poll() is not None and r not in payloads
        }
        expired = time.monotonic() - started[name] > ctx.deadline(name)
        if dead or expired:
            if dead:
                # Let a peer that saw the failure report it (it aborts within its margin).
                time.sleep(0.2)
            for item in ranks:
                item.kill()
            events = B.read_events(events_dir)
            payloads = B.rank_results(events, name)
            if dead:
                who = ", ".join(f"rank {r} exited with {_rc(c)}" for r, c in sorted(dead.items()))
                text, details = _hang_reason(name, events, world, ctx.deadline(name), who)
                text = f"{who} during {name}; peers were killed"
                details["rank_exit"] = {str(r): c for r, c in dead.items()}
                tails = {str(r): ranks[r].tail(6) for r in dead}
                details["log_tail"] = tails
            else:
                text, details = _hang_reason(
                    name,
                    events,
                    world,
                    ctx.deadline(name),
                    f"deadline {ctx.deadline(name):g} s expired",
                )
                timeouts = [
                    f"rank {r}: {p['timeout']}" for r, p in payloads.items() if p.get("timeout")
                ]
                if timeouts:
                    text += "; " + "; ".join(timeouts)
                error = _error_from(payloads)
                if error:
                    text += f"; {error}"
                text += "; process group killed"
            duration = time.monotonic() - started.get(name, time.monotonic())
            details["timeline_s"] = B.timeline(events, name, stage_t0)
            results[name] = Result(
                name, ctx.node, Status.FAIL, text, duration_s=duration, details=details
            )
            run.progress(name, results[name])
            for other in pending[1:]:
                results[other] = Result(
                    other,
                    ctx.node,
                    Status.ERROR,
                    f"not run: the GPU worker processes were killed after {name} failed",
                )
                run.progress(other, results[other])
            return
        time.sleep(POLL_S)
    for item in ranks:
        wait(item, 10)


def _rc(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def _judge_gpu(
    ctx: B.Context,
    name: str,
    gpus: list[dict[str, Any]],
    payloads: Mapping[int, Mapping[str, Any]],
    world: int,
    duration: float,
) -> Result:
    error = _error_from(payloads)
    if error:
        tb = next((p["traceback"] for p in payloads.values() if p.get("traceback")), "")
        return Result(
            name, ctx.node, Status.ERROR, error, duration_s=duration, details={"traceback": tb}
        )
    module = CHECKS[name]
    try:
        result = (
            module.judge(ctx, gpus, payloads, world)
            if name == "nccl"
            else module.judge(ctx, gpus, payloads)
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        return Result(
            name,
            ctx.node,
            Status.ERROR,
            f"cannot judge the ranks' results: {exc!r}",
            duration_s=duration,
        )
    result.duration_s = duration
    return result


def _launched_check(
    run: _Run,
    name: str,
    launch: Launch,
    gate: Path,
    events_dir: Path,
    world: int,
    judge: Callable[[Mapping[int, Mapping[str, Any]]], Result],
) -> Result:
    """Open a prestarted launch's gate, wait for it under the deadline, judge its ranks."""
    ctx = run.ctx
    deadline = ctx.deadline(name)
    run.progress(name, "running")
    gate.touch()
    opened = time.time()
    complete_since: list[float] = []

    def complete() -> bool:
        """Every rank posted its result: allow the launcher TEARDOWN_S to exit, then end it.

        NCCL and torchrun teardown take seconds and decide nothing; the verdict is in.
        """
        if not complete_since:
            if len(B.rank_results(B.read_events(events_dir), name)) < world:
                return False
            complete_since.append(time.monotonic())
        return time.monotonic() - complete_since[0] > TEARDOWN_S

    outcome = wait(launch, deadline, tick=complete)
    events = B.read_events(events_dir)
    payloads = B.rank_results(events, name)
    # Where the time went, from the gate's opening: start-up, each stage, the launcher's exit.
    trace = {
        "timeline_s": B.timeline(events, name, opened),
        "launcher_exit_s": round(outcome.elapsed_s, 3),
        "launcher_ended_after_results": outcome.stopped,
    }
    if outcome.timed_out:
        text, details = _hang_reason(
            name, events, world, deadline, f"deadline {deadline:g} s expired"
        )
        text += "; process group killed"
        return Result(
            name, ctx.node, Status.FAIL, text, duration_s=outcome.elapsed_s,
            details={**details, **trace},
        )  # fmt: skip
    if len(payloads) < world or (outcome.returncode != 0 and not outcome.stopped):
        launcher = launch.argv[2] if launch.argv[0] == sys.executable else launch.argv[0]
        how = f"{launcher} exited with {_rc(outcome.returncode)}"
        text, details = _hang_reason(name, events, world, deadline, how)
        missing = sorted(set(range(world)) - set(payloads))
        if missing:
            text += f"; no result from rank(s) {missing}"
        error = _error_from(payloads)
        if error:
            text += f"; {error}"
        details["log_tail"] = launch.tail()
        return Result(
            name, ctx.node, Status.FAIL, text, duration_s=outcome.elapsed_s,
            details={**details, **trace},
        )  # fmt: skip
    error = _error_from(payloads)
    if error:
        return Result(
            name, ctx.node, Status.ERROR, error, duration_s=outcome.elapsed_s,
            details={"log_tail": launch.tail(), **trace},
        )  # fmt: skip
    result = judge(payloads)
    result.duration_s = outcome.elapsed_s
    result.details.update(trace)
    return result


def run_checks(
    ctx: B.Context, names: Sequence[str], progress: Progress | None = None
) -> list[Result]:
    """Run the named checks on this node, in the canonical order; never raises for a check."""
    progress = progress or (lambda name, state: None)
    workdir = Path(tempfile.mkdtemp(prefix="gpuenv-check-"))
    run = _Run(ctx, workdir, progress)
    results: dict[str, Result] = {}
    try:
        _run_all(run, list(names), results)
    finally:
        for item in run.launches:
            if item.proc is not None and item.poll() is None:
                item.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return [results[n] for n in CHECKS if n in results]


def _run_all(run: _Run, names: list[str], results: dict[str, Result]) -> None:
    from gpuenv.checks import ddp, mpi, system

    ctx = run.ctx
    # NVML first, always: the other checks need the GPU count, models and links.
    t0 = time.monotonic()
    if "system" in names:
        run.progress("system", "running")
    probe_dir = run.workdir / "system"
    probe_dir.mkdir()
    cfg = run.workdir / "system.json"
    cfg.write_text(
        json.dumps(
            {
                "world": 1,
                "checks": ["system"],
                "events": str(probe_dir),
                "params": {},
                "deadlines": {"system": ctx.deadline("system")},
            }
        ),
        encoding="utf-8",
    )
    launch = run.launch([sys.executable, "-m", "gpuenv.checks.worker", str(cfg), "0"], "system")
    outcome = wait(launch, ctx.deadline("system"))
    payload = B.rank_results(B.read_events(probe_dir), "system").get(0)
    if payload is None or payload.get("error"):
        why = (
            f"deadline {ctx.deadline('system'):g} s expired: NVML did not answer;"
            " process group killed"
            if outcome.timed_out
            else (payload or {}).get("error")
            or f"NVML probe exited with {_rc(outcome.returncode)}: {launch.tail(3)}"
        )
        sysres = Result("system", ctx.node, Status.FAIL if outcome.timed_out else Status.ERROR, why)
        probe: dict[str, Any] = {"available": False, "reason": f"system probe failed: {why}"}
    else:
        sysres = system.judge(ctx, payload)
        probe = payload["probe"]
    sysres.duration_s = time.monotonic() - t0
    if "system" in names:
        results["system"] = sysres
        run.progress("system", sysres)
    gpus = system.visible(probe.get("gpus", [])) if probe.get("available") else []
    no_gpu = (
        probe.get("reason")
        if not probe.get("available")
        else (None if gpus else "no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES hides all)")
    )

    # Decide what can run here, and say why not.
    gpu_names = []
    for name in gpu_checks():
        if name not in names:
            continue
        if no_gpu:
            reason = (
                no_gpu
                if no_gpu.startswith("no NVIDIA GPU")
                else f"no NVIDIA GPU visible ({no_gpu})"
            )
            results[name] = _skip(ctx, name, reason)
        elif not _has("cupy"):
            results[name] = _skip(ctx, name, "cupy not installed")
        elif name == "nccl" and len(gpus) < 2:
            results[name] = _skip(
                ctx, name, f"an all-reduce needs at least 2 GPUs; {len(gpus)} visible"
            )
        else:
            gpu_names.append(name)
            continue
        run.progress(name, results[name])

    # Prestart the slow launchers; they wait at their gate until the GPU checks are done.
    prestarted: dict[str, tuple[Launch, Path, Path, int]] = {}
    for name, module in (("ddp", ddp), ("mpi", mpi)):
        if name not in names:
            continue
        why_not = module.unavailable(bool(gpus))
        if why_not:
            results[name] = _skip(ctx, name, why_not)
            run.progress(name, results[name])
            continue
        world = len(gpus) if gpus else 2
        events_dir = run.workdir / name
        events_dir.mkdir()
        gate = run.workdir / f"{name}.gate"
        env = {
            B.EVENT_DIR_ENV: str(events_dir),
            B.GATE_ENV: str(gate),
            B.DEADLINE_ENV: str(ctx.deadline(name)),
        }
        argv = module.command(ctx, world, bool(gpus))
        prestarted[name] = (
            run.launch(argv, name, {**env, **module.environment(ctx, bool(gpus))}),
            gate,
            events_dir,
            world,
        )

    if gpu_names:
        _gpu_stage(run, gpu_names, gpus, len(gpus), results)

    # MPI first: it takes a second, while torchrun's ranks are still importing torch.
    for name, module in (("mpi", mpi), ("ddp", ddp)):
        if name not in prestarted:
            continue
        launch, gate, events_dir, world = prestarted[name]
        results[name] = _launched_check(
            run,
            name,
            launch,
            gate,
            events_dir,
            world,
            lambda payloads, m=module, w=world: m.judge(ctx, payloads, w, bool(gpus)),
        )
        run.progress(name, results[name])
