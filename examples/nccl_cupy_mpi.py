"""NCCL through cupy.cuda.nccl: an all-reduce of CuPy arrays, the NCCL id broadcast over MPI.

The seed document's method 3 ("使用NCCL进行GPU间通信"), one rank per GPU:

    mpirun -n 2 python3 examples/nccl_cupy_mpi.py      # as many ranks as GPUs, on every node

Needs a GPU for every rank: NCCL refuses two ranks of one communicator on the same GPU
("Duplicate GPU detected"), so start at most as many ranks per node as the node has GPUs. MPI
only carries the NCCL id (a few bytes of host memory), so any MPI will do; NCCL moves the data.

The document's bugs, and the fixes here:

1. ``nranks``, ``rank`` and ``nccl_id`` are never defined: ``nranks``/``rank`` come from MPI,
   and ``nccl_id`` is made by ``nccl.get_unique_id()`` on rank 0 and broadcast with
   ``comm.bcast`` (the document says "通过MPI广播" but does not do it).
2. The arguments are in the wrong order: the constructor is
   ``NcclCommunicator(ndev, commId, rank)`` (cupy.cuda.nccl's documentation), not
   ``(nranks, rank, nccl_id)``.
3. No GPU was chosen: every rank would use GPU 0 and NCCL would refuse the duplicate. Each rank
   uses its index among its own node's ranks (``Split_type(COMM_TYPE_SHARED)``), before the
   communicator is made.
4. ``print(recvbuf)`` right after ``allReduce`` prints the result of a launch that may not have
   run yet on an asynchronous stream: the stream is synchronised first (``print`` would also
   wait, but a check of the values must not rely on that).
5. Nothing checked the answer: ``sendbuf`` holds ``[1, 2, 3] * (rank + 1)`` so that the sum is
   known (``[1, 2, 3] * n(n+1)/2``), every rank compares, and rank 0 prints one line
   ``EXAMPLE-RESULT {json}`` (exit 1 when anything is wrong).
"""

from __future__ import annotations

import json
import sys

import cupy as cp
from cupy.cuda import nccl
from mpi4py import MPI

EXAMPLE = "nccl_cupy_mpi"


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


def main() -> None:
    mpi = MPI.COMM_WORLD
    nranks = mpi.Get_size()
    rank = mpi.Get_rank()

    # One GPU per rank of this node (bug 3).
    local = mpi.Split_type(MPI.COMM_TYPE_SHARED)
    gpus = cp.cuda.runtime.getDeviceCount()
    if local.Get_size() > gpus:
        sys.exit(
            f"{EXAMPLE}: {local.Get_size()} ranks on this node but {gpus} GPU(s): NCCL needs a"
            " GPU of its own for every rank (start at most one rank per GPU)"
        )
    cp.cuda.Device(local.Get_rank()).use()

    # The NCCL id, made once and broadcast over MPI (bug 1).
    nccl_id = nccl.get_unique_id() if rank == 0 else None
    nccl_id = mpi.bcast(nccl_id, root=0)

    # Initialise NCCL: (number of ranks, the id, this rank) (bug 2).
    comm = nccl.NcclCommunicator(nranks, nccl_id, rank)

    # The GPU buffers.
    sendbuf = cp.array([1, 2, 3], dtype=cp.float32) * (rank + 1)
    recvbuf = cp.zeros_like(sendbuf)

    # The all-reduce.
    stream = cp.cuda.Stream.null
    comm.allReduce(
        sendbuf.data.ptr, recvbuf.data.ptr, sendbuf.size, nccl.NCCL_FLOAT32,
        nccl.NCCL_SUM, stream.ptr,
    )  # fmt: skip
    stream.synchronize()  # bug 4

    print(recvbuf)
    expected = cp.array([1, 2, 3], dtype=cp.float32) * (nranks * (nranks + 1) / 2)
    mine = bool((recvbuf == expected).all())
    everyone = mpi.allgather((mine, recvbuf.tolist(), cp.cuda.Device().pci_bus_id))
    comm.destroy()
    if rank != 0:
        return
    want = expected.tolist()
    wrong = [f"rank {r}: {got} != {want}" for r, (ok, got, _) in enumerate(everyone) if not ok]
    report(
        not wrong,
        ranks=nranks,
        array="cupy",
        device="cuda",
        gpus=sorted({bus for _, _, bus in everyone}),
        nccl=nccl.get_version(),
        checked=f"allReduce (sum) of [1, 2, 3] x (rank + 1) on {nranks} rank(s)",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
