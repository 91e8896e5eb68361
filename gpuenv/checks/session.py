"""Runs node checks through the check contract (gpuenv.checks.base), never by their names.

1. The PROBE check runs first, alone, in one worker process: its payload says which GPUs the
   other checks may use (``NodeInfo``) and gives its own verdict.
2. Each other check is asked whether it can run here (``unavailable``); a check that cannot is
   a SKIP with its reason. GPU-placement checks also need a visible GPU.
3. LAUNCHER checks are started early (torchrun and mpirun take seconds to start) and wait at
   their gate: during the probe, on the probe's guess from files (``early_node``); a launch
   whose command or environment differs once the probe has answered is killed and started
   again on the answer.
4. GPU checks run in one worker process per visible GPU, one check after the other, each under
   its own deadline that starts when the check before it ended.
5. The gates open one at a time, in registry order; each launch runs under its deadline.

Whatever happens, no process outlives the run: a deadline or a dead rank kills the whole
process session (gpuenv.proc), and the ranks' event files name the rank that fell behind.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from gpuenv import bytecode, proc
from gpuenv.checks import rank_cause, ranklog
from gpuenv.checks.base import Check, Context, LaunchedCheck, NodeInfo, Placement, ProbeCheck
from gpuenv.progress import Progress, Silent
from gpuenv.results import Result, Status

# How long a launcher may take to exit once all its ranks reported: NCCL and torchrun teardown
# take seconds and decide nothing, the verdict is in.
TEARDOWN_S = 0.2
# After a rank died, how long its peers get to report what they saw (they abort by themselves).
PEER_REPORT_S = 0.2
# How long the GPU workers get to exit once every check reported.
WORKER_EXIT_S = 10.0


def module_of(check: Check) -> str:
    """The importable module that holds a check: the worker imports it by this name."""
    if not isinstance(check, ModuleType):
        raise TypeError(f"check {check.NAME!r} must be a module (the worker imports it by name)")
    return check.__name__


@dataclass
class _Session:
    ctx: Context
    registry: Mapping[str, Check]
    workdir: Path
    progress: Progress
    results: dict[str, Result] = field(default_factory=dict)
    launches: list[proc.Launch] = field(default_factory=list)
    # torch compiled from source in every child (gpuenv.bytecode): they get a bytecode cache
    pyc: bytecode.Reading | None = None

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        # gpuenv must be importable by the children exactly as it is by this process.
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(extra or {})
        return bytecode.child_env(env, self.pyc)

    def start(self, argv: list[str], name: str, extra: Mapping[str, str]) -> proc.Launch:
        # In the run's own folder: the caller's may not be readable (a sudo'ed user in another
        # user's home), and Open MPI 5's mpirun dies with SIGSEGV there.
        launch = proc.Launch(
            argv, self.workdir / f"{name}.log", self.env(extra), cwd=str(self.workdir)
        ).start()
        self.launches.append(launch)
        return launch

    def config(self, name: str, checks: Sequence[str], world: int, gate: Path | None) -> Path:
        events = self.workdir / name
        shutil.rmtree(events, ignore_errors=True)  # a launch started on a wrong guess wrote here
        events.mkdir()
        config = ranklog.RankConfig(
            world=world,
            events=str(events),
            gate=str(gate) if gate else None,
            checks={
                n: {
                    "module": module_of(self.registry[n]),
                    "params": self.ctx.profile_params(n),
                    "deadline_s": self.ctx.deadline_s(n),
                }
                for n in checks
            },
        )
        return config.write(self.workdir / f"{name}.json")

    def begin(self, name: str) -> None:
        self.progress.begin(name, self.registry[name].DESCRIPTION)

    def done(self, result: Result) -> None:
        self.results[result.check] = result
        self.progress.end(result.check, result.reason, result.status.value)


@dataclass
class _Prestart:
    """A launcher waiting at its gate, and what it was started with."""

    launch: proc.Launch
    gate: Path
    events: Path
    world: int
    argv: list[str]
    extra: dict[str, str]
    early: bool  # started during the probe, on its guess


@dataclass
class NodeRun:
    """What a run found: the node as the probe saw it, and one Result per check run."""

    node: NodeInfo
    results: list[Result]


def run_checks(
    registry: Mapping[str, Check],
    ctx: Context,
    names: Sequence[str],
    progress: Progress | None = None,
) -> NodeRun:
    """Run the named checks of ``registry`` on this node, in registry order; never raises for a
    check. The caller hands the registry (gpuenv.checks.REGISTRY, or fakes in tests)."""
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown check(s): {', '.join(unknown)}")
    workdir = Path(tempfile.mkdtemp(prefix="gpuenv-check-"))
    session = _Session(ctx, registry, workdir, progress or Silent(), pyc=bytecode.read())
    try:
        node = _run(session, [n for n in registry if n in names])
    finally:
        for launch in session.launches:
            if launch.running():
                launch.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    return NodeRun(node, [session.results[n] for n in registry if n in session.results])


def _the_probe(registry: Mapping[str, Check]) -> ProbeCheck:
    probes = [c for c in registry.values() if c.PLACEMENT is Placement.PROBE]
    if len(probes) != 1:
        raise ValueError(f"the registry needs exactly one PROBE check, it has {len(probes)}")
    return cast(ProbeCheck, probes[0])


def _probe(session: _Session, names: Sequence[str], check: ProbeCheck) -> NodeInfo:
    ctx = session.ctx
    name = check.NAME
    wanted = name in names
    if wanted:
        session.begin(name)
    began_at = time.monotonic()
    config = session.config(name, [name], 1, None)
    launch = session.start(_worker_argv(0), name, {ranklog.CONFIG_ENV: str(config)})
    outcome = proc.wait(launch, ctx.deadline_s(name))
    payload = ranklog.rank_results(ranklog.read_events(session.workdir / name), name).get(0)
    if payload is None or payload.get("error"):
        why = (
            f"deadline {ctx.deadline_s(name):g} s expired: the probe did not answer;"
            " process group killed"
            if outcome.timed_out
            else (payload or {}).get("error")
            or f"probe exited with {proc.describe_exit(outcome.returncode)}: {launch.tail(3)}"
        )
        status = Status.FAIL if outcome.timed_out else Status.ERROR
        result = Result(name, ctx.node, status, why)
        node = check.node_info(None, f"{name} probe failed: {why}")
    else:
        node = check.node_info(payload, None)
        result = _judge(check, ctx, node, {0: payload}, 1)
        if session.pyc is not None and session.pyc.compiles_every_time:
            result.reason += f"; note: {session.pyc.describe()}"
    result.duration_s = time.monotonic() - began_at
    if wanted:
        session.done(result)
    return node


def _why_not(session: _Session, check: Check, node: NodeInfo) -> tuple[str | None, int]:
    """Why ``check`` cannot run on ``node`` (None when it can), and its world."""
    why_not = None
    if check.PLACEMENT is Placement.GPU and not node.has_gpu:
        why_not = node.no_gpu or "no NVIDIA GPU visible"
    why_not = why_not or check.unavailable(session.ctx, node)
    world = 0 if why_not else check.world(session.ctx, node)
    if not why_not and world < 1:
        why_not = f"{check.NAME} has no rank to run here (world {world})"
    return why_not, world


def _prestart(
    session: _Session,
    check: LaunchedCheck,
    node: NodeInfo,
    world: int,
    early: bool,
    previous: _Prestart | None = None,
) -> _Prestart:
    """Start ``check``'s launcher for ``node``; it waits at its gate until its turn. A launch
    started before with the same command and environment is kept (it is further on)."""
    argv = check.command(session.ctx, node, world)
    extra = check.environment(session.ctx, node)
    if previous is not None:
        if (previous.argv, previous.extra, previous.world) == (argv, extra, world):
            return previous
        previous.launch.kill()
    name = check.NAME
    gate = session.workdir / f"{name}.gate"
    config = session.config(name, [name], world, gate)
    launch = session.start(argv, name, {ranklog.CONFIG_ENV: str(config), **extra})
    return _Prestart(launch, gate, session.workdir / name, world, argv, extra, early)


def _run(session: _Session, names: list[str]) -> NodeInfo:
    ctx, registry = session.ctx, session.registry
    launchers = [
        (n, cast(LaunchedCheck, registry[n]))
        for n in names
        if registry[n].PLACEMENT is Placement.LAUNCHER
    ]
    probe = _the_probe(registry)
    guess = probe.early_node(ctx) if launchers else None
    early: dict[str, _Prestart] = {}
    for name, launcher in launchers if guess is not None else []:
        why_not, world = _why_not(session, launcher, guess)
        if not why_not:
            early[name] = _prestart(session, launcher, guess, world, True)
    node = _probe(session, names, probe)

    gpu_names: list[str] = []
    launched: dict[str, _Prestart] = {}
    for name in names:
        check = registry[name]
        if check.PLACEMENT is Placement.PROBE:
            continue
        why_not, world = _why_not(session, check, node)
        if why_not:
            if name in early:
                early.pop(name).launch.kill()
            session.done(Result(name, ctx.node, Status.SKIP, why_not))
        elif check.PLACEMENT is Placement.GPU:
            gpu_names.append(name)
        else:
            previous = early.pop(name, None)
            launched[name] = _prestart(
                session, cast(LaunchedCheck, check), node, world, False, previous
            )

    if gpu_names:
        _gpu_stage(session, gpu_names, node)
    for name, started in launched.items():
        session.done(_launched(session, node, name, started))
    return node


def _worker_argv(rank: int) -> list[str]:
    return [sys.executable, "-m", "gpuenv.checks.worker", str(rank)]


def _judge(
    check: Check,
    ctx: Context,
    node: NodeInfo,
    payloads: Mapping[int, Mapping[str, Any]],
    world: int,
) -> Result:
    """The check's verdict, or ERROR when a rank raised or the judge cannot read the payloads."""
    error = ranklog.errors_of(payloads)
    if error:
        tb = next((p["traceback"] for p in payloads.values() if p.get("traceback")), "")
        cause = rank_cause.find({}, payloads, rank_cause.login_here())
        return Result(check.NAME, ctx.node, Status.ERROR, cause.text or error,
                      details={"traceback": tb, **cause.details()})  # fmt: skip
    missing = sorted(set(range(world)) - set(payloads))
    if missing:
        return Result(
            check.NAME, ctx.node, Status.FAIL, f"no result from rank(s) {missing} of {world}"
        )
    try:
        return check.judge(ctx, node, payloads, world)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
        return Result(
            check.NAME, ctx.node, Status.ERROR, f"cannot judge the ranks' results: {exc!r}"
        )


