"""A GPU-placement check: every rank posts rank+1; the judge wants them all, right."""

from gpuenv.checks.base import Placement, always_needed, verdict
from gpuenv.results import Measurement

NAME = "gpusum"
DESCRIPTION = "fake GPU check: each rank posts rank+1"
PLACEMENT = Placement.GPU
OPTIONAL = False
needed = always_needed


def unavailable(ctx, node):
    return None


def world(ctx, node):
    return len(node.gpus)


def rank_main(rank):
    rank.mark("work")
    rank.mark("post")
    value = rank.rank + 1 + int(rank.params.get("offset", 0))
    return {"value": value, "device": rank.device}


def judge(ctx, node, payloads, world):
    total = sum(p["value"] for p in payloads.values())
    want = world * (world + 1) // 2
    problems = [] if total == want else [f"sum {total} != {want}"]
    ms = [Measurement("sum", total, "", float(want), "min")]
    return verdict(ctx, NAME, problems, [], f"{world} ranks summed to {total}", ms)
