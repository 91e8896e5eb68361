"""How lab operations report progress without printing: the CLI passes a rich-backed one."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def begin(self, key: str, description: str) -> None:
        """A step started (``key`` identifies it in later calls)."""

    def update(self, key: str, detail: str) -> None:
        """A step that is still running has news (a build line, a node that answered)."""

    def end(self, key: str, detail: str = "") -> None:
        """A step finished."""


class Silent:
    """Progress that goes nowhere (library use, tests)."""

    def begin(self, key: str, description: str) -> None:
        pass

    def update(self, key: str, detail: str) -> None:
        pass

    def end(self, key: str, detail: str = "") -> None:
        pass
