"""`ddp`: PyTorch DistributedDataParallel under torchrun, at least 2 ranks.

One process per GPU with NCCL; on a one-GPU node two processes share the GPU with gloo (NCCL
refuses two ranks on one GPU); on a CPU-only node two processes with gloo.

The parent side builds the torchrun command and judges; ``python -m gpuenv.checks.ddp``
is what each rank runs. A few training steps of a small MLP on a fixed batch per rank:
after them the parameters must be identical on every rank and the loss must have gone
down. The process group's timeout sits below the check's deadline and NCCL's async
error handling is on, so a rank whose peer hangs aborts by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuenv.checks import ranklog
from gpuenv.checks.base import (
    Context,
    NodeInfo,
    Placement,
    always_needed,
    has_module,
    module_version,
    verdict,
)
from gpuenv.results import Measurement, Result

NAME = "ddp"
DESCRIPTION = (
    "torchrun DDP, one process per GPU (NCCL; 2 on one GPU with gloo) or 2 on CPU (gloo):"
    " equal params, loss down"
)
PLACEMENT = Placement.LAUNCHER
OPTIONAL = False
needed = always_needed
MIN_RANKS = 2  # one rank agreeing with itself proves nothing


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    return None if has_module("torch") else "torch not installed"


def world(ctx: Context, node: NodeInfo) -> int:
    return max(MIN_RANKS, len(node.gpus))


def backend(node: NodeInfo) -> str:
    """NCCL with one GPU per rank; NCCL refuses two ranks on one GPU, so gloo shares one."""
    return "nccl" if len(node.gpus) >= MIN_RANKS else "gloo"


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    steps = int(ctx.profile_params(NAME).get("steps", 20))
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(world), "--max-restarts", "0",
        "-m", "gpuenv.checks.ddp", "--steps", str(steps),
        "--device", "cuda" if node.has_gpu else "cpu", "--backend", backend(node),
        "--gpus", str(len(node.gpus)),
    ]  # fmt: skip


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "4" if node.has_gpu else "1",
    }


def problems(payload: Mapping[str, Any], max_loss_ratio: float) -> list[str]:
    """The one pass rule of a DDP run, on a node or across nodes: every rank holds the same
    parameters after training, and the global loss fell to at most ``max_loss_ratio``."""
    found = []
    diff = float(payload["param_max_diff"])
    if diff > 0.0:
        found.append(f"parameters differ across ranks after training (max |diff| {diff:.3g})")
    first, last = float(payload["loss_first"]), float(payload["loss_last"])
    ratio = last / first if first else float("inf")
    if ratio > max_loss_ratio:
        found.append(f"loss did not decrease enough: last/first {ratio:.3f} > {max_loss_ratio}")
    return found


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    first = payloads[0]
    max_ratio = float(ctx.thresholds["ddp"]["max_loss_ratio"])
    ratio = first["loss_last"] / first["loss_first"] if first["loss_first"] else float("inf")
    diff = max(float(p["param_max_diff"]) for p in payloads.values())
    step_ms = max(float(p["step_time_s"]) for p in payloads.values()) * 1e3
    ms = [
        Measurement("param_max_diff", diff, "", 0.0, "max"),
        Measurement("loss_ratio", round(ratio, 4), "", max_ratio, "max"),
        Measurement("step_time", round(step_ms, 3), "ms"),
        Measurement("ranks", world, "", float(MIN_RANKS), "min"),
    ]
    details = {
        "backend": first["backend"],
        "steps": first["steps"],
        "ranks_per_gpu": first.get("ranks_per_gpu"),
        "losses": {str(r): p["losses"] for r, p in sorted(payloads.items())},
    }
    found = problems({**first, "param_max_diff": diff}, max_ratio)
    if world < MIN_RANKS:
        found.append(f"{world} rank(s): parameters agreeing with themselves prove nothing")
    shared = (
        f", {first['ranks_per_gpu']} ranks on one GPU (NCCL refuses that: gloo)"
        if (first.get("ranks_per_gpu") or 1) > 1
        else ""
    )
    passed = (
        f"{world} ranks ({first['backend']}{shared}): parameters identical after"
        f" {first['steps']} steps, loss x{ratio:.3f} <= {max_ratio}, {step_ms:.2f} ms/step"
    )
    return verdict(ctx, NAME, found, [], passed, ms, {"torch": first["torch"]}, details)


def train(
    rank: int,
    world: int,
    device: Any,
    steps: int,
    mark: Callable[[str], None] = lambda _stage: None,
) -> dict[str, Any]:
    """The DDP training step of every gpuenv DDP run (node check and cluster): a small MLP, the
    same initial parameters on every rank, each rank its own batch, Adam for ``steps`` steps.

    Returns the global loss before and after, the largest parameter difference from rank 0
    (known to every rank), and the mean step time. The process group must be initialised.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = device.type == "cuda"
    # Adam at a higher rate overshoots on the first steps of the wider model.
    din, hidden, batch, lr = (1024, 1024, 1024, 3e-4) if cuda else (32, 64, 64, 1e-3)
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = torch.nn.Sequential(
        torch.nn.Linear(din, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    ).to(device)  # fmt: skip
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own batch
    x = torch.randn(batch, din, generator=gen)
    w = torch.randn(din, 1, generator=torch.Generator().manual_seed(7)) / din**0.5
    x, y = x.to(device), torch.sin(x @ w).to(device)
    mark("wrap model")
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    losses, times = [], []
    mark("train")
    for _ in range(steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))  # .item() waits for the step to finish
        times.append(time.perf_counter() - t)
    mark("compare")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = (flat - ref).abs().max().reshape(1)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)  # every rank knows the worst rank's difference
    pair = torch.tensor([losses[0], losses[-1]], device=device)
    dist.all_reduce(pair)  # the global loss: the mean over ranks
    pair /= world
    steady = times[1:] or times
    return {
        "steps": steps,
        "losses": [round(v, 6) for v in losses],
        "loss_first": float(pair[0]),
        "loss_last": float(pair[1]),
        "param_max_diff": float(diff.item()),
        "step_time_s": sum(steady) / len(steady),
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="gloo")
    parser.add_argument("--gpus", type=int, default=0)
    args = parser.parse_args(argv)
    index = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", index))
    log = ranklog.RankLog(ranklog.RankConfig.load().events, index)
    log.mark(NAME, "start")

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    gpu = local % max(1, args.gpus)
    if cuda:
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize()  # the CUDA context, before the gate: it takes seconds
    device = torch.device("cuda", gpu) if cuda else torch.device("cpu")
    # DistributedDataParallel's constructor imports torch._dynamo (hundreds of modules,
    # seconds); pay that here, before the gate, not inside the timed check.
    with contextlib.suppress(ImportError):
        import torch._dynamo
    log.mark(NAME, "ready")
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, index, world, gpu)
    with ranklog.Heartbeat(log, NAME):
        # Below the parent's deadline, so a rank blocked on a missing peer errors out by
        # itself (NCCL's watchdog aborts the communicator; gloo raises) and says so.
        timeout = timedelta(seconds=rank.remaining_s())
        kwargs: dict[str, Any] = {"device_id": device} if args.backend == "nccl" else {}
        dist.init_process_group(args.backend, timeout=timeout, **kwargs)
        rank.mark("process group")
        ranklog.fault_point(NAME, index)  # a rank that never joins the first collective
        outcome = train(index, world, device, args.steps, rank.mark)
        log.result(NAME, {
            **outcome,
            "backend": args.backend,
            "ranks_per_gpu": world // args.gpus if cuda and args.gpus else None,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else "",
        })  # fmt: skip
        # No rank tears its connections down while a peer still uses them (gloo aborts then).
        dist.barrier()
        dist.destroy_process_group()
    return 0


def installed_version() -> str | None:
    return module_version("torch")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
