"""Node-side ranks of the multi-node runs; started by torchrun or mpirun, never by hand.

``torchrun ... -m gpuenv.cluster.worker torch`` measures a torch.distributed all-reduce sweep
(NCCL on GPUs, gloo on CPU) across every rank of every node, with NCCL's own log read back to
say which transport it used, then runs the DDP training step of the node check
(gpuenv.checks.ddp.train) across the nodes; given ``--pair-nodes``, the same launch then measures
the node-pair matrix (``pair_phase``): the first rank of each node joins a 2-rank subgroup per
pair, and the disjoint pairs of a round run at the same time, so torch is imported once per node
for all three. ``mpirun ... python3 -m gpuenv.cluster.worker mpi``
runs an mpi4py all-reduce of numpy arrays across the hostfile's nodes. ``python3 -m
gpuenv.cluster.worker dask`` is one node's part of the dask stage (scheduler and client on the
first node, one worker per GPU everywhere; gpuenv.checks.dask computes and judges). The first
rank of each node prints one line ``GPUENV_RESULT {json}``: the controller collects one such line
per node (and in the pair phase one line per pair the node took part in, as soon as it is
measured, so that a launch killed later keeps what was measured).
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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpuenv import proc

MARK = "GPUENV_RESULT "
MIB = 1 << 20
# The exit status of a torch rank whose pair phase met an error (it said which in its lines).
PAIR_PHASE_FAILED = 3
# A pair's operations time out this long before the launch's own timeout, at the latest, so
# that the rank that waited can still say for whom.
PAIR_MARGIN_S = 3.0
# When this process started: the launch's timeout counts from about here.
_STARTED_AT = time.monotonic()


def _emit(payload: dict[str, Any]) -> None:
    print(MARK + json.dumps(payload), flush=True)


def _busbw(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def _nccl_log_path(local_rank: int) -> str:
    """Where a local rank of this launch writes NCCL's log (torchrun's run id names the launch)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID") or f"ppid{os.getppid()}"
    return os.path.join(tempfile.gettempdir(), f"gpuenv-nccl-{run}-{local_rank}.log")


def run_torch(
    sizes: list[int],
    iters: int,
    steps: int,
    timeout_s: float,
    node: str = "",
    pairs: PairPhase | None = None,
) -> bool:
    """The all-node sweep and DDP (one ``torch`` line per node), then the pair phase when
    ``pairs`` asks for it. False: the pair phase met an error (said in its lines)."""
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
    if local_rank == 0:
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
    dist.barrier()  # the node's first rank has read every local rank's NCCL log
    if debug_file is not None:
        with contextlib.suppress(OSError):
            os.unlink(debug_file)
    if pairs is None:
        dist.destroy_process_group()
        return True
    return pair_phase(node, pairs, device, sync, timeout_s)


@dataclass(frozen=True)
class PairPhase:
    """What the pair phase of the all-node launch measures: every pair of ``nodes`` (inventory
    names, in the controller's order) once, in the rounds of gpuenv.cluster.pairs.all_pairs_rounds,
    ``iters`` all-reduces of ``nbytes`` each; each pair's operations time out after
    ``timeout_s``."""

    nodes: tuple[str, ...]
    nbytes: int
    iters: int
    timeout_s: float


def _leaders(node: str, nodes: tuple[str, ...]) -> dict[str, int]:
    """Global rank of every node's first local rank (the one device today's 2-node pair launch
    used), by inventory name: every rank says which node it is on and which local rank it is."""
    import torch.distributed as dist

    me = (node, int(os.environ.get("LOCAL_RANK", "0")))
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    found = {n: rank for rank, (n, local) in enumerate(everyone) if local == 0}
    missing = [n for n in nodes if n not in found]
    if missing or len(found) != len(nodes):
        raise RuntimeError(
            f"pair phase: ranks report nodes {sorted(found)}, expected {list(nodes)}"
        )
    return found


