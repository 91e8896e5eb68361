"""A LAUNCHER check: its launcher starts WORLD ranks of this module, which meet at the gate,
exchange nothing but files, and post rank+1. ``python -m fakechecks.launched launch N`` is the
launcher; ``python -m fakechecks.launched rank R N`` a rank."""

import os
import signal
import subprocess
import sys
import time

from gpuenv.checks import ranklog
from gpuenv.checks.base import Placement, always_needed, verdict
from gpuenv.results import Measurement

NAME = "launched"
DESCRIPTION = "fake launched check: N ranks behind a gate"
PLACEMENT = Placement.LAUNCHER
OPTIONAL = False
needed = always_needed


def unavailable(ctx, node):
    if os.environ.get("FAKE_LAUNCHED_NEEDS_GPU") and not node.has_gpu:
        return "needs a GPU"
    return None


def world(ctx, node):
    return max(2, len(node.gpus))


def command(ctx, node, world):
    return [sys.executable, "-m", "fakechecks.launched", "launch", str(world)]


def environment(ctx, node):
    return {"FAKE_LAUNCHED_FOR": f"{len(node.gpus)} GPUs"}


def judge(ctx, node, payloads, world):
    values = sorted(p["value"] for p in payloads.values())
    problems = [] if values == list(range(1, world + 1)) else [f"values {values}"]
    ms = [Measurement("ranks", world, "", 2.0, "min")]
    return verdict(ctx, NAME, problems, [], f"{world} ranks posted {values}", ms)


def run_rank(r, world):
    log = ranklog.RankLog(ranklog.RankConfig.load().events, r)
    log.mark(NAME, "start")
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, r, world)
    if os.environ.get("FAKE_LAUNCHER_WAKES_RANKS"):
        # A rank that says it is alive on its way out (a heartbeat thread, a handler's log line).
        def last_word(_signum, _frame):
            log.beat(NAME, log.stages.get(NAME, "start"))
            os._exit(143)

        signal.signal(signal.SIGTERM, last_word)
    with ranklog.Heartbeat(log, NAME):
        rank.mark("meet")
        # A barrier through files, like a collective: every rank inside 'meet' waits for all
        # peers' tokens (a peer frozen inside 'meet' keeps them waiting, all in one stage).
        (rank.events / f"token{r}").touch()
        while not all((rank.events / f"token{p}").exists() for p in range(world)):
            time.sleep(0.05)
        rank.mark("post")
        log.result(NAME, {"value": r + 1})


def main(argv):
    if argv[0] == "launch":
        n = int(argv[1])
        children = [
            subprocess.Popen([sys.executable, "-m", "fakechecks.launched", "rank", str(r), str(n)])
            for r in range(n)
        ]
        if os.environ.get("FAKE_LAUNCHER_WAKES_RANKS"):
            # Open MPI 4.1's mpirun on SIGTERM: SIGCONT to its ranks first, so that a stopped
            # rank takes the SIGTERM too (and wakes, however briefly).
            def wake(_signum, _frame):
                for child in children:
                    child.send_signal(signal.SIGCONT)
                    child.send_signal(signal.SIGTERM)
                for child in children:
                    child.wait()
                os._exit(143)

            signal.signal(signal.SIGTERM, wake)
        return max(c.wait() for c in children)
    run_rank(int(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
