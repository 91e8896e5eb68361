"""Command lines for the real launchers, and the parsing of what their ranks report.

Every command runs as the cluster user in an SSH login of that user on the node (the transport,
``fanout.remote_command``), with the programs a user types: ``torchrun`` and ``mpirun``, and
``python3`` (the inventory's ``gpuenv_cluster_python`` where set). So a node whose login
environment does not find the cluster's Python stack fails here, as the user's own jobs would,
instead of passing because gpuenv called a venv by path.

torchrun with c10d rendezvous starts the ranks on every node; the master node hosts the
rendezvous store (``is_host`` is set explicitly, so several emulated nodes on one machine cannot
race for it). mpirun starts the MPI ranks from the first node over the SSH mesh with the
hostfile the ``mpi`` role generated; the remote ranks' ``python3`` is found through the
environment the roles give non-login SSH sessions.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from typing import Any

from gpuenv.cluster.fanout import NodeAnswer
from gpuenv.cluster.inventory import Host
from gpuenv.cluster.worker import MARK, PairPhase


def torchrun(
    host: Host,
    master: Host,
    nnodes: int,
    port: int,
    run_id: str,
    nproc: int,
    sizes: Sequence[int],
    iters: int,
    steps: int,
    timeout_s: float,
    pairs: PairPhase | None = None,
) -> str:
    """One node's torchrun of the all-node launch (or of a pair's own 2-node launch); with
    ``pairs``, its ranks measure the pair matrix after the sweep and DDP (worker.pair_phase)."""
    # On a real node the user's torchrun; an emulated (local) node uses the inventory's Python.
    launcher = [host.python, "-m", "torch.distributed.run"] if host.local else ["torchrun"]
    argv = [
        *launcher,
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={master.rendezvous_address}:{port}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=join_timeout={max(10, int(timeout_s))},is_host={int(host is master)}",
        "--max-restarts=0",
        "-m",
        "gpuenv.cluster.worker",
        "torch",
        f"--sizes={','.join(str(s) for s in sizes)}",
        f"--iters={iters}",
        f"--steps={steps}",
        f"--timeout={max(10, int(timeout_s))}",
    ]
    if pairs is not None:
        argv += [
            f"--node-name={host.name}",
            f"--pair-nodes={','.join(pairs.nodes)}",
            f"--pair-bytes={pairs.nbytes}",
            f"--pair-timeout={max(1, int(pairs.timeout_s))}",
        ]
    return shlex.join(argv)


def mpirun(master: Host, hosts: Sequence[Host], nbytes: int, iters: int) -> str:
    """mpirun on the first node; for emulated (local) nodes, all ranks on this machine."""
    worker = [master.python, "-m", "gpuenv.cluster.worker", "mpi", f"--bytes={nbytes}"]
    worker += [f"--iters={iters}"]
    if master.local:
        argv = ["mpirun", "--oversubscribe", "-np", str(len(hosts)), *worker]
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])
    # One rank per node, on the nodes of the selection only. The generated hostfile may list
    # more nodes; Open MPI 5 rejects `--hostfile F --host <addresses>` when the launching node
    # is among them ("not enough slots"), so the selection's lines are taken from the generated
    # hostfile into a private copy, and a node missing from it stops the launch by name.
    addresses = [h.rendezvous_address for h in hosts]
    mpirun_argv = ["mpirun", "--hostfile", "$sel", "--map-by", "ppr:1:node"]
    mpirun_argv += ["-np", str(len(hosts)), *worker]
    script = "\n".join(
        [
            "set -u",
            "sel=$(mktemp) && trap 'rm -f \"$sel\"' EXIT",
            f"for a in {shlex.join(addresses)}; do",
            f"  awk -v a=\"$a\" '$1 == a {{print; f=1; exit}} END {{exit !f}}' "
            f'{shlex.quote(master.hostfile)} >>"$sel" ||',
            f'    {{ echo "gpuenv: $a is not in {master.hostfile}" >&2; exit 1; }}',
            "done",
            " ".join(shlex.quote(a) if a != "$sel" else '"$sel"' for a in mpirun_argv),
        ]
    )
    return shlex.join(["bash", "-c", script])


def dask(
    host: Host,
    master: Host,
    port: int,
    run_id: str,
    workers: int,
    gpus: int,
    total: int,
    blocks: str,
    size: tuple[int, int],
    timeout_s: float,
) -> str:
    """One node's part of the dask stage: plain ``python3`` (the inventory's interpreter) runs
    the scheduler and the client on the first node, and every node's workers."""
    argv = [
        host.python, "-m", "gpuenv.cluster.worker", "dask",
        f"--scheduler={master.rendezvous_address}:{port}", f"--workers={workers}",
        f"--gpus={gpus}", f"--total={total}", f"--blocks={blocks}", f"--n={size[0]}",
        f"--chunk={size[1]}", f"--run-id={run_id}", f"--node-name={host.name}",
        f"--timeout={max(10, int(timeout_s))}",
    ]  # fmt: skip
    if host is master:
        argv.append("--client")
    return shlex.join(argv)


def stop_dask(rid: str) -> str:
    """A command that ends one dask launch on a node: its driver, which ends its scheduler and
    workers on SIGTERM (the bracket keeps pkill from matching its own command line)."""
    return f"pkill -TERM -f -- 'run-id=[{rid[0]}]{rid[1:]}' || true"


def payloads(outcome: NodeAnswer) -> list[dict[str, Any]]:
    """The GPUENV_RESULT lines a node's ranks printed."""
    found = []
    for line in outcome.stdout.splitlines():
        idx = line.find(MARK)
        if idx >= 0:
            try:
                found.append(json.loads(line[idx + len(MARK) :]))
            except json.JSONDecodeError:
                continue
    return found


def run_id(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}"


def stop(rid: str) -> str:
    """A command that ends one launch's processes on a node (its torchrun agent, which takes
    its workers down with it). The bracket keeps pkill from matching its own command line."""
    return f"pkill -TERM -f -- 'rdzv-id=[{rid[0]}]{rid[1:]}' || true"


# mpirun names the first rank that failed: Open MPI 5 `[prterun-HOST-PID@1,RANK]`,
# Open MPI 4 `[[JOB,1],RANK]`.
_FAILED_RANK = re.compile(r"Process name:\s*\[(?:prterun-\S+@\d+|\[\d+,\d+\]),(\d+)\]")


def mpirun_failed_rank(stderr: str, hosts: Sequence[Host]) -> str | None:
    """The rank mpirun names as the first that failed, and its node: ``rank 1 on n2``.

    With one rank per node in hostfile order (``--map-by ppr:1:node``), rank i is the i-th host.
    """
    m = _FAILED_RANK.search(stderr)
    if m is None:
        return None
    rank = int(m.group(1))
    return f"rank {rank} on {hosts[rank].name}" if rank < len(hosts) else f"rank {rank}"
