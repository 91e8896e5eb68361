"""argparse value types shared by the subcommands (standard library only: nodes import it)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from gpuenv import proc

# `nvidia-smi -L` answers in well under a second; one that hangs (a GPU in a bad state) is not
# waited for: the probe's own NVML reading decides then.
NVIDIA_SMI_S = 10.0


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


# A pip requirement as gpuenv bundle takes it: a PEP 508 name, optional extras, and optional
# version clauses (PEP 440 operators, each with a version); no URL, marker or environment part.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_CLAUSE = r"\s*(?:===|==|!=|~=|<=|>=|<|>)\s*[A-Za-z0-9*+!._-]+\s*"
_REQUIREMENT = re.compile(
    rf"^\s*{_NAME}\s*(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?(?:{_CLAUSE}(?:,{_CLAUSE})*)?$"
)


def requirement(text: str) -> str:
    """A pip requirement (``torch==2.13.0``, ``cupy-cuda12x>=13``); anything else, such as an
    operator without a version (``torch===``), is refused naming it."""
    if not _REQUIREMENT.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a pip requirement (NAME, optional [extras], optional version"
            " clauses such as ==2.13.0 or >=2,<3)"
        )
    return text.strip()


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
    # Permission bits do not tell (root may write anywhere by them, but not in /proc, /sys or a
    # read-only mount): a file is made in the folder and removed, as the report will be.
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".gpuenv-write-test-"):
            pass
    except OSError as exc:
        raise BadInput(
            f"{option} {target}: folder {parent} cannot hold a file: {exc.strerror or exc}"
        ) from None


def nvidia_smi_uuids(
    run: Callable[[list[str]], str | None] | None = None,
) -> dict[str, str] | None:
    """GPU index -> UUID as `nvidia-smi -L` lists them (``GPU 0: NVIDIA H200 (UUID: GPU-...)``);
    None when it cannot tell (no nvidia-smi, no driver, no answer in ``NVIDIA_SMI_S``)."""
    import re

    text = (run or _run_text)(["nvidia-smi", "-L"])
    if text is None:
        return None
    found = re.findall(r"^GPU (\d+):.*\(UUID: (GPU-[0-9a-fA-F-]+)\)", text, re.MULTILINE)
    return dict(found) or None


def _run_text(argv: list[str]) -> str | None:
    rc, out = proc.command_output(argv, NVIDIA_SMI_S)
    return out if rc == 0 else None


def _gpu_of(item: str, uuids: dict[str, str] | None) -> str:
    """The GPU an entry names, as its UUID where ``uuids`` can tell (an index, or a UUID prefix
    as CUDA accepts it), else the entry itself."""
    key = item.lower()
    if uuids is None:
        return key
    if key.isdigit():
        return uuids.get(str(int(key)), key)
    matches = [u for u in uuids.values() if u.lower().startswith(key)]
    return matches[0] if len(matches) == 1 else key


def _same_uuid(a: str, b: str) -> bool:
    """Whether two UUID entries (``GPU-…``, either a prefix of the other) name the same GPU."""
    if a.isdigit() or b.isdigit() or not a.startswith("gpu-") or not b.startswith("gpu-"):
        return False
    return a.startswith(b) or b.startswith(a)


def visible_devices(
    spec: str | None,
    uuids: Callable[[], dict[str, str] | None] = nvidia_smi_uuids,
) -> None:
    """Refuse a CUDA_VISIBLE_DEVICES that names one GPU twice (two ranks on one GPU): the same
    entry twice (``0,0``), or one GPU by index and by UUID (``0,GPU-<GPU 0's UUID>``), told
    apart by the UUIDs `nvidia-smi -L` lists (asked only when the list mixes the two forms)."""
    from gpuenv.errors import BadInput

    if not spec:
        return
    items = [s.strip() for s in spec.split(",") if s.strip()]
    mixed = any(i.isdigit() for i in items) and not all(i.isdigit() for i in items)
    table = uuids() if mixed else None
    seen: dict[str, str] = {}
    twice: list[str] = []
    for item in items:
        key = _gpu_of(item, table)
        # A UUID and a prefix of it (CUDA takes any unique prefix) name one GPU, table or not.
        key = next((k for k in seen if not k.isdigit() and _same_uuid(k, key)), key)
        if key not in seen:
            seen[key] = item
            continue
        first = seen[key]
        if item.lower() == first.lower():
            said = f"names {item} more than once"
        else:
            said = f"{first} and {item} name the same GPU ({key})"
        if said not in twice:
            twice.append(said)
    if twice:
        raise BadInput(
            f"CUDA_VISIBLE_DEVICES={spec}: {'; '.join(twice)}; each GPU may be listed once"
            " (ranks would share a GPU and NCCL refuses that)"
        )
