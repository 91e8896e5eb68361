"""MPI + CuPy: Bcast a CuPy array, square a slice on every rank, Gather the slices on rank 0.

The seed document's method 1 ("使用MPI与CuPy结合"), run as written:

    mpirun -n 2 python3 examples/mpi_cupy.py                  # GPUs: CuPy device buffers
    mpirun -n 2 python3 examples/mpi_cupy.py --array numpy    # CPU-only node: numpy buffers

Runs on a CPU-only node with ``--array numpy`` (``auto``, the default, takes CuPy when it is
installed and sees a GPU). With CuPy, MPI reads and writes device memory: that needs a
CUDA-aware MPI (Open MPI built with CUDA). An MPI that is not CUDA-aware reads the device pointer
as host memory and the rank dies with a segmentation fault inside libmpi; this example does not
hide that by copying through host memory, because the document's users would not either.

The document's bugs, and the fixes here:

1. ``cp.cuda.Device(rank).use()`` fails (``cudaErrorInvalidDevice``) when a node runs more ranks
   than it has GPUs, and gives rank 8 of a second node a GPU index that does not exist: the GPU
   is the rank's index among the ranks of its own node (``Split_type(COMM_TYPE_SHARED)``) modulo
   the node's GPU count.
2. ``comm.Gather`` needs parts of one length, but ``data[rank::size]`` has ``ceil`` or
   ``floor(10 / size)`` elements (with 3 ranks: 4, 3, 3), so the receive buffer
   ``[size, len(local_result)]`` is wrong on rank 0 and MPI reads past the end of the others:
   ``Gatherv`` with each rank's count.
3. ``gathered_results.reshape(-1)`` puts the parts end to end (rank 0's elements 0, 2, 4, ...
   then rank 1's), which is not the order of ``data``: part ``r`` goes back to ``[r::size]``.
4. CuPy kernels are asynchronous and MPI does not know CuPy's stream: ``cp.arange`` on rank 0 and
   ``cp.square`` may not have written their output when MPI reads it. The stream is
   synchronised before each MPI call reads a device buffer.
5. Nothing checked the answer: every rank checks the broadcast, rank 0 checks the squares, and
   the run ends with one line ``EXAMPLE-RESULT {json}`` (exit 1 when anything is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mpi4py import MPI

EXAMPLE = "mpi_cupy"


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


def array_module(choice: str) -> Any:
    """CuPy where asked (or, with ``auto``, where it is installed and sees a GPU), else numpy."""
    if choice in ("cupy", "auto"):
        try:
            import cupy

            if cupy.cuda.runtime.getDeviceCount() > 0:
                return cupy
        except Exception:  # CuPy missing, or no driver: ``auto`` means numpy then
            if choice == "cupy":
                raise
        if choice == "cupy":
            sys.exit(f"{EXAMPLE}: --array cupy but CuPy sees no GPU")
    import numpy

    return numpy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--array", choices=("auto", "cupy", "numpy"), default="auto")
    parser.add_argument("--n", type=int, default=10, help="elements broadcast (the document: 10)")
    args = parser.parse_args()
    cp = array_module(args.array)
    on_gpu = cp.__name__ == "cupy"

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    size = comm.Get_size()

    # Each process chooses a GPU: its index among its own node's ranks, modulo the GPUs (bug 1).
    local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    device = local_rank % cp.cuda.runtime.getDeviceCount() if on_gpu else None
    if on_gpu:
        cp.cuda.Device(device).use()

    def sync() -> None:
        """Let the GPU finish writing before MPI reads a device buffer (bug 4)."""
        if on_gpu:
            cp.cuda.get_current_stream().synchronize()

    # The distributed array.
    if rank == 0:  # noqa: SIM108  the document's own shape
        data = cp.arange(args.n, dtype=cp.float32)
    else:
        data = cp.empty(args.n, dtype=cp.float32)

    # Broadcast the data.
    sync()
    comm.Bcast(data, root=0)
    bcast_ok = bool((data == cp.arange(args.n, dtype=cp.float32)).all())

    # Each rank processes its part of the data.
    local_result = cp.square(data[rank::size])

    # Gather the results: parts of unequal length (bug 2).
    counts = [len(range(r, args.n, size)) for r in range(size)]
    gathered_results = None
    if rank == 0:
        gathered_results = cp.empty(args.n, dtype=cp.float32)
    sync()
    comm.Gatherv(local_result, [gathered_results, counts] if rank == 0 else None, root=0)

    everyone_ok = comm.allreduce(bcast_ok, op=MPI.LAND)
    if rank != 0:
        return
    # Each part back to the places it came from (bug 3).
    final_result = cp.empty(args.n, dtype=cp.float32)
    offsets = [sum(counts[:r]) for r in range(size)]
    for r in range(size):
        final_result[r::size] = gathered_results[offsets[r] : offsets[r] + counts[r]]
    print(final_result)

    expected = cp.arange(args.n, dtype=cp.float32) ** 2
    wrong = [] if everyone_ok else ["Bcast: a rank received other values than rank 0's"]
    if not bool((final_result == expected).all()):
        wrong.append(f"Gatherv: {final_result.tolist()} != {expected.tolist()}")
    report(
        not wrong,
        ranks=size,
        array=cp.__name__,
        device="cuda" if on_gpu else "cpu",
        mpi=MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip(),
        checked=f"Bcast + Gatherv of {args.n} float32 on {size} rank(s), squares in order",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
