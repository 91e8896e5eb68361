"""A missing answer is not a pass, and degraded is not healthy (issue 32, items 2 and 3), beyond
the mutation table: the nvidia-ml-py backend keeps NVML's errors, a GPU without peers is judged
on what it and its model say, and what peers share (an administrator's cap) is no finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from healthnode import build
from test_health_nvml import FakePynvml, NVMLError

from gpuenv.checks.thresholds import load_thresholds
from gpuenv.floor import fabric
from gpuenv.health import rules
from gpuenv.health.expect import READS, Expected, expectations, read_findings
from gpuenv.health.nvml import FakeNvml, GpuReading, PynvmlNvml
from gpuenv.health.scan import scan

TH = load_thresholds()["health"]
NOW_UNIX = 1_780_000_000.0


class CodedError(NVMLError):
    """pynvml's NVMLError carries its nvmlReturn_t code in ``value``."""

    def __init__(self, value: int, words: str) -> None:
        super().__init__(words)
        self.value = value


def _pynvml_reading(tmp_path, fail: dict[str, Exception]) -> Any:
    reading = FakeNvml(build(tmp_path, "hgx8").nvml_data).read()

    class Failing(FakePynvml):
        def __getattribute__(self, name: str) -> Any:
            value = object.__getattribute__(self, name)
            if name in fail:

                def failing(*args: Any) -> Any:
                    if args and args[0] == 2:  # GPU 2 only
                        raise fail[name]
                    return value(*args)

                return failing
            return value

    return PynvmlNvml(Failing(reading)).read()


def test_an_nvml_error_other_than_not_supported_is_kept_and_becomes_a_finding(tmp_path):
    got = _pynvml_reading(
        tmp_path,
        {
            "nvmlDeviceGetRemappedRows": CodedError(999, "Unknown Error"),
            "nvmlDeviceGetPowerUsage": CodedError(3, "Not Supported"),
        },
    )
    gpu = got.gpus[2]
    assert gpu.remap_pending is None and gpu.power_w is None
    assert gpu.errors == {"nvmlDeviceGetRemappedRows": "Unknown Error"}  # not the NOT_SUPPORTED
    assert got.gpus[1].errors == {}
    found = read_findings(gpu, Expected(model="H100-SXM"))
    remap = [f for f in found if f.subject == "row_remap"]
    assert len(remap) == 1 and remap[0].action == "reset"
    assert "nvmlDeviceGetRemappedRows failed: Unknown Error" in remap[0].evidence


def test_a_lost_gpu_answer_is_a_reboot_and_a_missing_link_is_not_an_error(tmp_path):
    got = _pynvml_reading(
        tmp_path,
        {
            "nvmlDeviceGetTemperature": CodedError(15, "GPU is lost"),
            "nvmlDeviceGetNvLinkState": CodedError(2, "Invalid Argument"),
        },
    )
    gpu = got.gpus[2]
    assert gpu.errors == {"nvmlDeviceGetTemperature": "GPU is lost"}  # no link: not an error
    assert gpu.nvlinks is None
    [lost] = [f for f in read_findings(gpu, Expected(model="x")) if f.subject == "temperature"]
    assert lost.action == "reboot"


def test_an_nvlink_state_error_names_the_link(tmp_path):
    got = _pynvml_reading(tmp_path, {"nvmlDeviceGetNvLinkState": CodedError(999, "Timeout")})
    errors = got.gpus[2].errors
    assert len(errors) == 18 and errors["nvmlDeviceGetNvLinkState(link 17)"] == "Timeout"
    [found] = read_findings(got.gpus[2], Expected(model="H100-SXM"))  # one finding, not 18
    assert found.subject == "nvlinks" and found.action == "drain"
    assert "nvmlDeviceGetNvLinkState(link 0) failed: Timeout" in found.evidence
    assert "and 14 more" in found.evidence


def _gpu(**values: Any) -> GpuReading:
    base = {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-0",
        "bus_id": "0000:18:00.0",
        "temperature_c": 40,
        "pcie_gen": 5,
        "pcie_max_gen": 5,
        "pcie_width": 16,
        "pcie_max_width": 16,
    }
    return GpuReading(**{**base, **values})


