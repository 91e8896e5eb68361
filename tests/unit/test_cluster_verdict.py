"""The cluster verdict: a one-node cluster is judged by the checks that make sense for one node."""

from test_cluster_pipeline import emulated, opts

from gpuenv.checks.profiles import EXCUSED_ONE_NODE, assess_cluster
from gpuenv.checks.thresholds import load_thresholds
from gpuenv.cluster import pipeline
from gpuenv.results import Result, RunReport, RunVerdict, Status

STAGES = ("consistency", "rendezvous", "torch", "mpi", "pairs")


def _healthy_node(name):
    """A CPU node whose own run is OK by the cpu profile (its `gpuenv check` report)."""
    results = [Result(c, name, Status.PASS, "ok") for c in ("mpi", "ddp")]
    verdict = RunVerdict(ok=True, profile="cpu", node_kind="cpu", required=["mpi", "ddp"])
    return RunReport(node=name, profile="cpu", verdict=verdict, results=results)


def _judge(hosts, stages=STAGES):
    """``hosts`` validated as emulated nodes; a name starting with "dead" does not answer."""
    nodes = [
        emulated(h, python="/bin/false") if h.startswith("dead") else emulated(h) for h in hosts
    ]
    report = pipeline.validate(nodes, opts(stages=stages))
    for host in hosts:
        if any(r.check == "reach" and r.node == host and r.status is Status.PASS
               for r in report.results):  # fmt: skip
            report.node_reports[host] = _healthy_node(host)
            report.results.extend(report.node_reports[host].results)
    report.verdict = assess_cluster(load_thresholds(), "cpu", report)
    return report


def test_a_healthy_one_node_cluster_is_ok_and_the_excused_skips_say_so():
    report = _judge(["node1"])
    assert report.verdict.ok, report.verdict.problems
    skipped = [r for r in report.results if r.status is Status.SKIP]
    # the torch stage's own checks say it did not run, under the names the profile requires
    assert {r.check for r in skipped} == {*STAGES, "allreduce", "busbw", "ddp"}
    for r in skipped:
        assert r.reason.endswith(f"({EXCUSED_ONE_NODE})"), r.reason
    assert "nothing to compare" in next(r.reason for r in skipped if r.check == "consistency")


def test_a_one_node_cluster_whose_node_is_not_ok_is_not_ok():
    report = _judge(["node1"])
    report.node_reports["node1"].verdict = RunVerdict(
        ok=False, profile="cpu", node_kind="cpu", problems=["required check mpi did not run: x"]
    )
    verdict = assess_cluster(load_thresholds(), "cpu", report)
    assert not verdict.ok and "node1: required check mpi did not run: x" in verdict.problems


def test_one_node_answering_of_several_is_not_excused():
    """Two nodes were to be compared and run together: one that answered alone proves neither."""
    report = _judge(["node1", "dead"])
    assert not report.verdict.ok
    assert any("required check consistency did not run" in p for p in report.verdict.problems)
    assert not any(EXCUSED_ONE_NODE in r.reason for r in report.results)


def test_the_excuse_is_said_once_when_judged_twice():
    report = _judge(["node1"])
    again = assess_cluster(load_thresholds(), "cpu", report)
    assert again.ok
    reasons = [r.reason for r in report.results if r.check == "consistency"]
    assert reasons[0].count(EXCUSED_ONE_NODE) == 1


def test_leaving_out_the_check_stage_never_passes_a_gpu_node():
    report = _judge(["node1", "node2"], stages=("consistency",))
    report.node_reports.clear()
    report.results = [r for r in report.results if r.node == "cluster" or r.check == "reach"]
    report.facts["node2"]["gpu.count"] = "8"
    verdict = assess_cluster(load_thresholds(), "cpu", report)
    assert not verdict.ok and verdict.node_kind == "gpu"
    assert (
        "node2: GPU node (8 GPU(s) seen by nvidia-smi): GPUs not verified: no gpuenv check ran"
        " there (the check stage was left out)"
    ) in verdict.problems
    report.facts["node2"]["gpu.count"] = "0"  # CPU-only nodes: the stage may be left out
    assert assess_cluster(load_thresholds(), "cpu", report).ok


def test_the_probe_facts_are_in_the_report_without_the_consistency_stage():
    report = _judge(["node1"], stages=("rendezvous",))
    assert "gpu.count" in report.facts["node1"]


def test_a_required_check_whose_stage_could_not_run_is_not_taken_for_one_left_out(monkeypatch):
    """torch missing from the nodes: the torch stage cannot run, so allreduce and ddp, which the
    profile requires, did not run; only a stage the user left out (--skip) is left out."""
    monkeypatch.setitem(pipeline._PACKAGES, "torch", "gpuenv_no_such_package")
    report = _judge(["node1", "node2"])
    assert not report.verdict.ok
    assert any(
        p.startswith("required check allreduce did not run: the torch stage did not run:")
        and "gpuenv_no_such_package is not installed on any node" in p
        for p in report.verdict.problems
    ), report.verdict.problems
    left_out = _judge(["node1", "node2"], stages=("consistency", "rendezvous", "mpi"))
    assert left_out.verdict.ok, left_out.verdict.problems


def _left_node(name, left):
    """A node run that left ``left`` to the cluster's launches (gpuenv check --left-to-cluster)."""
    from gpuenv.checks.profiles import LEFT_TO_CLUSTER

    problem = (
        f"{LEFT_TO_CLUSTER}{', '.join(left)} (--left-to-cluster): this run did not verify them"
    )
    verdict = RunVerdict(
        ok=False, profile="cpu", node_kind="cpu", problems=[problem], left_to_cluster=list(left)
    )
    results = [Result("system", name, Status.PASS, "ok")]
    return RunReport(node=name, profile="cpu", verdict=verdict, results=results)


def test_a_node_run_that_left_checks_is_ok_only_beside_the_results_that_stand_for_them():
    from gpuenv.results import CLUSTER_NODE

    report = _judge(["node1", "node2"])
    assert report.verdict.ok, report.verdict.problems
    for host in ("node1", "node2"):
        report.node_reports[host] = _left_node(host, ["ddp", "mpi"])
    cluster = {r.check: r for r in report.results if r.node == CLUSTER_NODE}
    # The cluster's ddp and mpi name both nodes: they stand for the nodes' checks.
    for check in ("ddp", "mpi"):
        cluster[check].details["node_checks_left_here"] = ["node1", "node2"]
    verdict = assess_cluster(load_thresholds(), "cpu", report)
    assert verdict.ok, verdict.problems
    # In the cluster's report, each node's verdict has that problem settled.
    assert all(report.node_reports[h].verdict.ok for h in ("node1", "node2"))
    # The cluster's mpi stands for node1 only: node2's mpi stands nowhere.
    for host in ("node1", "node2"):
        report.node_reports[host] = _left_node(host, ["ddp", "mpi"])
    cluster["mpi"].details["node_checks_left_here"] = ["node1"]
    verdict = assess_cluster(load_thresholds(), "cpu", report)
    assert not verdict.ok
    assert [p for p in verdict.problems if p.startswith("node2: left to gpuenv cluster")]
    assert report.node_reports["node1"].verdict.ok and not report.node_reports["node2"].verdict.ok
    # A skipped covering result stands for nothing.
    for host in ("node1", "node2"):
        report.node_reports[host] = _left_node(host, ["ddp", "mpi"])
    cluster["mpi"].details["node_checks_left_here"] = ["node1", "node2"]
    cluster["mpi"].status, cluster["mpi"].reason = Status.SKIP, "mpirun not found"
    assert not assess_cluster(load_thresholds(), "cpu", report).ok
