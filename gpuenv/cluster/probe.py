"""Node-side probe: what a node runs, for consistency and the rendezvous preflight.

Runs on every node as ``python -m gpuenv.cluster.probe facts|listen|connect`` with the standard
library only (Python 3.10+), so it answers in well under a second even where torch is slow to
import. Output is one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import socket
import sys
import time
from importlib import metadata
from typing import Any

from gpuenv import proc
from gpuenv.floor import cuda_compat, login_env, net
from gpuenv.floor import fabric as floor_fabric
from gpuenv.floor.node import package_versions

# Distributions whose versions must agree across nodes (the Python stack of the jobs).
PACKAGES = (
    "gpuenv", "torch", "numpy", "mpi4py", "nvidia-ml-py", "cupy-cuda12x", "cupy-cuda13x",
    # The optional frameworks (gpu_env_frameworks), where installed.
    "dask", "distributed", "dask-cuda", "tensorflow", "tensorflow-cpu", "pycuda", "horovod",
)  # fmt: skip
_PACKAGE_PREFIXES = ("nvidia-nccl-",)
_TOOL_TIMEOUT_S = 10.0


def _run(argv: list[str]) -> str | None:
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        done = proc.capture([exe, *argv[1:]], _TOOL_TIMEOUT_S)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def _packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in PACKAGES or name.startswith(_PACKAGE_PREFIXES):
            found[name] = dist.version
    return found


def _visible(rows: list[list[str]]) -> list[list[str]]:
    """nvidia-smi ignores CUDA_VISIBLE_DEVICES; apply it (indices or UUIDs) like CUDA does."""
    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if wanted is None:
        return rows
    keep = [w.strip() for w in wanted.split(",") if w.strip()]
    return [r for r in rows if r[0] in keep or r[1] in keep]


def _gpus() -> dict[str, str]:
    out = _run(
        [
            "nvidia-smi",
            "--query-gpu=index,uuid,name,driver_version",
            "--format=csv,noheader",
        ]
    )
    if out is None:
        return {"gpu.count": "0"}
    rows = _visible([[c.strip() for c in line.split(",")] for line in out.splitlines() if line])
    facts = {"gpu.count": str(len(rows))}
    if rows:
        facts["gpu.model"] = ",".join(sorted({r[2] for r in rows}))
        facts["driver"] = ",".join(sorted({r[3] for r in rows}))
    banner = _run(["nvidia-smi"]) or ""
    match = re.search(r"CUDA Version:\s*([0-9.]+)", banner)
    if match:
        facts["cuda.driver_api"] = match.group(1)
    return facts


def _toolkits() -> dict[str, str]:
    facts: dict[str, str] = {}
    nvcc = _run(["nvcc", "--version"])
    if nvcc and (m := re.search(r"release ([0-9.]+)", nvcc)):
        facts["cuda.toolkit"] = m.group(1)
    mpirun = _run(["mpirun", "--version"])
    if mpirun and (m := re.search(r"Open MPI\)?\s*([0-9][0-9.]*)", mpirun)):
        facts["openmpi"] = m.group(1)
    nccl = package_versions(proc.command_output, ["libnccl2"]).get("libnccl2")
    if nccl:
        facts["nccl.system"] = nccl
    compat = cuda_compat.installed_compat("/")  # a cuda-compat-X-Y package's CUDA
    if compat:
        facts["cuda.compat"] = compat
    return facts


def _nccl_env() -> dict[str, str]:
    facts = {f"env.{k}": v for k, v in os.environ.items() if k.startswith("NCCL_")}
    for key, value in net.nccl_conf("/").items():
        facts.setdefault(f"nccl.conf.{key}", value)
    return facts


def links(root: str = "/") -> dict[str, Any]:
    """What the network of this node can carry: active InfiniBand/RoCE ports with their rate,
    and the speed of the default route's NIC (the node floor's readings, gpuenv.floor.net).
    Bandwidth floors across nodes come from these."""
    ports = net.rdma_ports(root)
    active = [p for p in ports if p.active]
    rates = [r for r in (p.rate_gbytes for p in active) if r]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    out: dict[str, Any] = {
        "ib.active_ports": [p.name for p in active],
        # The fabric's rules (gpuenv.checks.fabric): every port, the NCCL settings in force,
        # error counters before the runs, the verbs library, nvidia_peermem, perftest.
        "ib.ports": [dataclasses.asdict(p) for p in ports],
        "ib.settings": net.nccl_settings(root, os.environ, net.NCCL_FABRIC_SETTINGS),
        "ib.counters": net.all_port_counters(root),
        "ib.verbs": net.verbs_library(root),
        "tools.ib_write_bw": shutil.which("ib_write_bw"),
        # The fabric reader's share (gpuenv.floor.fabric): gdr.peermem, gdr.dmabuf,
        # gdr.acs_bridges, gdr.far_pairs, the derivation's rails and settings, the GID tables.
        **floor_fabric.topology_links(
            floor_fabric.read(root, proc.command_output, cuda_visible_devices=visible)
        ),
    }
    if rates:
        out["ib.rate_gbps"] = min(rates)
    iface = net.default_route_interface(root)
    if iface:
        out["net.iface"] = iface
        speed = net.interface_speed(root, iface)
        if speed:
            out["net.speed_gbps"] = speed
    return out


def facts() -> dict[str, Any]:
    """Everything consistency compares, plus what the rendezvous preflight needs."""
    compared: dict[str, str] = {
        "python": platform.python_version(),
        **{f"pkg.{k}": v for k, v in _packages().items()},
        **_gpus(),
        **_toolkits(),
        **_nccl_env(),
    }
    interfaces = net.interfaces() or sorted(name for _, name in socket.if_nameindex())
    return {
        "hostname": socket.gethostname(),
        "python_executable": sys.executable,
        "interfaces": interfaces,
        "links": links(),
        # Slurm's client in this login: the cluster's slurm stage runs where a node has it.
        "slurm_srun": shutil.which("srun"),
        "facts": compared,
        # The job variables this login got from a login file that is not gpuenv's: a node whose
        # checks fail names them (pipeline.check_stage).
        "login_env": login_env.job_variables("/", os.path.expanduser("~"), os.environ),
    }


def listen(host: str, port: int, expect: int, seconds: float) -> dict[str, Any]:
    """Accept ``expect`` connections on host:port, or stop at the deadline; report the peers."""
    deadline = time.monotonic() + seconds
    peers: list[str] = []
    with socket.create_server((host, port), reuse_port=False) as server:
        print(json.dumps({"listening": port}), flush=True)
        while len(peers) < expect:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                break
            with conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    peers.append(conn.recv(256).decode("utf-8", "replace").strip())
                except OSError:
                    continue
    return {"port": port, "peers": peers}


def connect(host: str, port: int, name: str, seconds: float) -> dict[str, Any]:
    """Reach host:port, retrying until the deadline (the listener may start a moment later)."""
    deadline = time.monotonic() + seconds
    error = ""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=2.0) as conn:
                conn.sendall(name.encode())
            return {"reached": True}
        except OSError as exc:
            error = str(exc)
            time.sleep(0.2)
    return {"reached": False, "error": error or "deadline passed"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuenv.cluster.probe")
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("facts")
    sub.add_parser("counters")
    lis = sub.add_parser("listen")
    lis.add_argument("--host", default="")
    lis.add_argument("--port", type=int, required=True)
    lis.add_argument("--expect", type=int, required=True)
    lis.add_argument("--seconds", type=float, required=True)
    con = sub.add_parser("connect")
    con.add_argument("--host", required=True)
    con.add_argument("--port", type=int, required=True)
    con.add_argument("--name", required=True)
    con.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    if args.what == "facts":
        out = facts()
    elif args.what == "counters":
        out = {"counters": net.all_port_counters("/")}
    elif args.what == "listen":
        out = listen(args.host, args.port, args.expect, args.seconds)
    else:
        out = connect(args.host, args.port, args.name, args.seconds)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
