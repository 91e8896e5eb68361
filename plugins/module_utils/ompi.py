# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Open MPI as ``ompi_info --parsable --all`` tells it: its version and whether it is CUDA-aware.

The one rule, the role's fact ``mpi_cuda_aware`` and the ``mpi`` check's buffer path both read:
CUDA-aware means built with CUDA support (``mpi_built_with_cuda_support`` true) AND not switched
off at run time (``opal_cuda_support`` / ``mpi_cuda_support``, where the build has them, not
false). That is what Open MPI's own ``MPIX_Query_cuda_support`` answers ("built with the NVIDIA
CUDA library and the runtime supports CUDA buffers"). Built-with alone is not enough: conda-forge's
Open MPI is built with CUDA support and ships it disabled (``opal_cuda_support`` false), and handing
a device buffer to a library that does not take one kills the rank with a segmentation fault.
"""

from __future__ import annotations

import re

from .node import Run

ARGV = ["ompi_info", "--parsable", "--all"]
BUILT = "mpi_built_with_cuda_support"
# Run-time switches, in the order they are consulted (Open MPI 4/5: opal; 3: mpi).
SWITCHES = ("opal_cuda_support", "mpi_cuda_support")


def values(text: str) -> dict[str, str]:
    """``mca:mpi:base:param:NAME:value:VALUE`` lines as NAME -> VALUE."""
    found = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 7 and parts[3] == "param" and parts[5] == "value":
            found[parts[4]] = ":".join(parts[6:]).strip()
    return found


def version(text: str) -> str | None:
    found = re.search(r"^ompi:version:full:([0-9]\S*)", text, re.M)
    return found.group(1) if found else None


def cuda_awareness(text: str) -> tuple[bool, str]:
    """Whether this Open MPI takes CUDA device buffers, and the ompi_info line that decided."""
    params = values(text)
    built = params.get(BUILT)
    if built != "true":
        return False, f"{BUILT}: {built or 'not reported'}"
    for switch in SWITCHES:
        if params.get(switch) == "false":
            return False, f"{BUILT}: true, but {switch}: false (CUDA support switched off)"
    return True, f"{BUILT}: true"


def read(run: Run) -> dict | None:
    """Version and CUDA-awareness (with its evidence); None when ompi_info does not answer."""
    rc, out = run(ARGV)
    found = version(out) if rc == 0 else None
    if found is None:
        return None
    aware, evidence = cuda_awareness(out)
    return {"version": found, "cuda_aware": aware, "cuda_evidence": evidence}
