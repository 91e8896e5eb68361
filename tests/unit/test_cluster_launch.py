"""The mpirun command the cluster runner sends to the first node, run here against a fake mpirun."""

import os
import subprocess

from gpuenv.cluster import launch
from gpuenv.cluster.inventory import Host


def _hosts(tmp_path, *addresses):
    hostfile = tmp_path / "mpi-hostfile"
    hostfile.write_text(
        "# Open MPI hostfile\n10.0.0.1 slots=2\n10.0.0.11 slots=2\n"
        "10.0.0.2 slots=1\n10.0.0.3 slots=1\n"
    )
    return [
        Host(name=f"n{i}", address=a, rendezvous_address=a, hostfile=str(hostfile))
        for i, a in enumerate(addresses)
    ]


def _run(tmp_path, command):
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    fake = bindir / "mpirun"
    # The fake mpirun prints the hostfile it was given, then its arguments.
    fake.write_text('#!/bin/sh\ncat "$2"\necho "ARGS $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env)


def test_selection_is_taken_from_the_generated_hostfile(tmp_path):
    hosts = _hosts(tmp_path, "10.0.0.1", "10.0.0.3")
    out = _run(tmp_path, launch.mpirun(hosts[0], hosts, 1024, 2))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # Only the selected nodes, with the slots the mpi role wrote; 10.0.0.11 is not 10.0.0.1.
    assert lines[:2] == ["10.0.0.1 slots=2", "10.0.0.3 slots=1"]
    assert "--host " not in lines[2]
    assert "-np 2" in lines[2] and "--map-by ppr:1:node" in lines[2]


def test_node_missing_from_the_hostfile_is_named(tmp_path):
    hosts = _hosts(tmp_path, "10.0.0.1", "10.0.0.9")
    out = _run(tmp_path, launch.mpirun(hosts[0], hosts, 1024, 2))
    assert out.returncode == 1
    assert "10.0.0.9 is not in" in out.stderr
    assert "ARGS" not in out.stdout


OMPI5 = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
ModuleNotFoundError: No module named 'mpi4py'
--------------------------------------------------------------------------
prterun detected that one or more processes exited with non-zero status,
thus causing the job to be terminated. The first process to do so was:

   Process name: [prterun-cl-node1-3640@1,1]
   Exit code:    1
--------------------------------------------------------------------------
"""
OMPI4 = """ModuleNotFoundError: No module named 'mpi4py'
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[41233,1],2]
  Exit code:    1
"""


def test_the_node_whose_rank_failed_is_named():
    from gpuenv.cluster.causes import mpirun_failure
    from gpuenv.cluster.fanout import NodeAnswer

    hosts = [Host(n, n, n) for n in ("n1", "n2", "n3")]

    def failure(stderr):
        return mpirun_failure(NodeAnswer("n1", 1, stderr=stderr), hosts, {}, local=False)

    assert failure(OMPI5) == (
        "rank 1 on n2 failed: ModuleNotFoundError: No module named 'mpi4py' (exit status 1)"
    )
    assert failure(OMPI4).startswith("rank 2 on n3 failed")
    assert failure("segmentation fault") == "exit status 1: segmentation fault"


def test_the_pair_phase_options_reach_the_worker_through_torchrun():
    """torchrun's own parser abbreviates options: the worker's must not look like one of its
    (``--node`` was taken for ``--node-rank``)."""
    import shlex

    import pytest

    from gpuenv.cluster.worker import PairPhase

    run = pytest.importorskip("torch.distributed.run")
    host = Host(name="n1", address="10.0.0.1", rendezvous_address="10.0.0.1")
    phase = PairPhase(("n1", "n2"), 1 << 20, 3, 12.5)
    argv = shlex.split(launch.torchrun(host, host, 2, 29400, "all-1", 1, [1 << 20], 5, 5, 60.0,
                                       phase))  # fmt: skip
    args = run.get_args_parser().parse_args(argv[1:])
    assert args.module and args.training_script == "gpuenv.cluster.worker"
    assert args.training_script_args[-4:] == [
        "--node-name=n1", "--pair-nodes=n1,n2", "--pair-bytes=1048576", "--pair-timeout=12",
    ]  # fmt: skip


def test_a_torch_rank_dies_with_its_agent_even_when_stopped():
    """torchrun starts each rank in a session of its own: when the agent is killed (a launch's
    deadline), a rank that is stopped or stuck must not outlive it."""
    import signal
    import sys
    import time

    rank = (
        "from gpuenv.cluster.worker import _die_with_parent; _die_with_parent();"
        " print('ready', flush=True); import time; time.sleep(120)"
    )
    agent = (
        "import subprocess, sys, time;"
        f" p = subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True,"
        " stdout=subprocess.PIPE, text=True); p.stdout.readline();"
        " print(p.pid, flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", agent], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(child, signal.SIGSTOP)
    parent.kill()
    parent.wait()

    def gone():
        try:
            with open(f"/proc/{child}/stat") as fh:
                return fh.read().split(") ")[1].startswith("Z")
        except FileNotFoundError:
            return True

    give_up_at = time.monotonic() + 10
    while not gone() and time.monotonic() < give_up_at:
        time.sleep(0.1)
    if not gone():
        os.kill(child, signal.SIGKILL)
        raise AssertionError(f"rank {child} outlived its agent")


def test_the_worker_accepts_every_launch_command_line(monkeypatch):
    """What launch builds for the worker, the worker's own parser takes: the torch stage (with
    and without the pair phase), mpi and both sides of dask."""
    import shlex

    from gpuenv.cluster import worker
    from gpuenv.cluster.worker import PairPhase

    seen = []
    monkeypatch.setattr(worker, "run_dask", lambda *a: seen.append(("dask", a)))
    monkeypatch.setattr(worker, "run_mpi", lambda *a: seen.append(("mpi", a)))
    first = Host(name="n1", address="10.0.0.1", rendezvous_address="10.0.0.1", python="python3")
    other = Host(name="n2", address="10.0.0.2", rendezvous_address="10.0.0.2", python="python3")
    for host in (first, other):
        argv = shlex.split(launch.dask(host, first, 29464, "dask-1", 2, 0, 4, "numpy",
                                       (512, 128), 60.0))  # fmt: skip
        assert worker.main(argv[argv.index("gpuenv.cluster.worker") + 1 :]) == 0
    assert [a[-2] for _, a in seen] == ["n1", "n2"]  # each node's inventory name
    assert [a[4] for _, a in seen] == [True, False]  # the first node runs the client
    argv = shlex.split(launch.mpirun(first, [first, other], 1 << 20, 3))
    if "gpuenv.cluster.worker" in argv:
        assert worker.main(argv[argv.index("gpuenv.cluster.worker") + 1 :]) == 0
    phase = PairPhase(("n1", "n2"), 1 << 20, 3, 12.5)
    parser_argv = shlex.split(
        launch.torchrun(first, first, 2, 29400, "all-1", 1, [1 << 20], 5, 5, 60.0, phase)
    )
    worker_args = parser_argv[parser_argv.index("gpuenv.cluster.worker") + 1 :]
    monkeypatch.setattr(worker, "run_torch", lambda *a: seen.append(("torch", a)) or True)
    monkeypatch.setattr(worker, "_die_with_parent", lambda: None)
    monkeypatch.setattr(worker.os, "_exit", lambda code: seen.append(("exit", code)))
    worker.main(worker_args)
    assert seen[-2][0] == "torch" and seen[-2][1][4] == "n1" and seen[-1] == ("exit", 0)