@pytest.mark.parametrize(
    ("values", "subject", "action"),
    [
        # ECC on: the counters exist; with no repair state either, the memory is unjudged.
        ({"ecc_current": True, "ecc_pending": True}, "ecc.counters", "watch"),
        ({"ecc_current": True, "ecc_pending": True}, "row_remap", "reset"),
        # A remapper that answers means ECC memory: the mode must answer too.
        ({"remap_pending": False, "remap_failure": False}, "ecc.mode", "reset"),
        # A temperature without thresholds.
        ({}, "temperature.thresholds", "watch"),
        ({"power_w": 100.0}, "power.limit", "watch"),
        ({"pcie_gen": None, "pcie_width": None}, "pcie.link", "drain"),
    ],
)
def test_a_lone_gpu_is_judged_on_what_it_says_itself(values, subject, action):
    found = read_findings(_gpu(**values), Expected(model="H100-SXM"))
    got = {f.subject: f.action for f in found}
    assert got.get(subject) == action, [f.evidence for f in found]


def test_a_gpu_without_ecc_is_not_asked_for_its_counters():
    found = read_findings(_gpu(ecc_current=False, ecc_pending=False), Expected(model="x"))
    assert "ecc.counters" not in {f.subject for f in found}


def test_every_read_names_a_real_nvidia_ml_py_call():
    import pynvml

    for read in READS:
        for call in read.call.split(", "):
            assert hasattr(pynvml, call), call


def test_a_lone_sxm_gpu_in_a_vm_without_nvlink_is_not_judged_but_an_nvswitch_node_is(tmp_path):
    """The lent 1 x H100/H200 machines: one SXM GPU passed through, NVLink Not Supported. No
    peer to link to, so no finding (as the system check); on an NVSwitch node, drain."""
    lone = _gpu(nvlinks=None)
    exps = expectations([lone], {"0000:18:00.0": "0x2330"}, _specs(), nvswitch_node=False)
    assert exps[0].nvlink_links == 18  # the model has 18 (gpu_specs.yaml)
    assert rules.nvlink_state_findings([lone], False, exps) == []
    exps = expectations([lone], {"0000:18:00.0": "0x2330"}, _specs(), nvswitch_node=True)
    [finding] = rules.nvlink_state_findings([lone], True, exps)
    assert finding.action == "drain" and "as bad as every link down" in finding.evidence


def test_two_sxm_gpus_one_without_nvlink_answer_is_drain():
    gpus = [_gpu(nvlinks=None), _gpu(index=1, uuid="GPU-1", bus_id="0000:2a:00.0", nvlinks=[])]
    ids = {"0000:18:00.0": "0x2330", "0000:2a:00.0": "0x2330"}
    exps = expectations(gpus, ids, _specs(), nvswitch_node=False)
    found = rules.nvlink_state_findings(gpus, False, exps)
    assert [f.action for f in found] == ["drain", "drain"]
    assert "its model H100-SXM has 18" in found[0].evidence


def _specs() -> dict[str, Any]:
    from gpuenv.checks.thresholds import load_specs

    return load_specs()


def _hgx8_scan(tmp_path, **patch: Any) -> Any:
    node = build(tmp_path, "hgx8")
    data = json.loads(json.dumps(node.nvml_data))
    data["gpu_defaults"].update(patch.pop("defaults", {}))
    for index, values in patch.pop("gpus", {}).items():
        data["gpus"][index].update(values)
    return scan(node.root, node.run(), FakeNvml(data), load_thresholds(), None, NOW_UNIX)


def test_an_administrators_cap_on_every_gpu_is_no_finding_but_one_capped_gpu_is(tmp_path):
    every = _hgx8_scan(tmp_path / "a", defaults={"power_limit_w": 500.0})
    assert every.worst == "none"
    one = _hgx8_scan(tmp_path / "b", gpus={5: {"power_limit_w": 500.0}})
    [cap] = [f for f in one.findings if f.signal == "power.cap" and f.action != "none"]
    assert cap.gpu == 5 and "its peers' 700 W" in cap.evidence


