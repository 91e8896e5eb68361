"""`tensorflow`: tf.distribute.MirroredStrategy over the node's GPUs, a few steps of model.fit.

Optional (``--only tensorflow`` or the ``frameworks`` profile). One process, started early and
held at a gate like the other launched checks (importing TensorFlow takes seconds); no GPU is
touched before the gate opens. The strategy mirrors a small Keras model over every GPU
TensorFlow sees, trains it for a few epochs on a fixed regression problem, and reads back each
replica's copy of every variable: they must be identical, and the loss must fall to at most
``tensorflow.max_loss_ratio`` of its first value.

At least two replicas, as ``ddp`` has at least two ranks: one visible GPU is split into two
logical GPUs; without a GPU, the CPU is split into two logical CPU devices and the result says
that it ran on CPU. A node with GPUs on which TensorFlow sees none (a CPU-only build) FAILs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.checks import ranklog
from gpuenv.checks.base import Context, NodeInfo, Placement, always_needed, has_module, verdict
from gpuenv.results import Measurement, Result

NAME = "tensorflow"
DESCRIPTION = (
    "TensorFlow MirroredStrategy over the GPUs (2 logical devices on one GPU or on CPU):"
    " model.fit, loss down, replicas equal"
)
PLACEMENT = Placement.LAUNCHER
OPTIONAL = True
needed = always_needed
MIN_REPLICAS = 2  # one replica agreeing with itself proves nothing
# Memory of each logical GPU where one GPU is split in two (MiB): the model needs a few MiB.
LOGICAL_GPU_MIB = 1024


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    return None if has_module("tensorflow") else "tensorflow not installed"


def world(ctx: Context, node: NodeInfo) -> int:
    return 1  # one process; the replicas are its devices


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    epochs = int(ctx.profile_params(NAME).get("epochs", 5))
    return [sys.executable, "-m", "gpuenv.checks.tensorflow", "--epochs", str(epochs)]


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    # TensorFlow's C++ start-up chatter (oneDNN, CPU features) goes to the log, not the table.
    return {"TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1" if not node.has_gpu else "4"}


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    p = payloads[0]
    max_ratio = float(ctx.thresholds["tensorflow"]["max_loss_ratio"])
    losses = [float(v) for v in p["losses"]]
    ratio = losses[-1] / losses[0] if losses and losses[0] else float("inf")
    diff = float(p["replica_max_diff"])
    replicas = int(p["replicas"])
    kind = str(p["device_kind"])
    ms = [
        Measurement("replica_max_diff", diff, "", 0.0, "max"),
        Measurement("loss_ratio", round(ratio, 4), "", max_ratio, "max"),
        Measurement("replicas", replicas, "", float(MIN_REPLICAS), "min"),
        Measurement("step_time", round(float(p["step_time_s"]) * 1e3, 3), "ms"),
    ]
    problems = []
    if diff > 0.0:
        problems.append(f"replicas' variables differ after training (max |diff| {diff:.3g})")
    if ratio > max_ratio:
        problems.append(f"loss did not decrease enough: last/first {ratio:.3f} > {max_ratio}")
    if replicas < MIN_REPLICAS:
        problems.append(f"{replicas} replica(s): a mirror of itself proves nothing")
    if node.has_gpu and kind != "gpu":
        problems.append(
            f"the node has {len(node.gpus)} GPU(s) but TensorFlow sees none"
            " (a CPU-only build such as tensorflow-cpu?)"
        )
    elif kind == "gpu" and int(p["physical_devices"]) < len(node.gpus):
        problems.append(
            f"TensorFlow sees {p['physical_devices']} of the node's {len(node.gpus)} GPUs"
        )
    where = {
        "gpu": f"{p['physical_devices']} GPU(s)",
        "cpu": "CPU only (2 logical CPU devices; no GPU verified)",
    }[kind]
    if kind == "gpu" and int(p["physical_devices"]) < replicas:
        where += f", {replicas} logical GPUs on one"
    passed = (
        f"{replicas} replicas on {where}: variables identical after {len(losses)} epochs,"
        f" loss x{ratio:.3f} <= {max_ratio}"
    )
    details = {
        "device_kind": kind,
        "devices": p["devices"],
        "losses": losses,
        "epochs": len(losses),
    }
    return verdict(ctx, NAME, problems, [], passed, ms, {"tensorflow": p["tensorflow"]}, details)


def _split_devices(tf: Any) -> tuple[str, int]:
    """Make at least MIN_REPLICAS logical devices; return their kind and the physical count."""
    physical = tf.config.list_physical_devices("GPU")
    if len(physical) >= MIN_REPLICAS:
        for gpu in physical:  # not the whole of each GPU's memory, as TensorFlow takes by default
            tf.config.experimental.set_memory_growth(gpu, True)
    elif physical:
        tf.config.set_logical_device_configuration(
            physical[0],
            [tf.config.LogicalDeviceConfiguration(memory_limit=LOGICAL_GPU_MIB)] * MIN_REPLICAS,
        )
    if physical:
        return "gpu", len(physical)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * MIN_REPLICAS
    )
    return "cpu", 0


def train(tf: Any, kind: str, epochs: int, mark: Any) -> dict[str, Any]:
    """A small regression model mirrored over every logical device of ``kind``."""
    import numpy as np

    devices = [d.name for d in tf.config.list_logical_devices(kind.upper())]
    strategy = tf.distribute.MirroredStrategy(devices=devices)
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 16)).astype("float32")
    w = rng.standard_normal((16, 1)).astype("float32") / 4.0
    y = np.sin(x @ w).astype("float32")
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(16,)),
                tf.keras.layers.Dense(32, activation="relu"),
                tf.keras.layers.Dense(1),
            ]
        )
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="mse")
    mark("fit")
    began_at = time.perf_counter()
    # The global batch is split over the replicas: each gets 64 samples a step.
    history = model.fit(x, y, batch_size=64 * len(devices), epochs=epochs, shuffle=False,
                        verbose=0)  # fmt: skip
    fit_s = time.perf_counter() - began_at
    mark("compare")
    worst = 0.0
    for var in model.trainable_variables:
        copies = [np.asarray(v.numpy()) for v in getattr(var, "values", (var,))]
        for other in copies[1:]:
            worst = max(worst, float(np.max(np.abs(other - copies[0]))))
    steps = epochs * -(-len(x) // (64 * len(devices)))
    return {
        "losses": [round(float(v), 6) for v in history.history["loss"]],
        "replica_max_diff": worst,
        "replicas": int(strategy.num_replicas_in_sync),
        "devices": devices,
        "step_time_s": fit_s / max(1, steps),
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.tensorflow")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    log = ranklog.RankLog(ranklog.RankConfig.load().events, 0)
    log.mark(NAME, "start")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # seconds: paid before the gate

    log.mark(NAME, "ready")
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, 0, 1)
    with ranklog.Heartbeat(log, NAME):
        rank.mark("devices")
        kind, physical = _split_devices(tf)
        outcome = train(tf, kind, args.epochs, rank.mark)
        log.result(NAME, {
            **outcome,
            "device_kind": kind,
            "physical_devices": physical,
            "tensorflow": tf.__version__,
        })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
