"""One rank of a torch.distributed gloo all-reduce between lab nodes; rank 0 prints JSON.

    python3 allreduce_gloo.py RANK WORLD MASTER_ADDR [--mib 16] [--iters 10] [--seconds 60]

busbw = bytes / mean time x 2(n-1)/n (nccl-tests' convention). The rendezvous is torch's TCP
store on MASTER_ADDR:29500 (torchrun's default port, one of net_qos's default ports); gloo's own
connections use ephemeral ports, so it is the user rule (meta skuid) that classifies them.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MASTER_PORT = 29500


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rank", type=int)
    parser.add_argument("world", type=int)
    parser.add_argument("master")
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=120)
    args = parser.parse_args()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}:{MASTER_PORT}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=args.seconds),
    )
    data = torch.ones(args.mib * 2**20 // 4, dtype=torch.float32)
    for _ in range(2):
        dist.all_reduce(data)
    dist.barrier()
    started_at = time.monotonic()
    for _ in range(args.iters):
        dist.all_reduce(data)
    dist.barrier()
    mean_s = (time.monotonic() - started_at) / args.iters
    size = data.numel() * 4
    if args.rank == 0:
        busbw = size / mean_s * 2 * (args.world - 1) / args.world
        print(
            json.dumps(
                {"mib": args.mib, "iters": args.iters, "mean_s": mean_s, "busbw_mb_s": busbw / 1e6}
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
