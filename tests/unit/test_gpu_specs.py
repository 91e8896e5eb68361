"""The shipped GPU spec table: every row is well formed, matches exactly one way (no PCI id or NVML
name in two rows), cites a source, and the models the checks must judge are all there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

SPECS = Path(__file__).resolve().parents[2] / "gpuenv" / "data" / "gpu_specs.yaml"
FIELDS = {
    "key",
    "names",
    "pci_ids",
    "fp16_dense_tflops",
    "bf16_dense_tflops",
    "nvlink_gbps",
    "nvlink_links",
    "pcie_gen",
    "source",
}
REQUIRED_KEYS = {
    "A100-PCIE-40GB",
    "A100-PCIE-80GB",
    "A100-SXM4-40GB",
    "A100-SXM4-80GB",
    "A800-PCIE-80GB",
    "A800-SXM4-80GB",
    "A10",
    "A30",
    "L4",
    "L20",
    "L40",
    "L40S",
    "H100-PCIE",
    "H100-SXM",
    "H100-NVL",
    "H800-PCIE",
    "H800-SXM",
    "H20",
    "H200-SXM",
    "H200-NVL",
    "GH200",
    "B200",
    "RTX-4090",
    "RTX-5090",
    "GB200",
    "B300",
    "A10G",
    "T4",
    "V100-SXM2",
    "V100-PCIE",
}
PCI_ID = re.compile(r"^0x[0-9a-f]{4}$")


def _specs() -> dict[str, Any]:
    return yaml.safe_load(SPECS.read_text(encoding="utf-8"))


def _rows() -> list[dict[str, Any]]:
    rows = _specs()["models"]
    assert isinstance(rows, list) and rows
    return rows


def _by_key() -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in _rows()}


def _is_positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@pytest.mark.parametrize("row", _rows(), ids=lambda row: str(row.get("key")))
def test_row_is_well_formed(row: dict[str, Any]) -> None:
    assert set(row) == FIELDS, f"fields: missing {FIELDS - set(row)}, unknown {set(row) - FIELDS}"
    assert isinstance(row["key"], str) and re.fullmatch(r"[A-Z0-9][A-Z0-9-]*", row["key"])
    assert isinstance(row["names"], list) and row["names"]
    assert all(isinstance(name, str) and name.strip() == name and name for name in row["names"])
    assert isinstance(row["pci_ids"], list) and row["pci_ids"]
    for pci_id in row["pci_ids"]:
        assert isinstance(pci_id, str) and PCI_ID.match(pci_id), pci_id
    assert isinstance(row["source"], str) and row["source"].strip()


@pytest.mark.parametrize("row", _rows(), ids=lambda row: str(row.get("key")))
def test_figures_are_positive_or_null_and_unconfirmed(row: dict[str, Any]) -> None:
    for field in ("fp16_dense_tflops", "bf16_dense_tflops"):
        value = row[field]
        if value is None:
            why = f"{row['key']}: {field} is null but source does not say TFLOPS unconfirmed"
            assert "tflops unconfirmed" in row["source"].lower(), why
        else:
            assert _is_positive_number(value), f"{row['key']}: {field}={value!r}"
    assert row["nvlink_gbps"] is None or _is_positive_number(row["nvlink_gbps"])
    assert row["pcie_gen"] is None or row["pcie_gen"] in _specs()["pcie"]["generations"]


def test_keys_are_unique() -> None:
    keys = [row["key"] for row in _rows()]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("field", ["pci_ids", "names"])
def test_no_id_or_name_is_in_two_rows(field: str) -> None:
    owner: dict[str, str] = {}
    for row in _rows():
        for value in row[field]:
            assert value not in owner, f"{value!r} is in {owner[value]} and {row['key']}"
            owner[value] = row["key"]


def test_every_required_model_is_present() -> None:
    missing = REQUIRED_KEYS - set(_by_key())
    assert not missing, sorted(missing)


def test_h200_sxm_row_matches_what_the_h200_node_reports() -> None:
    row = _by_key()["H200-SXM"]
    assert "0x2335" in row["pci_ids"]
    assert row["names"] == ["NVIDIA H200"]
    assert row["nvlink_gbps"] == 450
    assert row["fp16_dense_tflops"] == pytest.approx(1979 / 2)
    assert row["pcie_gen"] == 5


def test_variants_of_one_family_are_separate_rows() -> None:
    """Exact matching only works if a variant's name never doubles as another's."""
    rows = _by_key()
    assert rows["H200-NVL"]["names"] == ["NVIDIA H200 NVL"]
    assert rows["H100-SXM"]["names"] == ["NVIDIA H100 80GB HBM3"]
    assert rows["A100-SXM4-40GB"]["pci_ids"] != rows["A100-SXM4-80GB"]["pci_ids"]


@pytest.mark.parametrize(
    "key", ["RTX-4090", "RTX-5090", "L4", "L40", "L40S", "A10", "A10G", "T4", "V100-PCIE"]
)
def test_gpus_without_nvlink_have_none(key: str) -> None:
    assert _by_key()[key]["nvlink_gbps"] is None


@pytest.mark.parametrize("key, tflops", [("RTX-4090", 165.2), ("RTX-5090", 209.5)])
def test_geforce_uses_the_fp32_accumulate_figure(key: str, tflops: float) -> None:
    row = _by_key()[key]
    assert row["fp16_dense_tflops"] == pytest.approx(tflops)
    assert "FP32 accumulate" in row["source"]


def test_pcie_section_is_the_pci_sig_table() -> None:
    pcie = _specs()["pcie"]
    assert "PCI-SIG" in pcie["source"]
    assert pcie["generations"] == {
        1: {"gts": 2.5, "encoding": 0.8},
        2: {"gts": 5.0, "encoding": 0.8},
        3: {"gts": 8.0, "encoding": 0.984615},
        4: {"gts": 16.0, "encoding": 0.984615},
        5: {"gts": 32.0, "encoding": 0.984615},
        6: {"gts": 64.0, "encoding": 0.945312},
    }
    assert pcie["generations"][5]["gts"] == 32.0


@pytest.mark.parametrize(
    ("key", "fp16", "nvlink"),
    [("GB200", 2500, 900), ("B300", 2250, 900), ("T4", 65, None), ("V100-SXM2", 125, 150),
     ("V100-PCIE", 112, None)],
)  # fmt: skip
def test_added_rows_carry_the_datasheet_figures_and_cite_a_url(key, fp16, nvlink) -> None:
    row = _by_key()[key]
    assert row["fp16_dense_tflops"] == fp16 and row["nvlink_gbps"] == nvlink
    assert "https://www.nvidia.com/" in row["source"]
