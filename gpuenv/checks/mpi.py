"""`mpi`: mpi4py Bcast, Gather, Allreduce and Send/Recv across ranks, the way users call them:
CuPy arrays straight into MPI on GPU nodes, numpy arrays on nodes without GPUs.

Whether this Open MPI carries device buffers is decided first, by the node floor's transfer
(gpuenv.floor.ompi: rank 0 hands a device buffer to MPI_Allreduce in a child process, against the
libmpi this rank loaded), never by ompi_info's claim. A library that does not take device buffers
kills the process with a segmentation fault: the check then FAILs naming the MPI build and the
crash users' ``comm.Bcast(cupy_array)`` will meet, and runs the collectives with the buffers staged
through host memory as a separate measurement. ``--mpi-host-staging`` (or the profile's
``mpi: {host_staging: true}``) accepts such a node: the result passes on the staged run and its
caveat, on the verdict line, says that device-buffer MPI code will crash there.
Unlike the seed document, every rank's Gather part has the same length, the device is
synchronised before MPI reads a buffer, and every result is compared with the truth.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv import proc
from gpuenv.checks import ranklog
from gpuenv.checks.base import (
    CAVEAT,
    Context,
    NodeInfo,
    Placement,
    always_needed,
    has_module,
    is_open_mpi,
    mpirun_flags,
    rank_problems,
    verdict,
)
from gpuenv.floor import ompi
from gpuenv.results import Measurement, Result

NAME = "mpi"
DESCRIPTION = (
    "mpirun + mpi4py: Bcast, Gather, Allreduce, Send/Recv on CuPy device buffers"
    " (numpy without GPUs)"
)

PLACEMENT = Placement.LAUNCHER
OPTIONAL = False
needed = always_needed
MIN_RANKS = 2  # one rank agreeing with itself proves nothing
# The transfer child inherits none of mpirun's wiring: it is a singleton of its own.
LAUNCH_ENV = re.compile(r"^(OMPI_|PMIX_|PRTE_|PMI_)")


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    for module in ("mpi4py", "numpy"):
        if not has_module(module):
            return f"{module} not installed"
    if shutil.which("mpirun") is None:
        return "mpirun not found on PATH"
    if node.has_gpu and not has_module("cupy"):
        return "cupy not installed (needed for GPU buffers)"
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    """One rank per GPU, and never fewer than two (two ranks share a lone GPU)."""
    return max(MIN_RANKS, len(node.gpus))


def host_staging_accepted(ctx: Context) -> bool:
    """--mpi-host-staging, or the profile's ``mpi: {host_staging: true}``."""
    return ctx.mpi_host_staging or bool(ctx.profile_params(NAME).get("host_staging", False))


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    mib = float(ctx.profile_params(NAME).get("mib", 16))
    # The CI machine has fewer cores than ranks; root needs Open MPI's explicit consent.
    argv = ["mpirun", "-n", str(world), *mpirun_flags(is_open_mpi())]
    device = "cuda" if node.has_gpu else "cpu"
    rank_argv = [sys.executable, "-m", "gpuenv.checks.mpi", "--device", device, "--mib", str(mib)]
    if host_staging_accepted(ctx):
        rank_argv.append("--host-staging-ok")
    return [*argv, *rank_argv]


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1"}


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    first = payloads[0]
    found = rank_problems(payloads, world, MIN_RANKS, "a collective")
    slowest = max(float(p["allreduce_s"]) for p in payloads.values())
    ms = [
        Measurement("ranks", world, "", float(MIN_RANKS), "min"),
        Measurement("path", first["path"]),
        Measurement("allreduce_time", round(slowest * 1e3, 3), "ms"),
        Measurement("allreduce_bytes", first["bytes"], "B"),
    ]
    staged = [p["staged_allreduce_s"] for p in payloads.values() if p.get("staged_allreduce_s")]
    if staged and first["path"] != "host-staging":
        ms.append(Measurement("staged_allreduce_time", round(max(staged) * 1e3, 3), "ms"))
    versions = {"mpi4py": first["mpi4py"], "mpi": first["mpi"]}
    devices = sorted({p.get("device") for p in payloads.values() if p.get("device") is not None})
    details: dict[str, Any] = {"path": first["path"], "why": first["why"], "devices": devices}
    if first.get("transfer"):
        details["transfer"] = first["transfer"]
    if first.get("caveat"):
        details[CAVEAT] = first["caveat"]
    shared = (
        f"; {world} ranks share GPU {devices[0]}"
        if first["path"] != "numpy" and len(devices) == 1 and world > 1
        else ""
    )
    passed = (
        f"Bcast, Gather, Allreduce, Send/Recv verified on {world} ranks; path {first['path']}"
        f" ({first['why']}){shared}"
    )
    return verdict(ctx, NAME, found, [], passed, ms, versions, details)


