import pytest

from gpuenv.checks import nccl
from gpuenv.checks.base import Context, NodeInfo
from gpuenv.checks.thresholds import (
    link_spec_gbps,
    load_specs,
    load_thresholds,
    model_spec,
    nccl_efficiency,
    pcie_gbps,
)
from gpuenv.errors import BadInput
from gpuenv.results import Status

H200 = {
    "name": "NVIDIA H200",
    "pci_device_id": "0x2335",
    "nvlink_active": 18,
    "pcie_max_gen": 5,
    "pcie_max_width": 16,
}
P2P_LOG = {
    "nccl_version": "2.28.9",
    "families": {"P2P": 4},
    "gdrdma": False,
    "evidence": ["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUDA IPC"],
}


def _node(*gpus):
    return NodeInfo(gpus=list(gpus))


def _ctx(thresholds=None):
    return Context(node="n1", thresholds=thresholds or load_thresholds(), specs=load_specs())


def _payloads(busbw_gbps, world=2, sizes=(64 * 2**20, 2**30)):
    """Rank payloads whose slowest rank gives ``busbw_gbps`` at every size."""
    factor = nccl.bus_factor(world)
    sweep = [{"bytes": b, "seconds": b / (busbw_gbps / factor * 1e9)} for b in sizes]
    return {
        r: {"sweep": sweep, "wrong_values": 0, "pairs": [], "versions": {}, "transport": P2P_LOG}
        for r in range(world)
    }


def test_bus_factor_matches_nccl_tests():
    assert nccl.bus_factor(2) == 1.0
    assert nccl.bus_factor(8) == pytest.approx(1.75)


def test_h200_nvlink_threshold_is_spec_times_efficiency():
    t, s = load_thresholds(), load_specs()
    assert link_spec_gbps(s, H200, "NVLink") == 450
    assert nccl_efficiency(t, "H200-SXM", "NVLink") == 0.6


def test_pcie_gen5_x16_bandwidth():
    assert pcie_gbps(load_specs(), 5, 16) == pytest.approx(63.0, abs=0.1)
    assert pcie_gbps(load_specs(), 9, 16) is None


def test_specs_match_exactly_never_by_substring():
    specs = load_specs()
    assert model_spec(specs, H200)["key"] == "H200-SXM"
    # The PCI id wins over the name; the name alone works too.
    assert model_spec(specs, {"name": "NVIDIA H200"})["key"] == "H200-SXM"
    assert model_spec(specs, {"name": "whatever", "pci_device_id": "0x2335"})["key"] == "H200-SXM"
    # GH200 and H20 contain "H200" and "H20": neither may get the H200's numbers.
    assert model_spec(specs, {"name": "NVIDIA GH200 480GB"})["key"] == "GH200"
    assert model_spec(specs, {"name": "NVIDIA H20"})["key"] == "H20"
    assert model_spec(specs, {"name": "NVIDIA H200 NVL"})["key"] == "H200-NVL"
    assert model_spec(specs, {"name": "NVIDIA H2000"}) is None
    assert model_spec(specs, {"name": "Tesla T4"})["key"] == "T4"
    assert model_spec(specs, {"name": "Tesla P100-PCIE-16GB"}) is None  # no row: not judged


def test_nccl_passes_above_and_fails_below_the_threshold():
    good = nccl.judge(_ctx(), _node(H200, H200), _payloads(330.0), 2)
    assert good.status is Status.PASS
    busbw = next(m for m in good.measurements if m.name == "busbw")
    assert busbw.threshold == pytest.approx(270.0) and busbw.bound == "min"
    bad = nccl.judge(_ctx(), _node(H200, H200), _payloads(200.0), 2)
    assert bad.status is Status.FAIL
    assert "270.0" in bad.reason and "NVLink" in bad.reason


def test_wrong_values_fail_even_when_fast():
    payloads = _payloads(330.0)
    payloads[1]["wrong_values"] = 3
    result = nccl.judge(_ctx(), _node(H200, H200), payloads, 2)
    assert result.status is Status.FAIL and "rank 1" in result.reason


def test_slow_pair_is_named():
    payloads = _payloads(330.0, world=3)
    fast, slow = 2**28 / 330e9, 2**28 / 100e9
    payloads[0]["pairs"] = [
        {"pair": [0, 1], "bytes": 2**28, "seconds": fast, "ok": True},
        {"pair": [0, 2], "bytes": 2**28, "seconds": slow, "ok": True},
    ]
    result = nccl.judge(_ctx(), _node(H200, H200, H200), payloads, 3)
    assert result.status is Status.FAIL
    assert "GPU pair 0,2" in result.reason and "0,1" not in result.reason


