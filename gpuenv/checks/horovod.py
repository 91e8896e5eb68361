"""`horovod`: hvd.allreduce of a PyTorch tensor across ranks under horovodrun, values and bandwidth.

Optional (``--only horovod`` or the ``frameworks`` profile). ``horovodrun --gloo`` starts one rank
per GPU (at least two: two ranks share a lone GPU, two ranks on a CPU-only node), each rank
all-reduces (sum) a tensor of ``mib`` MiB holding ``rank + 1`` and checks every element against
n(n+1)/2, then times ``iters`` more all-reduces: algbw = bytes / time, busbw = algbw x 2(n-1)/n
(the nccl-tests definitions, as the ``nccl`` check).

Bandwidth on GPUs (one rank per GPU, NCCL underneath) is held to the ``nccl`` check's floor
(``nccl.busbw_floor``: link spec x efficiency); a GPU without a spec row leaves it NOT JUDGED
(SKIP, FAIL with ``--strict``). With gloo between CPU ranks, or ranks sharing one GPU, there is no
link spec to judge by: the bandwidth is reported only and the PASS rests on the values, as the
``mpi`` check's all-reduce time.

Horovod 0.28.1, the latest release on PyPI, does not build against PyTorch 2.13 (it compiles its
PyTorch extension as C++14; PyTorch's headers require C++17): docs/checks.md quotes the error.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.checks import ranklog
from gpuenv.checks.base import (
    Context,
    NodeInfo,
    Placement,
    always_needed,
    has_module,
    rank_problems,
    verdict,
)
from gpuenv.checks.nccl import bus_factor, busbw_floor
from gpuenv.results import Measurement, Result

NAME = "horovod"
DESCRIPTION = (
    "horovodrun (gloo), one rank per GPU (2 on CPU): hvd.allreduce of a torch tensor verified,"
    " busbw measured"
)
PLACEMENT = Placement.LAUNCHER
OPTIONAL = True
needed = always_needed
MIN_RANKS = 2  # one rank agreeing with itself proves nothing


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    for module in ("horovod", "torch"):
        if not has_module(module):
            return f"{module} not installed"
    if shutil.which("horovodrun") is None:
        return "horovodrun not found on PATH"
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    return max(MIN_RANKS, len(node.gpus))


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    params = ctx.profile_params(NAME)
    return [
        "horovodrun", "--gloo", "-np", str(world), "-H", f"localhost:{world}",
        sys.executable, "-m", "gpuenv.checks.horovod",
        "--mib", str(float(params.get("mib", 64))), "--iters", str(int(params.get("iters", 10))),
        "--gpus", str(len(node.gpus)),
    ]  # fmt: skip


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1"}


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    first = payloads[0]
    found = rank_problems(payloads, world, MIN_RANKS, "an all-reduce")
    seconds = max(float(p["allreduce_s"]) for p in payloads.values())
    nbytes = int(first["bytes"])
    algbw = nbytes / seconds / 1e9
    busbw = algbw * bus_factor(world)
    devices = sorted({p.get("device") for p in payloads.values() if p.get("device") is not None})
    one_per_gpu = first["device_kind"] == "cuda" and len(devices) == world
    unjudged: list[str] = []
    details: dict[str, Any] = {"device_kind": first["device_kind"], "devices": devices}
    floor = None
    judged = "reported only"
    if one_per_gpu:
        link, spec, eff, floor = busbw_floor(ctx, node.gpus)
        details.update(link=link, link_spec_gbps=spec, efficiency=eff)
        if floor is None:
            unjudged.append(f"busbw: no {link} spec for this GPU in gpu_specs.yaml")
        elif busbw < floor:
            found.append(
                f"busbw {busbw:.2f} GB/s at {nbytes // 2**20} MiB < {floor:.1f} GB/s"
                f" ({link} {spec:.0f} GB/s x {eff})"
            )
        else:
            judged = f">= {floor:.1f} GB/s ({link} {spec:.0f} GB/s x {eff})"
    else:
        why = "gloo between CPU ranks" if first["device_kind"] == "cpu" else "ranks share a GPU"
        judged = f"reported only ({why}: no link spec to judge by)"
    ms = [
        Measurement("ranks", world, "", float(MIN_RANKS), "min"),
        Measurement("busbw", round(busbw, 3), "GB/s", floor, "min" if floor is not None else None),
        Measurement("algbw", round(algbw, 3), "GB/s"),
        Measurement("bytes", nbytes, "B"),
    ]
    where = (
        f"{world} GPUs"
        if one_per_gpu
        else f"{world} ranks on CPU (gloo)"
        if first["device_kind"] == "cpu"
        else f"{world} ranks sharing GPU {devices[0] if devices else '?'}"
    )
    passed = (
        f"hvd.allreduce verified on {where}; busbw {busbw:.2f} GB/s at"
        f" {nbytes / 2**20:g} MiB {judged}"
    )
    versions = {"horovod": first["horovod"], "torch": first["torch"]}
    return verdict(ctx, NAME, found, unjudged, passed, ms, versions, details)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.horovod")
    parser.add_argument("--mib", type=float, default=64)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--gpus", type=int, default=0)
    args = parser.parse_args(argv)

    import horovod
    import horovod.torch as hvd
    import torch

    hvd.init()
    index, size = hvd.rank(), hvd.size()
    log = ranklog.RankLog(ranklog.RankConfig.load().events, index)
    log.mark(NAME, "start")
    cuda = args.gpus > 0
    device = torch.device("cuda", hvd.local_rank() % args.gpus) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, index, size, device.index or 0)
    with ranklog.Heartbeat(log, NAME):
        rank.mark("allreduce")
        ranklog.fault_point(NAME, index)  # a rank that never joins
        n = max(1, int(args.mib * 2**20) // 4)
        send = torch.full((n,), float(index + 1), device=device)
        out = hvd.allreduce(send, op=hvd.Sum, name="gpuenv.verify")
        errors = []
        if not bool(torch.all(out == size * (size + 1) / 2)):
            errors.append("hvd.allreduce: wrong sum")
        rank.mark("bandwidth")
        if cuda:
            torch.cuda.synchronize(device)
        began_at = time.perf_counter()
        for i in range(args.iters):
            hvd.allreduce(send, op=hvd.Sum, name=f"gpuenv.bw{i}")
        if cuda:
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - began_at) / max(1, args.iters)
        log.result(NAME, {
            "errors": errors,
            "bytes": n * 4,
            "allreduce_s": seconds,
            "device_kind": device.type,
            "device": device.index,
            "horovod": horovod.__version__,
            "torch": torch.__version__,
            "host": os.uname().nodename,
        })  # fmt: skip
        hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