def loaded_libmpi() -> str | None:
    """The libmpi this process mapped (mpi4py's), from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if re.search(r"/libmpi\.so[.0-9]*$", path):
                    return path
    except OSError:
        return None
    return None


def device_transfer(build: str) -> dict[str, Any]:
    """The floor's transfer against this rank's libmpi, in a child process of its own (a library
    that does not take device buffers kills it, not this rank)."""
    library = loaded_libmpi()
    if library is None:
        return {"cuda_aware": None, "evidence": "no libmpi mapped in this rank (not Open MPI?)"}
    env = {k: v for k, v in os.environ.items() if not LAUNCH_ENV.match(k)}

    def run(argv: list[str], timeout_s: float) -> tuple[int, str]:
        done = proc.capture(argv, timeout_s, env=env)
        return (124 if done.returncode is None else done.returncode), done.stdout

    try:
        answer = ompi.transfer(run, sys.executable, library)
    except OSError as exc:
        return {"cuda_aware": None, "evidence": f"the transfer could not start: {exc}"}
    return {**answer, "library": library, "build": build}


def crash_warning(transfer: Mapping[str, Any]) -> str:
    """What users' code meets on an MPI that does not carry device buffers."""
    return (
        f"device buffers: {transfer['evidence']}: {transfer['build']} does not carry CUDA device"
        " buffers, so MPI code that hands CuPy or torch GPU arrays to MPI (the seed documents'"
        " comm.Bcast(cupy_array)) will crash on this node; provision the CUDA-aware Open MPI"
        " (roles/mpi, mpi_cuda_build)"
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.mpi")
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--mib", type=float, default=16)
    parser.add_argument("--host-staging-ok", action="store_true")
    args = parser.parse_args(argv)

    import mpi4py
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    index, size = comm.Get_rank(), comm.Get_size()
    log = ranklog.RankLog(ranklog.RankConfig.load().events, index)
    log.mark(NAME, "start")
    # A rank's exception is its result, and ends the job: its peers would wait in a collective.
    ranklog.report_uncaught(log, NAME, comm.Abort)
    build = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
    device = None
    xp: Any = np
    transfer: dict[str, Any] = {}
    if args.device == "cuda":
        import cupy as cp

        xp = cp
        device = index % cp.cuda.runtime.getDeviceCount()
        cp.cuda.Device(device).use()
        # One answer for every rank: rank 0 asks the transfer while the others wait.
        transfer = comm.bcast(device_transfer(build) if index == 0 else None, root=0)
    plan = buffer_plan(args.device, transfer, args.host_staging_ok)

    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, index, size, device or 0)
    with ranklog.Heartbeat(log, NAME):
        payload = _collectives(rank, comm, MPI, np, xp, plan, args.mib)
    rank.log.result(NAME, {
        **payload,
        "path": plan["path"],
        "why": plan["why"],
        "device": device,
        "errors": plan["errors"] + payload["errors"],
        "transfer": transfer,
        "caveat": plan["caveat"],
        "mpi4py": mpi4py.__version__,
        "mpi": build,
    })  # fmt: skip
    comm.Barrier()
    return 0


def buffer_plan(device: str, transfer: Mapping[str, Any], host_staging_ok: bool) -> dict[str, Any]:
    """How buffers reach MPI, and what that means for the verdict: numpy without GPUs; device
    buffers where the transfer passed; otherwise host staging, which FAILs unless accepted."""
    if device == "cpu":
        return {"path": "numpy", "why": "no GPU: numpy buffers", "errors": [], "caveat": ""}
    if transfer.get("cuda_aware") is True:
        why = f"CuPy device buffers passed directly: {transfer['evidence']}"
        return {"path": "cuda-aware", "why": why, "errors": [], "caveat": ""}
    if transfer.get("cuda_aware") is None:
        problem = f"device buffers: the transfer could not decide ({transfer.get('evidence')})"
        return {"path": "host-staging", "why": problem, "errors": [problem], "caveat": ""}
    warning = crash_warning(transfer)
    if host_staging_ok:
        why = "CuPy buffers staged through host memory, accepted by --mpi-host-staging"
        return {"path": "host-staging", "why": why, "errors": [], "caveat": warning}
    why = "CuPy buffers staged through host memory (a measurement, not a pass)"
    return {"path": "host-staging", "why": why, "errors": [warning], "caveat": ""}