def test_user_override_changes_the_verdict(tmp_path):
    override = tmp_path / "t.yaml"
    override.write_text("nccl:\n  efficiency:\n    H200-SXM: {NVLink: 0.8}\n")
    thresholds = load_thresholds(override)
    assert nccl_efficiency(thresholds, "H200-SXM", "NVLink") == 0.8
    assert nccl_efficiency(thresholds, "A100-SXM4-80GB", "NVLink") == 0.6
    result = nccl.judge(_ctx(thresholds), _node(H200, H200), _payloads(330.0), 2)
    assert result.status is Status.FAIL  # 330 < 450 x 0.8 = 360


def test_override_keeps_unmentioned_keys(tmp_path):
    override = tmp_path / "t.yaml"
    override.write_text("deadlines_s:\n  nccl: 42\n")
    thresholds = load_thresholds(override)
    assert thresholds["deadlines_s"]["nccl"] == 42
    assert thresholds["deadlines_s"]["ddp"] == load_thresholds()["deadlines_s"]["ddp"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("deadlines_s: [1, 2\n", "not valid YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("nccl:\n  efficiencies: {}\n", "unknown key 'nccl.efficiencies'"),
        ("deadlines_s:\n  nccl: -5\n", "deadlines_s.nccl must be a number > 0"),
        ("deadlines_s:\n  nccl: soon\n", "deadlines_s.nccl"),
        ("nccl:\n  efficiency:\n    H200-SXM: {Infiniband: 0.5}\n", "unknown link type"),
        ("nccl:\n  efficiency:\n    H200-SXM: {NVLink: 7}\n", "must be in (0, 1.5]"),
        ("cupy:\n  gemm_efficiency: 3\n", "cupy.gemm_efficiency"),
        # A thresholds file's GPU rows and profiles (docs/checks.md, "Thresholds file").
        (
            "gpu_specs:\n  h20: {fp16_dense_tflops: 148, source: s}\n",
            "GPU key 'h20' is not a row key",
        ),
        ("gpu_specs:\n  H20: {tflops: 148, source: s}\n", "gpu_specs.H20: unknown key(s) 'tflops'"),
        ("gpu_specs:\n  H20: {fp16_dense_tflops: '148', source: s}\n", "must be a number > 0"),
        ("gpu_specs:\n  H20: {fp16_dense_tflops: true, source: s}\n", "must be a number > 0"),
        ("gpu_specs:\n  H20: {pcie_gen: 9, source: s}\n", "gpu_specs.H20.pcie_gen must be one of"),
        ("gpu_specs:\n  H20: {fp16_dense_tflops: 148}\n", "gpu_specs.H20.source"),
        (
            "gpu_specs:\n  NEW: {fp16_dense_tflops: 1, source: s}\n",
            "must say which GPUs it matches",
        ),
        (
            "gpu_specs:\n  NEW: {names: [NVIDIA H200], fp16_dense_tflops: 1, source: s}\n",
            "already matched by another row: 'NVIDIA H200' (row H200-SXM)",
        ),
        ("gpu_specs:\n  NEW: {pci_ids: ['2329'], source: s}\n", "PCI device ids such as"),
        ("gpu_specs: [H20]\n", "gpu_specs must map GPU keys to rows"),
        ("nccl:\n  efficiency:\n    H200: {NVLink: 0.5}\n", "unknown GPU key(s) 'H200'"),
        (
            "profiles:\n  quick:\n    requires:\n      gpu_node: [system, cupyy]\n",
            "profiles.quick.requires.gpu_node: unknown check(s) 'cupyy'",
        ),
        (
            "profiles:\n  cpu:\n    requires:\n      gpu_cluster: [busbw, pairs]\n",
            "requires.gpu_cluster: unknown check(s) 'pairs'",
        ),
        (
            "profiles:\n  cpu:\n    requires:\n      gpu_node: mpi\n",
            "must be a list of check names",
        ),
        ("profiles:\n  turbo: {}\n", "unknown key 'profiles.turbo'"),
    ],
)
def test_malformed_thresholds_are_bad_input(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(BadInput) as exc:
        load_thresholds(path)
    assert message in str(exc.value)
    assert str(path) in str(exc.value)


def test_missing_thresholds_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="cannot read"):
        load_thresholds(tmp_path / "nope.yaml")


def test_nccl_without_a_spec_is_never_a_pass():
    unknown = {**H200, "name": "NVIDIA Future", "pci_device_id": "0xffff"}
    result = nccl.judge(_ctx(), _node(unknown, unknown), _payloads(330.0), 2)
    assert result.status is Status.SKIP
    assert "NOT JUDGED" in result.reason and "'NVIDIA Future' (PCI id 0xffff)" in result.reason
    strict = Context(node="n1", thresholds=load_thresholds(), specs=load_specs(), strict=True)
    assert nccl.judge(strict, _node(unknown, unknown), _payloads(330.0), 2).status is Status.FAIL


