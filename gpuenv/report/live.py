"""The rich implementations of gpuenv.progress.Progress: what a person sees while work runs.

``Steps`` shows one line per step (spinner, description, latest news, elapsed time): the lab's
builds, the cluster's stages and fan-outs. ``CheckTable`` shows one row per node check: waiting,
running with a timer, then its verdict.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

STYLES = {
    "PASS": "bold green",
    "FAIL": "bold red",
    "ERROR": "bold magenta",
    "SKIP": "yellow",
}


class Steps:
    """Progress as a list of steps on stderr (thread-safe: fan-out threads report into it)."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description}"),
            TextColumn("[dim]{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
        )
        self._tasks: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Steps:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def begin(self, key: str, description: str) -> None:
        with self._lock:
            self._tasks[key] = self._progress.add_task(escape(description), total=1, detail="")

    def update(self, key: str, detail: str) -> None:
        with self._lock:
            if key in self._tasks:
                self._progress.update(self._tasks[key], detail=escape(detail))

    def end(self, key: str, detail: str = "", status: str | None = None) -> None:
        text = f"{status}: {detail}" if status and detail else status or detail
        with self._lock:
            if key in self._tasks:
                self._progress.update(self._tasks[key], completed=1, detail=escape(text))


class CheckTable:
    """A table with one row per check: waiting, running (spinner, seconds), then verdict."""

    def __init__(self, names: Sequence[str], console: Console, node: str) -> None:
        self.names = list(names)
        self.console = console
        self.node = node
        self.running: dict[str, float] = {}  # name -> monotonic start
        self.done: dict[str, tuple[str, str, float]] = {}  # name -> (status, detail, seconds)
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._live = Live(
            console=console, refresh_per_second=8, transient=False, get_renderable=self._render
        )

    def __enter__(self) -> CheckTable:
        self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(kind, exc, tb)

    def begin(self, key: str, description: str) -> None:
        with self._lock:
            self.running[key] = time.monotonic()
        self._live.refresh()

    def update(self, key: str, detail: str) -> None:
        self._live.refresh()

    def end(self, key: str, detail: str = "", status: str | None = None) -> None:
        with self._lock:
            began_at = self.running.pop(key, time.monotonic())
            self.done[key] = (status or "", detail, time.monotonic() - began_at)
        self._live.refresh()

    def _render(self) -> Group:
        table = Table(title=f"gpuenv check on {self.node}", title_justify="left", expand=False)
        for column in ("check", "status", "time", "result"):
            table.add_column(column, justify="right" if column == "time" else "left")
        with self._lock:
            for name in self.names:
                if name in self.done:
                    status, detail, seconds = self.done[name]
                    # Text, not markup: a reason quotes a library's own words, such as gloo's
                    # "[/path/unbound_buffer.cc:129]", which rich would take for a closing tag.
                    table.add_row(
                        name, Text(status, STYLES.get(status, "")), f"{seconds:.1f}s", Text(detail)
                    )
                elif name in self.running:
                    elapsed = time.monotonic() - self.running[name]
                    table.add_row(name, Spinner("dots", text="running"), f"{elapsed:.1f}s", "")
                else:
                    table.add_row(name, Text("waiting", "dim"), "", "")
            count = len(self.done)
        footer = Text(f"{count}/{len(self.names)} done, {time.monotonic() - self.t0:.1f}s", "dim")
        return Group(table, footer)
