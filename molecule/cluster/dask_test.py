"""`gpuenv cluster`'s optional dask stage over two real lab nodes (dask installed by
gpu_env_frameworks): the scheduler and client on the first, a worker on each, numpy blocks (no
GPU); it must PASS with both workers computing, and leave no scheduler, worker or driver on either
node. Run by molecule/cluster/verify.yml, or by hand with the environment molecule sets:

    python molecule/cluster/dask_test.py --nodes cl-node1 cl-node2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sshinv import inventory, on

LEFT = "distributed[.]cli|gpuenv[.]cluster[.]worker"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", nargs=2, required=True)
    parser.add_argument("--user", default="gpuenv", help="the cluster user (ssh_mesh_user)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuenv-dask-") as tmp:
        inv = inventory(Path(tmp), args.nodes, args.user)
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "gpuenv", "cluster", "-i", str(inv), "--profile", "cpu",
             "--skip", "check,consistency,torch,mpi,pairs", "--with", "dask",
             "--json", "-", "--no-progress", "--deadline", "120"],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        wall = time.monotonic() - began
    print(f"dask_test: gpuenv cluster exit {done.returncode} in {wall:.1f}s", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"dask_test: FAIL: exit {done.returncode}\n{done.stderr[-3000:]}")
    dask = next(r for r in json.loads(done.stdout)["results"] if r["check"] == "dask")
    print(f"dask_test: {dask['status']} {dask['reason']}", flush=True)
    want = ("2 workers on 2 nodes", "numpy blocks (CPU-only nodes)")
    if dask["status"] != "PASS" or not all(w in dask["reason"] for w in want):
        raise SystemExit(f"dask_test: FAIL: {dask}")
    if dask["details"]["left_running"]:
        raise SystemExit(f"dask_test: FAIL: killed after shutdown: {dask['details']}")
    for node in args.nodes:
        left = on(node, "sh", "-c", f"pgrep -af '{LEFT}' || true").strip()
        if left:
            raise SystemExit(f"dask_test: FAIL: left on {node}: {left}")
    print("dask_test: ok: nothing of the run left on either node", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
