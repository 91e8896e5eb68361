"""The cluster stages' rules (gpuenv.cluster.judge) on plain data, without a node."""

from gpuenv.checks import nccl_log
from gpuenv.cluster import judge, pairs
from gpuenv.results import CLUSTER_NODE, Status

MIB = 1 << 20


def test_a_pair_that_failed_or_is_slow_fails_the_matrix_and_names_the_pair():
    matrix = {("a", "b"): 10.0, ("a", "c"): 9.0, ("b", "c"): 2.0, ("c", "d"): None}
    result, marks = judge.pair_matrix(matrix, None, 0.5, 64 * MIB, 1.0)
    assert result.status is Status.FAIL and result.node == CLUSTER_NODE
    assert "pairs failed: c-d" in result.reason and "b-c (2.00 GB/s)" in result.reason
    assert marks == {"pair_median_gbps": 9.0, "pair_relative_gbps": 4.5, "pair_floor_gbps": None}


def test_a_matrix_without_a_floor_is_not_judged_and_one_above_its_floor_passes():
    matrix = {("a", "b"): 10.0, ("a", "c"): 9.5, ("b", "c"): 9.0}
    unjudged, _ = judge.pair_matrix(matrix, None, 0.5, 64 * MIB, 1.0)
    assert unjudged.status is Status.SKIP and "NOT JUDGED" in unjudged.reason
    passed, _ = judge.pair_matrix(matrix, 8.0, 0.5, 64 * MIB, 1.0)
    assert passed.status is Status.PASS and "every pair >= 8.00 GB/s" in passed.reason
    below, _ = judge.pair_matrix(matrix, 9.2, 0.5, 64 * MIB, 1.0)
    assert below.status is Status.FAIL and "below the floor 9.20 GB/s: b-c" in below.reason


def test_busbw_over_gloo_has_no_floor_to_derive_and_is_not_a_pass():
    bw = judge.Bandwidth(
        {"a": [{"busbw_gbps": 3.0}], "b": [{"busbw_gbps": 2.5}]},
        "gloo", nccl_log.Transports(), 12.5, {}, None, 64 * MIB,
    )  # fmt: skip
    result, floor = judge.busbw(bw)
    assert floor is None and result.status is Status.SKIP
    assert result.reason.startswith("busbw 2.50 GB/s at 64 MiB NOT JUDGED: gloo has no NCCL")
    bw.min_busbw = 2.0
    result, floor = judge.busbw(bw)
    assert floor == 2.0 and result.status is Status.PASS


def test_mpi_ranks_on_too_few_hosts_fail():
    payload = {"world_size": 3, "rank_hosts": ["h1", "h1", "h2"], "correct": True,
               "busbw_gbps": 1.0, "mpi": "Open MPI v4.1.4", "python": "python3"}  # fmt: skip
    result = judge.mpi(payload, 3, 3, "mpirun ...", 2.0)
    assert result.status is Status.FAIL and "expected ranks on 3 hosts" in result.reason
    assert judge.mpi(payload, 3, 2, "mpirun ...", 2.0).status is Status.PASS


def test_isolation_names_what_it_found():
    iso = pairs.Isolation(["c"], [("a", "b")], [], threshold=4.0)
    result = judge.isolation(iso, 1.0)
    assert result.status is Status.FAIL
    assert result.reason == "bad node(s): c; bad link(s): a-b"


def test_dask_names_the_node_without_a_report_and_what_was_left_running():
    client = {"kind": "dask", "n": 64, "workers": ["w1", "w2"], "workers_used": ["w1", "w2"],
              "worker_hosts": ["10.0.0.1", "10.0.0.2"], "result_type": "numpy",
              "max_abs_err": 0.0, "blocks": "numpy", "compute_s": 0.1, "dask": "x",
              "distributed": "x", "exit_codes": [0, 0]}  # fmt: skip
    run = judge.DaskRun(
        {"a": client, "b": {"kind": "dask-node", "exit_codes": [0], "left_running": ["42"]},
         "c": "exit status 1: boom"},
        total=2, distinct_gpus=0, emulated=False, blocks="numpy", scheduler="a:29464",
        duration_s=3.0,
    )  # fmt: skip
    result = judge.dask(run)
    assert result.status is Status.FAIL
    assert result.reason.startswith("c: exit status 1: boom; b: still running after shutdown: 42")
    assert (
        result.details["left_running"] == {"b": ["42"]} and result.details["scheduler"] == "a:29464"
    )


def test_a_pair_that_failed_in_the_all_node_launch_says_why_and_the_launch_failure_fails():
    matrix = {("a", "b"): 10.0, ("a", "c"): 9.5, ("b", "c"): None}
    notes = {("b", "c"): "b: RuntimeError after 10.0 s: timed out; c never joined the pair"}
    failures = {"b": "exit status 1", "c": "stopped because b failed first"}
    result, _ = judge.pair_matrix(matrix, 1.0, 0.5, 64 * MIB, 1.0, notes=notes, in_launch=3,
                                  launch_failures=failures)  # fmt: skip
    assert result.status is Status.FAIL
    assert f"pairs failed: b-c ({notes[('b', 'c')]})" in result.reason
    assert (
        "the all-node launch failed in its pair phase: b: exit status 1;"
        " c: stopped because b failed first" in result.reason
    )
    assert result.details == {"in_all_node_launch": 3, "own_launches": 0,
                              "all_node_launch_failed": failures}  # fmt: skip
    # Every pair measured and passing, but the launch failed in its pair phase: still a FAIL.
    healthy = {("a", "b"): 10.0, ("a", "c"): 9.5, ("b", "c"): 9.0}
    result, _ = judge.pair_matrix(healthy, 1.0, 0.5, 64 * MIB, 1.0, launch_failures=failures)
    assert result.status is Status.FAIL and "failed in its pair phase" in result.reason
