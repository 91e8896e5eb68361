"""gpuenv's NCCL all-reduce busbw beside torch.distributed's, on the same GPUs, same run.

    python benchmarks/allreduce.py [--rounds 2] [--iters 20] [--out FILE]

For every size from 64 MiB to 4 GiB (doubling) it runs gpuenv's `nccl` check (one
process per GPU, cupy.cuda.nccl, out-of-place) and then `torchrun` with
torch.distributed.all_reduce (NCCL, in place) timed the same way: CUDA events around
`iters` back-to-back float32 sum all-reduces after `warmup` ones, the slowest rank's
mean, busbw = bytes / time x 2(n-1)/n. Rounds alternate gpuenv and torch; each side
keeps its best round per size. The ratio gpuenv/torch must stay within 0.98-1.02.
Exit code 0 when every size is within that band, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES_MIB = [64, 128, 256, 512, 1024, 2048, 4096]
BAND = (0.98, 1.02)


def gpuenv_sweep(sizes_mib: list[int], iters: int, warmup: int) -> dict[int, float]:
    from gpuenv.checks import REGISTRY
    from gpuenv.checks.base import Context
    from gpuenv.checks.session import run_checks
    from gpuenv.checks.thresholds import load_specs, load_thresholds
    from gpuenv.results import Status

    thresholds = load_thresholds()
    thresholds["profiles"]["full"]["nccl"] = {
        "sizes_mib": sizes_mib,
        "iters": iters,
        "warmup": warmup,
    }
    ctx = Context(node="bench", profile="full", thresholds=thresholds, specs=load_specs())
    (result,) = [r for r in run_checks(REGISTRY, ctx, ["nccl"]).results if r.check == "nccl"]
    if result.status is not Status.PASS:
        raise SystemExit(f"gpuenv nccl check did not pass: {result.status.value}: {result.reason}")
    return {row["bytes"]: row["busbw_gbps"] for row in result.details["sweep"]}


def torch_sweep(sizes_mib: list[int], iters: int, warmup: int, world: int) -> dict[int, float]:
    with tempfile.TemporaryDirectory(prefix="gpuenv-bench-") as tmp:
        out = Path(tmp) / "torch.json"
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(world), __file__, "--torch-rank", "--out", str(out),
            "--iters", str(iters), "--warmup", str(warmup),
            "--sizes", ",".join(map(str, sizes_mib)),
        ]  # fmt: skip
        subprocess.run(argv, check=True, timeout=600)
        return {int(k): v for k, v in json.loads(out.read_text()).items()}


def torch_rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    world = dist.get_world_size()
    sizes = [int(s) * 2**20 for s in args.sizes.split(",")]
    buf = torch.ones(max(sizes) // 4, dtype=torch.float32, device=device)
    stream = torch.cuda.current_stream()
    out = {}
    for size in sizes:
        view = buf[: size // 4]
        for _ in range(args.warmup):
            dist.all_reduce(view)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(args.iters):
            dist.all_reduce(view)
        end.record(stream)
        end.synchronize()
        seconds = torch.tensor([start.elapsed_time(end) / 1e3 / args.iters], device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank, as gpuenv
        algbw = size / float(seconds) / 1e9
        out[size] = algbw * 2 * (world - 1) / world
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES_MIB)), help="MiB, comma-separated"
    )
    parser.add_argument("--out", help="write the table as JSON here")
    parser.add_argument("--torch-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_rank:
        torch_rank(args)
        return 0

    from gpuenv.checks.system import probe, visible

    info = probe()
    gpus = visible(info.get("gpus", [])) if info.get("available") else []
    if len(gpus) < 2:
        print(f"needs at least 2 GPUs; {len(gpus)} visible", file=sys.stderr)
        return 1
    sizes = [int(s) for s in args.sizes.split(",")]
    best_g: dict[int, float] = {}
    best_t: dict[int, float] = {}
    t0 = time.monotonic()
    for _ in range(args.rounds):
        for size, bw in gpuenv_sweep(sizes, args.iters, args.warmup).items():
            best_g[size] = max(bw, best_g.get(size, 0.0))
        for size, bw in torch_sweep(sizes, args.iters, args.warmup, len(gpus)).items():
            best_t[size] = max(bw, best_t.get(size, 0.0))
    rows = []
    ok = True
    print(f"{len(gpus)} x {gpus[0]['name']}, {args.rounds} rounds, {args.iters} iters")
    print(f"{'size':>9} {'gpuenv busbw':>13} {'torch busbw':>12} {'ratio':>6}")
    for size in sorted(best_g):
        ratio = best_g[size] / best_t[size]
        inside = BAND[0] <= ratio <= BAND[1]
        ok &= inside
        rows.append({"bytes": size, "gpuenv_busbw_gbps": round(best_g[size], 2),
                     "torch_busbw_gbps": round(best_t[size], 2), "ratio": round(ratio, 4),
                     "within_band": inside})  # fmt: skip
        print(f"{size // 2**20:>5} MiB {best_g[size]:>8.1f} GB/s {best_t[size]:>7.1f} GB/s"
              f" {ratio:>6.3f}{'' if inside else '  OUTSIDE 0.98-1.02'}")  # fmt: skip
    print(f"{'PASS' if ok else 'FAIL'}: ratio band {BAND}; {time.monotonic() - t0:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"gpus": len(gpus), "model": gpus[0]["name"],
                                              "rows": rows, "ok": ok}, indent=2))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
