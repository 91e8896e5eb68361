"""`pycuda`: the seed documents' `add` kernel through PyCUDA, and two streams overlapping, per GPU.

Optional (run it with ``--only pycuda`` or the ``frameworks`` profile). In each GPU worker
process: the `add` kernel (the same source as the cupy check's) compiled by nvcc through
``SourceModule``, run on a non-default stream between asynchronous copies from and to
page-locked host memory, its values compared with numpy's; then a host->device copy on one stream
and a compute kernel on another, timed alone and together, judged by the rule of the ``streams``
check (``streams.judge_overlap``, threshold ``streams.min_overlap``).

Unlike the seed document (which compiled with ``compiler.compile`` and handed pageable int64
arrays to an ``int *`` kernel), the arrays are int32, the host buffers page-locked (an
asynchronous copy from pageable memory is not asynchronous), and the kernel is bounds-checked.
PyCUDA runs in the CUDA primary context that CuPy shares, pushed and popped around the work.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from gpuenv.checks.base import Context, NodeInfo, Placement, always_needed, has_module
from gpuenv.checks.cupy import ADD_KERNEL
from gpuenv.checks.ranklog import RankContext
from gpuenv.checks.streams import judge_overlap
from gpuenv.results import Result

NAME = "pycuda"
DESCRIPTION = (
    "PyCUDA per GPU: `add` kernel via SourceModule on a stream with async pinned copies;"
    " two-stream overlap"
)
PLACEMENT = Placement.GPU
OPTIONAL = True
needed = always_needed

# A kernel that only computes (dependent FMAs in registers): it keeps the SMs busy without
# touching the copy engines or much memory, so any slowdown beside a copy is contention.
BUSY_KERNEL = r"""
extern "C" __global__ void busy(float *out, const int iters)
{
    float v = threadIdx.x * 1e-3f;
    for (int i = 0; i < iters; ++i) {
        v = v * 0.999f + 0.001f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""
BUSY_BLOCKS, BUSY_THREADS = 1024, 256


def nvcc() -> str | None:
    """The nvcc SourceModule calls: on PATH, else under CUDA_HOME."""
    found = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if found is None and home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        found = os.path.join(home, "bin", "nvcc")
    return found


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    if not has_module("pycuda"):
        return "pycuda not installed"
    if not has_module("numpy"):
        return "numpy not installed"
    if nvcc() is None:
        return "nvcc not found on PATH or under CUDA_HOME (PyCUDA's SourceModule compiles with it)"
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    return len(node.gpus)


def _add_on_stream(cuda: Any, np: Any, module: Any, size: int) -> list[str]:
    """The `add` kernel between async copies on one non-default stream; what was wrong."""
    add = module.get_function("add")
    rng = np.random.default_rng(0)
    a = cuda.pagelocked_empty(size, np.int32)
    b = cuda.pagelocked_empty(size, np.int32)
    c = cuda.pagelocked_zeros(size, np.int32)
    a[:] = rng.integers(1, 100, size=size, dtype=np.int32)
    b[:] = rng.integers(1, 100, size=size, dtype=np.int32)
    da, db, dc = (cuda.mem_alloc(a.nbytes) for _ in range(3))
    stream = cuda.Stream()
    cuda.memcpy_htod_async(da, a, stream)
    cuda.memcpy_htod_async(db, b, stream)
    block = 128
    grid = ((size + block - 1) // block, 1)
    add(da, db, dc, np.int32(size), block=(block, 1, 1), grid=grid, stream=stream)
    cuda.memcpy_dtoh_async(c, dc, stream)
    stream.synchronize()
    return [] if np.array_equal(c, a + b) else ["`add` kernel on a stream gave wrong values"]


def _timed(cuda: Any, streams: list[Any], work: Callable[[], None]) -> float:
    """Milliseconds from a common start until the last of ``streams`` finished ``work``."""
    start = cuda.Event()
    start.record(streams[0])
    for s in streams[1:]:
        s.wait_for_event(start)
    work()
    ends = []
    for s in streams:
        e = cuda.Event()
        e.record(s)
        ends.append(e)
    for e in ends:
        e.synchronize()
    return max(e.time_since(start) for e in ends)


def _overlap(cuda: Any, np: Any, module: Any, nbytes: int) -> dict[str, Any]:
    busy = module.get_function("busy")
    host = cuda.pagelocked_empty(nbytes, np.uint8)
    dev = cuda.mem_alloc(nbytes)
    out = cuda.mem_alloc(BUSY_BLOCKS * BUSY_THREADS * 4)
    s_copy, s_comp = cuda.Stream(), cuda.Stream()
    iters = [1 << 12]

    def copy() -> None:
        cuda.memcpy_htod_async(dev, host, s_copy)

    def compute() -> None:
        busy(out, np.int32(iters[0]), block=(BUSY_THREADS, 1, 1), grid=(BUSY_BLOCKS, 1),
             stream=s_comp)  # fmt: skip

    _timed(cuda, [s_copy, s_comp], lambda: (copy(), compute()))  # warm-up: module load, clocks
    t_copy = min(_timed(cuda, [s_copy], copy) for _ in range(3))
    t_one = min(_timed(cuda, [s_comp], compute) for _ in range(3))
    # As much compute as copy, so that either one can hide the other completely.
    iters[0] = max(1, round(iters[0] * t_copy / max(t_one, 1e-3)))
    t_comp = min(_timed(cuda, [s_comp], compute) for _ in range(3))
    t_both = min(_timed(cuda, [s_copy, s_comp], lambda: (copy(), compute())) for _ in range(3))
    return {
        "t_copy_ms": t_copy,
        "t_compute_ms": t_comp,
        "t_both_ms": t_both,
        "overlap": (t_copy + t_comp - t_both) / min(t_copy, t_comp),
        "busy_iters": iters[0],
    }


def rank_main(rank: RankContext) -> dict[str, Any]:
    import numpy as np
    import pycuda
    import pycuda.driver as cuda
    from pycuda.compiler import SourceModule

    cuda.init()
    context = cuda.Device(rank.device).retain_primary_context()
    context.push()
    try:
        rank.mark("compile")
        # The kernels carry their own extern "C"; nvcc is the one found for unavailable().
        module = SourceModule(ADD_KERNEL + BUSY_KERNEL, no_extern_c=True, nvcc=nvcc() or "nvcc")
        rank.mark("add")
        errors = _add_on_stream(cuda, np, module, int(rank.params.get("add_n", 1 << 20)))
        rank.mark("overlap")
        timing = _overlap(cuda, np, module, int(float(rank.params.get("copy_mib", 256)) * 2**20))
    finally:
        context.pop()
    return {
        **timing,
        "errors": errors,
        "versions": {
            "pycuda": pycuda.VERSION_TEXT,
            "cuda_driver": ".".join(map(str, divmod(cuda.get_driver_version() // 10, 100))),
        },
    }


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    return judge_overlap(
        ctx, NAME, payloads, "`add` verified on a stream with async copies; copy and kernel overlap"
    )
