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


def output_target(option: str, target: str | None, stdout_ok: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written as a file.

    A directory, a missing or unwritable folder, or an existing file that cannot be replaced
    stops the run with one line (exit 2) instead of a traceback after all the work is done.
    """
    import os
    from pathlib import Path

    from gpuenv.errors import BadInput

    if target is None:
        return
    if target == "-":
        if stdout_ok:
            return
        raise BadInput(f"{option} -: this report needs a file, not stdout")
    path = Path(target)
    if target.endswith(os.sep) or path.is_dir():
        raise BadInput(f"{option} {target}: is a folder; give a file name (e.g. {path / 'report'})")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise BadInput(f"{option} {target}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {target}: folder {parent} is not writable")
    if path.exists() and not path.is_file():
        raise BadInput(f"{option} {target}: exists and is not a regular file")


def visible_devices(spec: str | None) -> None:
    """Refuse a CUDA_VISIBLE_DEVICES that names one GPU twice (two ranks on one GPU)."""
    from gpuenv.errors import BadInput

    if not spec:
        return
    items = [s.strip() for s in spec.split(",") if s.strip()]
    seen: set[str] = set()
    dupes = []
    for item in items:
        key = item.lower()
        if key in seen and item not in dupes:
            dupes.append(item)
        seen.add(key)
    if dupes:
        raise BadInput(
            f"CUDA_VISIBLE_DEVICES={spec}: names {', '.join(dupes)} more than once; each GPU"
            " may be listed once (ranks would share a GPU and NCCL refuses that)"
        )