def test_nccl_over_shm_between_nvlink_gpus_fails_naming_the_transport():
    payloads = _payloads(330.0)
    for p in payloads.values():
        p["transport"] = {**P2P_LOG, "families": {"SHM": 4}}
    result = nccl.judge(_ctx(), _node(H200, H200), payloads, 2)
    assert result.status is Status.FAIL
    assert "GPUs joined by NVLink talk over SHM instead of P2P" in result.reason


def test_nccl_without_its_log_fails():
    payloads = _payloads(330.0)
    for p in payloads.values():
        p["transport"] = {"families": {}}
    result = nccl.judge(_ctx(), _node(H200, H200), payloads, 2)
    assert result.status is Status.FAIL and "transport unknown" in result.reason


def test_the_pcie_table_cites_its_source():
    assert load_specs()["pcie"]["source"]


H20 = {**H200, "name": "NVIDIA H20", "pci_device_id": "0x2329"}
FILL_H20 = """\
gpu_specs:
  H20:
    fp16_dense_tflops: 148
    bf16_dense_tflops: 148
    nvlink_gbps: 450
    source: the vendor's figures as our supplier gave them
"""
P100_ROW = """\
gpu_specs:
  P100-PCIE:
    names: ["Tesla P100-PCIE-16GB"]
    pci_ids: ["0x15f8"]
    fp16_dense_tflops: 18.7
    pcie_gen: 3
    source: NVIDIA Tesla P100 datasheet, PCIe column, half precision 18.7 TFLOPS; PCIe Gen3 x16
"""


def test_a_null_spec_row_is_not_judged_until_a_thresholds_file_fills_it(tmp_path):
    assert nccl.judge(_ctx(), _node(H20, H20), _payloads(330.0), 2).status is Status.SKIP
    path = tmp_path / "t.yaml"
    path.write_text(FILL_H20)
    thresholds = load_thresholds(path)
    specs = load_specs(thresholds["gpu_specs"])
    row = model_spec(specs, H20)
    assert (row["key"], row["fp16_dense_tflops"], row["nvlink_gbps"]) == ("H20", 148, 450)
    assert row["names"] == ["NVIDIA H20"]  # the shipped match is kept
    ctx = Context(node="n1", thresholds=thresholds, specs=specs)
    assert nccl.judge(ctx, _node(H20, H20), _payloads(330.0), 2).status is Status.PASS
    assert nccl.judge(ctx, _node(H20, H20), _payloads(200.0), 2).status is Status.FAIL
    assert load_specs()["models"] == load_specs({})["models"]  # the shipped table is untouched


def test_a_thresholds_file_adds_a_gpu_the_table_lacks(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(P100_ROW + "nccl:\n  efficiency:\n    P100-PCIE: {PCIe: 0.4}\n")
    thresholds = load_thresholds(path)
    specs = load_specs(thresholds["gpu_specs"])
    assert model_spec(specs, {"name": "Tesla P100-PCIE-16GB"})["fp16_dense_tflops"] == 18.7
    assert model_spec(specs, {"name": "x", "pci_device_id": "0x15f8"})["key"] == "P100-PCIE"
    assert nccl_efficiency(thresholds, "P100-PCIE", "PCIe") == 0.4


def test_the_text_form_is_the_file_form(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(P100_ROW)
    assert load_thresholds(text=P100_ROW) == load_thresholds(path)


def test_requires_names_the_user_may_give(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "profiles:\n  cpu:\n    requires:\n      gpu_node: [system, cupy, mpi]\n"
        "      gpu_cluster: [consistency, busbw]\n"
    )
    requires = load_thresholds(path)["profiles"]["cpu"]["requires"]
    assert requires["gpu_node"] == ["system", "cupy", "mpi"]
    assert requires["gpu_cluster"] == ["consistency", "busbw"]


def test_the_documented_example_file_loads_and_fills_h20_and_l20():
    import re
    from pathlib import Path

    for doc in ("docs/checks.md", "README.zh-CN.md"):
        text = (Path(__file__).resolve().parents[2] / doc).read_text(encoding="utf-8")
        block = re.search(r"```yaml\n(gpu_specs:.*?)```", text, re.S).group(1)
        thresholds = load_thresholds(text=block)
        specs = load_specs(thresholds["gpu_specs"])
        for name in ("NVIDIA H20", "NVIDIA L20"):
            assert model_spec(specs, {"name": name})["fp16_dense_tflops"], (doc, name)
