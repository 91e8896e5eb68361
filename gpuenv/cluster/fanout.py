"""Run one command on many nodes at once, each under a deadline, and gather what they print.

SSH hosts go through fabric with the inventory's connection settings; host keys are checked
against the inventory's known_hosts with paramiko's RejectPolicy (an unknown or changed key is
refused, never added). Hosts with ``ansible_connection=local`` (several "nodes" emulated on one
machine) run as local process groups. Either way the command is the same string and its
result the same ``NodeAnswer``, so everything above this module has one code path.

Nothing outlives its deadline: on a node the command runs under coreutils ``timeout``, which
kills its whole process group; a local command runs in its own session, killed by gpuenv.proc;
the controller stops waiting for a node at that node's deadline plus a grace and closes its
connection.

Every node starts at once: a launch whose ranks wait for each other (torchrun, a rendezvous)
deadlocks if some nodes wait in a queue for others to finish. The real limit is file
descriptors: about 3 per local node and 6 per SSH node; ``fan_out`` raises the soft limit to the
hard one and refuses, naming both, a fan-out that would not fit.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import resource
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv import proc
from gpuenv.cluster.inventory import Host
from gpuenv.errors import EnvironmentProblem
from gpuenv.progress import Progress, Silent

# Time a node gets past its deadline to deliver the answer before it is called unresponsive.
GRACE_S = 10.0
# On a node, coreutils `timeout` sends SIGKILL this long after its SIGTERM.
KILL_AFTER_S = 5
# File descriptors one node's command holds on the controller (pipes, sockets), and a reserve.
FDS_PER_NODE = 8
FD_RESERVE = 64
# How often the controller looks for nodes past their deadline.
WAIT_POLL_S = 0.2


@dataclass
class NodeAnswer:
    """What one command did on one node: its answer, or why there was none."""

    host: str
    rc: int | None  # None: it never finished (unreachable, refused, deadline)
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self) -> str:
        if self.error:
            return self.error
        tail = " ".join(self.stderr.strip().splitlines()[-3:])
        return f"exit status {self.rc}" + (f": {tail}" if tail else "")

    def json(self) -> Any:
        """The last line of stdout that is JSON (node tools print one JSON document)."""
        text = self.stdout.strip()
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
        for line in reversed(text.splitlines()):
            line = line.strip()
            if line.startswith(("{", "[")):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    continue
        raise ValueError(f"{self.host}: no JSON in the output ({self.why()})")


def shell_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """A shell command line running ``argv`` with ``env`` set, every word quoted."""
    words = [f"{k}={v}" for k, v in (env or {}).items()]
    prefix = ["env", *words] if words else []
    return shlex.join([*prefix, *argv])


class _Local:
    """A local process session (gpuenv.proc): the emulated node of a one-machine 'cluster'."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._launch: proc.Launch | None = None
        self._lock = threading.Lock()
        self._stopped = False  # set by close(): a command not started yet never starts

    def run(self, command: str, deadline_s: float) -> NodeAnswer:
        start = time.monotonic()
        env = {**os.environ, **self.host.env}
        if self.host.problem:
            return NodeAnswer(self.host.name, None, error=self.host.problem)
        with tempfile.TemporaryDirectory(prefix="gpuenv-node-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            with self._lock:
                if self._stopped:
                    return NodeAnswer(self.host.name, None, error="stopped before it started")
                launch = proc.Launch(["bash", "-c", command], out, env, err_log=err).start()
                self._launch = launch
            try:
                # Hundreds of emulated nodes end at once: their process groups are enough,
                # without reading the process table for each.
                ended = proc.wait(launch, deadline_s, sweep=False)
            finally:
                self.close()
            rc, error = ended.returncode, ""
            if ended.timed_out:
                rc, error = None, f"did not finish within {deadline_s:.0f} s; killed"
            stdout, stderr = (p.read_text(encoding="utf-8", errors="replace") for p in (out, err))
        return NodeAnswer(self.host.name, rc, stdout, stderr, time.monotonic() - start, error)

    def close(self) -> None:
        """Kill whatever the command left in its session (workers of a launcher too)."""
        with self._lock:
            self._stopped = True
            running = self._launch
        if running is not None:
            running.kill(KILL_AFTER_S, sweep=False)


class _SSH:
    """A node reached over SSH with fabric, host keys verified against known_hosts."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._conn: Any = None
        self._lock = threading.Lock()
        self.stopped = False  # set when another node's failure ends the launch

    def _connect(self, timeout_s: float) -> Any:
        import paramiko
        from fabric import Config, Connection

        h = self.host
        conn = Connection(
            host=h.address,
            user=h.user,
            port=h.port,
            # An empty SSH config: the inventory alone says how to connect.
            config=Config(ssh_config=paramiko.SSHConfig()),
            connect_timeout=max(1, int(timeout_s)),
            connect_kwargs={
                "key_filename": [h.key_file] if h.key_file else [],
                "look_for_keys": h.key_file is None,
                "allow_agent": h.key_file is None,
                "banner_timeout": timeout_s,
                "auth_timeout": timeout_s,
                "channel_timeout": timeout_s,
            },
        )
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        for path in h.known_hosts:
            conn.client.load_host_keys(path)
        with self._lock:
            self._conn = conn
        return conn

    def run(self, command: str, deadline_s: float) -> NodeAnswer:
        import paramiko
        from invoke.exceptions import CommandTimedOut

        start = time.monotonic()
        h = self.host
        # On the node: the whole process group dies at the deadline, whatever the controller does.
        inner = f"{shell_command([], h.env)} {command}" if h.env else command
        remote = (
            f"timeout -k {KILL_AFTER_S} {max(1, int(deadline_s))} bash -lc {shlex.quote(inner)}"
        )

        def failed(error: str) -> NodeAnswer:
            return NodeAnswer(h.name, None, "", "", time.monotonic() - start, error)

        if h.problem:
            return failed(h.problem)
        try:
            conn = self._connect(min(deadline_s, 20.0))
            if self.stopped:
                return NodeAnswer(h.name, None, error="stopped before it started")
            res = conn.run(remote, hide=True, warn=True, in_stream=False, timeout=deadline_s + 2)
        except CommandTimedOut:
            return failed(f"did not finish within {deadline_s:.0f} s")
        except paramiko.BadHostKeyException as exc:
            return failed(
                f"host key of {h.address} CHANGED (not the one in "
                f"{', '.join(h.known_hosts)}): refused ({exc})"
            )
        except paramiko.AuthenticationException as exc:
            return failed(f"authentication as {h.user or 'the current user'} failed: {exc}")
        except paramiko.SSHException as exc:
            msg = str(exc)
            if "not found in known_hosts" in msg:
                msg = (
                    f"host key of {h.address} is not in {', '.join(h.known_hosts)}: "
                    "refused (gpuenv never adds unknown host keys)"
                )
            return failed(f"ssh: {msg}")
        except (OSError, EOFError) as exc:
            return failed(f"unreachable at {h.address}:{h.port}: {exc or type(exc).__name__}")
        finally:
            self.close()
        rc = res.exited
        error = (
            f"did not finish within {deadline_s:.0f} s; killed on the node"
            if rc in (124, 137)
            else ""
        )
        return NodeAnswer(h.name, rc, res.stdout, res.stderr, time.monotonic() - start, error)

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def ssh_connection(host: Host, timeout_s: float) -> Any:
    """A fabric Connection to ``host`` with the fan-out's settings (the inventory's user, key and
    known_hosts; unknown or changed host keys refused), for a caller that streams (gpuenv top)."""
    return _SSH(host)._connect(timeout_s)


def transport(host: Host) -> _Local | _SSH:
    return _Local(host) if host.local else _SSH(host)


def _stop(
    hosts: Sequence[Host],
    runners: Mapping[str, _Local | _SSH],
    stop_command: Callable[[Host], str],
) -> None:
    for h in hosts:
        runner = runners[h.name]
        if isinstance(runner, _Local):
            runner.close()
        else:
            runner.stopped = True
            threading.Thread(target=_stop_remote, args=(h, stop_command(h)), daemon=True).start()


def _stop_remote(host: Host, command: str) -> None:
    """Run the stop command over a second connection (the first waits for the launch), twice:
    a launch whose start was still on its way at the first pkill is caught by the second."""
    for pause in (0.0, 3.0):
        time.sleep(pause)
        _SSH(host).run(command, 15.0)


def ensure_fds(nodes: int) -> None:
    """Raise the soft file-descriptor limit to the hard one; refuse a fan-out that cannot fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = nodes * FDS_PER_NODE + FD_RESERVE
    if soft < need and (hard == resource.RLIM_INFINITY or hard > soft):
        target = need if hard == resource.RLIM_INFINITY else min(hard, max(need, soft))
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft < need:
        raise EnvironmentProblem(
            f"{nodes} nodes at once need about {need} file descriptors; the limit is {soft}"
            f" (hard {hard}): raise it (ulimit -n) or validate fewer nodes at a time (--limit)"
        )


