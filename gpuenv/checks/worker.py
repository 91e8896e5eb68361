"""Entry point of one GPU rank: ``python -m gpuenv.checks.worker CONFIG RANK``.

Runs the in-process checks (system, cupy, streams, nccl) one after the other in a single
process per GPU, so that Python and CUDA start-up are paid once, and writes each check's
raw result to the rank's event file. The parent judges them.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence

from gpuenv.checks.base import RANK_MARGIN_S, RankLog


def main(argv: Sequence[str]) -> int:
    with open(argv[0], encoding="utf-8") as fh:
        config = json.load(fh)
    rank = int(argv[1])
    world = int(config["world"])
    log = RankLog(config["events"], rank)
    for name in config["checks"]:
        module = importlib.import_module(f"gpuenv.checks.{name}")
        params = config["params"].get(name, {})
        log.mark(name, "start")
        deadline = time.monotonic() + float(config["deadlines"][name]) - RANK_MARGIN_S
        try:
            if name == "nccl":
                payload = module.rank_main(rank, world, params, log, deadline)
            else:
                payload = module.rank_main(rank, world, params, log)
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
