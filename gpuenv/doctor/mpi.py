"""Class 13: the Open MPI on the user's PATH carries CUDA device buffers.

The seed documents' first program hands CuPy arrays to ``comm.Bcast`` and ``comm.Gather``. On an
Open MPI built without CUDA support (Debian's and Ubuntu's), or built with it and switched off at
run time, MPI reads the device pointer as host memory and the rank dies with a segmentation fault.
The answer is the node floor's one rule (gpuenv.floor.ompi.decide): a device buffer handed to
MPI_Allreduce in a child process, never ompi_info's claim. The mpi role's fact
``gpuenv_mpi.cuda_aware`` is the same rule's answer for the Open MPI it installed.
"""

from __future__ import annotations

from gpuenv.doctor import pci
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor import ompi

NUMBER = 13
FIXES = (
    "provision the CUDA-aware Open MPI: ansible-playbook site.yml -i INVENTORY --tags mpi,env"
    " (role mpi, mpi_cuda_build: auto gives it to every GPU node; docs/roles/mpi.md)",
    "or put a CUDA-aware MPI first on PATH for the users' login shell and rebuild mpi4py against"
    " it: MPICC=PREFIX/bin/mpicc pip install --no-binary mpi4py --force-reinstall mpi4py",
)


def mpi_device_buffers(system: System) -> ClassReading:
    if not pci.gpus(system):
        return skipped(NUMBER, "no NVIDIA GPU on the PCI bus: no device buffers to carry")
    # Any Python 3 runs the transfer (standard library only): the one on the user's PATH.
    found = ompi.decide(system.floor_run, "python3", True)
    if found is None:
        return skipped(NUMBER, "no Open MPI on PATH (ompi_info does not answer)")
    facts = {key: found[key] for key in ("version", "cuda_aware", "cuda_tested", "cuda_evidence")}
    reading = ClassReading(NUMBER, facts=facts)
    if found["cuda_aware"]:
        return reading
    if not found["cuda_tested"]:
        title = f"Open MPI {found['version']}: whether it carries device buffers is unknown"
        cause = "the device transfer could not run, so nothing says MPI takes GPU arrays here"
    else:
        title = f"Open MPI {found['version']} does not carry CUDA device buffers"
        cause = (
            "MPI code that hands CuPy or torch GPU arrays to MPI (the seed documents'"
            " comm.Bcast(cupy_array)) will crash on this node with a segmentation fault"
        )
    reading.findings.append(Finding(NUMBER, title, cause, (found["cuda_evidence"],), FIXES))
    return reading
