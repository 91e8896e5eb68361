"""Node-side ranks of the multi-node runs; started by torchrun or mpirun, never by hand.

``python -m torch.distributed.run ... -m gpuenv.cluster.worker torch`` measures a torch.distributed
all-reduce sweep (NCCL on GPUs, gloo on CPU) across every rank of every node, then trains a
small DDP model a few steps and checks that all ranks hold identical parameters and that the
loss fell. ``mpirun ... python -m gpuenv.cluster.worker mpi`` runs an mpi4py all-reduce of numpy
arrays across the hostfile's nodes. The first rank of each node prints one line
``GPUENV_RESULT {json}``: the controller collects one such line per node.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
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

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local_rank)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
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

    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)
    ).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234 + rank)
    inputs = torch.randn(256, 64, generator=gen).to(device)
    target = inputs[:, :1].clone() * 0.5
    losses, times = [], []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(inputs), target)
        loss.backward()
        opt.step()
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    identical = bool(torch.equal(lo, hi))
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
                "ddp": {
                    "params_identical": identical,
                    "loss_first": losses[0] if losses else None,
                    "loss_last": losses[-1] if losses else None,
                    "step_time_s": statistics.median(times[1:] or times) if times else None,
                },
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
            }
        )
    dist.barrier()
    dist.destroy_process_group()


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