def _gpu_stage(session: _Session, names: list[str], node: NodeInfo) -> None:
    """The GPU checks in one process per GPU, each check under its own deadline."""
    ctx = session.ctx
    world = len(node.gpus)
    config = session.config("gpu", names, world, None)
    events_dir = session.workdir / "gpu"
    ranks = [
        session.start(_worker_argv(r), f"gpu{r}", {ranklog.CONFIG_ENV: str(config)})
        for r in range(world)
    ]
    stage_t0 = time.time()
    for position, name in enumerate(names):
        check = session.registry[name]
        session.begin(name)
        # The clock of a check starts when the one before it ended (or at launch).
        began_at = time.monotonic()
        deadline_s = ctx.deadline_s(name)
        failure = None
        while True:
            events = ranklog.read_events(events_dir)
            payloads = ranklog.rank_results(events, name)
            if len(payloads) == world:
                break
            dead = {
                r: x.poll()
                for r, x in enumerate(ranks)
                if x.poll() is not None and r not in payloads
            }
            if dead or time.monotonic() - began_at > deadline_s:
                failure = dead
                break
            time.sleep(proc.POLL_S)
        if failure is None:
            result = _judge(check, ctx, node, payloads, world)
            result.duration_s = time.monotonic() - began_at
            result.details["timeline_s"] = ranklog.timeline(events, name, stage_t0)
            session.done(result)
            continue
        if failure:
            time.sleep(PEER_REPORT_S)  # let a peer that saw the failure report it
            events = ranklog.read_events(events_dir)
        # The ranks' last events are the ones read before anything is killed (see _launched).
        payloads = ranklog.rank_results(events, name)
        for launch in ranks:
            launch.kill()
        if failure:
            who = ", ".join(
                f"rank {r} exited with {proc.describe_exit(c)}" for r, c in sorted(failure.items())
            )
            _, details = ranklog.hang_reason(name, events, world, who)
            outputs: dict[int | None, str] = {r: ranks[r].output() for r in sorted(failure)}
            cause = rank_cause.find(outputs, payloads, rank_cause.login_here())
            text = cause.before(f"{who} during {name}; peers were killed")
            details["rank_exit"] = {str(r): c for r, c in failure.items()}
            details["log_tail"] = {str(r): ranks[r].tail(6) for r in failure}
            details.update(cause.details())
        else:
            text, details = ranklog.hang_reason(
                name, events, world, f"deadline {deadline_s:g} s expired"
            )
            timeouts = [
                f"rank {r}: {p['timeout']}" for r, p in payloads.items() if p.get("timeout")
            ]
            error = ranklog.errors_of(payloads)
            text = "; ".join([text, *timeouts, *([error] if error else []), "process group killed"])
        details["timeline_s"] = ranklog.timeline(events, name, stage_t0)
        session.done(
            Result(
                name,
                ctx.node,
                Status.FAIL,
                text,
                duration_s=time.monotonic() - began_at,
                details=details,
            )
        )
        for other in names[position + 1 :]:
            session.done(
                Result(
                    other,
                    ctx.node,
                    Status.ERROR,
                    f"not run: the GPU worker processes were killed after {name} failed",
                )
            )
        return
    for launch in ranks:
        proc.wait(launch, WORKER_EXIT_S)


