"""Live console table with progress while checks run, and the final verdict."""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from gpuenv.results import Result, Status

STYLES = {
    Status.PASS: "bold green",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.SKIP: "yellow",
}


def _key_values(result: Result, limit: int = 3) -> str:
    judged = [m for m in result.measurements if m.threshold is not None and m.bound]
    shown = (judged or [m for m in result.measurements if isinstance(m.value, (int, float))])[
        :limit
    ]
    parts = []
    for m in shown:
        sign = ">=" if m.bound == "min" else "<="
        limit_text = f" ({sign} {m.threshold:g})" if m.threshold is not None and m.bound else ""
        parts.append(
            f"{m.name} {m.value:g}{(' ' + m.unit) if m.unit else ''}{limit_text}"
            if isinstance(m.value, (int, float)) and not isinstance(m.value, bool)
            else f"{m.name} {m.value}"
        )
    return ", ".join(parts)


class LiveTable:
    """A table with one row per check: waiting, running (spinner, seconds), then verdict."""

    def __init__(self, names: Sequence[str], console: Console, node: str) -> None:
        self.names = list(names)
        self.console = console
        self.node = node
        self.states: dict[str, str | Result] = {n: "waiting" for n in names}
        self.started: dict[str, float] = {}
        self.t0 = time.monotonic()
        self._live = Live(
            console=console, refresh_per_second=8, transient=False, get_renderable=self._render
        )

    def __enter__(self) -> LiveTable:
        self._live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(kind, exc, tb)

    def update(self, name: str, state: str | Result) -> None:
        if state == "running":
            self.started[name] = time.monotonic()
        self.states[name] = state
        self._live.refresh()

    def _render(self) -> Group:
        table = Table(title=f"gpuenv check on {self.node}", title_justify="left", expand=False)
        table.add_column("check")
        table.add_column("status")
        table.add_column("time", justify="right")
        table.add_column("result")
        for name in self.names:
            state = self.states.get(name, "waiting")
            if isinstance(state, Result):
                table.add_row(
                    name,
                    Text(state.status.value, STYLES[state.status]),
                    f"{state.duration_s:.1f}s",
                    _row_text(state),
                )
            elif state == "running":
                elapsed = time.monotonic() - self.started.get(name, time.monotonic())
                table.add_row(name, Spinner("dots", text="running"), f"{elapsed:.1f}s", "")
            else:
                table.add_row(name, Text("waiting", "dim"), "", "")
        done = sum(isinstance(s, Result) for s in self.states.values())
        footer = Text(f"{done}/{len(self.names)} done, {time.monotonic() - self.t0:.1f}s", "dim")
        return Group(table, footer)


def _row_text(result: Result) -> str:
    return result.reason or _key_values(result)


def print_summary(results: Sequence[Result], console: Console, wall_s: float) -> None:
    failed = [r for r in results if r.status.failed]
    skipped = [r for r in results if r.status is Status.SKIP]
    passed = [r for r in results if r.status is Status.PASS]
    verdict = Text("FAILED", "bold red") if failed else Text("OK", "bold green")
    line = Text.assemble(
        "verdict: ", verdict,
        f"  {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped in {wall_s:.1f}s",
    )  # fmt: skip
    console.print()
    console.print(line)
    for r in failed + skipped:
        console.print(
            f"  {r.check} {r.status.value}: {r.reason}",
            style=STYLES[r.status],
            markup=False,
            highlight=False,
        )
