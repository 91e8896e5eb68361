"""`ddp`: PyTorch DistributedDataParallel under torchrun, one process per GPU (gloo on CPU).

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
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.checks.base import (
    EVENT_DIR_ENV,
    Context,
    RankLog,
    fault_point,
    module_version,
    rank_deadline,
    wait_gate,
)
from gpuenv.results import Measurement, Result, Status

NAME = "ddp"
DESCRIPTION = "torchrun DDP, one process per GPU (NCCL) or 2 on CPU (gloo): equal params, loss down"


def unavailable(has_gpu: bool) -> str | None:
    from importlib.util import find_spec

    if find_spec("torch") is None:
        return "torch not installed"
    return None


def command(ctx: Context, world: int, has_gpu: bool) -> list[str]:
    steps = int(ctx.profile_params(NAME).get("steps", 20))
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone", "--nnodes", "1", "--nproc-per-node", str(world), "--max-restarts", "0",
        "-m", "gpuenv.checks.ddp", "--steps", str(steps), "--device", "cuda" if has_gpu else "cpu",
    ]  # fmt: skip


def environment(ctx: Context, has_gpu: bool) -> dict[str, str]:
    env = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "1" if not has_gpu else "4"}
    # torch spends seconds probing CUDA on a CPU-only host; say there is none.
    return env


def judge(
    ctx: Context, payloads: Mapping[int, Mapping[str, Any]], world: int, has_gpu: bool
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
        Measurement("ranks", world),
    ]
    details = {
        "backend": first["backend"],
        "steps": first["steps"],
        "losses": {str(r): p["losses"] for r, p in sorted(payloads.items())},
    }
    versions = {"torch": first["torch"]}
    problems = []
    if diff > 0.0:
        problems.append(f"parameters differ across ranks after training (max |diff| {diff:.3g})")
    if ratio > max_ratio:
        problems.append(f"loss did not decrease enough: last/first {ratio:.3f} > {max_ratio}")
    if problems:
        return Result(
            NAME, ctx.node, Status.FAIL, "; ".join(problems), ms, versions, details=details
        )
    reason = (
        f"{world} ranks ({first['backend']}): parameters identical after {first['steps']} steps,"
        f" loss x{ratio:.3f}, {step_ms:.2f} ms/step"
    )
    return Result(NAME, ctx.node, Status.PASS, reason, ms, versions, details=details)


def rank_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.ddp")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    args = parser.parse_args(argv)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    log = RankLog(os.environ[EVENT_DIR_ENV], rank)
    log.mark(NAME, "start")

    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        # Adam at a higher rate overshoots on the first steps of this wider model.
        backend, din, hidden, batch, lr = "nccl", 1024, 1024, 1024, 3e-4
    else:
        device = torch.device("cpu")
        backend, din, hidden, batch, lr = "gloo", 32, 64, 64, 1e-3
    # Before the gate (while the GPU checks run): CUDA context, model and data, which need
    # no peer and take seconds. Everything that talks to other ranks comes after it.
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
    if cuda:
        torch.cuda.synchronize()
    # DistributedDataParallel's constructor imports torch._dynamo (hundreds of modules,
    # seconds); pay that here, before the gate, not inside the timed check.
    with contextlib.suppress(ImportError):
        import torch._dynamo
    log.mark(NAME, "ready")
    wait_gate()
    # Below the parent's deadline, so a rank blocked on a missing peer errors out by itself
    # (NCCL's watchdog aborts the communicator; gloo raises) and says so before being killed.
    timeout = timedelta(seconds=max(2.0, rank_deadline() - time.monotonic()))
    kwargs: dict[str, Any] = {"device_id": device} if cuda else {}
    dist.init_process_group(backend, timeout=timeout, **kwargs)
    log.mark(NAME, "process group")
    fault_point(NAME, rank)  # a rank that never joins the first collective
    log.mark(NAME, "wrap model")
    ddp = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=lr)
    losses, times = [], []
    log.mark(NAME, "train")
    for _ in range(args.steps):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))  # .item() waits for the step to finish
        times.append(time.perf_counter() - t)
    log.mark(NAME, "compare")
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    diff = float((flat - ref).abs().max().item())
    pair = torch.tensor([losses[0], losses[-1]], device=device)
    dist.all_reduce(pair)  # the global loss: the mean over ranks
    pair /= world
    steady = times[1:] or times
    log.result(NAME, {
        "backend": backend,
        "steps": args.steps,
        "losses": [round(v, 6) for v in losses],
        "loss_first": float(pair[0]),
        "loss_last": float(pair[1]),
        "param_max_diff": diff,
        "step_time_s": sum(steady) / len(steady),
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
    raise SystemExit(rank_main(sys.argv[1:]))
