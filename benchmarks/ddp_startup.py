"""Where a DDP worker's start-up goes on a GPU machine: ``import torch``, the CUDA context,
``import torch._dynamo`` (DistributedDataParallel's constructor needs it), one after the other
("seq") and with the context opened in a second thread while the import runs ("overlap").

    python3 benchmarks/ddp_startup.py            # as many workers as GPUs, at least 2

Each repetition starts the workers at once, as torchrun does, and prints each worker's phases
and the wall time of the repetition. Needs torch with CUDA and at least one GPU.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time


def worker(mode: str, gpu: int) -> None:
    t0 = time.time()
    import torch

    t1 = time.time()
    if mode == "overlap":
        thread = threading.Thread(target=lambda: __import__("torch._dynamo"))
        thread.start()
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize()
        t2 = time.time()
        thread.join()
    else:
        torch.cuda.set_device(gpu)
        torch.cuda.synchronize()
        t2 = time.time()
        import torch._dynamo
    t3 = time.time()
    print(
        f"{mode} gpu{gpu} import torch {t1 - t0:.2f} s, CUDA context {t2 - t1:.2f} s,"
        f" then until torch._dynamo is imported {t3 - t2:.2f} s; total {t3 - t0:.2f} s",
        flush=True,
    )


def main() -> None:
    import torch  # the page cache warm for every worker

    gpus = torch.cuda.device_count()
    if gpus < 1:
        raise SystemExit("ddp_startup: no CUDA GPU visible")
    for _ in range(3):
        for mode in ("seq", "overlap"):
            t = time.time()
            workers = [
                subprocess.Popen([sys.executable, __file__, mode, str(rank % gpus)])
                for rank in range(max(2, gpus))
            ]
            for w in workers:
                w.wait()
            print(f"  {mode}: all workers ready after {time.time() - t:.2f} s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        worker(sys.argv[1], int(sys.argv[2]))
    else:
        main()
