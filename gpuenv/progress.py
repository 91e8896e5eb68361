"""How engines (checks, cluster, lab) report progress without printing. Imports nothing of gpuenv.

An engine calls ``begin`` when a step starts, ``update`` with news while it runs, and ``end`` when
it is over, with the step's verdict when it has one (PASS/FAIL/SKIP/ERROR). The rich
implementations live in gpuenv.report.live; ``Silent`` is for library use and tests.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def begin(self, key: str, description: str) -> None:
        """A step started (``key`` identifies it in later calls)."""

    def update(self, key: str, detail: str) -> None:
        """A step that is still running has news (a build line, a node that answered)."""

    def end(self, key: str, detail: str = "", status: str | None = None) -> None:
        """A step finished; ``status`` is its verdict when it has one."""


class Silent:
    """Progress that goes nowhere."""

    def begin(self, key: str, description: str) -> None:
        pass

    def update(self, key: str, detail: str) -> None:
        pass

    def end(self, key: str, detail: str = "", status: str | None = None) -> None:
        pass


class Recorder:
    """Progress that remembers every call, in order (tests, and engines that replay it)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str | None]] = []

    def begin(self, key: str, description: str) -> None:
        self.calls.append(("begin", key, description, None))

    def update(self, key: str, detail: str) -> None:
        self.calls.append(("update", key, detail, None))

    def end(self, key: str, detail: str = "", status: str | None = None) -> None:
        self.calls.append(("end", key, detail, status))
