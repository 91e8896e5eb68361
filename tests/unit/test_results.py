import pytest

from gpuenv.results import Measurement, Result, RunReport, RunVerdict, Status, any_failed


def test_skip_without_reason_is_rejected():
    with pytest.raises(ValueError, match="must say why"):
        Result(check="cupy", node="n1", status=Status.SKIP)


def test_round_trip_through_dict():
    r = Result(
        check="nccl",
        node="n1",
        status=Status.PASS,
        measurements=[Measurement("busbw", 300.0, "GB/s", threshold=250.0, bound="min")],
        versions={"nccl": "2.28.9"},
        duration_s=1.5,
        details={"sizes": [1, 2]},
    )
    data = r.to_dict()
    assert data["status"] == "PASS"
    assert Result.from_dict(data) == r


@pytest.mark.parametrize(
    ("value", "bound", "expected"),
    [(300.0, "min", True), (200.0, "min", False), (5.0, "max", False), (1.0, "max", True)],
)
def test_measurement_judgement(value, bound, expected):
    threshold = 250.0 if bound == "min" else 2.0
    assert Measurement("x", value, threshold=threshold, bound=bound).ok() is expected


def test_unjudged_measurement():
    assert Measurement("model", "H200").ok() is None


def test_any_failed_counts_fail_and_error_not_skip():
    ok = Result("a", "n", Status.PASS)
    skip = Result("b", "n", Status.SKIP, reason="no GPU")
    err = Result("c", "n", Status.ERROR, reason="boom")
    assert not any_failed([ok, skip])
    assert any_failed([ok, err])


def test_a_verdict_refuses_to_contradict_itself():
    with pytest.raises(ValueError, match="must say why"):
        RunVerdict(ok=False, profile="quick", node_kind="gpu")
    with pytest.raises(ValueError, match="cannot list problems"):
        RunVerdict(ok=True, profile="quick", node_kind="gpu", problems=["x"])
    with pytest.raises(ValueError, match="node_kind"):
        RunVerdict(ok=True, profile="quick", node_kind="tpu")


def test_run_report_round_trip_and_refusals():
    verdict = RunVerdict(ok=False, profile="cpu", node_kind="cpu", problems=["mpi FAIL: x"])
    report = RunReport("n1", "cpu", verdict, [Result("mpi", "n1", Status.FAIL, "x")])
    data = report.to_dict()
    assert data["ok"] is False and data["exit_code"] == 1
    again = RunReport.from_dict(data)
    assert again.verdict == verdict and again.results == report.results
    with pytest.raises(ValueError, match="not a gpuenv-check report"):
        RunReport.from_dict({**data, "kind": "gpuenv-cluster"})
    with pytest.raises(ValueError, match="schema_version 1 is not supported"):
        RunReport.from_dict({**data, "schema_version": 1})
