"""The node checks. REGISTRY is the only list of them: the CLI, the engine and the reports read it.

Adding a check is one module that follows the contract in gpuenv.checks.base, one line here, and
its deadline under ``deadlines_s`` in gpuenv/data/thresholds.yaml. The order here is the order
they run and are reported in (launched checks open their gates in this order: mpi before ddp,
because torchrun's ranks are still importing torch when mpirun's are ready).

A check whose module sets ``OPTIONAL = True`` (the frameworks of the seed documents: pycuda,
tensorflow, horovod, dask) runs only when asked: named by ``--only``, or required by the profile
(``frameworks``). See gpuenv.checks.profiles.default_names. ``examples`` (optional too, required
by the ``examples`` profile) runs the seed documents' methods from examples/ as users run them.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuenv.checks import (
    cupy,
    dask,
    ddp,
    examples,
    fabric,
    horovod,
    mpi,
    nccl,
    pycuda,
    streams,
    system,
    tensorflow,
)
from gpuenv.checks.base import Check

REGISTRY: Mapping[str, Check] = {
    c.NAME: c  # type: ignore[misc]
    for c in (
        system,
        cupy,
        streams,
        nccl,
        fabric,
        pycuda,
        mpi,
        ddp,
        horovod,
        tensorflow,
        dask,
        examples,
    )
}
