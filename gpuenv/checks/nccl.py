"""`nccl`: all-reduce through cupy.cuda.nccl, one process per local GPU.

algbw = bytes / time and busbw = algbw x 2(n-1)/n, as nccl-tests defines them for
all-reduce. The time of a size is the slowest rank's mean over the timed iterations.
With 3 or more GPUs every pair is measured too, on its own 2-rank communicator, so a
slow GPU or link is named. Ranks poll their CUDA events instead of blocking, and abort
the communicator (ncclCommAbort) when peers do not arrive before the deadline.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuenv.checks import nccl_log
from gpuenv.checks.base import Context, NodeInfo, Placement, has_module, verdict
from gpuenv.checks.ranklog import RankContext, RankLog
from gpuenv.checks.thresholds import describe_gpu, link_spec_gbps, model_spec, nccl_efficiency
from gpuenv.results import Measurement, Result, Status

NAME = "nccl"
DESCRIPTION = (
    "NCCL all-reduce via cupy.cuda.nccl over all GPUs: verified, busbw sweep, per pair, transport"
)
PLACEMENT = Placement.GPU
OPTIONAL = False


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    if not has_module("cupy"):
        return "cupy not installed"
    if len(node.gpus) < 2:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): nothing to measure.
        return f"an all-reduce between GPUs needs at least 2 GPUs; {len(node.gpus)} visible"
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    return len(node.gpus)


def needed(node: NodeInfo) -> bool:
    """Required only where there are GPUs to join: a one-GPU node has no NCCL path to prove."""
    return len(node.gpus) >= 2


class CollectiveTimeout(RuntimeError):
    pass


# Counts the elements that differ from a value. A raw kernel compiles in a fraction of a
# second; a CuPy reduction (count_nonzero) pulls in CUB and takes seconds on a cold cache.
COUNT_NE = r"""
extern "C" __global__ void count_ne(const float *x, const float v, const unsigned long long n,
                                    unsigned long long *out)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long wrong = 0;
    for (; i < n; i += stride) {
        if (x[i] != v) {
            wrong++;
        }
    }
    if (wrong) {
        atomicAdd(out, wrong);
    }
}
"""


def count_not_equal(cp: Any, arr: Any, value: float, count: int) -> int:
    """How many of the first ``count`` float32 elements of ``arr`` differ from ``value``."""
    import numpy as np

    out = cp.zeros(1, dtype=cp.uint64)
    kernel = cp.RawKernel(COUNT_NE, "count_ne")
    kernel((1024,), (256,), (arr, np.float32(value), np.uint64(count), out))
    return int(out.get()[0])


def busbw_floor(
    ctx: Context, gpus: list[dict[str, Any]]
) -> tuple[str, float | None, float, float | None]:
    """The all-reduce busbw a healthy node reaches between its GPUs: (link, link spec GB/s,
    efficiency, floor = spec x efficiency); spec and floor are None where gpu_specs.yaml has no
    figure. NVLink on a model whose board carries NVLink (``nvlink_links`` in its spec row:
    a GPU with links down is slow, not a PCIe GPU) or where every GPU has active NVLinks,
    else PCIe. Any NCCL all-reduce inside the node is held to it (this check, and horovod over
    NCCL)."""
    row = model_spec(ctx.specs, gpus[0]) if gpus else None
    board = bool(row and row.get("nvlink_links"))
    link = "NVLink" if gpus and (board or all(g.get("nvlink_active") for g in gpus)) else "PCIe"
    spec = link_spec_gbps(ctx.specs, gpus[0], link) if gpus else None
    eff = nccl_efficiency(ctx.thresholds, row.get("key") if row else None, link)
    return link, spec, eff, spec * eff if spec else None


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor 2(n-1)/n."""
    return 2.0 * (world - 1) / world


def share_unique_id(nccl: Any, directory: Path, tag: str, create: bool, deadline: float) -> Any:
    """Rank ``create`` makes the NCCL unique id; the others read it from a file.

    CuPy 14 returns the id as bytes (older releases: a tuple of ints); it travels as hex
    or as a list, and comes back as the same type.
    """
    path = directory / f"nccl-id-{tag}.json"
    if create:
        uid = nccl.get_unique_id()
        record = {"hex": uid.hex()} if isinstance(uid, bytes) else {"ints": list(uid)}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)  # atomic: readers never see half a file
        return uid
    while not path.exists():
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"NCCL id {tag!r} never appeared: its creator did not start")
        time.sleep(0.005)
    record = json.loads(path.read_text(encoding="utf-8"))
    return bytes.fromhex(record["hex"]) if "hex" in record else tuple(record["ints"])