def pair_phase(
    node: str, phase: PairPhase, device: Any, sync: Any, launch_timeout_s: float
) -> bool:
    """The node-pair matrix inside the all-node launch.

    Every rank creates every pair's subgroup (and one of the node leaders, whose all-reduce of
    one element separates the rounds) in the same order, as torch.distributed requires; then
    each node's first rank runs its pairs round by round: it says it starts the pair (a
    ``pair-start`` line), one warm-up all-reduce whose values are checked, then ``iters`` timed
    ones, busbw = algbw for 2 ranks (a ``pair`` line). Each pair's subgroup has the phase's own
    timeout (cut to what is left of the launch's): a partner that hangs makes its peer's
    operation fail in time, and the peer's line names the pair and the error; that rank then
    stops (its launch fails, and the controller stops the others). Where even that is too late,
    the ``pair-start`` lines say who joined a pair and who never did. True when every pair of
    this node was measured.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from gpuenv.checks import ranklog
    from gpuenv.cluster.pairs import all_pairs_rounds

    left_s = launch_timeout_s - (time.monotonic() - _STARTED_AT) - PAIR_MARGIN_S
    timeout = timedelta(seconds=max(1.0, min(phase.timeout_s, left_s)))
    leaders = _leaders(node, phase.nodes)
    rounds = all_pairs_rounds(phase.nodes)
    groups = {
        (a, b): dist.new_group(sorted((leaders[a], leaders[b])), timeout=timeout)
        for round_pairs in rounds
        for a, b in round_pairs
    }
    between = dist.new_group(sorted(leaders.values()), timeout=timeout)
    rank = dist.get_rank()
    if leaders[node] != rank:
        return True  # not a node's first rank: only the groups needed it
    # Test-only (GPUENV_FAULT): "rank" is the node's place in the phase's node list here.
    ranklog.fault_point("cluster-pairs", phase.nodes.index(node), "pair")
    tick = torch.zeros(1, device=device)
    for round_pairs in rounds:
        mine = next(((a, b) for a, b in round_pairs if node in (a, b)), None)
        if mine is not None:
            _emit({"kind": "pair-start", "a": mine[0], "b": mine[1], "node": node})
            line = _one_pair(mine, groups[mine], leaders, phase, node, device, sync)
            _emit(line)
            if "error" in line:
                return False
        try:
            dist.all_reduce(tick, group=between)  # the next round starts together
            sync()
        except RuntimeError as exc:
            _emit({"kind": "pair-phase", "node": node, "error": f"between rounds: {exc}"})
            return False
    return True


def _one_pair(
    pair: tuple[str, str],
    group: Any,
    leaders: dict[str, int],
    phase: PairPhase,
    node: str,
    device: Any,
    sync: Any,
) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    a, b = pair
    line: dict[str, Any] = {"kind": "pair", "a": a, "b": b, "node": node, "bytes": phase.nbytes}
    began_at = time.monotonic()
    try:
        x = torch.empty(phase.nbytes // 4, dtype=torch.float32, device=device)
        x.fill_(dist.get_rank() + 1)
        dist.all_reduce(x, group=group)  # warm-up, and the value check
        sync()
        line["correct"] = bool(torch.all(x == leaders[a] + leaders[b] + 2).item())
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        sync()
        t0 = time.perf_counter()
        for _ in range(phase.iters):
            dist.all_reduce(x, group=group)
        sync()
        seconds = (time.perf_counter() - t0) / phase.iters
        line["busbw_gbps"] = _busbw(phase.nbytes, seconds, 2)[1]
    except RuntimeError as exc:  # gloo's timeout, a peer that left (torch's DistError too)
        line["error"] = f"{type(exc).__name__} after {time.monotonic() - began_at:.1f} s: {exc}"
    return line


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


def _die_with_parent() -> None:
    """Be killed when torchrun's agent dies. The agent starts each rank in a session of its own,
    so the process-group kill that ends a launch at its deadline (on a node: coreutils
    ``timeout``) reaches the agent but not the ranks; the agent forwards SIGTERM, which a rank
    that is stopped or stuck never acts on. SIGKILL from the kernel (Linux PR_SET_PDEATHSIG)
    ends it whatever state it is in."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the agent is already gone
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuenv.cluster.worker")
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("torch")
    t.add_argument("--sizes", default=f"{MIB},{16 * MIB}", help="bytes, comma-separated")
    t.add_argument("--iters", type=int, default=5)
    t.add_argument("--steps", type=int, default=5)
    t.add_argument("--timeout", type=float, default=60.0)
    # Not --node: torchrun's parser would take it for an abbreviation of its --node-rank.
    t.add_argument("--node-name", default=socket.gethostname(), help="this node's inventory name")
    t.add_argument("--pair-nodes", default="", help="inventory names, comma-separated: the"
                   " pair phase measures every pair of them (none: no pair phase)")  # fmt: skip
    t.add_argument("--pair-bytes", type=int, default=64 * MIB)
    t.add_argument("--pair-timeout", type=float, default=30.0)
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
    d.add_argument("--node-name", default=socket.gethostname(), help="this node's inventory name")
    d.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.what == "dask":
        run_dask(args.scheduler, args.workers, args.gpus, args.total, args.client, args.blocks,
                 args.n, args.chunk, args.run_id, args.node_name, args.timeout)  # fmt: skip
        return 0
    if args.what == "torch":
        _die_with_parent()
        sizes = [int(s) for s in args.sizes.split(",") if s]
        nodes = tuple(n for n in args.pair_nodes.split(",") if n)
        phase = PairPhase(nodes, args.pair_bytes, args.iters, args.pair_timeout) if nodes else None
        done = run_torch(sizes, args.iters, args.steps, args.timeout, args.node_name, phase)
        # gloo's threads can abort the interpreter's teardown ("terminate called without an
        # active exception", seen with torch 2.13 CPU): the work is done and reported, so leave
        # without running C++ static destructors. A pair phase that met an error fails the
        # launch, so that the controller stops the other nodes at once.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if done else PAIR_PHASE_FAILED)
    else:
        run_mpi(args.bytes, args.iters)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
