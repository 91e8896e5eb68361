"""Horovod + CuPy: hvd.allreduce (sum) of a CuPy array, through horovod.tensorflow.

The seed document's method 4 ("使用Horovod与CuPy集成"), one process per GPU:

    horovodrun -np 2 -H localhost:2 python3 examples/horovod_cupy.py
    horovodrun -np 2 -H localhost:2 python3 examples/horovod_cupy.py --array numpy   # CPU only

Needs Horovod built with TensorFlow support (``HOROVOD_WITH_TENSORFLOW=1``) and TensorFlow.
Runs on a CPU-only node with ``--array numpy`` (``auto``, the default, takes CuPy when it is
installed and sees a GPU). Not run on the project's machines: Horovod 0.28.1 does not build
against the TensorFlow and PyTorch versions they carry (docs/examples.md).

The document's bugs, and the fixes here:

1. ``cp.cuda.Device(hvd.local_rank())`` fails when a node runs more ranks than it has GPUs: the
   local rank modulo the node's GPU count.
2. ``horovod.tensorflow.allreduce`` takes TensorFlow tensors: a CuPy array is not one, and
   TensorFlow's conversion through numpy is refused by CuPy ("Implicit conversion to a NumPy
   array is not allowed"). The array goes to TensorFlow and back through DLPack, without a
   copy: ``tf.experimental.dlpack.from_dlpack`` and ``cp.from_dlpack``.
3. ``average=False`` is deprecated (and removed in later Horovod): ``op=hvd.Sum``.
4. TensorFlow takes all of every GPU's memory at start by default, leaving none to CuPy: memory
   growth is switched on before anything runs.
5. Nothing checked the answer: rank ``r`` contributes ``[1, 2, 3] * (r + 1)``, every rank compares
   the sum with ``[1, 2, 3] * n(n+1)/2``, and rank 0 prints one line ``EXAMPLE-RESULT {json}``
   (exit 1 when anything is wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

import horovod
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

EXAMPLE = "horovod_cupy"


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


def cupy_or_none(choice: str) -> Any:
    """CuPy where asked (``auto``: where it is installed and sees a GPU), else None (numpy)."""
    if choice == "numpy":
        return None
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # CuPy missing, or no driver: ``auto`` means numpy then
        if choice == "cupy":
            raise
    if choice == "cupy":
        sys.exit(f"{EXAMPLE}: --array cupy but CuPy sees no GPU")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--array", choices=("auto", "cupy", "numpy"), default="auto")
    args = parser.parse_args()
    cp = cupy_or_none(args.array)
    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)  # bug 4

    hvd.init()
    size, rank = hvd.size(), hvd.rank()

    # Bind a GPU: the local rank modulo this node's GPUs (bug 1).
    if cp is not None:
        cp.cuda.Device(hvd.local_rank() % cp.cuda.runtime.getDeviceCount()).use()

    # The data.
    base = [1.0, 2.0, 3.0]
    if cp is not None:
        tensor = cp.array(base) * (rank + 1)
        cp.cuda.get_current_stream().synchronize()  # written before TensorFlow reads it
        as_tf = tf.experimental.dlpack.from_dlpack(tensor.__dlpack__())  # bug 2
    else:
        tensor = np.array(base) * (rank + 1)
        as_tf = tf.constant(tensor)

    # The all-reduce (bug 3).
    sum_tensor = hvd.allreduce(as_tf, op=hvd.Sum)
    if cp is not None:
        sum_tensor = cp.from_dlpack(tf.experimental.dlpack.to_dlpack(sum_tensor))
        got = cp.asnumpy(sum_tensor)
    else:
        got = sum_tensor.numpy()
    print(sum_tensor)

    expected = np.array(base) * (size * (size + 1) / 2)
    mine = bool(np.array_equal(got, expected))
    everyone = hvd.allgather_object((mine, got.tolist()))
    hvd.shutdown()
    if rank != 0:
        return
    want = expected.tolist()
    wrong = [f"rank {r}: {g} != {want}" for r, (ok, g) in enumerate(everyone) if not ok]
    report(
        not wrong,
        ranks=size,
        array="cupy" if cp is not None else "numpy",
        device="cuda" if cp is not None else "cpu",
        horovod=horovod.__version__,
        checked=f"hvd.allreduce (sum) of [1, 2, 3] x (rank + 1) on {size} rank(s)",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
