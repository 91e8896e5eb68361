"""Entry point of one rank of the PROBE and GPU checks: ``python -m gpuenv.checks.worker RANK``.

Runs the checks its rank configuration (gpuenv.checks.ranklog, ``GPUENV_RANK_CONFIG``) lists,
one after the other, in a single process per GPU, so that Python and CUDA start-up are paid
once, and writes each check's payload to the rank's event file. The parent judges them.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections.abc import Sequence

from gpuenv.checks.ranklog import (
    RANK_MARGIN_S,
    Heartbeat,
    RankConfig,
    RankContext,
    RankLog,
    fault_point,
)


def main(argv: Sequence[str]) -> int:
    index = int(argv[0])
    config = RankConfig.load()
    log = RankLog(config.events, index)
    for name, spec in config.checks.items():
        check = importlib.import_module(spec["module"])
        rank = RankContext(
            check=name,
            rank=index,
            world=config.world,
            params=config.params(name),
            log=log,
            # The parent's clock for this check starts when the previous one ended.
            deadline_at=time.monotonic() + config.deadline_s(name) - RANK_MARGIN_S,
            device=index,
        )
        log.mark(name, "start")
        try:
            with Heartbeat(log, name):
                fault_point(name, index)
                payload = check.rank_main(rank)
        except Exception as exc:  # reported as the check's ERROR, with where it broke
            payload = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=6),
            }
        log.result(name, payload)
        if payload.get("timeout"):
            # The communicator was aborted; this process' CUDA state is not to be trusted.
            sys.stdout.flush()
            os._exit(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
