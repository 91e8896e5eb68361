"""`mpi`: mpi4py Bcast, Gather and Allreduce across ranks, with CuPy buffers on GPUs.

CuPy device buffers are handed to MPI only when Open MPI is CUDA-aware by the node floor's one
rule (gpuenv.floor.ompi: built with CUDA support and not switched off at run time, the rule the
role's fact ``mpi_cuda_aware`` follows too); otherwise an MPI library reads a device pointer as
host memory and the rank dies with a segmentation fault, so the buffers are staged through host
memory. On a host without GPUs, numpy buffers.
Unlike the seed document, every rank's Gather part has the same length, the device is
synchronised before MPI reads a buffer, and every result is compared with the truth.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv import proc
from gpuenv.checks import ranklog
from gpuenv.checks.base import (
    Context,
    NodeInfo,
    Placement,
    always_needed,
    has_module,
    rank_problems,
    verdict,
)
from gpuenv.floor import ompi
from gpuenv.results import Measurement, Result

NAME = "mpi"
DESCRIPTION = (
    "mpirun + mpi4py: Bcast, Gather, Allreduce on CuPy (CUDA-aware or host-staged) or numpy"
)

PLACEMENT = Placement.LAUNCHER
OPTIONAL = False
needed = always_needed
MIN_RANKS = 2  # one rank agreeing with itself proves nothing
OMPI_INFO_DEADLINE_S = 30.0
MPIRUN_VERSION_DEADLINE_S = 20.0


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


def choose_path(has_gpu: bool) -> str:
    """How buffers reach MPI. Asked by rank 0 before the gate: ``ompi_info --all`` takes about
    a second, which the parent would otherwise spend before it can start the next launcher."""
    if not has_gpu:
        return "numpy"
    found = ompi.read(lambda argv: proc.command_output(argv, OMPI_INFO_DEADLINE_S))
    return "cuda-aware" if found is not None and found["cuda_aware"] else "host-staging"


def _is_open_mpi() -> bool:
    try:
        done = proc.capture(["mpirun", "--version"], MPIRUN_VERSION_DEADLINE_S)
    except OSError:
        return False
    said = done.stdout + done.stderr
    return done.returncode is not None and ("Open MPI" in said or "OpenRTE" in said)


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    mib = float(ctx.profile_params(NAME).get("mib", 16))
    argv = ["mpirun", "-n", str(world)]
    if _is_open_mpi():
        # The CI machine has fewer cores than ranks; root needs Open MPI's explicit consent.
        argv.append("--oversubscribe")
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
    device = "cuda" if node.has_gpu else "cpu"
    return [*argv, sys.executable, "-m", "gpuenv.checks.mpi", "--device", device, "--mib", str(mib)]


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
    versions = {"mpi4py": first["mpi4py"], "mpi": first["mpi"]}
    devices = sorted({p.get("device") for p in payloads.values() if p.get("device") is not None})
    details = {"path": first["path"], "why": first["why"], "devices": devices}
    shared = (
        f"; {world} ranks share GPU {devices[0]}"
        if first["path"] != "numpy" and len(devices) == 1 and world > 1
        else ""
    )
    passed = (
        f"Bcast, Gather, Allreduce verified on {world} ranks; path {first['path']}"
        f" ({first['why']}){shared}"
    )
    return verdict(ctx, NAME, found, [], passed, ms, versions, details)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.mpi")
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--mib", type=float, default=16)
    args = parser.parse_args(argv)

    import mpi4py
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    index, size = comm.Get_rank(), comm.Get_size()
    log = ranklog.RankLog(ranklog.RankConfig.load().events, index)
    log.mark(NAME, "start")
    # One answer for every rank: rank 0 asks Open MPI, the others take its word.
    path = comm.bcast(choose_path(args.device == "cuda") if index == 0 else None, root=0)
    device = None
    if path == "numpy":
        xp: Any = np
        why = "no GPU: numpy buffers"
    else:
        import cupy as cp

        xp = cp
        device = index % cp.cuda.runtime.getDeviceCount()
        cp.cuda.Device(device).use()
        why = (
            "Open MPI built with CUDA support: CuPy buffers passed directly"
            if path == "cuda-aware"
            else "Open MPI not CUDA-aware: CuPy buffers staged through host memory"
        )

    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, index, size, device or 0)
    with ranklog.Heartbeat(log, NAME):
        _collectives(rank, comm, MPI, mpi4py, np, xp, path, args.mib, why, device)
    comm.Barrier()
    return 0


def _collectives(
    rank: ranklog.RankContext,
    comm: Any,
    MPI: Any,
    mpi4py: Any,
    np: Any,
    xp: Any,
    path: str,
    mib: float,
    why: str,
    device: int | None,
) -> None:
    index, size = rank.rank, rank.world

    def to_mpi(arr: Any) -> Any:
        if path == "host-staging":
            return xp.asnumpy(arr)  # waits for the device
        if path == "cuda-aware":
            xp.cuda.get_current_stream().synchronize()  # MPI reads the buffer from now on
        return arr

    def from_mpi(buf: Any, arr: Any) -> None:
        if path == "host-staging":
            arr.set(buf)

    def host(arr: Any) -> Any:
        """For checking on the host (no device reduction kernels to compile)."""
        return arr if xp is np else xp.asnumpy(arr)

    rank.mark("ready")
    ranklog.fault_point(NAME, index)  # a rank that never joins
    rank.mark("bcast")
    k = max(1, int(mib * 2**20) // 4 // size)
    n = k * size
    errors = []
    data = xp.arange(n, dtype=xp.float32) if index == 0 else xp.empty(n, dtype=xp.float32)
    buf = to_mpi(data)
    comm.Bcast(buf, root=0)
    from_mpi(buf, data)
    truth = np.arange(n, dtype=np.float32)
    if not np.array_equal(host(data), truth):
        errors.append("Bcast: values differ from the root's")

    rank.mark("gather")
    local = xp.square(data[index * k : (index + 1) * k])  # the same length on every rank
    recv = xp.empty((size, k), dtype=xp.float32) if index == 0 else None
    rbuf = to_mpi(recv) if recv is not None else None
    comm.Gather(to_mpi(local), rbuf, root=0)
    if index == 0:
        from_mpi(rbuf, recv)
        if not np.array_equal(host(recv).reshape(-1), np.square(truth)):
            errors.append("Gather: root received wrong values")

    rank.mark("allreduce")
    send = xp.full(n, index + 1, dtype=xp.float32)
    out = xp.empty_like(send)
    comm.Barrier()
    t = time.perf_counter()
    obuf = to_mpi(out)
    comm.Allreduce(to_mpi(send), obuf, op=MPI.SUM)
    from_mpi(obuf, out)
    if path != "numpy":
        xp.cuda.get_current_stream().synchronize()
    seconds = time.perf_counter() - t
    if not bool(np.all(host(out) == size * (size + 1) / 2)):
        errors.append("Allreduce: wrong sum")
    rank.mark("done")
    rank.log.result(NAME, {
        "path": path,
        "why": why,
        "device": device,
        "errors": errors,
        "bytes": n * 4,
        "allreduce_s": seconds,
        "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
    })  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
