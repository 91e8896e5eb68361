"""A GPU-placement check: every rank posts rank+1; the judge wants them all, right."""

from gpuenv.checks.base import Placement, verdict
from gpuenv.results import Measurement

NAME = "gpusum"
DESCRIPTION = "fake GPU check: each rank posts rank+1"
PLACEMENT = Placement.GPU


def unavailable(ctx, node):
    return None


def world(ctx, node):
    return len(node.gpus)


def rank_main(rc):
    rc.mark("work")
    rc.mark("post")
    value = rc.rank + 1 + int(rc.params.get("offset", 0))
    return {"value": value, "device": rc.device}


def judge(ctx, node, payloads, world):
    total = sum(p["value"] for p in payloads.values())
    want = world * (world + 1) // 2
    problems = [] if total == want else [f"sum {total} != {want}"]
    ms = [Measurement("sum", total, "", float(want), "min")]
    return verdict(ctx, NAME, problems, [], f"{world} ranks summed to {total}", ms)