def fan_out(
    hosts: Sequence[Host],
    command: Callable[[Host], str],
    deadline_s: float,
    label: str = "nodes",
    progress: Progress | None = None,
    stop_others: Callable[[Host], str] | None = None,
) -> dict[str, NodeAnswer]:
    """Run ``command(host)`` on every host at once; one NodeAnswer per host, by its deadline.

    Each node has its own deadline, from the moment its command started. With
    ``stop_others`` (a launch whose ranks wait for each other), the first node that fails
    stops the rest at once instead of letting them wait for their deadline: local process
    groups are killed, and on SSH nodes ``stop_others(host)`` is run (e.g. a pkill of that
    launch's processes).
    """
    if not hosts:
        return {}
    progress = progress or Silent()
    ensure_fds(len(hosts))
    runners = {h.name: transport(h) for h in hosts}
    outcomes: dict[str, NodeAnswer] = {}
    started_at: dict[str, float] = {}
    # One thread per node: no node waits in a queue behind another.
    pool = cf.ThreadPoolExecutor(max_workers=len(hosts), thread_name_prefix="gpuenv-node")

    def run_one(h: Host) -> NodeAnswer:
        started_at[h.name] = time.monotonic()
        return runners[h.name].run(command(h), deadline_s)

    progress.begin(label, f"{label}: {len(hosts)} node(s)")
    try:
        futures = {pool.submit(run_one, h): h.name for h in hosts}
        pending = set(futures)
        first_failure = ""
        while pending:
            done, pending = cf.wait(pending, timeout=WAIT_POLL_S, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                name = futures[fut]
                try:
                    outcomes[name] = fut.result()
                except Exception as exc:
                    outcomes[name] = NodeAnswer(name, None, error=f"{type(exc).__name__}: {exc}")
                progress.update(label, f"{len(outcomes)}/{len(hosts)} answered (last: {name})")
                if first_failure:
                    outcomes[name].error = f"stopped because {first_failure} failed first"
                elif stop_others is not None and not outcomes[name].ok:
                    first_failure = name
                    waiting = [h for h in hosts if h.name not in outcomes]
                    _stop(waiting, runners, stop_others)
            now = time.monotonic()
            for fut in list(pending):
                name = futures[fut]
                began_at = started_at.get(name)
                if began_at is not None and now > began_at + deadline_s + GRACE_S:
                    pending.discard(fut)
                    runners[name].close()
                    outcomes[name] = NodeAnswer(
                        name,
                        None,
                        duration_s=now - began_at,
                        error=f"no answer within {deadline_s:.0f} s (+{GRACE_S:.0f} s grace)",
                    )
    finally:
        for h in hosts:
            if h.name not in outcomes:
                runners[h.name].close()
                outcomes[h.name] = NodeAnswer(h.name, None, error="interrupted before it answered")
        pool.shutdown(wait=False, cancel_futures=True)
    failed = sum(not o.ok for o in outcomes.values())
    progress.end(label, f"{len(hosts) - failed}/{len(hosts)} ok", "FAIL" if failed else "PASS")
    return {h.name: outcomes[h.name] for h in hosts}
