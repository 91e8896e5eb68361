"""`dask`: a dask.distributed cluster computing ``(x + x.T).mean(axis=0)`` on CuPy blocks.

Optional (``--only dask`` or the ``frameworks`` profile). On one node, the launched process starts
a scheduler and one worker process per GPU, each worker seeing only its GPU
(``CUDA_VISIBLE_DEVICES``, as dask-cuda's ``LocalCUDACluster`` does; that cluster is used when
dask-cuda is installed), and at least two workers: on a one-GPU node two workers share it, on a
CPU-only node two workers hold numpy blocks and the result says so. Across nodes the same
computation runs as the ``dask`` stage of ``gpuenv cluster`` (scheduler on the first node,
workers on every node: ``python -m gpuenv.cluster.worker dask``).

The seed documents' computation, made checkable: ``x`` comes from dask's seeded generator, so
the client computes the same ``x`` by itself with numpy (dask's synchronous scheduler, no
worker involved) and compares the cluster's answer with it; the workers turn their blocks into
CuPy arrays (``map_blocks(cupy.asarray)``), the answer must come back as a CuPy array, every
worker must have run a task, and on GPUs each worker must have used a different GPU where there
are enough. Nothing is left running: the client shuts the scheduler and its workers down, and the
engine ends the launch's whole process session whatever happens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuenv.checks import ranklog
from gpuenv.checks.base import Context, NodeInfo, Placement, always_needed, has_module, verdict
from gpuenv.results import Measurement, Result

NAME = "dask"
DESCRIPTION = (
    "dask.distributed: scheduler + a worker per GPU (2 on CPU: numpy blocks), (x + x.T).mean(0)"
    " on CuPy blocks verified"
)
PLACEMENT = Placement.LAUNCHER
OPTIONAL = True
needed = always_needed
MIN_WORKERS = 2  # blocks must travel between workers (x.T), or nothing distributed was proven


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    for module in ("dask", "distributed", "numpy"):
        if not has_module(module):
            return f"{module} not installed"
    if node.has_gpu and not has_module("cupy"):
        return "cupy not installed (needed for CuPy blocks on GPU workers)"
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    return 1  # one client process; the workers are its cluster's


def workers_for(gpus: int) -> int:
    return max(MIN_WORKERS, gpus)


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    params = ctx.profile_params(NAME)
    return [
        sys.executable, "-m", "gpuenv.checks.dask",
        "--gpus", str(len(node.gpus)),
        "--n", str(int(params.get("n", 4096))), "--chunk", str(int(params.get("chunk", 1024))),
    ]  # fmt: skip


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------- the computation


def compute(client: Any, blocks: str, n: int, chunk: int, timeout_s: float) -> dict[str, Any]:
    """The seed documents' ``(x + x.T).mean(axis=0)`` on the client's cluster, verified.

    ``blocks`` is ``cupy`` (the workers turn each block into a CuPy array) or ``numpy``.
    """
    import dask
    import dask.array as da
    import distributed
    import numpy as np

    x = da.random.default_rng(0).random((n, n), chunks=(chunk, chunk))
    expected = dask.compute((x + x.T).mean(axis=0), scheduler="sync")[0]  # here, numpy only
    if blocks == "cupy":
        import cupy

        x = x.map_blocks(cupy.asarray)
    began_at = time.perf_counter()
    with distributed.get_task_stream(client) as tasks:
        future = client.compute((x + x.T).mean(axis=0))
        got = future.result(timeout=timeout_s)
    compute_s = time.perf_counter() - began_at
    kind = type(got).__module__.split(".")[0]
    host = got.get() if kind == "cupy" else np.asarray(got)
    err = float(np.max(np.abs(host - expected))) if host.shape == expected.shape else float("inf")
    return {
        "blocks": blocks,
        "result_type": kind,
        "n": n,
        "chunk": chunk,
        "max_abs_err": err,
        "workers_used": sorted({str(t.get("worker")) for t in tasks.data if t.get("worker")}),
        "compute_s": compute_s,
        "dask": dask.__version__,
        "distributed": distributed.__version__,
    }


def worker_gpu() -> str:
    """The PCI bus id of the GPU this worker process uses (run on each worker)."""
    import cupy

    return str(cupy.cuda.Device(0).pci_bus_id)


def describe(client: Any, blocks: str) -> dict[str, Any]:
    """Each worker's address, node and GPU (bus id, on GPU workers), as the scheduler knows them."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    gpus = client.run(worker_gpu) if blocks == "cupy" else {}
    return {
        "workers": sorted(info),
        "worker_hosts": sorted({str(w.get("host")) for w in info.values()}),
        "worker_gpus": {str(a): str(g) for a, g in gpus.items()},
    }


