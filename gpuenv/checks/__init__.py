"""The node checks, one module each, in the order they run.

Each module defines NAME and DESCRIPTION and imports its heavy libraries (cupy, torch,
mpi4py, pynvml) only inside functions, so that listing or skipping checks costs nothing.
"""

from __future__ import annotations

from types import ModuleType

from gpuenv.checks import cupy, ddp, mpi, nccl, streams, system

CHECKS: dict[str, ModuleType] = {m.NAME: m for m in (system, cupy, streams, nccl, ddp, mpi)}


def gpu_checks() -> list[str]:
    """Checks that run in the one-process-per-GPU worker (gpuenv.checks.worker)."""
    return ["cupy", "streams", "nccl"]
