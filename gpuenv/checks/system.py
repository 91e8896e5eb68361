"""`system`: what NVML sees: GPUs, driver, CUDA, ECC, persistence, PCIe, NVLink; versions."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpuenv.checks.base import Context, RankLog, fault_point, measurement, module_version
from gpuenv.results import Measurement, Result, Status

NAME = "system"
DESCRIPTION = (
    "GPUs through NVML: count, model, memory, driver, CUDA, ECC, persistence, PCIe, NVLink"
)


def _call(fn: Any, *args: Any) -> Any:
    """An NVML query that a GPU may not support: None instead of an exception."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe() -> dict[str, Any]:
    """Query NVML. Returns {"available": False, "reason": ...} when it cannot."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py (pynvml) not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"available": False, "reason": f"no NVIDIA GPU visible (NVML: {exc})"}
    try:
        cuda = _call(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        info: dict[str, Any] = {
            "available": True,
            "driver": _text(_call(pynvml.nvmlSystemGetDriverVersion)),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "unknown",
            "gpus": [],
        }
        for index in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
            ecc = _call(pynvml.nvmlDeviceGetEccMode, h)
            links = []
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                state = _call(pynvml.nvmlDeviceGetNvLinkState, h, link)
                if state is None:
                    break
                links.append(bool(state))
            info["gpus"].append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": _text(_call(pynvml.nvmlDeviceGetUUID, h)),
                    "memory_mib": int(mem.total) // 2**20 if mem else None,
                    "ecc": None if ecc is None else bool(ecc[0]),
                    "persistence": _call(pynvml.nvmlDeviceGetPersistenceMode, h) == 1,
                    "pcie_gen": _call(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    "pcie_width": _call(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                    "pcie_max_gen": _call(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                    "pcie_max_width": _call(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                    "nvlink_links": len(links),
                    "nvlink_active": sum(links),
                }
            )
        return info
    finally:
        pynvml.nvmlShutdown()


def visible(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The NVML GPUs that CUDA programs here see, in CUDA order (CUDA_VISIBLE_DEVICES)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus
    chosen = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            break
        if item.isdigit():
            match = [g for g in gpus if g["index"] == int(item)]
        else:
            match = [g for g in gpus if str(g.get("uuid", "")).startswith(item)]
        if not match:
            break  # CUDA stops at the first invalid entry too
        chosen.append(match[0])
    return chosen


def library_versions() -> dict[str, str]:
    """Versions of the node's GPU libraries, read from package metadata (no import)."""
    versions = {}
    for name in ("cupy", "torch", "mpi4py", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        version = module_version(name)
        if version:
            versions[name] = version
    return versions


def rank_main(rank: int, world: int, params: Mapping[str, Any], log: RankLog) -> dict[str, Any]:
    fault_point(NAME, rank)
    return {"probe": probe(), "versions": library_versions()}


def judge(ctx: Context, payload: Mapping[str, Any]) -> Result:
    info = payload["probe"]
    versions = dict(payload.get("versions", {}))
    if not info.get("available"):
        if ctx.expect_gpus:
            return Result(
                NAME,
                ctx.node,
                Status.FAIL,
                reason=f"expected {ctx.expect_gpus} GPUs, found none: {info['reason']}",
                measurements=[Measurement("gpus", 0, threshold=ctx.expect_gpus)],
                versions=versions,
            )
        return Result(NAME, ctx.node, Status.SKIP, reason=info["reason"], versions=versions)
    versions.update(driver=info["driver"], cuda_driver=info["cuda_driver"])
    gpus = info["gpus"]
    count = len(gpus)
    ms = [Measurement(**measurement("gpus", count, threshold=ctx.expect_gpus))]
    for g in gpus:
        i = g["index"]
        ms += [
            Measurement(f"gpu{i}.model", g["name"]),
            Measurement(f"gpu{i}.memory", g["memory_mib"] or 0, "MiB"),
            Measurement(f"gpu{i}.pcie", f"gen{g['pcie_max_gen']} x{g['pcie_max_width']}"),
            Measurement(f"gpu{i}.nvlink_active", g["nvlink_active"], "links"),
            Measurement(f"gpu{i}.ecc", bool(g["ecc"])),
            Measurement(f"gpu{i}.persistence", bool(g["persistence"])),
        ]
    details = {"gpus": gpus, "visible": [g["index"] for g in visible(gpus)]}
    summary = (
        f"{count} x {gpus[0]['name']}, driver {info['driver']}, CUDA {info['cuda_driver']}"
        if gpus
        else f"no GPU, driver {info['driver']}"
    )
    if ctx.expect_gpus is not None and count != ctx.expect_gpus:
        return Result(
            NAME,
            ctx.node,
            Status.FAIL,
            reason=f"expected {ctx.expect_gpus} GPUs, NVML sees {count}: {summary}",
            measurements=ms,
            versions=versions,
            details=details,
        )
    down = [
        f"GPU{g['index']}: {g['nvlink_links'] - g['nvlink_active']} of {g['nvlink_links']} down"
        for g in gpus
        if 0 < g["nvlink_active"] < g["nvlink_links"]
    ]
    notes = f"; NVLink links down: {', '.join(down)}" if down else ""
    return Result(
        NAME,
        ctx.node,
        Status.PASS,
        reason=summary + notes,
        measurements=ms,
        versions=versions,
        details=details,
    )