def problems(payload: Mapping[str, Any], expect_workers: int, expect_gpus: int) -> list[str]:
    """The pass rule of a dask run, on one node or across nodes: the answer is numpy's, in the
    blocks' kind, every worker computed, and GPU workers used distinct GPUs where they can."""
    found = []
    tolerance = 1e-9 if payload["blocks"] == "numpy" else 1e-6
    err = float(payload["max_abs_err"])
    if not err <= tolerance:
        found.append(f"(x + x.T).mean(axis=0) differs from numpy's by {err:.3g} > {tolerance:g}")
    if payload["result_type"] != payload["blocks"]:
        found.append(
            f"the answer came back as a {payload['result_type']} array, not {payload['blocks']}"
        )
    workers = list(payload["workers"])
    if len(workers) < expect_workers:
        found.append(f"{len(workers)} of {expect_workers} workers joined the scheduler")
    idle = sorted(set(workers) - set(payload["workers_used"]))
    if idle:
        found.append(f"worker(s) {', '.join(idle)} ran no task")
    if payload["blocks"] == "cupy":
        distinct = len(set(payload["worker_gpus"].values()))
        want = min(expect_gpus, len(workers))
        if distinct < want:
            found.append(f"the GPU workers used {distinct} distinct GPU(s), expected {want}")
    return found


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    p = payloads[0]
    gpus = len(node.gpus)
    expect = workers_for(gpus)
    found = problems(p, expect, gpus)
    if node.has_gpu and p["blocks"] != "cupy":
        found.append(f"the node has {gpus} GPU(s) but the blocks were {p['blocks']}")
    ms = [
        Measurement("workers", len(p["workers"]), "", float(expect), "min"),
        Measurement("max_abs_err", p["max_abs_err"], "", 1e-9 if p["blocks"] == "numpy" else 1e-6,
                    "max"),
        Measurement("compute_time", round(float(p["compute_s"]), 3), "s"),
        Measurement("n", p["n"]),
    ]  # fmt: skip
    where = (
        f"CuPy blocks on {len(set(p['worker_gpus'].values()))} GPU(s)"
        if p["blocks"] == "cupy"
        else "numpy blocks (no GPU: CPU only)"
    )
    passed = (
        f"{len(p['workers'])} workers ({p['cluster']}), {where}: (x + x.T).mean(axis=0) of"
        f" {p['n']}x{p['n']} equals numpy's; every worker computed; nothing left running"
    )
    details = {k: p[k] for k in ("cluster", "blocks", "workers", "worker_gpus", "chunk")}
    details["left_running"] = p.get("left_running", [])
    if p.get("left_running"):
        found.append(f"still running after shutdown: {', '.join(p['left_running'])}")
    versions = {"dask": p["dask"], "distributed": p["distributed"]}
    return verdict(ctx, NAME, found, [], passed, ms, versions, details)


# ---------------------------------------------------------------- one node


def visible_gpu_ids(gpus: int) -> list[str]:
    """The ids to give each worker's CUDA_VISIBLE_DEVICES: the parent's own list where it has one
    (the node's GPU 0 may be another physical GPU), else 0..gpus-1."""
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[:gpus] if len(visible) >= gpus > 0 else [str(i) for i in range(gpus)]


def local_cluster(gpus: int) -> tuple[Any, str]:
    """A scheduler and its worker processes on this node; the cluster and how it was made."""
    from distributed import Nanny, Scheduler, SpecCluster

    if gpus >= MIN_WORKERS and has_module("dask_cuda"):
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(
            CUDA_VISIBLE_DEVICES=",".join(visible_gpu_ids(gpus)),
            threads_per_worker=1,
            dashboard_address=None,
        )
        return cluster, "dask-cuda LocalCUDACluster"
    # Without dask-cuda (or with one GPU, shared by two workers): the same, by hand.
    ids = visible_gpu_ids(gpus) if gpus else []
    count = workers_for(gpus)
    workers = {
        f"worker-{i}": {
            "cls": Nanny,
            "options": {
                "nthreads": 1,
                "env": {"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]} if ids else {},
            },
        }
        for i in range(count)
    }
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    shared = f", {count} workers share GPU {ids[0]}" if len(ids) == 1 else ""
    return SpecCluster(workers=workers, scheduler=scheduler), f"local scheduler{shared}"


def run_local(
    gpus: int, n: int, chunk: int, mark: Callable[[str], None], remaining_s: Callable[[], float]
) -> dict[str, Any]:
    from distributed import Client

    blocks = "cupy" if gpus else "numpy"
    mark("cluster")
    cluster, how = local_cluster(gpus)
    try:
        with Client(cluster) as client:
            mark("workers")
            client.wait_for_workers(workers_for(gpus), timeout=remaining_s())
            mark("compute")
            outcome = compute(client, blocks, n, chunk, remaining_s())
            outcome.update(describe(client, blocks))
            mark("shutdown")
    finally:
        cluster.close(timeout=max(5.0, min(30.0, remaining_s())))
    outcome["cluster"] = how
    outcome["left_running"] = [str(p.pid) for p in children_alive()]
    return outcome


def children_alive() -> list[Any]:
    """This process' child processes still running (the workers, after the cluster closed)."""
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.is_alive()]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.dask")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=1024)
    args = parser.parse_args(argv)
    log = ranklog.RankLog(ranklog.RankConfig.load().events, 0)
    log.mark(NAME, "start")
    import dask.array  # noqa: F401  seconds of imports, paid before the gate
    import distributed  # noqa: F401

    log.mark(NAME, "ready")
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, 0, 1)
    with ranklog.Heartbeat(log, NAME):
        outcome = run_local(args.gpus, args.n, args.chunk, rank.mark, rank.remaining_s)
        log.result(NAME, outcome)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
