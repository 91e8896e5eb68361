"""`gpuenv top`: every GPU of this node, or of every inventory node, as rows refreshed in place
(utilization, memory, temperature, power, throttle reasons, the health state), from the same NVML
reader and GPU rules as `gpuenv health`.

A frame is one NVML pass (``frame``); the health state of a GPU is the worst action of the scan's
per-GPU rules on that reading (the kernel log is not read at each refresh: `gpuenv health` does).
Across an inventory every node runs one long-lived ``gpuenv top --stream`` that prints a JSON
line per frame; the controller keeps one connection per node (fabric over SSH, a process session
for an emulated node) and shows the newest line of each, so a refresh costs no connection and no
process start (``Streams``).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv.health import expect, rules
from gpuenv.health import nvml as nv
from gpuenv.health.findings import Finding, rank

# Names of nvmlClocksEventReasons bits as `nvidia-smi -q -d PERFORMANCE` prints them.
REASONS = {
    nv.REASON_GPU_IDLE: "idle",
    0x2: "app clocks",
    nv.REASON_SW_POWER_CAP: "sw power cap",
    nv.REASON_HW_SLOWDOWN: "hw slowdown",
    0x10: "sync boost",
    nv.REASON_SW_THERMAL: "sw thermal",
    nv.REASON_HW_THERMAL: "hw thermal",
    nv.REASON_HW_POWER_BRAKE: "hw power brake",
    0x100: "display clocks",
}
INTERVAL_S = 1.0  # between two frames of a node
# A node's stream ends by itself after this long, whatever happens to the controller (on the
# node it runs under coreutils timeout, like every fan-out command).
STREAM_MAX_S = 12 * 3600
# A node whose newest frame is older than this many intervals is shown as stale.
STALE_INTERVALS = 3


def reasons(bits: int | None) -> str:
    if bits is None:
        return "?"
    named = [name for bit, name in REASONS.items() if bits & bit]
    return ", ".join(named) or "none"


def gpu_row(
    gpu: nv.GpuReading,
    th: Mapping[str, Any],
    exp: expect.Expected | None = None,
    more: list[Finding] | None = None,
) -> dict[str, Any]:
    """One GPU's row; ``exp``: what it should answer and read, from its model and its peers in
    the same frame, ``more``: its findings of the node-wide rules (its NVLinks against its
    peers'), as `gpuenv health` judges the same reading."""
    if gpu.error:
        return {"gpu": gpu.index, "name": gpu.name, "error": gpu.error, "health": "reset"}
    findings = rules.gpu_findings(gpu, {}, th, None, exp) + (more or [])
    worst = max((f.action for f in findings), key=rank, default="none")
    return {
        "gpu": gpu.index,
        "name": gpu.name,
        "util_pct": gpu.utilization_pct,
        "mem_used_mib": gpu.memory_used_mib,
        "mem_total_mib": gpu.memory_total_mib,
        "temp_c": gpu.temperature_c,
        "power_w": gpu.power_w,
        "power_limit_w": gpu.power_limit_w,
        "throttle": reasons(gpu.clock_reasons),
        "health": worst,
        "why": "; ".join(f"{f.signal}: {f.action}" for f in findings if f.action != "none"),
    }


def frame(node: str, reader: nv.Nvml, th: Mapping[str, Any]) -> dict[str, Any]:
    reading = reader.read()
    good = [g for g in reading.gpus if not g.error]
    exps = expect.expectations(good, {}, expect.shipped_specs(), nvswitch_node=False)
    links: dict[int | None, list[Finding]] = {}
    for f in rules.nvlink_state_findings(good, False, exps):
        links.setdefault(f.gpu, []).append(f)
    return {
        "node": node,
        "at_unix": time.time(),
        "error": reading.error,
        "gpus": [gpu_row(g, th, exps.get(g.index), links.get(g.index)) for g in reading.gpus],
    }


def stream(
    node: str,
    reader: nv.Nvml,
    th: Mapping[str, Any],
    write: Callable[[str], None],
    interval_s: float = INTERVAL_S,
    count: int | None = None,
) -> None:
    """A JSON line per frame, every ``interval_s``, ``count`` times (None: until write fails)."""
    n = 0
    next_at = time.monotonic()
    while count is None or n < count:
        write(json.dumps(frame(node, reader, th), separators=(",", ":")) + "\n")
        n += 1
        next_at += interval_s
        time.sleep(max(0.0, next_at - time.monotonic()))


def this_node() -> str:
    return socket.gethostname().split(".")[0]


# ---------------------------------------------------------------- the controller's streams


@dataclass
class NodeView:
    """The newest frame of a node and when it came (monotonic), or why there is none."""

    frame: dict[str, Any] | None = None
    at: float | None = None
    error: str = ""
    partial: str = ""  # a line not complete yet
    lock: threading.Lock = field(default_factory=threading.Lock)

    def feed(self, data: str) -> None:
        with self.lock:
            text = self.partial + data
            *lines, self.partial = text.split("\n")
            for line in reversed(lines):
                line = line.strip()
                if line.startswith("{"):
                    try:
                        self.frame = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    self.at = time.monotonic()
                    break


class _Sink:
    """A file-like object fabric writes the remote stdout into, as it arrives."""

    def __init__(self, view: NodeView) -> None:
        self.view = view

    def write(self, data: str) -> int:
        self.view.feed(data)
        return len(data)

    def flush(self) -> None:
        return None


def node_command(host: Any, interval_s: float) -> str:
    argv = [host.python, "-m", "gpuenv", "top", "--stream", "--interval", f"{interval_s:g}",
            "--node", host.name]  # fmt: skip
    return shlex.join(argv)


class Streams:
    """One long-lived ``gpuenv top --stream`` per node; ``views`` holds the newest frame of each."""

    def __init__(self, hosts: Sequence[Any], interval_s: float = INTERVAL_S) -> None:
        self.hosts = list(hosts)
        self.interval_s = interval_s
        self.views = {h.name: NodeView() for h in hosts}
        self._closers: list[Callable[[], None]] = []
        self._threads: list[threading.Thread] = []
        self._tmp: Any = None

    def start(self) -> Streams:
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="gpuenv-top-")
        for host in self.hosts:
            target = self._local if host.local else self._ssh
            t = threading.Thread(target=target, args=(host,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _local(self, host: Any) -> None:
        from gpuenv import proc

        view = self.views[host.name]
        out = Path(self._tmp.name) / f"{host.name}.jsonl"
        env = {**os.environ, **host.env}
        argv = ["timeout", "-k", "5", str(STREAM_MAX_S), "bash", "-c"]
        launch = proc.Launch([*argv, node_command(host, self.interval_s)], out, env).start()
        self._closers.append(lambda: launch.kill(2.0, sweep=False))
        offset = 0
        while launch.running():
            time.sleep(self.interval_s / 4)
            if out.exists():
                with out.open(encoding="utf-8", errors="replace") as f:
                    f.seek(offset)
                    data = f.read()
                    offset = f.tell()
                if data:
                    view.feed(data)
        view.error = view.error or "the stream ended"

    def _ssh(self, host: Any) -> None:
        import paramiko

        from gpuenv.cluster.fanout import KILL_AFTER_S, ssh_connection

        view = self.views[host.name]
        remote = (
            f"timeout -k {KILL_AFTER_S} {STREAM_MAX_S} bash -lc "
            f"{shlex.quote(node_command(host, self.interval_s))}"
        )
        try:
            conn = ssh_connection(host, 20.0)
            self._closers.append(conn.close)
            result = conn.run(remote, hide=True, warn=True, in_stream=False,
                              out_stream=_Sink(view))  # fmt: skip
            view.error = f"the stream ended (exit status {result.exited}): " + " ".join(
                result.stderr.strip().splitlines()[-2:]
            )
        except (OSError, EOFError, paramiko.SSHException) as exc:  # shown on the node's row
            view.error = f"{type(exc).__name__}: {exc}"

    def wait_first(self, timeout_s: float) -> None:
        """Until every node gave a frame or an error, or ``timeout_s`` passed."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if all(v.frame is not None or v.error for v in self.views.values()):
                return
            time.sleep(0.05)

    def close(self) -> None:
        for close in self._closers:
            try:
                close()
            except OSError:
                continue
        if self._tmp is not None:
            self._tmp.cleanup()


def rows(views: Mapping[str, NodeView], interval_s: float) -> Iterator[dict[str, Any]]:
    """Every GPU of every node in order, with its node's state (stale, error)."""
    now = time.monotonic()
    for node in sorted(views):
        view = views[node]
        with view.lock:
            got, at, error = view.frame, view.at, view.error
        if got is None:
            yield {"node": node, "state": error or "waiting"}
            continue
        age_s = now - (at or now)
        state = "stale" if age_s > STALE_INTERVALS * interval_s else ""
        if got.get("error") and not got.get("gpus"):
            yield {"node": node, "state": f"NVML: {got['error']}"}
        elif not got.get("gpus"):
            yield {"node": node, "state": "no GPU"}
        for gpu in got.get("gpus", []):
            yield {"node": node, "state": state or error, **gpu}
