"""The smallest DDP job a user could launch with torchrun: the floor under gpuenv's ddp checks.

    torchrun --standalone --nproc-per-node 2 benchmarks/ddp_floor_job.py

Imports torch, joins a process group (NCCL with a GPU per rank; gloo on CPU, or where ranks share
a GPU, as gpuenv's ddp check does), wraps one Linear layer in DistributedDataParallel (which
imports torch._dynamo) and takes 5 SGD steps. It prints nothing and checks nothing: its wall time
is what any DDP job pays before its first useful step. benchmarks/cluster_cpu.py --floor sends
this file's text to the nodes (``python3 -c``); benchmarks/gpu_machine_floor.sh runs it as is.
"""

import os

import torch
import torch.distributed as dist

gpus = torch.cuda.device_count()
world = int(os.environ.get("WORLD_SIZE", "1"))
local = int(os.environ.get("LOCAL_RANK", "0"))
dist.init_process_group("nccl" if gpus >= world > 0 else "gloo")
dev = torch.device("cuda", local % gpus) if gpus else torch.device("cpu")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    opt.zero_grad()
    model(torch.ones(8, 64, device=dev)).sum().backward()
    opt.step()
dist.destroy_process_group()
