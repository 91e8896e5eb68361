"""`streams`: a host->device copy on one CUDA stream overlapping a GEMM on another, per GPU.

overlap = (t_copy + t_compute - t_both) / min(t_copy, t_compute): 1.0 when the shorter
one is entirely hidden behind the longer, 0.0 when the two ran one after the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuenv.checks.base import (
    Context,
    NodeInfo,
    Placement,
    always_needed,
    has_module,
    measurement,
    verdict,
)
from gpuenv.checks.ranklog import RankContext
from gpuenv.results import Measurement, Result

NAME = "streams"
DESCRIPTION = "two CUDA streams: host->device copy overlapping a GEMM; overlap measured and judged"

PLACEMENT = Placement.GPU
OPTIONAL = False
needed = always_needed

H2D = 1


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    return None if has_module("cupy") else "cupy not installed"


def world(ctx: Context, node: NodeInfo) -> int:
    return len(node.gpus)


def _timed(cp: Any, streams: list[Any], work: Any) -> float:
    """Milliseconds from a common start until the last of ``streams`` finished ``work``."""
    start = cp.cuda.Event()
    start.record(streams[0])
    for s in streams[1:]:
        s.wait_event(start)
    work()
    ends = []
    for s in streams:
        e = cp.cuda.Event()
        e.record(s)
        ends.append(e)
    for e in ends:
        e.synchronize()
    return max(cp.cuda.get_elapsed_time(start, e) for e in ends)


def rank_main(rank: RankContext) -> dict[str, Any]:
    import cupy as cp

    params = rank.params
    cp.cuda.Device(rank.device).use()
    nbytes = int(params["copy_mib"] * 2**20)
    host = cp.cuda.alloc_pinned_memory(nbytes)
    dev = cp.cuda.alloc(nbytes)
    s_copy = cp.cuda.Stream(non_blocking=True)
    s_comp = cp.cuda.Stream(non_blocking=True)
    n = 4096
    a = cp.random.default_rng(3).random((n, n), dtype=cp.float32).astype(cp.float16)
    b = cp.random.default_rng(4).random((n, n), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((n, n), dtype=cp.float16)
    cp.cuda.Device().synchronize()  # a, b were made on the default stream

    def copy() -> None:
        cp.cuda.runtime.memcpyAsync(dev.ptr, host.ptr, nbytes, H2D, s_copy.ptr)

    reps = 1

    def compute() -> None:
        with s_comp:
            for _ in range(reps):
                cp.matmul(a, b, out=c)

    rank.mark("alone")
    _timed(cp, [s_copy, s_comp], lambda: (copy(), compute()))  # warm-up: cuBLAS handle, clocks
    t_copy = min(_timed(cp, [s_copy], copy) for _ in range(3))
    t_one = min(_timed(cp, [s_comp], compute) for _ in range(3))
    # As much compute as copy, so that either one can hide the other completely.
    reps = max(1, round(t_copy / t_one))
    t_comp = min(_timed(cp, [s_comp], compute) for _ in range(3))
    rank.mark("together")
    t_both = min(_timed(cp, [s_copy, s_comp], lambda: (copy(), compute())) for _ in range(3))
    overlap = (t_copy + t_comp - t_both) / min(t_copy, t_comp)
    # The result of the GEMM must still be right when it ran beside a copy.
    import numpy as np

    from gpuenv.checks.cupy import corner_ok

    ok = corner_ok(cp, np, a, b, c, k=32)
    return {
        "t_copy_ms": t_copy,
        "t_compute_ms": t_comp,
        "t_both_ms": t_both,
        "overlap": overlap,
        "gemm_reps": reps,
        "errors": [] if ok else ["GEMM on the compute stream gave wrong values"],
    }


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    return judge_overlap(ctx, NAME, payloads, "copy and compute overlap")


def judge_overlap(
    ctx: Context, check: str, payloads: Mapping[int, Mapping[str, Any]], what: str
) -> Result:
    """The verdict of a two-stream overlap run, per GPU, against ``streams.min_overlap``: the
    rule of this check and of any other that measures the same overlap (pycuda). Each payload
    holds ``t_copy_ms``, ``t_compute_ms``, ``t_both_ms``, ``overlap`` and ``errors`` (wrong
    values found by the rank); ``what`` opens the PASS reason."""
    minimum = float(ctx.thresholds["streams"]["min_overlap"])
    ms, problems, per_gpu = [], [], []
    for rank, p in sorted(payloads.items()):
        m = Measurement(
            **measurement(f"gpu{rank}.overlap", round(p["overlap"], 3), "", minimum, "min")
        )
        ms += [
            m,
            Measurement(f"gpu{rank}.t_copy", round(p["t_copy_ms"], 3), "ms"),
            Measurement(f"gpu{rank}.t_compute", round(p["t_compute_ms"], 3), "ms"),
            Measurement(f"gpu{rank}.t_both", round(p["t_both_ms"], 3), "ms"),
        ]
        problems += [f"GPU{rank}: {e}" for e in p.get("errors", [])]
        if m.ok() is False:
            problems.append(
                f"GPU{rank}: overlap {m.value} < {minimum} (copy and compute serialised)"
            )
        per_gpu.append({"rank": rank, **dict(p)})
    worst = min(float(m.value) for m in ms[::4])
    passed = f"{what} on {len(payloads)} GPU(s); lowest {worst:.2f} >= {minimum}"
    versions = dict(next(iter(payloads.values()), {}).get("versions", {}))
    return verdict(ctx, check, problems, [], passed, ms, versions, {"per_gpu": per_gpu})
