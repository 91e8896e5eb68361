"""Dask + CuPy: ``(x + x.T).mean(axis=0)`` of a random matrix whose blocks are CuPy arrays.

The seed document's method 2 ("使用Dask + CuPy进行分布式计算"). Across nodes, start a scheduler on
one node and a worker per GPU on every node, then give this script the scheduler's address:

    dask scheduler --port 8786                                    # node 1
    CUDA_VISIBLE_DEVICES=0 dask worker tcp://node1:8786 --nthreads 1   # each node, each GPU
    python3 examples/dask_cupy.py tcp://node1:8786

Without an address it starts a local cluster of ``--workers`` worker processes on this machine
(``distributed.LocalCluster``: dask-cuda is not needed; its workers share this machine's first
GPU, where dask-cuda's ``LocalCUDACluster`` would give each its own):

    python3 examples/dask_cupy.py                  # CuPy blocks where CuPy sees a GPU
    python3 examples/dask_cupy.py --array numpy    # CPU-only node: numpy blocks

Runs on a CPU-only node (numpy blocks). The client needs CuPy too when the blocks are CuPy:
``map_blocks`` calls ``cp.asarray`` once on the client to learn what the blocks will be.

The document's bugs, and the fixes here:

1. ``Client("scheduler-address:8786")`` is a placeholder that fails to connect: the address is
   the first argument, and without one a local cluster is started (and shut down at the end).
2. ``result.compute()`` throws its answer away, and ``x`` is drawn unseeded, so nothing could
   be checked: ``x`` comes from a seeded generator, the client computes the same expression
   with numpy alone (dask's synchronous scheduler, no worker) and the cluster's answer must
   equal it; it must come back as a CuPy array when the blocks are CuPy.
3. The document's 10000 x 10000 float64 matrix is 800 MB: kept as the default (``--n``), and
   ``--n``/``--chunk`` make it smaller for a quick run.
4. The run ends with one line ``EXAMPLE-RESULT {json}`` (exit 1 when anything is wrong).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.distributed import Client, LocalCluster

EXAMPLE = "dask_cupy"


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


def use_cupy(choice: str) -> bool:
    """CuPy blocks where asked (``auto``: where CuPy is installed and sees a GPU)."""
    if choice == "numpy":
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # CuPy missing, or no driver: ``auto`` means numpy then
        if choice == "cupy":
            raise
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scheduler", nargs="?", help="tcp://HOST:8786 (default: a local cluster)")
    parser.add_argument("--array", choices=("auto", "cupy", "numpy"), default="auto")
    parser.add_argument("--n", type=int, default=10000, help="x is n x n (the document: 10000)")
    parser.add_argument("--chunk", type=int, default=1000, help="blocks of chunk x chunk")
    parser.add_argument("--workers", type=int, default=2, help="local cluster's worker processes")
    args = parser.parse_args()
    blocks = "cupy" if use_cupy(args.array) else "numpy"
    if args.array == "cupy" and blocks != "cupy":
        sys.exit(f"{EXAMPLE}: --array cupy but CuPy sees no GPU")

    with contextlib.ExitStack() as stack:
        # Connect to the cluster (bug 1).
        if args.scheduler:
            client = stack.enter_context(Client(args.scheduler))
        else:
            cluster = stack.enter_context(
                LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None)
            )
            client = stack.enter_context(Client(cluster))
        client.wait_for_workers(1, timeout=120)

        # A distributed array whose blocks are CuPy arrays.
        x = da.random.default_rng(0).random((args.n, args.n), chunks=(args.chunk, args.chunk))
        expected = dask.compute((x + x.T).mean(axis=0), scheduler="sync")[0]  # numpy (bug 2)
        if blocks == "cupy":
            import cupy as cp

            x = x.map_blocks(cp.asarray)  # each block becomes a CuPy array

        # The distributed computation.
        result = (x + x.T).mean(axis=0)
        got: Any = result.compute()

        kind = type(got).__module__.split(".")[0]
        host = got.get() if kind == "cupy" else np.asarray(got)
        workers = client.scheduler_info(n_workers=-1)["workers"]
    print(host[:5], "...")

    err = float(np.max(np.abs(host - expected))) if host.shape == expected.shape else np.inf
    wrong = []
    if not err <= 1e-9:
        wrong.append(f"(x + x.T).mean(axis=0) differs from numpy's by {err:.3g}")
    if kind != blocks:
        wrong.append(f"the answer came back as a {kind} array, not {blocks}")
    report(
        not wrong,
        array=blocks,
        device="cuda" if blocks == "cupy" else "cpu",
        workers=len(workers),
        hosts=sorted({str(w.get("host")) for w in workers.values()}),
        cluster=args.scheduler or f"local ({args.workers} worker processes)",
        max_abs_err=err,
        checked=f"(x + x.T).mean(axis=0) of {args.n}x{args.n}, {args.chunk}-blocks, equals numpy's",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