def _collectives(
    rank: ranklog.RankContext, comm: Any, MPI: Any, np: Any, xp: Any, plan: Mapping[str, Any],
    mib: float,
) -> dict[str, Any]:  # fmt: skip
    index, size = rank.rank, rank.world
    path = plan["path"]
    gpu = xp is not np

    def host(arr: Any) -> Any:
        """For checking on the host (no device reduction kernels to compile)."""
        return xp.asnumpy(arr) if gpu else arr

    def sync() -> None:
        if gpu:
            xp.cuda.get_current_stream().synchronize()  # MPI reads the buffers from now on

    def staged(op: Any, *arrays: Any) -> None:
        """``op`` on host copies of ``arrays`` (None passes through), copied back after."""
        hosts = [host(a) if a is not None else None for a in arrays]
        op(*hosts)
        for arr, copy in zip(arrays, hosts, strict=True):
            if arr is not None:
                arr.set(copy)

    def call(op: Any, *arrays: Any) -> None:
        if path == "host-staging":
            staged(op, *arrays)
        else:
            sync()
            op(*arrays)

    rank.mark("ready")
    ranklog.fault_point(NAME, index)  # a rank that never joins
    k = max(1, int(mib * 2**20) // 4 // size)
    n = k * size
    errors = []
    truth = np.arange(n, dtype=np.float32)

    rank.mark("bcast")
    data = xp.arange(n, dtype=xp.float32) if index == 0 else xp.empty(n, dtype=xp.float32)
    call(lambda d: comm.Bcast(d, root=0), data)
    if not np.array_equal(host(data), truth):
        errors.append("Bcast: values differ from the root's")

    rank.mark("gather")
    local = xp.square(data[index * k : (index + 1) * k])  # the same length on every rank
    recv = xp.empty((size, k), dtype=xp.float32) if index == 0 else None
    call(lambda s, r: comm.Gather(s, r, root=0), local, recv)
    if index == 0 and not np.array_equal(host(recv).reshape(-1), np.square(truth)):
        errors.append("Gather: root received wrong values")

    rank.mark("sendrecv")
    out = xp.full(k, index, dtype=xp.float32)
    back = xp.empty(k, dtype=xp.float32)
    right, left = (index + 1) % size, (index - 1) % size

    def ring(s: Any, r: Any) -> None:
        request = comm.Isend(s, dest=right, tag=7)
        comm.Recv(r, source=left, tag=7)
        request.Wait()

    call(ring, out, back)
    if not bool(np.all(host(back) == left)):
        errors.append(f"Send/Recv: wrong values from rank {left}")

    rank.mark("allreduce")
    send = xp.full(n, index + 1, dtype=xp.float32)
    total = xp.empty_like(send)
    comm.Barrier()
    t = time.perf_counter()
    call(lambda s, r: comm.Allreduce(s, r, op=MPI.SUM), send, total)
    sync()
    seconds = time.perf_counter() - t
    if not bool(np.all(host(total) == size * (size + 1) / 2)):
        errors.append("Allreduce: wrong sum")

    staged_s = None
    if gpu and path != "host-staging":
        # Host staging as a measurement of its own beside the device path, never its pass.
        rank.mark("allreduce-staged")
        again = xp.empty_like(send)
        comm.Barrier()
        t = time.perf_counter()
        staged(lambda s, r: comm.Allreduce(s, r, op=MPI.SUM), send, again)
        staged_s = time.perf_counter() - t
        if not bool(np.all(host(again) == size * (size + 1) / 2)):
            errors.append("Allreduce (host-staged): wrong sum")
    rank.mark("done")
    return {
        "errors": errors,
        "bytes": n * 4,
        "allreduce_s": seconds,
        "staged_allreduce_s": staged_s,
    }


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
