"""`cupy`: kernels with verified results, pinned copy bandwidth and GEMM TFLOPS, per GPU.

Runs in one process per GPU (gpuenv.checks.worker). ``import cupy`` below is the CuPy
package (absolute import), not this module.
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
from gpuenv.checks.thresholds import describe_gpu, model_spec, pcie_gbps
from gpuenv.results import Measurement, Result

NAME = "cupy"
DESCRIPTION = (
    "CuPy per GPU: allocation, elementwise and NVRTC RawKernel, pinned copy GB/s, GEMM TFLOPS"
)
PLACEMENT = Placement.GPU
OPTIONAL = False
needed = always_needed


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    return None if has_module("cupy") else "cupy not installed"


def world(ctx: Context, node: NodeInfo) -> int:
    return len(node.gpus)


# The seed documents' `add` kernel, corrected: element type int32 on both sides (the seed
# fed int64 numpy arrays to an `int *` kernel), and a bounds check so that a grid larger
# than the data cannot write past the end.
ADD_KERNEL = r"""
extern "C" __global__ void add(const int *a, const int *b, int *c, const int n)
{
    int idx = threadIdx.x + blockIdx.x * blockDim.x;
    if (idx < n) {
        c[idx] = a[idx] + b[idx];
    }
}
"""

H2D, D2H = 1, 2  # cudaMemcpyKind


def _kernels(cp: Any, np: Any) -> list[str]:
    """Run the small kernels; return what was wrong (empty: all verified).

    Results are compared on the host with numpy: a device-side reduction would cost a
    CUB compile of seconds on a node's first run.
    """
    errors = []
    n = 1 << 20
    expected = np.arange(n, dtype=np.float32)  # exact in float32: n < 2**24
    a = cp.arange(n, dtype=cp.float32)
    if not np.array_equal(cp.asnumpy(a), expected):
        errors.append("arange on the device gave wrong values")
    axpy = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = 2.0f * x + y", "axpy")
    z = axpy(a, cp.ones_like(a))
    if not np.array_equal(cp.asnumpy(z), 2 * expected + 1):
        errors.append("elementwise kernel gave wrong values")
    add = cp.RawKernel(ADD_KERNEL, "add")
    rng = np.random.default_rng(0)
    size = 1000
    ha = rng.integers(1, 100, size=size, dtype=np.int32)
    hb = rng.integers(1, 100, size=size, dtype=np.int32)
    da, db = cp.asarray(ha), cp.asarray(hb)
    dc = cp.zeros(size, dtype=cp.int32)
    block = 128
    add(((size + block - 1) // block,), (block,), (da, db, dc, np.int32(size)))
    if not np.array_equal(cp.asnumpy(dc), ha + hb):
        errors.append("RawKernel add (NVRTC) gave wrong values")
    return errors


def corner_ok(cp: Any, np: Any, a: Any, b: Any, c: Any, k: int = 64) -> bool:
    """Whether c[:k, :k] of c = a @ b (fp16) matches an fp32 product computed on the host."""
    ref = cp.asnumpy(a[:k]).astype(np.float32) @ cp.asnumpy(b[:, :k]).astype(np.float32)
    got = cp.asnumpy(c[:k, :k]).astype(np.float32)
    return bool(np.allclose(got, ref, rtol=2e-2, atol=1e-1))


def _copy_gbps(cp: Any, nbytes: int, iters: int, kind: int) -> float:
    host = cp.cuda.alloc_pinned_memory(nbytes)
    dev = cp.cuda.alloc(nbytes)
    stream = cp.cuda.Stream(non_blocking=True)
    src, dst = (host.ptr, dev.ptr) if kind == H2D else (dev.ptr, host.ptr)
    cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)  # warm-up
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(iters):
        cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
    end.record(stream)
    end.synchronize()
    seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
    return nbytes * iters / seconds / 1e9


def _gemm(cp: Any, n: int, iters: int) -> tuple[float, bool]:
    """fp16 GEMM TFLOPS, and whether a corner of the product matches an fp32 reference."""
    a = cp.random.default_rng(1).random((n, n), dtype=cp.float32).astype(cp.float16)
    b = cp.random.default_rng(2).random((n, n), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((n, n), dtype=cp.float16)
    for _ in range(2):
        cp.matmul(a, b, out=c)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        cp.matmul(a, b, out=c)
    end.record()
    end.synchronize()
    seconds = cp.cuda.get_elapsed_time(start, end) / 1e3
    import numpy as np

    return 2.0 * n**3 * iters / seconds / 1e12, corner_ok(cp, np, a, b, c)


def rank_main(rank: RankContext) -> dict[str, Any]:
    import cupy as cp
    import numpy as np

    params = rank.params
    cp.cuda.Device(rank.device).use()
    rank.mark("kernels")
    errors = _kernels(cp, np)
    rank.mark("copy")
    nbytes = int(params["copy_mib"] * 2**20)
    h2d = _copy_gbps(cp, nbytes, int(params["copy_iters"]), H2D)
    d2h = _copy_gbps(cp, nbytes, int(params["copy_iters"]), D2H)
    rank.mark("gemm")
    tflops, gemm_ok = _gemm(cp, int(params["gemm_n"]), int(params["gemm_iters"]))
    if not gemm_ok:
        errors.append("GEMM result differs from the fp32 reference")
    return {
        "errors": errors,
        "h2d_gbps": h2d,
        "d2h_gbps": d2h,
        "gemm_tflops": tflops,
        "gemm_n": int(params["gemm_n"]),
        "versions": {
            "cupy": cp.__version__,
            "cuda_runtime": str(cp.cuda.runtime.runtimeGetVersion()),
        },
    }


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    effs = ctx.thresholds["cupy"]
    ms: list[Measurement] = []
    problems: list[str] = []
    unjudged: list[str] = []
    per_gpu = []
    versions: dict[str, str] = {}
    for rank, p in sorted(payloads.items()):
        gpu = node.gpus[rank] if rank < len(node.gpus) else {}
        versions.update(p.get("versions", {}))
        spec = model_spec(ctx.specs, gpu)
        link = pcie_gbps(
            ctx.specs, int(gpu.get("pcie_max_gen") or 0), int(gpu.get("pcie_max_width") or 0)
        )
        copy_min = link * effs["copy_efficiency"] if link else None
        tflops = spec.get("fp16_dense_tflops") if spec else None
        gemm_min = float(tflops) * effs["gemm_efficiency"] if tflops else None
        items = [
            measurement(f"gpu{rank}.h2d", round(p["h2d_gbps"], 2), "GB/s", copy_min, "min"),
            measurement(f"gpu{rank}.d2h", round(p["d2h_gbps"], 2), "GB/s", copy_min, "min"),
            measurement(
                f"gpu{rank}.gemm_fp16", round(p["gemm_tflops"], 1), "TFLOPS", gemm_min, "min"
            ),
        ]
        ms += [Measurement(**m) for m in items]
        problems += [f"GPU{rank}: {e}" for e in p.get("errors", [])]
        problems += [
            f"GPU{rank} {m.name.split('.')[1]} {m.value} {m.unit} < {m.threshold:.1f}"
            for m in ms[-3:]
            if m.ok() is False
        ]
        if gemm_min is None:
            unjudged.append(
                f"GPU{rank} GEMM: no fp16 spec for {describe_gpu(gpu)} in gpu_specs.yaml"
            )
        if copy_min is None:
            unjudged.append(
                f"GPU{rank} copies: PCIe gen {gpu.get('pcie_max_gen')} x{gpu.get('pcie_max_width')}"
                " unknown"
            )
        per_gpu.append(
            {
                "rank": rank,
                "name": gpu.get("name"),
                "spec": spec.get("key") if spec else None,
                **{k: p[k] for k in ("h2d_gbps", "d2h_gbps", "gemm_tflops", "gemm_n")},
            }
        )
    worst = min(ms[2::3], key=lambda m: float(m.value))
    slowest_copy = min(ms[0::3] + ms[1::3], key=lambda m: float(m.value))
    passed = (
        f"kernels verified on {len(payloads)} GPU(s); slowest GEMM {worst.value} TFLOPS"
        + (f" >= {worst.threshold:.0f}" if worst.threshold is not None else "")
        + f", slowest copy {slowest_copy.value} GB/s"
        + (f" >= {slowest_copy.threshold:.1f}" if slowest_copy.threshold is not None else "")
    )
    return verdict(ctx, NAME, problems, unjudged, passed, ms, versions, {"per_gpu": per_gpu})