def test_a_degraded_maximum_does_not_lower_its_own_bar(tmp_path):
    """x8 of a maximum that itself reads x8, among x16 peers: narrow (drain), not healthy."""
    report = _hgx8_scan(tmp_path, gpus={2: {"pcie_width": 8, "pcie_max_width": 8}})
    width = [f for f in report.findings if f.signal == "pcie.width" and f.gpu == 2]
    assert width[0].action == "drain" and "x8 of x16 (its peers' maximum)" in width[0].evidence


def test_a_hot_gpu_without_thresholds_is_judged_on_its_peers(tmp_path):
    report = _hgx8_scan(
        tmp_path, gpus={4: {"temperature_c": 90, "slowdown_c": None, "shutdown_c": None}}
    )
    shutdown = [f for f in report.findings if f.signal == "temperature.shutdown" and f.gpu == 4]
    assert shutdown[0].action == "drain", shutdown[0].evidence
    assert "its peers'" in shutdown[0].evidence
    assert report.worst == "drain"


def test_a_connectx_card_without_its_rdma_device_is_drain_naming_the_card_and_cause(tmp_path):
    """The floor's one rule (the fabric check's, system's and the doctor's) names each card; the
    health scan drains on each. Mutated from the recorded 8-GPU base: mlx5_2's device removed."""
    base = Path(__file__).resolve().parent.parent / "fixtures" / "health" / "_base" / "hgx8"
    root = tmp_path / "root"
    shutil.copytree(base / "root", root, symlinks=True)
    assert fabric.invisible_named(fabric.adapters(str(root))) == []
    shutil.rmtree(root / "sys/class/infiniband/mlx5_2")
    said = fabric.invisible_named(fabric.adapters(str(root)))
    assert len(said) == 1 and "0000:9b:00.0: no RDMA device" in said[0]
    [f] = rules.ib_device_findings(said)
    assert f.action == "drain" and f.subject in said[0] and "sockets" in f.evidence
    assert rules.ib_device_findings([]) == []


def test_docs_health_lists_every_read_with_its_action():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "health.md").read_text(encoding="utf-8")
    for read in READS:
        row = f"| `{read.name}` | `{read.call}` | {read.expected_when} | {read.action}"
        assert row in doc, row


def test_a_call_whose_older_name_answers_is_no_failed_read(tmp_path):
    reading = FakeNvml(build(tmp_path, "hgx8").nvml_data).read()

    class OldName(FakePynvml):
        def nvmlDeviceGetCurrentClocksEventReasons(self, h):
            raise CodedError(999, "Unknown Error")

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
            return self._gpu(h).clock_reasons

    got = PynvmlNvml(OldName(reading)).read()
    assert got.gpus[0].clock_reasons == 0 and got.gpus[0].errors == {}


def test_gpuenv_top_judges_a_gpu_against_its_peers_in_the_frame(tmp_path):
    """gpuenv top's health column applies the same rules: GPU 3 answering no NVLinks while its
    seven H100 SXM peers do is drain there too."""
    from gpuenv.health import top
    from gpuenv.health.nvml import patch_gpus

    data = patch_gpus(build(tmp_path, "hgx8").nvml_data, {"3": {"nvlinks": None}})
    rows = top.frame("n1", FakeNvml(data), TH)["gpus"]
    assert [r["health"] for r in rows] == ["none"] * 3 + ["drain"] + ["none"] * 4
    assert "nvlink.state: drain" in rows[3]["why"]


def test_a_failed_fabric_read_drains_only_where_nvswitches_join_the_gpus():
    gpu = _gpu(
        errors={"nvmlDeviceGetGpuFabricInfo": "Invalid Argument"}, slowdown_c=87, shutdown_c=92
    )
    [alone] = read_findings(gpu, Expected(model="H200-SXM"))
    assert (alone.subject, alone.action) == ("fabric", "watch")
    [switched] = read_findings(gpu, Expected(model="H200-SXM", nvswitch_node=True))
    assert switched.action == "drain"
