"""PyCUDA: the ``add`` kernel on GPU arrays, then the same kernel on a CUDA stream.

The seed document's PyCUDA methods ("使用NumPy和PyCUDA" and "利用CUDA Stream提高并发性能"):

    python3 examples/pycuda_kernel.py

Needs a GPU and nvcc (``SourceModule`` compiles the kernel with it; on PATH, or
``CUDA_HOME``/bin): no CPU-only run.

The document's bugs, and the fixes here:

1. ``from pycuda import autoinit`` then ``autoinit()``: ``pycuda.autoinit`` is a module (importing
   it makes the context), not a function: ``TypeError: 'module' object is not callable``.
   ``import pycuda.autoinit``.
2. ``compiler.compile(code, 'add', 'int', 'int', 'int')`` returns a cubin's bytes, not a
   function, and takes no argument types; ``cuda.autoinit.get_module(...)`` does not exist:
   ``SourceModule(code).get_function("add")`` in both parts.
3. ``np.random.randint`` gives int64 arrays on Linux, the kernel reads ``int *`` (32 bits): the
   sums are of the wrong halves, and in the stream part ``memcpy_htod_async`` copies 8000 bytes
   into a 4000-byte allocation. The arrays are int32.
4. ``memcpy_*_async`` from pageable numpy memory is not asynchronous (CUDA stages it
   synchronously): the stream part's host arrays are page-locked (``cuda.pagelocked_empty``).
5. The kernel writes ``c[idx]`` with no bound: correct only while the grid is exactly the array
   length (100 x 10 = 1000). The kernel takes ``n`` and checks ``idx < n``; the grid is rounded
   up from ``n``.
6. Nothing checked the answer: both parts compare ``c`` with numpy's ``a + b``, and the run ends
   with one line ``EXAMPLE-RESULT {json}`` (exit 1 when anything is wrong).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pycuda.autoinit  # makes the CUDA context (bug 1)
import pycuda.driver as cuda
from pycuda import gpuarray
from pycuda.compiler import SourceModule

EXAMPLE = "pycuda_kernel"
N = 1000
BLOCK = 10

# The GPU code (bound-checked: bug 5).
code = """
__global__ void add(int *a, int *b, int *c, int n)
{
    int idx = threadIdx.x + blockIdx.x * blockDim.x;
    if (idx < n) {
        c[idx] = a[idx] + b[idx];
    }
}
"""


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


def main() -> None:
    rng = np.random.default_rng(0)
    grid = ((N + BLOCK - 1) // BLOCK, 1)

    # 1. NumPy and PyCUDA: compile the GPU code (bug 2).
    func = SourceModule(code).get_function("add")

    # GPU memory, int32 as the kernel reads (bug 3).
    a_gpu = gpuarray.to_gpu(rng.integers(1, 100, size=N, dtype=np.int32))
    b_gpu = gpuarray.to_gpu(rng.integers(1, 100, size=N, dtype=np.int32))
    c_gpu = gpuarray.empty_like(a_gpu)

    # Compute on the GPU.
    func(a_gpu, b_gpu, c_gpu, np.int32(N), block=(BLOCK, 1, 1), grid=grid)

    # The result.
    c = c_gpu.get()
    print(c)
    wrong = []
    if not np.array_equal(c, a_gpu.get() + b_gpu.get()):
        wrong.append("add on GPU arrays: c != a + b")

    # 2. CUDA streams.
    stream = cuda.Stream()
    a_gpu = cuda.mem_alloc(N * 4)
    b_gpu = cuda.mem_alloc(N * 4)
    c_gpu = cuda.mem_alloc(N * 4)

    # The data, in page-locked host memory (bugs 3 and 4).
    a = cuda.pagelocked_empty(N, np.int32)
    b = cuda.pagelocked_empty(N, np.int32)
    a[:] = rng.integers(1, 100, size=N)
    b[:] = rng.integers(1, 100, size=N)

    # Host to GPU, on the stream.
    cuda.memcpy_htod_async(a_gpu, a, stream=stream)
    cuda.memcpy_htod_async(b_gpu, b, stream=stream)

    # Compute on the GPU, on the same stream (it runs after the copies).
    func(a_gpu, b_gpu, c_gpu, np.int32(N), block=(BLOCK, 1, 1), grid=grid, stream=stream)

    # The result, back on the stream; wait for it.
    c = cuda.pagelocked_empty(N, np.int32)
    cuda.memcpy_dtoh_async(c, c_gpu, stream=stream)
    stream.synchronize()
    print(c)
    if not np.array_equal(c, a + b):
        wrong.append("add on a stream: c != a + b")

    device = pycuda.autoinit.device
    report(
        not wrong,
        device="cuda",
        gpu=device.name(),
        pycuda=pycuda.VERSION_TEXT,
        checked=f"add kernel on {N} int32: GPU arrays, then async copies + kernel on a stream",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
