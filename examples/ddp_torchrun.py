"""PyTorch DistributedDataParallel under torchrun: a small model trained on every rank.

The seed documents' PyTorch method ("使用DataParallel或DistributedDataParallel"), the
DistributedDataParallel way, one process per GPU:

    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py       # one node
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint node1:29500 examples/ddp_torchrun.py                 # each of 2 nodes

Runs on a CPU-only node too (``--device cpu``, or ``auto`` where CUDA is unavailable): the gloo
backend, as where ranks share a GPU (NCCL refuses two ranks on one GPU).

The document's bugs, and the fixes here:

1. ``nn.DataParallel`` is one process driving the GPUs of one node by threads: it cannot span
   nodes and PyTorch recommends DistributedDataParallel even on one node. Each rank is a
   process started by torchrun, ``init_process_group`` joins them, and ``DDP`` wraps the model.
2. ``MyModel``, ``dataloader`` and ``loss_function`` are never defined: a small MLP, a fixed
   regression problem (the same on every node: seeded) split between the ranks by a
   ``DistributedSampler``, and ``nn.MSELoss``.
3. ``.cuda()`` puts every process on GPU 0: each rank uses ``LOCAL_RANK`` modulo the node's
   GPU count (``torch.cuda.set_device``) and NCCL only when every rank of the node has its own
   GPU; otherwise gloo.
4. The indentation of the loop body was lost in the document (a syntax error as printed).
5. Nothing checked the training: after it, every rank's parameters must be identical (DDP
   averages the gradients) and the loss must have fallen; rank 0 prints one line
   ``EXAMPLE-RESULT {json}`` (exit 1 when anything is wrong), and the process group is
   destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch import optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXAMPLE = "ddp_torchrun"


def report(ok: bool, **fields: object) -> None:
    """The last line: what `gpuenv check --profile examples` reads; exit 1 when not ok."""
    print("EXAMPLE-RESULT " + json.dumps({"example": EXAMPLE, "ok": ok, **fields}), flush=True)
    if not ok:
        sys.exit(f"{EXAMPLE}: FAILED: {fields.get('error')}")


class MyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ:
        sys.exit(f"{EXAMPLE}: start it with torchrun (see the top of this file)")
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda:
        gpus = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % gpus)  # bug 3
        torch.cuda.set_device(device)
        backend = "nccl" if local_world <= gpus else "gloo"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same data and the same first weights on every rank
    inputs = torch.randn(2048, 16)
    targets = inputs @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
    dataset = TensorDataset(inputs, targets)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    dataloader = DataLoader(dataset, batch_size=64, sampler=sampler)

    model = MyModel().to(device)  # the model to its GPU (or the CPU)
    model = DDP(model, device_ids=[device.index] if cuda else None)  # bug 1
    optimizer = optim.Adam(model.parameters(), lr=1e-2)
    loss_function = nn.MSELoss()

    model.train()
    epoch_losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for data, target in dataloader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = loss_function(output, target)
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item() * len(data), len(data)], device=device)
        dist.all_reduce(total)  # the epoch's loss over every rank's samples
        epoch_losses.append(float(total[0] / total[1]))

    # Every rank must hold the same parameters (bug 5).
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    diff = max(float((g - gathered[0]).abs().max()) for g in gathered)
    dist.destroy_process_group()
    if rank != 0:
        return
    print("loss by epoch:", [round(v, 4) for v in epoch_losses])
    wrong = []
    if diff > 0.0:
        wrong.append(f"parameters differ across ranks after training (max |diff| {diff:.3g})")
    if not epoch_losses[-1] < 0.5 * epoch_losses[0]:
        wrong.append(f"loss did not fall: {epoch_losses[0]:.4f} -> {epoch_losses[-1]:.4f}")
    report(
        not wrong,
        ranks=world,
        backend=backend,
        device=device.type,
        torch=torch.__version__,
        losses=epoch_losses,
        param_max_diff=diff,
        checked=f"DDP on {world} rank(s) ({backend}): parameters identical, loss"
        f" {epoch_losses[0]:.3f} -> {epoch_losses[-1]:.3f}",
        **({"error": "; ".join(wrong)} if wrong else {}),
    )


if __name__ == "__main__":
    main()
