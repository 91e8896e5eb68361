"""NCCL versions known to hang or corrupt: the table's rows, the version rule, and the cluster
preflight naming them with the fixed version."""

from types import SimpleNamespace

import pytest
import yaml

from gpuenv.cluster.preflight import nccl_known_bad_result
from gpuenv.known_issues import TABLE, nccl_findings, nccl_issues, version_key
from gpuenv.results import Status


def test_every_row_has_a_source_a_fixed_version_or_none_and_a_severity():
    rows = yaml.safe_load(TABLE.read_text())["nccl"]
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert row["source"].startswith("https://github.com/"), row
        assert row["severity"] in ("error", "warning"), row
        assert row["fixed"] is None or version_key(row["fixed"]), row
        assert row.get("versions") or row.get("from"), row
    assert len(nccl_issues()) == len(rows)


@pytest.mark.parametrize(
    ("version", "ids"),
    [
        ("2.29.2", {"nccl-2.29.2-hang", "nccl-symmetric-coherency"}),
        ("2.29.2-1", {"nccl-2.29.2-hang", "nccl-symmetric-coherency"}),
        ("2.29.3", {"nccl-symmetric-coherency"}),
        ("2.30.4+cuda13.2", {"nccl-2.30.4-nvls-hang", "nccl-symmetric-coherency"}),
        ("2.30.7", {"nccl-2.30.4-nvls-hang"}),  # the coherency fix, not the NVLS one
        ("2.27.7", set()),
        ("2.31.2", set()),
        ("unknown", set()),
    ],
)
def test_which_rows_a_version_meets(version, ids):
    assert {i.id for i in nccl_findings(version)} == ids


def _probe(**facts):
    return {"facts": facts}


def test_preflight_fails_on_a_version_that_hangs_in_any_use_naming_the_fix():
    hosts = [SimpleNamespace(name="n1"), SimpleNamespace(name="n2")]
    n2 = {"pkg.nvidia-nccl-cu12": "2.29.2", "nccl.system": "2.27.7-1+cuda12.9"}
    probes = {"n1": _probe(**{"pkg.nvidia-nccl-cu12": "2.27.7"}), "n2": _probe(**n2)}
    r = nccl_known_bad_result(hosts, probes)
    assert r.status is Status.FAIL
    assert "n2: nvidia-nccl-cu12 NCCL 2.29.2: hang" in r.reason
    assert "fixed in 2.29.3" in r.reason and "pytorch/pytorch/pull/174338" in r.reason
    assert "n1" not in r.details["known_bad"][0].split(":")[0]
    assert r.details["versions"]["n2"] == {
        "nvidia-nccl-cu12": "2.29.2",
        "libnccl2": "2.27.7-1+cuda12.9",
    }


def test_preflight_names_a_conditional_fault_and_goes_on():
    r = nccl_known_bad_result(
        [SimpleNamespace(name="n1")], {"n1": _probe(**{"pkg.nvidia-nccl-cu13": "2.30.4"})}
    )
    assert r.status is Status.PASS
    assert "under conditions: n1: nvidia-nccl-cu13 NCCL 2.30.4: hang (NVLS path" in r.reason
    assert "no fixed release known" in r.reason


def test_preflight_judges_each_nodes_toolkit_against_its_driver_by_number():
    from gpuenv.cluster.preflight import cuda_compat_result

    hosts = [SimpleNamespace(name=n) for n in ("n1", "n2", "n3")]
    probes = {
        "n1": _probe(**{"cuda.toolkit": "12.8", "cuda.driver_api": "12.9", "driver": "575.51.03"}),
        "n2": _probe(**{"cuda.toolkit": "13.0", "cuda.driver_api": "12.9", "driver": "575.51.03"}),
        "n3": _probe(**{"cuda.toolkit": "13.0", "cuda.driver_api": "12.2", "cuda.compat": "13.0"}),
    }
    r = cuda_compat_result(hosts, probes)
    assert r.status is Status.FAIL
    assert list(r.details["failing"]) == ["n2"]
    assert "n2: CUDA 13.0 needs a CUDA 13.x driver" in r.reason
    assert r.details["judged"]["n3"].startswith("CUDA 13.0 through cuda-compat 13.0")
    ok = cuda_compat_result(hosts[:1], probes)
    assert ok.status is Status.PASS and "n1: CUDA 12.8 <= CUDA 12.9" in ok.reason
    none = cuda_compat_result(hosts[:1], {"n1": _probe(**{"cuda.driver_api": "12.9"})})
    assert none.status is Status.SKIP
