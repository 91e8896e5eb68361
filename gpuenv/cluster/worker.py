"""Node-side ranks of the multi-node runs; started by torchrun or mpirun, never by hand.

``torchrun ... -m gpuenv.cluster.worker torch`` measures a torch.distributed all-reduce sweep
(NCCL on GPUs, gloo on CPU) across every rank of every node, with NCCL's own log read back to
say which transport it used, then runs the DDP training step of the node check
(gpuenv.checks.ddp.train) across the nodes. ``mpirun ... python3 -m gpuenv.cluster.worker mpi``
runs an mpi4py all-reduce of numpy arrays across the hostfile's nodes. The first rank of each
node prints one line ``GPUENV_RESULT {json}``: the controller collects one such line per node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

MARK = "GPUENV_RESULT "
MIB = 1 << 20


def _emit(payload: dict[str, Any]) -> None:
    print(MARK + json.dumps(payload), flush=True)


def _busbw(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def run_torch(sizes: list[int], iters: int, steps: int, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    from gpuenv.checks import ddp, nccl_log

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = torch.cuda.is_available()
    debug_file = None
    if gpu:
        torch.cuda.set_device(local_rank)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        # NCCL's own log says which transport it chose; read back after the sweep.
        debug_file = os.path.join(tempfile.gettempdir(), f"gpuenv-nccl-{os.getpid()}.log")
        os.environ["NCCL_DEBUG"] = "INFO"
        os.environ["NCCL_DEBUG_FILE"] = debug_file
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    backend = "nccl" if gpu else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize(device)

    sweep = []
    expected = world * (world + 1) / 2
    for nbytes in sizes:
        x = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        x.fill_(rank + 1)
        dist.all_reduce(x)  # warm-up, and the value check
        sync()
        correct = bool(torch.all(x == expected).item())
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        seconds = (time.perf_counter() - t0) / iters
        algbw, busbw = _busbw(nbytes, seconds, world)
        sweep.append(
            {
                "bytes": nbytes,
                "time_us": seconds * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "correct": correct,
            }
        )
        del x

    outcome = ddp.train(rank, world, device, steps)
    transport = nccl_log.read(debug_file) if debug_file is not None else {}
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        _emit(
            {
                "kind": "torch",
                "host": socket.gethostname(),
                "node_rank": int(os.environ.get("GROUP_RANK", "0")),
                "rank": rank,
                "world_size": world,
                "backend": backend,
                "sweep": sweep,
                "ddp": outcome,
                "transport": transport,
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
            }
        )
    dist.barrier()
    dist.destroy_process_group()
    if debug_file is not None:
        with contextlib.suppress(OSError):
            os.unlink(debug_file)


def run_mpi(nbytes: int, iters: int) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    hosts = comm.allgather(MPI.Get_processor_name())
    x = np.full(nbytes // 8, rank + 1, dtype=np.float64)
    out = np.empty_like(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    correct = bool(np.all(out == world * (world + 1) / 2))
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.Allreduce(x, out, op=MPI.SUM)
    seconds = (time.perf_counter() - t0) / iters
    algbw, busbw = _busbw(nbytes, seconds, world)
    if rank == 0:
        _emit(
            {
                "kind": "mpi",
                "host": socket.gethostname(),
                "world_size": world,
                "rank_hosts": hosts,
                "correct": bool(comm.allreduce(int(correct), op=MPI.MIN)),
                "bytes": nbytes,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "mpi": MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00"),
                "python": sys.executable,
            }
        )
    else:
        comm.allreduce(int(correct), op=MPI.MIN)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuenv.cluster.worker")
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--sizes", default=f"{MIB},{16 * MIB}", help="bytes, comma-separated")
    t.add_argument("--iters", type=int, default=5)
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--timeout", type=float, default=60.0)
    m = sub.add_parser("mpi")
    m.add_argument("--bytes", type=int, default=8 * MIB)
    m.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    if args.what == "torch":
        sizes = [int(s) for s in args.sizes.split(",") if s]
        run_torch(sizes, args.iters, args.steps, args.timeout)
        # gloo's threads can abort the interpreter's teardown ("terminate called without an
        # active exception", seen with torch 2.13 CPU): the work is done and reported, so leave
        # without running C++ static destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    else:
        run_mpi(args.bytes, args.iters)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
