"""A GPU-placement check whose rank 1 dies as a rank does when NCCL gives up at its start: NCCL's
WARN line on stderr (the shape NCCL 2.x prints: ``host:pid:tid [device] NCCL WARN ...``), then
the process exits without posting anything. Rank 0 posts and waits for its peer. With
FAKE_DYING_RAISES set, rank 1 raises NCCL's error instead (the worker posts it) and rank 0 ends."""

import os
import socket
import sys
import time

from gpuenv.checks.base import Placement, always_needed, verdict

NAME = "dying"
DESCRIPTION = "fake GPU check: rank 1 dies after NCCL's WARN line"
PLACEMENT = Placement.GPU
OPTIONAL = False
needed = always_needed


def unavailable(ctx, node):
    return None


def world(ctx, node):
    return len(node.gpus)


def rank_main(rank):
    if os.environ.get("FAKE_DYING_RAISES"):
        if rank.rank == 1:
            raise RuntimeError("NCCL error: unhandled system error, Last error: Bootstrap : no"
                               " socket interface found")  # fmt: skip
        return {}
    if rank.rank == 1:
        where = f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [1]"
        print(f"{where} NCCL INFO Bootstrap : Using eth0", flush=True)
        print(f"{where} NCCL WARN Bootstrap : no socket interface found", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    time.sleep(30)  # a peer in a collective with the rank that died
    return {}


def judge(ctx, node, payloads, world):
    return verdict(ctx, NAME, [], [], "unreachable", [])
