"""Load the shipped thresholds and GPU specs, merge a user's override file, validate it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuenv.errors import BadInput

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
LINK_TYPES = ("NVLink", "PCIe")
# Mappings whose keys are not fixed by the shipped file (GPU model names).
_OPEN_MAPS = {("nccl", "efficiency")}


def _load_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise BadInput(f"{what} {path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"{what} {path}: expected a mapping at the top, got {type(data).__name__}")
    return data


def load_specs() -> dict[str, Any]:
    return _load_yaml(DATA_DIR / "gpu_specs.yaml", "GPU spec table")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _merge(base: Any, override: Any, path: tuple[str, ...], source: str) -> Any:
    where = ".".join(path) or "(top)"
    if isinstance(base, dict):
        if not isinstance(override, dict):
            raise BadInput(f"thresholds file {source}: {where} must be a mapping")
        merged = dict(base)
        for key, value in override.items():
            key = str(key)
            if path in _OPEN_MAPS:
                merged[key] = _merge_efficiency(merged.get(key, {}), value, (*path, key), source)
            elif key not in base:
                known = ", ".join(sorted(str(k) for k in base))
                raise BadInput(
                    f"thresholds file {source}: unknown key {'.'.join((*path, key))!r}"
                    f" (known here: {known})"
                )
            else:
                merged[key] = _merge(base[key], value, (*path, key), source)
        return merged
    if isinstance(base, list) and base and all(isinstance(v, str) for v in base):
        if not isinstance(override, list) or not all(isinstance(v, str) for v in override):
            raise BadInput(f"thresholds file {source}: {where} must be a list of check names")
        return list(override)
    if isinstance(base, list):
        if not isinstance(override, list) or not all(_is_number(v) and v > 0 for v in override):
            raise BadInput(f"thresholds file {source}: {where} must be a list of positive numbers")
        return list(override)
    if _is_number(base):
        if not _is_number(override) or override <= 0:
            raise BadInput(
                f"thresholds file {source}: {where} must be a number > 0, got {override!r}"
            )
        return override
    return override


def _merge_efficiency(base: Any, value: Any, path: tuple[str, ...], source: str) -> dict:
    where = ".".join(path)
    if not isinstance(value, dict):
        raise BadInput(f"thresholds file {source}: {where} must map link types to efficiencies")
    merged = dict(base) if isinstance(base, dict) else {}
    for link, eff in value.items():
        if link not in LINK_TYPES:
            raise BadInput(
                f"thresholds file {source}: {where}.{link}: unknown link type"
                f" (expected one of {', '.join(LINK_TYPES)})"
            )
        if not _is_number(eff) or not 0 < eff <= 1.5:
            raise BadInput(
                f"thresholds file {source}: {where}.{link} must be in (0, 1.5], got {eff!r}"
            )
        merged[link] = eff
    return merged


def load_thresholds(override: str | Path | None = None) -> dict[str, Any]:
    """The shipped thresholds, with ``override`` (a user's YAML file) merged over them."""
    shipped = _load_yaml(DATA_DIR / "thresholds.yaml", "shipped thresholds")
    if override is None:
        return shipped
    user = _load_yaml(Path(override), "thresholds file")
    merged = _merge(shipped, user, (), str(override))
    for key in ("gemm_efficiency", "copy_efficiency"):
        if not 0 < merged["cupy"][key] <= 1.5:
            raise BadInput(f"thresholds file {override}: cupy.{key} must be in (0, 1.5]")
    return merged


def model_spec(specs: Mapping[str, Any], gpu: Mapping[str, Any]) -> dict[str, Any] | None:
    """The spec row of ``gpu``: its PCI device id first, else its exact NVML name; never a guess.

    A substring match would give a GH200 the H200's numbers, or an H20 the H200's.
    """
    rows = specs.get("models", [])
    device_id = str(gpu.get("pci_device_id") or "").lower()
    if device_id:
        for row in rows:
            if device_id in (str(i).lower() for i in row.get("pci_ids", [])):
                return dict(row)
    name = " ".join(str(gpu.get("name", "")).split())
    for row in rows:
        if name and name in row.get("names", []):
            return dict(row)
    return None


def describe_gpu(gpu: Mapping[str, Any]) -> str:
    """``'NVIDIA H200' (PCI id 0x2335)``: how a GPU is named where its spec is missing."""
    device_id = gpu.get("pci_device_id")
    return f"{gpu.get('name', '?')!r}" + (f" (PCI id {device_id})" if device_id else "")


def pcie_gbps(specs: Mapping[str, Any], generation: int, width: int) -> float | None:
    """PCIe bandwidth per direction in GB/s for a link of that generation and width."""
    gen = specs.get("pcie", {}).get("generations", {}).get(generation)
    if gen is None or width <= 0:
        return None
    return float(gen["gts"]) * width * float(gen["encoding"]) / 8.0


def nccl_efficiency(thresholds: Mapping[str, Any], spec_key: str | None, link: str) -> float:
    """busbw / link spec a healthy node reaches: per spec row key (exact), else the default."""
    table = thresholds["nccl"]["efficiency"]
    if spec_key is not None and link in table.get(spec_key, {}):
        return float(table[spec_key][link])
    return float(table["default"][link])


def link_spec_gbps(specs: Mapping[str, Any], gpu: Mapping[str, Any], link: str) -> float | None:
    """Per-direction bandwidth of the link between GPUs, from the spec tables."""
    if link == "NVLink":
        spec = model_spec(specs, gpu)
        value = spec.get("nvlink_gbps") if spec else None
        return float(value) if value else None
    return pcie_gbps(specs, int(gpu.get("pcie_max_gen") or 0), int(gpu.get("pcie_max_width") or 0))