def _launched(session: _Session, node: NodeInfo, name: str, started: _Prestart) -> Result:
    """Open a prestarted launch's gate, wait for it under the deadline, judge its ranks."""
    launch, gate, events_dir, world = started.launch, started.gate, started.events, started.world
    ctx = session.ctx
    check = session.registry[name]
    deadline_s = ctx.deadline_s(name)
    session.begin(name)
    gate.touch()
    opened = time.time()
    complete_since: list[float] = []
    # The ranks' events as last read before anything is killed: a launcher that is killed may
    # wake a stopped rank on its way out (Open MPI 4.1's mpirun sends SIGCONT before SIGTERM),
    # and that rank's late heartbeat would hide the freeze. proc.wait ticks once more after the
    # launcher exits on its own, before it sweeps what is left of its session.
    seen: list[dict[int, list[dict[str, Any]]]] = [ranklog.read_events(events_dir)]

    def complete() -> bool:
        """Every rank posted its result: allow the launcher TEARDOWN_S to exit, then end it."""
        seen[0] = ranklog.read_events(events_dir)
        if not complete_since:
            if len(ranklog.rank_results(seen[0], name)) < world:
                return False
            complete_since.append(time.monotonic())
        return time.monotonic() - complete_since[0] > TEARDOWN_S

    outcome = proc.wait(launch, deadline_s, tick=complete)
    events = seen[0]
    payloads = ranklog.rank_results(events, name)
    # Where the time went, from the gate's opening: start-up, each stage, the launcher's exit.
    trace = {
        "timeline_s": ranklog.timeline(events, name, opened),
        "launcher_exit_s": round(outcome.elapsed_s, 3),
        "launcher_ended_after_results": outcome.stopped,
        "launcher_started": "during the probe" if started.early else "after the probe",
    }

    def failed(text: str, details: dict[str, Any], status: Status = Status.FAIL) -> Result:
        return Result(
            name, ctx.node, status, text, duration_s=outcome.elapsed_s, details={**details, **trace}
        )

    def cause() -> rank_cause.Cause:
        """The ranks' own errors, as they posted them and as their launcher's output shows them
        (never its boilerplate), and the login settings of the library that failed."""
        return rank_cause.find(launch.output(), payloads, rank_cause.login_here(), launch.argv)

    if outcome.timed_out:
        text, details = ranklog.hang_reason(
            name, events, world, f"deadline {deadline_s:g} s expired"
        )
        why = cause()
        return failed(why.before(f"{text}; process group killed"), {**details, **why.details()})
    if len(payloads) < world or (outcome.returncode != 0 and not outcome.stopped):
        launcher = launch.argv[2] if launch.argv[0] == sys.executable else launch.argv[0]
        how = f"{launcher} exited with {proc.describe_exit(outcome.returncode)}"
        text, details = ranklog.hang_reason(name, events, world, how)
        missing = sorted(set(range(world)) - set(payloads))
        if missing:
            text += f"; no result from rank(s) {missing}"
        details["log_tail"] = launch.tail()
        why = cause()
        return failed(why.before(text), {**details, **why.details()})
    result = _judge(check, ctx, node, payloads, world)
    if result.status is Status.ERROR:
        result.details.setdefault("log_tail", launch.tail())
    result.duration_s = outcome.elapsed_s
    result.details.update(trace)
    return result
