"""Load the shipped thresholds and GPU specs, merge a user's override file, validate it.

A user's file (``--thresholds FILE``, docs/checks.md) has the shape of the shipped
thresholds.yaml, and may also add or fill GPU spec rows under ``gpu_specs`` (the rows of
gpu_specs.yaml, by their key). Everything in it is checked before anything runs: an unknown key,
a GPU key of the wrong shape, an unknown check in ``requires``, a value of the wrong type is
bad input naming it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuenv.errors import BadInput

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
LINK_TYPES = ("NVLink", "PCIe")
# Mappings whose keys are not fixed by the shipped file (GPU model names).
_OPEN_MAPS = {("nccl", "efficiency")}
# A spec row's key, as gpu_specs.yaml spells them (H200-SXM, RTX-4090, A100-PCIE-40GB).
ROW_KEY = re.compile(r"^[A-Z0-9][A-Z0-9-]*$")
PCI_ID = re.compile(r"^0x[0-9a-f]{4}$")
# What a user's row may set: the figures the checks judge by, what it matches, where it is from.
ROW_FIGURES = (
    "fp16_dense_tflops",
    "bf16_dense_tflops",
    "nvlink_gbps",
    "nvlink_links",
    "pcie_gen",
)
ROW_FIELDS = ("names", "pci_ids", *ROW_FIGURES, "source")
# The scopes of a profile's ``requires``, and the names each may hold.
NODE_SCOPES = ("gpu_node", "cpu_node")
CLUSTER_SCOPES = ("gpu_cluster", "cpu_cluster")


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


def load_specs(rows: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The shipped GPU spec table, with ``rows`` (a thresholds file's ``gpu_specs``, already
    validated by load_thresholds) filling the rows of their key or added as new rows."""
    specs = _load_yaml(DATA_DIR / "gpu_specs.yaml", "GPU spec table")
    by_key = {row["key"]: row for row in specs.get("models", [])}
    for key, fields in (rows or {}).items():
        row = by_key.get(key)
        if row is None:
            row = {"key": key, "names": [], "pci_ids": [], **dict.fromkeys(ROW_FIGURES)}
            specs["models"].append(row)
            by_key[key] = row
        for field, value in fields.items():
            if field in ("names", "pci_ids"):
                row[field] = [*row[field], *(v for v in value if v not in row[field])]
            else:
                row[field] = value
    return specs


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
    if isinstance(base, bool):
        if not isinstance(override, bool):
            raise BadInput(f"thresholds file {source}: {where} must be true or false")
        return override
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


def load_thresholds(override: str | Path | None = None, text: str | None = None) -> dict[str, Any]:
    """The shipped thresholds, with a user's YAML merged over them: the file ``override``, or
    ``text`` (that file's content, as `gpuenv cluster` hands it to the nodes)."""
    shipped = _load_yaml(DATA_DIR / "thresholds.yaml", "shipped thresholds")
    if override is None and text is None:
        return shipped
    source = str(override) if override is not None else "(--thresholds-text)"
    user = _load_yaml(Path(override), "thresholds file") if override is not None else _parse(text)
    rows = _user_rows(user.pop("gpu_specs", None) or {}, source)
    merged = _merge(shipped, user, (), source)
    merged["gpu_specs"] = rows
    for key in ("gemm_efficiency", "copy_efficiency"):
        if not 0 < merged["cupy"][key] <= 1.5:
            raise BadInput(f"thresholds file {source}: cupy.{key} must be in (0, 1.5]")
    _check_requires(merged, shipped, source)
    row_keys = {row["key"] for row in load_specs(rows)["models"]}
    unknown = sorted(set(merged["nccl"]["efficiency"]) - row_keys - {"default"})
    if unknown:
        raise BadInput(
            f"thresholds file {source}: nccl.efficiency: unknown GPU key(s)"
            f" {', '.join(map(repr, unknown))}: a gpu_specs.yaml row key (e.g. H200-SXM), one"
            " added under gpu_specs, or default"
        )
    return merged


def _parse(text: str | None) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text or "")
    except yaml.YAMLError as exc:
        raise BadInput(f"--thresholds-text: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInput("--thresholds-text: expected a mapping at the top")
    return data


def _check_requires(merged: Mapping[str, Any], shipped: Mapping[str, Any], source: str) -> None:
    """Every profile's ``requires`` names known checks: node scopes the registry's, cluster
    scopes those the shipped profiles name (the cluster stages' results)."""
    from gpuenv.checks import REGISTRY

    known = {scope: sorted(REGISTRY) for scope in NODE_SCOPES}
    cluster = sorted(
        {
            str(name)
            for profile in shipped["profiles"].values()
            for scope in CLUSTER_SCOPES
            for name in profile["requires"].get(scope) or []
        }
    )
    known.update(dict.fromkeys(CLUSTER_SCOPES, cluster))
    for name, profile in merged["profiles"].items():
        for scope, names in profile.get("requires", {}).items():
            where = f"profiles.{name}.requires.{scope}"
            if names is None:
                continue
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadInput(
                    f"thresholds file {source}: {where} must be a list of check names or null"
                )
            unknown = [n for n in names if n not in known[scope]]
            if unknown:
                raise BadInput(
                    f"thresholds file {source}: {where}: unknown check(s)"
                    f" {', '.join(map(repr, unknown))}; known: {', '.join(known[scope])}"
                )


def _user_rows(rows: Any, source: str) -> dict[str, dict[str, Any]]:
    """A thresholds file's ``gpu_specs``: each key a shipped row to fill, or a new row that says
    which GPUs it matches; every figure of the type the checks judge by, with its source."""
    if not isinstance(rows, dict):
        raise BadInput(f"thresholds file {source}: gpu_specs must map GPU keys to rows")
    shipped = _load_yaml(DATA_DIR / "gpu_specs.yaml", "GPU spec table")
    by_key = {row["key"]: row for row in shipped["models"]}
    generations = shipped["pcie"]["generations"]
    owner = {
        value: row["key"] for row in shipped["models"] for value in row["names"] + row["pci_ids"]
    }
    checked: dict[str, dict[str, Any]] = {}
    for key, row in rows.items():
        where = f"thresholds file {source}: gpu_specs.{key}"
        if not isinstance(key, str) or not ROW_KEY.match(key):
            raise BadInput(
                f"thresholds file {source}: gpu_specs: GPU key {key!r} is not a row key"
                " (capitals, digits and dashes, as gpu_specs.yaml spells them: H20, RTX-4090)"
            )
        if not isinstance(row, dict):
            raise BadInput(f"{where} must be a mapping of {', '.join(ROW_FIELDS)}")
        unknown = sorted(set(map(str, row)) - set(ROW_FIELDS))
        if unknown:
            raise BadInput(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}"
                f" (known here: {', '.join(ROW_FIELDS)})"
            )
        for field in ("names", "pci_ids"):
            values = row.get(field, [])
            pattern = PCI_ID if field == "pci_ids" else None
            if not isinstance(values, list) or not all(
                isinstance(v, str) and v.strip() and (pattern is None or pattern.match(v))
                for v in values
            ):
                shape = "PCI device ids such as '0x2329'" if pattern else "exact NVML names"
                raise BadInput(f"{where}.{field} must be a list of {shape}")
            taken = [f"{v!r} (row {owner[v]})" for v in values if owner.get(v, key) != key]
            if taken:
                raise BadInput(
                    f"{where}.{field}: already matched by another row: {', '.join(taken)}"
                )
            owner.update(dict.fromkeys(values, key))
        for field in ROW_FIGURES:
            value = row.get(field)
            if field == "pcie_gen":
                if value is not None and value not in generations:
                    raise BadInput(f"{where}.pcie_gen must be one of {sorted(generations)} or null")
            elif value is not None and not (_is_number(value) and value > 0):
                raise BadInput(f"{where}.{field} must be a number > 0 or null, got {value!r}")
        if not isinstance(row.get("source"), str) or not row["source"].strip():
            raise BadInput(f"{where}.source: say where the figures come from (a datasheet, a run)")
        if key not in by_key and not (row.get("names") or row.get("pci_ids")):
            raise BadInput(
                f"{where}: a new row must say which GPUs it matches (names or pci_ids);"
                f" to fill a shipped row use its key ({', '.join(sorted(by_key))})"
            )
        checked[key] = dict(row)
    return checked


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


def model_links(specs: Mapping[str, Any]) -> dict[str, int]:
    """The fabric reader's ``model_links`` (gpuenv.floor.fabric.read): each PCI device id of a
    row with ``nvlink_links`` -> that count. Rows without a count (PCIe, NVL cards) are left out."""
    return {
        str(i).lower(): int(row["nvlink_links"])
        for row in specs.get("models", [])
        if row.get("nvlink_links")
        for i in row.get("pci_ids", [])
    }


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
