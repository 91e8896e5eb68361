"""argparse value types shared by the subcommands (standard library only: nodes import it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type[int] | type[float], what: str) -> Callable[[str], int | float]:
    """A parser for a finite number > 0; the error says what was expected and what was given."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse
