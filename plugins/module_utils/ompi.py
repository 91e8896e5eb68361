# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Open MPI: its version, what ``ompi_info --parsable --all`` says of its CUDA support, and
whether it really carries device buffers, decided by a transfer (``decide``).

The one rule, which the role's fact ``mpi_cuda_aware``, the doctor and the ``mpi`` check read: a
device buffer handed to MPI_Allreduce comes back intact (``TRANSFER_PROGRAM``). The build's claim
is evidence, never the answer: ``mpi_built_with_cuda_support`` true is not enough where the run-time
switch is off (conda-forge ships ``opal_cuda_support`` false), and handing a device buffer to a
library that does not take one kills the rank with a segmentation fault. ``cuda_awareness`` reads
the claim (built with CUDA support and not switched off at run time, what Open MPI's
``MPIX_Query_cuda_support`` answers).
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


def read(run: Run, ompi_info: str = "ompi_info") -> dict | None:
    """Version and CUDA support as built (with its evidence); None when ompi_info does not answer.
    What the build says is not the answer users need: ``decide`` asks a transfer."""
    rc, out = run([ompi_info, *ARGV[1:]])
    found = version(out) if rc == 0 else None
    if found is None:
        return None
    aware, evidence = cuda_awareness(out)
    return {"version": found, "cuda_aware": aware, "cuda_evidence": evidence}


# The transfer that decides CUDA-awareness: one process (a singleton MPI_Init, no mpirun) hands a
# device buffer to MPI_Allreduce on MPI_COMM_SELF and reads the result back. A library that takes
# device buffers copies it with the CUDA driver; one that does not reads the device pointer as host
# memory and the process dies with SIGSEGV: the crash users' ``comm.Gather(cupy_array)`` meets.
# Standard library only (ctypes over libcuda.so.1 and the libmpi ompi_info loads), so it runs
# before any venv exists. Exit 3: no usable GPU (not decided); it prints one verdict word last.
# Its first line names it: the floor's command name of the run (fixture files) comes from it alone.
TRANSFER_PROGRAM = (
    (
        "# gpuenv.floor.ompi transfer: does this libmpi carry a CUDA device buffer"
        " through MPI_Allreduce?\n"
    )
    + r"""import ctypes, sys
N = 4096
size = ctypes.c_size_t(N * 4)
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as err:
    print("no-gpu libcuda.so.1: %s" % err); sys.exit(3)
def ok(rc, what):
    if rc != 0:
        print("no-gpu %s answered CUresult %d" % (what, rc)); sys.exit(3)
ok(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
src, dst = ctypes.c_uint64(), ctypes.c_uint64()
ok(cuda.cuMemAlloc_v2(ctypes.byref(src), size), "cuMemAlloc")
ok(cuda.cuMemAlloc_v2(ctypes.byref(dst), size), "cuMemAlloc")
ok(cuda.cuMemcpyHtoD_v2(src, (ctypes.c_float * N)(*range(N)), size), "cuMemcpyHtoD")
ok(cuda.cuMemsetD32_v2(dst, ctypes.c_uint(0), ctypes.c_size_t(N)), "cuMemsetD32")
mpi = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
def handle(name):
    return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(mpi, name)))
mpi.MPI_Init(None, None)
print("transfer-start", flush=True)
rc = mpi.MPI_Allreduce(ctypes.c_void_p(src.value), ctypes.c_void_p(dst.value), N,
                       handle("ompi_mpi_float"), handle("ompi_mpi_op_sum"),
                       handle("ompi_mpi_comm_self"))
back = (ctypes.c_float * N)()
ok(cuda.cuMemcpyDtoH_v2(back, dst, size), "cuMemcpyDtoH")
mpi.MPI_Finalize()
good = rc == 0 and list(back) == [float(i) for i in range(N)]
print("transfer-ok" if good else "transfer-wrong rc=%d" % rc)
"""
)
TRANSFER_DEADLINE_S = 60
NO_GPU_EXIT = 3
SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}


def libmpi(ldd_output: str) -> str | None:
    """The libmpi a program loads, from ``ldd`` of it (ompi_info links it)."""
    found = re.search(r"=> (/\S*/libmpi\.so[.0-9]*) ", ldd_output)
    return found.group(1) if found else None


def judge_transfer(rc: int, out: str, library: str) -> dict:
    """The transfer's verdict: cuda_aware True/False, or None when no GPU could run it."""
    said = out.strip().splitlines()[-1] if out.strip() else ""
    if rc == NO_GPU_EXIT or said.startswith("no-gpu"):
        return {"cuda_aware": None, "evidence": f"no device transfer: {said or 'no GPU'}"}
    if rc == 0 and said == "transfer-ok":
        return {
            "cuda_aware": True,
            "evidence": f"a device buffer passed through MPI_Allreduce of {library} intact",
        }
    if rc == 124:
        how = "did not return within its deadline"
    elif rc > 128 or rc < 0:
        number = rc - 128 if rc > 128 else -rc
        how = f"killed the process with {SIGNALS.get(number, f'signal {number}')}"
    elif said.startswith("transfer-wrong"):
        how = f"returned wrong values ({said})"
    else:
        how = f"failed (exit {rc}: {said or 'no output'})"
    return {"cuda_aware": False, "evidence": f"MPI_Allreduce of a device buffer in {library} {how}"}


def transfer(run: Run, python: str, library: str) -> dict:
    """Run the transfer with ``python`` against ``library`` (a libmpi path) and judge it."""
    rc, out = run([python, "-c", TRANSFER_PROGRAM, library], timeout_s=TRANSFER_DEADLINE_S)
    return judge_transfer(rc, out, library)


def library_of(run: Run, ompi_info: str) -> str | None:
    """The libmpi that ``ompi_info`` (a path or a name on PATH) loads."""
    found = ompi_info
    if "/" not in ompi_info:
        rc, out = run(["which", ompi_info])
        found = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if not found:
        return None
    rc, out = run(["ldd", found])
    return libmpi(out) if rc == 0 else None


def decide(run: Run, python: str, has_gpu: bool, ompi_info: str = "ompi_info") -> dict | None:
    """The one answer to "does this Open MPI carry device buffers?": version, ``cuda_aware``,
    ``cuda_tested`` (whether a transfer decided) and ``cuda_evidence``. The build's own claim
    (``mpi_built_with_cuda_support``) is evidence only: without a GPU to run the transfer on,
    ``cuda_aware`` is False and ``cuda_tested`` False. None when ompi_info does not answer."""
    found = read(run, ompi_info)
    if found is None:
        return None
    built = found["cuda_evidence"]
    library = library_of(run, ompi_info) if has_gpu else None
    if library is None:
        why = "no GPU on this node" if not has_gpu else f"no libmpi found in ldd of {ompi_info}"
        tested = {"cuda_aware": None, "evidence": f"no device transfer: {why}"}
    else:
        tested = transfer(run, python, library)
    return {
        "version": found["version"],
        "cuda_aware": tested["cuda_aware"] is True,
        "cuda_tested": tested["cuda_aware"] is not None,
        "cuda_evidence": f"{tested['evidence']} (ompi_info: {built})",
    }
