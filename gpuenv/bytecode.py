"""Whether this interpreter compiles a package from source in every process, and a bytecode
cache for gpuenv's own child processes when it does.

An image that sets ``PYTHONDONTWRITEBYTECODE=1`` and ships torch without ``.pyc`` files (or a
site-packages its user cannot write) makes every Python process compile torch again: on the H200
machine 3.3 s for ``import torch`` and 3.7 s for ``import torch._dynamo``, against 1.3 s and
1.0 s from a bytecode cache (``benchmarks/gpu_machine_gap.sh``, docs/benchmarks.md). A DDP worker
pays both, and torchrun's agent the first. gpuenv's launched checks then get
``PYTHONPYCACHEPREFIX`` (a cache in the user's cache folder) with the variable cleared, so only
the first run compiles; the user's own jobs do not, and the ``system`` result says how to fix that.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DONT_WRITE = "PYTHONDONTWRITEBYTECODE"
PREFIX = "PYTHONPYCACHEPREFIX"


@dataclass(frozen=True)
class Reading:
    package: str
    source: str  # the package's __init__.py
    cached: bool  # its .pyc exists where this interpreter looks
    why_not_written: str  # "" when this interpreter would write the .pyc

    @property
    def compiles_every_time(self) -> bool:
        return not self.cached and bool(self.why_not_written)

    def describe(self) -> str:
        site = str(Path(self.source).parent.parent)
        return (
            f"Python compiles {self.package} in every process ({self.why_not_written}, no .pyc"
            f" for {self.source}): seconds per process start; gpuenv's own ranks use a bytecode"
            f" cache, your jobs do not: `{sys.executable} -m compileall -q -j 0 {site}`"
            f" (or unset {DONT_WRITE})"
        )


def read(package: str = "torch") -> Reading | None:
    """The package's bytecode as this interpreter sees it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    pyc = Path(importlib.util.cache_from_source(spec.origin))
    why = ""
    if sys.flags.dont_write_bytecode:
        why = f"{DONT_WRITE}={os.environ.get(DONT_WRITE, '1')}"
    else:
        folder = pyc.parent if pyc.parent.exists() else pyc.parent.parent
        if not os.access(folder, os.W_OK):
            why = f"{folder} is not writable by this user"
    return Reading(package, spec.origin, pyc.exists(), why)


def cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuenv" / "pycache"


def child_env(env: dict[str, str], reading: Reading | None) -> dict[str, str]:
    """``env`` with a bytecode cache for the children when ``reading`` compiles every time (and
    the cache folder can be made); otherwise ``env`` unchanged."""
    if reading is None or not reading.compiles_every_time or env.get(PREFIX):
        return env
    folder = cache_dir(env)
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return env
    if not os.access(folder, os.W_OK):
        return env
    env = dict(env)
    env[PREFIX] = str(folder)
    env.pop(DONT_WRITE, None)
    return env
