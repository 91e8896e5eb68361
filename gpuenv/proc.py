"""Start, wait for and kill a process session under a deadline. Imports nothing of gpuenv.

Every launch (a GPU rank, torchrun, mpirun, debootstrap, an emulated node's command) starts in
a new session, so it and all its descendants share one session and process group id. To kill
it, ``kill_session`` signals that process group, every process of the session, and any
descendant that moved to a group of its own: SIGTERM first, SIGKILL after a grace period.

Output goes to a file, never a pipe: a pipe that nobody reads blocks the child, and a reader
blocked on a pipe cannot keep a deadline (a child that hangs with its output open would never be
killed). A caller that wants the output as it comes reads the file from ``wait``'s ``tick``.

Names for time: ``*_s`` is a span in seconds, ``*_at`` a point on ``time.monotonic()``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KILL_GRACE_S = 2.0  # between SIGTERM and SIGKILL
SWEEP_GRACE_S = 0.5  # for leftovers of a session whose leader already exited
REAP_S = 5.0  # how long to wait for the killed leader's exit status
POLL_S = 0.05


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, pgid, sid) for every live process, from /proc."""
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


def alive(pids: set[int]) -> bool:
    table = _proc_table() if os.path.isdir("/proc") else {}
    return any(p in table for p in pids)


def processes_with_env(key: str, value: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``key=value``: leftovers."""
    needle = f"{key}={value}".encode()
    found = []
    for pid in _proc_table():
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


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_session(
    leader: int,
    grace_s: float = KILL_GRACE_S,
    sweep: bool = True,
    reap: Callable[[], object] | None = None,
) -> None:
    """SIGTERM then SIGKILL the leader's process group, session and descendants.

    ``sweep=False`` signals the process group only, without reading the process table: for
    callers that start hundreds of sessions whose children never leave their group. ``reap``
    collects the leader's exit status while waiting (a zombie leader keeps its group alive).
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        targets = session_members(leader) if sweep else set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, sig)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig is signal.SIGKILL:
            break
        give_up_at = time.monotonic() + grace_s
        while time.monotonic() < give_up_at:
            if reap is not None:
                reap()
            if not (alive(session_members(leader)) if sweep else group_alive(leader)):
                break
            time.sleep(POLL_S)


@dataclass
class Launch:
    """One child started in its own session; its stdout and stderr go to ``log`` (stderr to
    ``err_log`` instead where one is given: a caller that parses stdout)."""

    argv: list[str]
    log: Path
    env: dict[str, str] | None = None
    cwd: str | None = None
    err_log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def start(self) -> Launch:
        self.started_at = time.monotonic()
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(self.log, "wb"))
            err = files.enter_context(open(self.err_log, "wb")) if self.err_log else None
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if err is None else err,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "Launch.start() was not called"
        return self.proc.pid

    def poll(self) -> int | None:
        assert self.proc is not None, "Launch.start() was not called"
        return self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, grace_s: float = KILL_GRACE_S, sweep: bool = True) -> None:
        """Kill the whole session (``sweep=False``: its process group only, see kill_session)."""
        if self.proc is None:
            return
        kill_session(self.proc.pid, grace_s, sweep=sweep, reap=self.proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=REAP_S)
        if sweep:
            # Descendants reparented away from the leader can survive the group kill; sweep them.
            kill_session(self.proc.pid, grace_s=SWEEP_GRACE_S)

    def output(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 12) -> str:
        return "\n".join(self.output().strip().splitlines()[-lines:])


@dataclass
class Exit:
    """How a launch ended."""

    returncode: int | None
    timed_out: bool
    elapsed_s: float
    stopped: bool = False  # ended by the caller's ``tick`` (its work was complete)


def wait(
    launch: Launch,
    deadline_s: float,
    tick: Callable[[], bool] | None = None,
    sweep: bool = True,
) -> Exit:
    """Wait for ``launch`` at most ``deadline_s`` from now; ``tick`` returning True stops early.

    ``tick`` runs every POLL_S while the child runs (to read its log, or to end a launcher whose
    work is already reported). At the deadline the whole session is killed; ``sweep=False``
    kills its process group only, without reading the process table (see kill_session).
    """
    begun_at = time.monotonic()
    deadline_at = begun_at + deadline_s
    try:
        while True:
            rc = launch.poll()
            if rc is not None:
                if tick is not None:
                    tick()  # the last lines it wrote
                # The leader is done; leftovers of its session (daemonised helpers) go too.
                if sweep and alive(session_members(launch.pid) - {launch.pid}):
                    kill_session(launch.pid, grace_s=SWEEP_GRACE_S)
                elif not sweep and group_alive(launch.pid):
                    kill_session(launch.pid, grace_s=SWEEP_GRACE_S, sweep=False)
                return Exit(rc, False, time.monotonic() - begun_at)
            if tick is not None and tick():
                launch.kill(grace_s=0.0, sweep=sweep)  # its work is done: nothing to let finish
                return Exit(launch.poll(), False, time.monotonic() - begun_at, stopped=True)
            if time.monotonic() >= deadline_at:
                launch.kill(sweep=sweep)
                return Exit(launch.poll(), True, time.monotonic() - begun_at)
            time.sleep(POLL_S)
    except BaseException:
        launch.kill(sweep=sweep)
        raise


def run(
    argv: Sequence[str],
    deadline_s: float,
    log: Path,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Exit:
    """Run ``argv`` in a new session under a deadline; ``on_line`` sees each line as written."""
    launch = Launch(list(argv), log, dict(env) if env is not None else None).start()
    if on_line is None:
        return wait(launch, deadline_s)
    follower = LineFollower(log, on_line)
    return wait(launch, deadline_s, tick=lambda: follower.read() and False)


class LineFollower:
    """Hands each complete new line of a growing file to a callback (a ``wait`` tick)."""

    def __init__(self, path: Path, on_line: Callable[[str], None]) -> None:
        self.path = path
        self.on_line = on_line
        self._offset = 0
        self._partial = b""

    def read(self) -> bool:
        """Deliver the lines written since the last call; True when there were any."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return False
        if not chunk:
            return False
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self.on_line(line.decode("utf-8", errors="replace"))
        return bool(lines)


def describe_exit(code: int | None) -> str:
    """``exit code 3``, ``signal SIGKILL`` or ``no exit status``."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


@dataclass
class Captured:
    returncode: int | None  # None: it did not finish by the deadline (and was killed)
    stdout: str
    stderr: str


def capture(
    argv: Sequence[str], deadline_s: float, env: Mapping[str, str] | None = None
) -> Captured:
    """Run a short command in a new session, its output kept apart; at the deadline the whole
    session is killed. For commands whose output is small (a probe's reading of the node)."""
    child = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env) if env is not None else None,
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        kill_session(child.pid, grace_s=0.0, reap=child.poll)
        out, err = child.communicate()
        return Captured(None, out, err)
    except BaseException:
        kill_session(child.pid, grace_s=0.0, reap=child.poll)
        raise
    return Captured(child.returncode, out, err)


def command_output(
    argv: Sequence[str], timeout_s: float = 60.0, env: Mapping[str, str] | None = None
) -> tuple[int, str]:
    """A node reader's ``run`` (the node floor's contract, plugins/module_utils/node.py): the
    exit status and standard output of a short command under a deadline; 124 when it ran past
    the deadline and was killed, 127 when it could not be started (coreutils' timeout's codes)."""
    try:
        done = capture(argv, timeout_s, {**os.environ, "LC_ALL": "C", **(env or {})})
    except OSError:
        return 127, ""
    return (124 if done.returncode is None else done.returncode), done.stdout
