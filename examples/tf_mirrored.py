"""TensorFlow: tf.distribute.MirroredStrategy training a Keras model, and a matmul on GPU:0.

The seed documents' TensorFlow methods ("tf.distribute.MirroredStrategy是最常用的多GPU训练策略",
and "使用TensorFlow或多线程框架"'s matmul), one process driving every GPU of the node:

    python3 examples/tf_mirrored.py

Runs on a CPU-only node too (the CPU split into two logical devices; the result says
``"device": "cpu"``). With one GPU, the GPU is split into two logical GPUs so that the mirror has
two replicas to keep equal; with two or more, one replica per GPU.

The document's bugs, and the fixes here:

1. ``build_model()`` and ``train_dataset`` are never defined: a small Keras classifier and a
   seeded 4-class problem in a ``tf.data.Dataset``, batched by the global batch size (each
   replica gets ``batch / replicas`` samples a step).
2. The body of ``with strategy.scope():`` lost its indentation (a syntax error as printed); the
   model is built and compiled inside the scope, ``fit`` is called after it.
3. The matmul example is TensorFlow 1 code: ``tf.Session`` and ``Tensor.eval`` no longer exist
   in TensorFlow 2, and the ops were built before ``with tf.device('/device:GPU:0')`` so the
   block placed nothing. The constants and the matmul are made inside the block, eagerly, and
   the result is compared with [[7, 10], [15, 22]] (on ``/CPU:0`` where there is no GPU).
4. Nothing checked the training: after it, every replica's copy of every variable must be
   identical and the loss must have fallen; the run ends with one line
   ``EXAMPLE-RESULT {json}`` (exit 1 when anything is wrong).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

import numpy as np
import tensorflow as tf

EXAMPLE = "tf_mirrored"
REPLICAS = 2  # at least: one replica agreeing with itself proves nothing


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


def logical_devices() -> tuple[str, list[str]]:
    """The devices to mirror over: every GPU, or two logical devices of one GPU or the CPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= REPLICAS:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
    else:
        one = gpus[0] if gpus else tf.config.list_physical_devices("CPU")[0]
        limit = {"memory_limit": 1024} if gpus else {}
        tf.config.set_logical_device_configuration(
            one, [tf.config.LogicalDeviceConfiguration(**limit)] * REPLICAS
        )
    kind = "GPU" if gpus else "CPU"
    return kind.lower(), [d.name for d in tf.config.list_logical_devices(kind)]


def build_model() -> tf.keras.Model:
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(16,)),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(4, activation="softmax"),
        ]
    )


def main() -> None:
    kind, devices = logical_devices()
    tf.keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 16)).astype("float32")
    y = np.argmax(x @ rng.standard_normal((16, 4)), axis=1).astype("int64")

    strategy = tf.distribute.MirroredStrategy(devices=devices)
    batch = 64 * strategy.num_replicas_in_sync
    train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=0).batch(batch)
    with strategy.scope():
        model = build_model()  # the model is built inside the strategy's scope (bug 2)
        model.compile(
            optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
    history = model.fit(train_dataset, epochs=5, verbose=2)

    # Every replica's copy of every variable must be the same (bug 4).
    worst = 0.0
    for var in model.trainable_variables:
        copies = [np.asarray(v.numpy()) for v in getattr(var, "values", (var,))]
        worst = max([worst, *(float(np.max(np.abs(c - copies[0]))) for c in copies[1:])])
    losses = [float(v) for v in history.history["loss"]]

    # The matmul, placed by the block it is made in (bug 3).
    where = "/device:GPU:0" if kind == "gpu" else "/device:CPU:0"
    with tf.device(where):
        a = tf.constant([[1, 2], [3, 4]])
        b = tf.constant([[1, 2], [3, 4]])
        c = tf.matmul(a, b)
    result = c.numpy()
    print(result)

    wrong = []
    if worst > 0.0:
        wrong.append(f"replicas' variables differ after training (max |diff| {worst:.3g})")
    if not losses[-1] < 0.9 * losses[0]:
        wrong.append(f"loss did not fall: {losses[0]:.4f} -> {losses[-1]:.4f}")
    if result.tolist() != [[7, 10], [15, 22]]:
        wrong.append(f"matmul on {where}: {result.tolist()} != [[7, 10], [15, 22]]")
    if kind == "gpu" and "GPU" not in c.device:
        wrong.append(f"the matmul ran on {c.device}, not {where}")
    report(
        not wrong,
        replicas=int(strategy.num_replicas_in_sync),
        devices=devices,
        device="cuda" if kind == "gpu" else "cpu",
        tensorflow=tf.__version__,
        losses=losses,
        replica_max_diff=worst,
        checked=f"MirroredStrategy over {len(devices)} {kind.upper()} replica(s): variables"
        f" identical, loss {losses[0]:.3f} -> {losses[-1]:.3f}; matmul on {where}",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
