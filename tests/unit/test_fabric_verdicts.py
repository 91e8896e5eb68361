"""The fabric holes of issue 21, each a test named for the hole it closes: one GPU with every
NVLink down, a subset of the GPUs passing as "GPUs verified", IB present but not ACTIVE passing
over TCP, eight rails judged as half of one, GPUDirect RDMA silently off. Fixtures in
tests/fixtures/fabric-logs/ (each cites the public output its shape comes from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv.checks import REGISTRY, nccl, system
from gpuenv.checks.base import Context, NodeInfo
from gpuenv.checks.profiles import assess, gpu_proof
from gpuenv.checks.thresholds import load_specs, load_thresholds
from gpuenv.report.console import verdict_line
from gpuenv.results import Result, Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric-logs"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _ctx(**kw) -> Context:
    return Context(node="n1", thresholds=load_thresholds(), specs=load_specs(), **kw)


def _system(payload: dict, **ctx) -> tuple[Result, NodeInfo]:
    node = system.node_info(payload, None)
    return system.judge(_ctx(**ctx), node, {0: payload}, 1), node


# ---------------------------------------------------------------- NVLink


def test_hole_one_gpu_with_every_nvlink_down_fails_system_naming_it():
    result, _ = _system(fixture("nvml-hgx-h100-gpu3-nvlink-down.json"))
    assert result.status is Status.FAIL
    assert "GPU3 (0000:5d:00.0) has 0 of 18 NVLinks active" in result.reason
    assert "its model H100-SXM has 18" in result.reason and "links down: 0-17" in result.reason


def test_hole_partly_down_nvlinks_fail_instead_of_a_note_inside_a_pass():
    result, _ = _system(fixture("nvml-hgx-h100-gpu5-two-links-down.json"))
    assert result.status is Status.FAIL
    assert "GPU5 (0000:ab:00.0) has 16 of 18 NVLinks active" in result.reason
    assert "links down: 4,11" in result.reason
    assert "GPU3" not in result.reason


def test_a_healthy_hgx_board_passes_system():
    result, node = _system(fixture("nvml-hgx-h100-healthy.json"))
    assert result.status is Status.PASS and len(node.gpus) == 8


def test_fewer_links_than_peers_fails_on_a_model_without_a_link_count():
    a100_pcie = {"index": 0, "name": "NVIDIA A100 80GB PCIe", "pci_device_id": "0x20b5",
                 "nvlink_links": 12, "nvlink_active": 12, "nvlink_down": []}  # fmt: skip
    slow = {**a100_pcie, "index": 1, "nvlink_active": 8, "nvlink_down": [8, 9, 10, 11]}
    bridged = [a100_pcie, slow]
    found = system.nvlink_problems(_ctx(), bridged)
    assert found == ["GPU1 (?) has 8 of 12 NVLinks active (its peers have 12); links down: 8-11"]
    unbridged = [{**a100_pcie, "nvlink_active": 0}, {**a100_pcie, "index": 1, "nvlink_active": 0}]
    assert system.nvlink_problems(_ctx(), unbridged) == []  # PCIe cards without a bridge


def test_hole_nccl_on_a_model_with_nvlink_is_judged_against_nvlink():
    gpus = fixture("nvml-hgx-h100-gpu3-nvlink-down.json")["probe"]["gpus"]
    link, spec, eff, floor = nccl.busbw_floor(_ctx(), gpus)
    assert link == "NVLink" and spec == 450 and floor == pytest.approx(450 * eff)
    assert floor > 25.0  # the 25 GB/s no longer passes a PCIe floor of 18.9
    pcie_only = [{**g, "name": "NVIDIA L40S", "pci_device_id": "0x26b9", "nvlink_active": 0}
                 for g in gpus]  # fmt: skip
    assert nccl.busbw_floor(_ctx(), pcie_only)[0] == "PCIe"


# ---------------------------------------------------------------- a subset of the GPUs


def _subset_node(monkeypatch, spec: str | None) -> tuple[Result, NodeInfo]:
    if spec is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    return _system(fixture("nvml-hgx-h100-healthy.json"))


def _gpu_pass(name: str) -> Result:
    return Result(name, "n1", Status.PASS, "ok")


def test_hole_a_subset_of_the_gpus_is_not_gpus_verified(monkeypatch):
    probe, node = _subset_node(monkeypatch, "0")
    assert probe.status is Status.PASS
    assert "1 of 8 GPUs visible: CUDA_VISIBLE_DEVICES=0 (not asked)" in probe.reason
    results = [probe, _gpu_pass("cupy"), _gpu_pass("streams")]
    verdict = assess(load_thresholds(), "quick", node, results, REGISTRY)
    assert not verdict.ok and not verdict.gpu_verified
    assert any("1 of 8 GPUs visible: CUDA_VISIBLE_DEVICES=0" in p for p in verdict.problems)
    line = verdict_line(verdict).plain
    assert "NOT OK" in line
    assert "no GPU verified: 1 of 8 GPUs visible: CUDA_VISIBLE_DEVICES=0" in line


def test_a_subset_asked_for_with_gpu_subset_is_verified_and_says_so(monkeypatch):
    probe, node = _subset_node(monkeypatch, "0")
    results = [probe, _gpu_pass("cupy"), _gpu_pass("streams")]
    assert gpu_proof(node, results, REGISTRY, gpu_subset=True) is None
    verdict = assess(load_thresholds(), "quick", node, results, REGISTRY, gpu_subset=True)
    assert verdict.ok and verdict.gpu_verified
    line = verdict_line(verdict).plain
    assert "GPUs verified: 1 of 8 GPUs visible: CUDA_VISIBLE_DEVICES=0" in line


def test_every_gpu_visible_has_no_subset_note(monkeypatch):
    probe, node = _subset_node(monkeypatch, None)
    assert node.subset is None and "visible" not in probe.reason


def test_a_lone_gpu_whose_nvlink_nvml_does_not_report_is_not_a_false_alarm():
    """Seen on the lent 1 x H200 (2026-12-01): NVIDIA H200, PCI id 0x2335, and
    nvmlDeviceGetNvLinkState(link 0) answers 'Not Supported' (one GPU passed through to a VM)."""
    lone = {
        **fixture("nvml-hgx-h100-healthy.json")["probe"]["gpus"][0],
        "name": "NVIDIA H200",
        "pci_device_id": "0x2335",
        "nvlink_links": 0,
        "nvlink_active": 0,
        "nvlink_down": [],
    }
    payload = {
        "probe": {"available": True, "driver": "580.159.04", "cuda_driver": "13.0", "gpus": [lone]},
        "pci_gpus": [lone["pci_bus_id"]],
        "versions": {},
    }
    result, _ = _system(payload)
    assert result.status is Status.PASS
    assert "NVLink not judged: NVML reports no NVLink on the one GPU" in result.reason
    two = [lone, {**lone, "index": 1}]
    assert system.nvlink_problems(_ctx(), two)[0].startswith("GPU0 (0000:18:00.0) has 0 of 18")
