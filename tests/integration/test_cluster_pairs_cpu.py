"""The pair matrix inside the all-node launch, with real torchrun and gloo on emulated nodes.

Each emulated node is a local process group (Host.local) running its own torchrun, as the lab's
nodes run theirs over SSH: the same command lines, the same worker, the same parsing."""

import socket
import sys
import uuid

import pytest

from gpuenv.cluster import pipeline
from gpuenv.cluster.inventory import Host
from gpuenv.proc import processes_with_env
from gpuenv.results import Status

pytest.importorskip("torch")


def emulated(name, **kw):
    return Host(name, name, "127.0.0.1", local=True, python=sys.executable, **kw)


def by(run, check):
    return next(r for r in run.results if r.check == check and r.node == "cluster")


def options(**kw):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = dict(stages=("rendezvous", "torch", "pairs"), probe_deadline_s=20, port=port,
                deadline_s=60, sizes=[1 << 20], pair_bytes=1 << 20, iters=2,
                min_busbw=1e-6, pair_relative=0.01)  # fmt: skip
    # Structure, not speed: two cores shared by every rank make the pairs' figures noisy.
    return pipeline.Options(**{**base, **kw})


def test_the_matrix_comes_from_the_all_node_launch_in_rounds_of_disjoint_pairs():
    """4 nodes: 6 pairs in 3 rounds of 2 pairs at once, all measured in the one launch, and
    isolation does not run on a healthy cluster."""
    names = ["n1", "n2", "n3", "n4"]
    run = pipeline.validate([emulated(n) for n in names], options())
    assert by(run, "allreduce").status is Status.PASS, by(run, "allreduce").reason
    assert by(run, "ddp").status is Status.PASS
    matrix = by(run, "pair-matrix")
    assert matrix.status is Status.PASS, matrix.reason
    assert matrix.details == {"in_all_node_launch": 6, "own_launches": 0}
    assert {frozenset(p) for p in run.matrix} == {
        frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1 :]
    }
    assert all(v is not None and v > 0 for v in run.matrix.values())
    assert not any(r.check == "isolation" for r in run.results)


def test_pairs_use_one_rank_per_node_the_first():
    """2 nodes of 2 ranks each: the pair is the nodes' first ranks (the device a pair's own
    launch uses); the worker checks the pair's sum against exactly those two ranks."""
    run = pipeline.validate([emulated("n1"), emulated("n2")], options(nproc_per_node=2))
    assert "4 ranks on 2 nodes" in by(run, "allreduce").reason
    matrix = by(run, "pair-matrix")
    assert matrix.status is Status.PASS, matrix.reason
    assert matrix.details == {"in_all_node_launch": 1, "own_launches": 0}


def test_a_node_that_freezes_in_the_pair_phase_is_named_within_the_deadline():
    """n3's first rank stops (SIGSTOP) at the start of the pair phase. Rounds of [n1, n2, n3]:
    (n2, n3) first, n1 sitting out. n2 says it started the pair and waits; its pair operation
    times out at the phase's timeout (or the launch's deadline comes first on a loaded machine):
    either way the pair fails naming n3 as the node that never joined, the launch ends within
    its deadline, the pairs it did not reach get launches of their own (which pass: the fault is
    in the pair phase only), and the matrix FAILs. Sweep and DDP, reported before the phase,
    still count."""
    marker = f"gpuenv-freeze-{uuid.uuid4().hex}"
    fault = {"GPUENV_FAULT": "freeze:rank=2:check=cluster-pairs:stage=pair", "GPUENV_MARK": marker}
    hosts = [emulated("n1"), emulated("n2"), emulated("n3", env=fault)]
    opts = options(deadline_s=40)
    run = pipeline.validate(hosts, opts)
    assert by(run, "allreduce").status is Status.PASS, by(run, "allreduce").reason
    assert by(run, "ddp").status is Status.PASS
    matrix = by(run, "pair-matrix")
    assert matrix.status is Status.FAIL
    assert run.matrix[("n2", "n3")] is None
    assert "pairs failed: n2-n3 (" in matrix.reason
    assert "n3 never joined the pair (n2 waited)" in matrix.reason
    assert "the all-node launch failed in its pair phase: " in matrix.reason
    assert set(matrix.details["all_node_launch_failed"]) == {"n1", "n2", "n3"}
    assert matrix.details["in_all_node_launch"] == 1 and matrix.details["own_launches"] == 2
    assert run.matrix[("n1", "n3")] and run.matrix[("n1", "n2")]
    # The launch ended by its deadline (+ the fan-out's grace), and nothing is left behind.
    assert by(run, "allreduce").duration_s < opts.deadline_s + 10
    assert processes_with_env("GPUENV_MARK", marker) == []
