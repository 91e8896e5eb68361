"""Node-side ranks of the multi-node runs; started by torchrun or mpirun, never by hand.

``torchrun ... -m gpuenv.cluster.worker torch`` measures a torch.distributed all-reduce sweep
(NCCL on GPUs, gloo on CPU) across every rank of every node, with NCCL's own log read back to
say which transport it used, then runs the DDP training step of the node check
(gpuenv.checks.ddp.train) across the nodes. ``mpirun ... python3 -m gpuenv.cluster.worker mpi``
runs an mpi4py all-reduce of numpy arrays across the hostfile's nodes. ``python3 -m
gpuenv.cluster.worker dask`` is one node's part of the dask stage (scheduler and client on the
first node, one worker per GPU everywhere; gpuenv.checks.dask computes and judges). The first
rank of each node prints one line ``GPUENV_RESULT {json}``: the controller collects one such line
per node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpuenv import proc

MARK = "GPUENV_RESULT "
MIB = 1 << 20


def _emit(payload: dict[str, Any]) -> None:
    print(MARK + json.dumps(payload), flush=True)


def _busbw(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def _nccl_log_path(local_rank: int) -> str:
    """Where a local rank of this launch writes NCCL's log (torchrun's run id names the launch)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID") or f"ppid{os.getppid()}"
    return os.path.join(tempfile.gettempdir(), f"gpuenv-nccl-{run}-{local_rank}.log")


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
        # NCCL's own log says which transport and which rails it chose; read back after the
        # sweep. One file per local rank of this launch: each GPU's channels go over its own
        # rails, and the node's first rank reads them all (the rails NCCL used on the node).
        debug_file = _nccl_log_path(local_rank)
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
    transport: dict[str, Any] = {}
    if debug_file is not None and local_rank == 0:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        logs = [nccl_log.read(_nccl_log_path(r)) for r in range(local_world)]
        transport = nccl_log.merge(logs).to_dict()
        unread = [str(log["error"]) for log in logs if "error" in log]
        if unread:
            transport["unread"] = unread
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


def _dask_children(
    scheduler: str,
    workers: int,
    gpus: int,
    name: str,
    timeout_s: float,
    own_scheduler: str | None,
    logs: Path,
) -> list[proc.Launch]:
    """The scheduler (on the first node) and this node's workers, one per GPU (or one), each in
    its own process session (gpuenv.proc) with its log in ``logs``: each worker sees only its
    GPU, as dask-cuda arranges it."""
    from gpuenv.checks.dask import visible_gpu_ids

    ids = visible_gpu_ids(gpus)  # within this node's own CUDA_VISIBLE_DEVICES, where it has one
    children = []
    if own_scheduler:
        host, port = own_scheduler.rsplit(":", 1)
        children.append(proc.Launch([
            sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", host,
            "--port", port, "--no-dashboard", "--idle-timeout", f"{int(timeout_s)}s",
        ], logs / "scheduler.log").start())  # fmt: skip
    for i in range(workers):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ids[i % len(ids)]
        children.append(proc.Launch([
            sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://{scheduler}",
            "--nthreads", "1", "--nworkers", "1", "--no-dashboard", "--name", f"{name}-{i}",
            "--death-timeout", f"{int(timeout_s)}s",
        ], logs / f"worker{i}.log", env).start())  # fmt: skip
    return children


def _end(children: list[proc.Launch], grace_s: float) -> list[str]:
    """Wait up to ``grace_s`` for the children to exit, then kill the sessions of those left
    (gpuenv.proc); who was left. Their logs go to this process' stderr, as if inherited."""
    give_up_at = time.monotonic() + grace_s
    while any(c.running() for c in children) and time.monotonic() < give_up_at:
        time.sleep(0.2)
    left = [str(c.pid) for c in children if c.running()]
    for c in children:
        c.kill()
        sys.stderr.write(c.output())
    sys.stderr.flush()
    return left


def run_dask(
    scheduler: str,
    workers: int,
    gpus: int,
    total: int,
    client: bool,
    blocks: str,
    n: int,
    chunk: int,
    run_id: str,
    node: str,
    timeout_s: float,
) -> None:
    """One node's part of the dask stage: on the first node (``client``) the scheduler, its
    workers and the client that computes and then shuts the whole cluster down; elsewhere the
    workers, until the scheduler closes them. Every node reports what it left running."""
    import signal

    from gpuenv.checks import dask as dask_check

    began_at = time.monotonic()
    host = socket.gethostname()
    # Worker names hold the run id (the controller's stop matches it) and the inventory's node
    # name: the scheduler refuses a name twice, and emulated nodes share one host name.
    logs = Path(tempfile.mkdtemp(prefix=f"gpuenv-dask-{run_id}-"))
    children = _dask_children(scheduler, workers, gpus, f"{run_id}-{node}", timeout_s,
                              scheduler if client else None, logs)  # fmt: skip

    def stop(_signum: int, _frame: Any) -> None:  # the controller's stop, or its deadline
        # The children have sessions of their own: the signal that reached this process did
        # not reach them, so end them at once.
        _end(children, 0.0)
        os._exit(1)

    signal.signal(signal.SIGTERM, stop)
    payload: dict[str, Any] = {"kind": "dask-node", "host": host, "node": node, "workers": workers}
    try:
        if client:
            from distributed import Client

            with Client(f"tcp://{scheduler}", timeout=f"{int(timeout_s)}s") as c:
                left_s = timeout_s - (time.monotonic() - began_at)
                c.wait_for_workers(total, timeout=max(1.0, left_s))
                left_s = timeout_s - (time.monotonic() - began_at)
                outcome = dask_check.compute(c, blocks, n, chunk, max(1.0, left_s))
                outcome.update(dask_check.describe(c, blocks))
                c.shutdown()  # the scheduler closes every worker, on every node
            payload.update(kind="dask", **outcome)
        else:
            # Until the scheduler closes these workers (or their death timeout).
            for child in children:
                ended = proc.wait(child, max(1.0, timeout_s - (time.monotonic() - began_at)))
                if ended.timed_out:
                    raise TimeoutError(f"dask process {child.pid} outlived {timeout_s:g} s")
    finally:
        # Whatever happened above, this node's scheduler and workers end here.
        payload["left_running"] = _end(children, 10.0)
        shutil.rmtree(logs, ignore_errors=True)
    payload["exit_codes"] = [c.poll() for c in children]
    _emit(payload)


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
    d = sub.add_parser("dask")
    d.add_argument("--scheduler", required=True, help="HOST:PORT of the first node's scheduler")
    d.add_argument("--workers", type=int, default=1, help="workers on this node")
    d.add_argument("--gpus", type=int, default=0, help="GPUs on this node (0: CPU workers)")
    d.add_argument("--total", type=int, default=1, help="workers on every node together")
    d.add_argument("--client", action="store_true", help="this node runs scheduler and client")
    d.add_argument("--blocks", choices=("cupy", "numpy"), default="numpy")
    d.add_argument("--n", type=int, default=4096)
    d.add_argument("--chunk", type=int, default=1024)
    d.add_argument("--run-id", required=True)
    d.add_argument("--node", default=socket.gethostname(), help="this node's inventory name")
    d.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.what == "dask":
        run_dask(args.scheduler, args.workers, args.gpus, args.total, args.client, args.blocks,
                 args.n, args.chunk, args.run_id, args.node, args.timeout)  # fmt: skip
        return 0
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
