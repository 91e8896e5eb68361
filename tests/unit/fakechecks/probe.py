"""A PROBE that reports the GPUs named in FAKE_GPUS (a count) without touching any GPU, and
guesses FAKE_EARLY_GPUS of them before it runs (no guess when that is unset)."""

import os

from gpuenv.checks.base import NodeInfo, Placement, always_needed
from gpuenv.results import Result, Status

NAME = "probe"
DESCRIPTION = "fake probe: FAKE_GPUS GPUs"
PLACEMENT = Placement.PROBE
OPTIONAL = False
needed = always_needed


def unavailable(ctx, node):
    return None


def world(ctx, node):
    return 1


def rank_main(rank):
    return {"gpus": int(os.environ.get("FAKE_GPUS", "2"))}


def node_info(payload, why):
    if payload is None:
        return NodeInfo(no_gpu=why)
    gpus = [{"index": i, "name": "Fake GPU"} for i in range(payload["gpus"])]
    return NodeInfo(gpus=gpus, no_gpu=None if gpus else "no fake GPU")


def early_node(ctx):
    guess = os.environ.get("FAKE_EARLY_GPUS")
    if guess is None:
        return None
    return node_info({"gpus": int(guess)}, None)


def judge(ctx, node, payloads, world):
    return Result(NAME, ctx.node, Status.PASS, f"{len(node.gpus)} fake GPUs")
