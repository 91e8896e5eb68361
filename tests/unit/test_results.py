import pytest

from gpuenv.results import Measurement, Result, Status, exit_code, overall_ok


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


def test_exit_code_counts_fail_and_error_not_skip():
    ok = Result("a", "n", Status.PASS)
    skip = Result("b", "n", Status.SKIP, reason="no GPU")
    err = Result("c", "n", Status.ERROR, reason="boom")
    assert overall_ok([ok, skip]) and exit_code([ok, skip]) == 0
    assert exit_code([ok, err]) == 1