def wait(event: Any, comm: Any, deadline: float, what: str) -> None:
    while not event.done:
        if time.monotonic() > deadline:
            comm.abort()
            raise CollectiveTimeout(
                f"{what} did not complete before the deadline: communicator aborted"
            )
        time.sleep(0.0002)


def _time_allreduce(
    cp: Any,
    nccl: Any,
    comm: Any,
    send: Any,
    recv: Any,
    count: int,
    iters: int,
    warmup: int,
    stream: Any,
    deadline: float,
    what: str,
) -> float:
    """Mean seconds of one all-reduce of ``count`` float32 on this rank."""

    def once() -> None:
        comm.allReduce(
            send.data.ptr, recv.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr
        )

    for _ in range(warmup):
        once()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        once()
    end.record(stream)
    wait(end, comm, deadline, what)
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / iters


def rank_main(rank: RankContext) -> dict[str, Any]:
    index, world, params, log, deadline = (
        rank.rank,
        rank.world,
        rank.params,
        rank.log,
        rank.deadline_at,
    )
    # NCCL's own log says which transport it chose (read back below): INFO, one file per rank.
    debug_file = rank.events / f"nccl-rank{index}.log"
    os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_FILE"] = str(debug_file)
    import cupy as cp
    from cupy.cuda import nccl

    directory = log.path.parent
    # Connect at init rather than inside the first all-reduce: then enqueueing never blocks
    # on a missing peer, and the polling below can abort the communicator at the deadline.
    os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
    cp.cuda.Device(rank.device).use()
    rank.mark("unique id")
    uid = share_unique_id(nccl, directory, "all", index == 0, deadline)
    comm = nccl.NcclCommunicator(world, uid, index)
    rank.mark("communicator")
    rank.mark("joining")  # a hung rank stays one mark behind this
    sizes = [int(mib * 2**20) for mib in params["sizes_mib"]]
    max_count = max(sizes) // 4
    send = cp.full(max_count, index + 1, dtype=cp.float32)
    recv = cp.zeros(max_count, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    # The buffers were filled on the legacy default stream, which a non-blocking stream
    # does not wait for.
    cp.cuda.Device().synchronize()
    iters, warmup = int(params["iters"]), int(params["warmup"])
    sweep = []
    try:
        for size in sizes:
            seconds = _time_allreduce(
                cp,
                nccl,
                comm,
                send,
                recv,
                size // 4,
                iters,
                warmup,
                stream,
                deadline,
                f"all-reduce of {size} bytes",
            )
            sweep.append({"bytes": size, "seconds": seconds})
            rank.mark(f"{size} bytes")
        expected = world * (world + 1) / 2
        wrong = count_not_equal(cp, recv, expected, max(sizes) // 4)
        pairs = []
        # GPUENV_NCCL_PAIRS=1 measures the pairs on a 2-GPU node too (to exercise that code).
        if world >= 3 or params.get("pairs") or os.environ.get("GPUENV_NCCL_PAIRS") == "1":
            pairs = _pairs(cp, nccl, comm, index, world, params, directory, log, deadline)
    except CollectiveTimeout as exc:
        return {"timeout": str(exc), "sweep": sweep, "transport": nccl_log.read(debug_file)}
    comm.destroy()
    return {
        "sweep": sweep,
        "wrong_values": wrong,
        "pairs": pairs,
        "transport": nccl_log.read(debug_file),
        "versions": {"nccl": _version(nccl.get_version()), "cupy": cp.__version__},
    }


def _pairs(
    cp: Any,
    nccl: Any,
    comm: Any,
    rank: int,
    world: int,
    params: Mapping[str, Any],
    directory: Path,
    log: RankLog,
    deadline: float,
) -> list[dict[str, Any]]:
    """Every GPU pair on its own 2-rank communicator, one pair at a time."""
    size = int(min(params["sizes_mib"][-1], params.get("pair_mib", 256)) * 2**20)
    token = cp.ones(1, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    results = []
    for i in range(world):
        for j in range(i + 1, world):
            if rank in (i, j):
                uid = share_unique_id(nccl, directory, f"pair-{i}-{j}", rank == i, deadline)
                pair = nccl.NcclCommunicator(2, uid, 0 if rank == i else 1)
                send = cp.full(size // 4, rank + 1, dtype=cp.float32)
                recv = cp.zeros(size // 4, dtype=cp.float32)
                cp.cuda.Device().synchronize()  # filled on the default stream
                seconds = _time_allreduce(
                    cp,
                    nccl,
                    pair,
                    send,
                    recv,
                    size // 4,
                    int(params["iters"]),
                    2,
                    stream,
                    deadline,
                    f"all-reduce of GPU pair {i},{j}",
                )
                ok = count_not_equal(cp, recv, i + j + 2, size // 4) == 0
                results.append({"pair": [i, j], "bytes": size, "seconds": seconds, "ok": ok})
                pair.destroy()
            # Barrier on the full communicator: the next pair starts when this one is done.
            comm.allReduce(
                token.data.ptr, token.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr
            )
            done = cp.cuda.Event()
            done.record(stream)
            wait(done, comm, deadline, f"barrier after GPU pair {i},{j}")
            log.mark(NAME, f"pair {i},{j}")
    return results


def _version(code: int) -> str:
    # NCCL >= 2.9 encodes X.Y.Z as X*10000 + Y*100 + Z.
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    gpus = node.gpus
    versions = dict(payloads.get(0, {}).get("versions", {}))
    timeouts = {r: p["timeout"] for r, p in payloads.items() if p.get("timeout")}
    if timeouts:
        rank, text = sorted(timeouts.items())[0]
        return Result(
            NAME,
            ctx.node,
            Status.FAIL,
            f"rank {rank}: {text}",
            versions=versions,
            details={"timeouts": timeouts},
        )
    link, spec, eff, threshold = busbw_floor(ctx, gpus)
    factor = bus_factor(world)
    sweep = []
    for k, first in enumerate(payloads[0]["sweep"]):
        seconds = max(p["sweep"][k]["seconds"] for p in payloads.values())
        algbw = first["bytes"] / seconds / 1e9
        sweep.append(
            {
                "bytes": first["bytes"],
                "time_us": round(seconds * 1e6, 1),
                "algbw_gbps": round(algbw, 2),
                "busbw_gbps": round(algbw * factor, 2),
            }
        )
    largest = sweep[-1]
    ms = [
        Measurement("busbw", largest["busbw_gbps"], "GB/s", threshold, "min"),
        Measurement("algbw", largest["algbw_gbps"], "GB/s"),
        Measurement("bytes", largest["bytes"], "B"),
        Measurement("gpus", world),
    ]
    problems = [
        f"rank {r}: {p['wrong_values']} wrong values after all-reduce"
        for r, p in sorted(payloads.items())
        if p.get("wrong_values")
    ]
    pairs = []
    # Each pair was measured by both of its ranks: keep the slower one's time.
    by_pair: dict[tuple[int, int], dict[str, Any]] = {}
    for p in payloads.values():
        for item in p.get("pairs", []):
            key = (item["pair"][0], item["pair"][1])
            if key not in by_pair or item["seconds"] > by_pair[key]["seconds"]:
                by_pair[key] = item
    for (i, j), item in sorted(by_pair.items()):
        busbw = item["bytes"] / item["seconds"] / 1e9 * bus_factor(2)
        pairs.append(
            {
                "pair": [i, j],
                "bytes": item["bytes"],
                "busbw_gbps": round(busbw, 2),
                "ok": item["ok"],
            }
        )
        ms.append(Measurement(f"pair{i}-{j}.busbw", round(busbw, 2), "GB/s", threshold, "min"))
        if not item["ok"]:
            problems.append(f"GPU pair {i},{j}: wrong values")
        elif threshold is not None and busbw < threshold:
            problems.append(f"GPU pair {i},{j}: busbw {busbw:.1f} GB/s < {threshold:.1f} ({link})")
    if threshold is not None and largest["busbw_gbps"] < threshold:
        problems.append(
            f"busbw {largest['busbw_gbps']} GB/s at {largest['bytes']} B < {threshold:.1f} GB/s"
            f" ({link} {spec:.0f} GB/s x {eff})"
        )
    transports = nccl_log.merge(p.get("transport") or {} for _, p in sorted(payloads.items()))
    problems += nccl_log.intra_node_problems(transports, nvlink=link == "NVLink")
    details = {
        "link": link,
        "efficiency": eff,
        "link_spec_gbps": spec,
        "sweep": sweep,
        "pairs": pairs,
        "transport": transports.to_dict(),
    }
    if transports.version:
        versions["nccl"] = transports.version
    unjudged = []
    if threshold is None:
        what = f"no {link} spec for {describe_gpu(gpus[0])}" if gpus else "no GPU"
        unjudged.append(f"busbw: {what} in gpu_specs.yaml")
    judged = f" >= {threshold:.1f} GB/s ({link} {spec:.0f} GB/s x {eff})" if spec else ""
    passed = (
        f"values verified on {world} GPUs; busbw {largest['busbw_gbps']} GB/s at"
        f" {largest['bytes'] // 2**20} MiB{judged}; transport {transports.summary()}"
    )
    return verdict(ctx, NAME, problems, unjudged, passed, ms, versions, details)
