"""`system`: the node's probe. What the PCI bus shows and what NVML sees: GPUs, driver, CUDA,
ECC, persistence, PCIe, NVLink; versions.

The expected GPU count comes from the PCI bus (the node floor's rule, gpuenv.floor.pci: an
NVIDIA VGA or 3D controller) unless the user gives one: a GPU on the bus that the driver does not
see is a FAIL that names its PCI address, never a SKIP. ``GPUENV_ROOT`` moves the root the PCI
bus is read from (a fixture in tests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuenv import proc
from gpuenv.checks.base import Context, NodeInfo, Placement, measurement, module_version
from gpuenv.checks.ranklog import RankContext
from gpuenv.checks.thresholds import model_spec
from gpuenv.floor import fabric, net, pci
from gpuenv.floor.pci import normal_bus_id
from gpuenv.results import Measurement, Result, Status

NAME = "system"
DESCRIPTION = (
    "GPUs on the PCI bus and through NVML: count, model, memory, driver, CUDA, ECC, PCIe, NVLink"
)
PLACEMENT = Placement.PROBE
OPTIONAL = False


def needed(node: NodeInfo) -> bool:
    return True  # every node has a bus to describe


ROOT_ENV = "GPUENV_ROOT"


def pci_gpus(root: str | os.PathLike[str] | None = None) -> list[str] | None:
    """PCI addresses of the NVIDIA GPUs on the bus (the node floor's rule, gpuenv.floor.pci);
    None when the bus cannot be read."""
    found = pci.gpus(str(root if root is not None else os.environ.get(ROOT_ENV, "/")))
    return None if found is None else [normal_bus_id(d.bdf) for d in found]


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
        # Nothing was asked of the driver: the reason must not read as "the driver sees none".
        return {
            "available": False,
            "reason": "nvidia-ml-py (pynvml) not installed",
            "unread": True,
        }
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
                    "pci_bus_id": _pci_bus_id(h),
                    "pci_device_id": _pci_device_id(h),
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
                    "nvlink_down": [n for n, up in enumerate(links) if not up],
                }
            )
        return info
    finally:
        pynvml.nvmlShutdown()


def _pci_bus_id(handle: Any) -> str | None:
    import pynvml

    info = _call(pynvml.nvmlDeviceGetPciInfo, handle)
    return normal_bus_id(_text(info.busId)) if info is not None else None


def _pci_device_id(handle: Any) -> str | None:
    """The PCI device id (``0x2335``), from NVML's combined device/vendor word."""
    import pynvml

    info = _call(pynvml.nvmlDeviceGetPciInfo, handle)
    return f"0x{(int(info.pciDeviceId) >> 16) & 0xFFFF:04x}" if info is not None else None


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


def rdma_ports(root: str | os.PathLike[str] | None = None) -> list[str]:
    """The node's InfiniBand/RoCE ports (``mlx5_0/1``), the node floor's reading."""
    return [p.name for p in net.rdma_ports(str(root or os.environ.get(ROOT_ENV, "/")))]


def rdma_invisible(root: str | os.PathLike[str] | None = None) -> list[str]:
    """The RDMA-capable network adapters on the PCI bus with no RDMA device, each with its
    cause (the node floor's rule, gpuenv.floor.fabric.invisible_rdma_adapters)."""
    return fabric.invisible_rdma_adapters(str(root or os.environ.get(ROOT_ENV, "/")))


def nvswitch_state(root: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The NVSwitches on the bus and Fabric Manager's state (the fabric reader's rule,
    gpuenv.floor.fabric): without Fabric Manager the NVLinks through NVSwitches do not train."""
    where = str(root or os.environ.get(ROOT_ENV, "/"))
    switches = tuple(d.bdf for d in (pci.devices(where) or []) if d.is_nvswitch)
    return {
        "switches": list(switches),
        "fabric_manager": fabric.fabric_manager(proc.command_output, switches),
    }


def rank_main(rank: RankContext) -> dict[str, Any]:
    return {
        "probe": probe(),
        "pci_gpus": pci_gpus(),
        "rdma_ports": rdma_ports(),
        "rdma_invisible": rdma_invisible(),
        "versions": library_versions(),
        "nvswitch": nvswitch_state(),
    }


def node_info(payload: Mapping[str, Any] | None, why: str | None) -> NodeInfo:
    if payload is None:
        return NodeInfo(no_gpu=why or "the system probe gave nothing")
    info = payload["probe"]
    pci = list(payload.get("pci_gpus") or [])
    rdma = list(payload.get("rdma_ports") or [])
    hidden = list(payload.get("rdma_invisible") or [])
    if not info.get("available"):
        return NodeInfo(
            no_gpu=str(info["reason"]), pci_gpus=pci, rdma_ports=rdma, rdma_invisible=hidden
        )
    gpus = visible(info.get("gpus", []))
    no_gpu = None if gpus else "no NVIDIA GPU visible (CUDA_VISIBLE_DEVICES hides all)"
    if not info.get("gpus"):
        no_gpu = f"no NVIDIA GPU visible (NVML sees none, driver {info.get('driver')})"
    return NodeInfo(
        gpus=gpus,
        no_gpu=no_gpu,
        pci_gpus=pci,
        nvml_gpus=len(info.get("gpus", [])),
        visible_spec=os.environ.get("CUDA_VISIBLE_DEVICES"),
        rdma_ports=rdma,
        rdma_invisible=hidden,
    )


def early_node(ctx: Context) -> NodeInfo | None:
    """The GPUs the NVIDIA driver lists in /proc/driver/nvidia/gpus (no driver: none),
    narrowed by CUDA_VISIBLE_DEVICES when it holds plain indices; None when it names GPUs by
    UUID or MIG instance (only NVML can tell those apart). A guess: see base.ProbeCheck."""
    listed = Path(os.environ.get(ROOT_ENV, "/")) / "proc/driver/nvidia/gpus"
    try:
        buses = sorted(p.name for p in listed.iterdir()) if listed.is_dir() else []
    except OSError:
        return None
    spec = os.environ.get("CUDA_VISIBLE_DEVICES") or ""
    if not all(item.strip().isdigit() or not item.strip() for item in spec.split(",")):
        return None
    listed_gpus = [{"index": i, "pci_bus_id": normal_bus_id(b)} for i, b in enumerate(buses)]
    gpus = visible(listed_gpus)
    no_gpu = None if gpus else "no NVIDIA GPU listed by the driver"
    return NodeInfo(
        gpus=gpus, no_gpu=no_gpu, rdma_ports=rdma_ports(), rdma_invisible=rdma_invisible()
    )


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    return None


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> ``0-2,5``: the links of a GPU, as nvidia-smi numbers them."""
    parts: list[str] = []
    for n in sorted(numbers):
        if parts and parts[-1].split("-")[-1] == str(n - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{n}"
        else:
            parts.append(str(n))
    return ",".join(parts)


def unlinked(gpu: Mapping[str, Any]) -> bool:
    """NVML answered for no NVLink of this GPU (its first link's state is not supported)."""
    return int(gpu.get("nvlink_links") or 0) == 0


def nvswitch_why(nvswitch: Mapping[str, Any] | None) -> str:
    """Why NVLinks may be down, from the NVSwitches and Fabric Manager ("" when not read or
    without NVSwitches)."""
    switches = list((nvswitch or {}).get("switches") or [])
    if not switches:
        return ""
    state = str((nvswitch or {}).get("fabric_manager") or "unknown")
    said = f"{len(switches)} NVSwitch(es) on the bus, Fabric Manager {state}"
    if state != "active":
        said += (
            " (NVLinks through NVSwitches train only while nvidia-fabricmanager runs:"
            " systemctl start nvidia-fabricmanager)"
        )
    return said


def nvlink_problems(
    ctx: Context, gpus: list[dict[str, Any]], nvswitch: Mapping[str, Any] | None = None
) -> list[str]:
    """Every GPU with fewer active NVLinks than its model has (``nvlink_links`` of its
    gpu_specs.yaml row) or than its best peer, naming the GPU, the counts and the links down.
    A GPU whose model has no NVLink on its board and whose peers have none is not judged, nor a
    lone GPU on which NVML reports no link at all (``unlinked``: one GPU passed through to a VM
    answers "Not Supported", as the lent 1 x H200 does): it has no peer to link to."""
    best_peer = max((int(g.get("nvlink_active") or 0) for g in gpus), default=0)
    found = []
    for g in gpus:
        if len(gpus) < 2 and unlinked(g):
            continue
        row = model_spec(ctx.specs, g)
        model_links = int(row.get("nvlink_links") or 0) if row else 0
        want = max(model_links, best_peer)
        active = int(g.get("nvlink_active") or 0)
        if active >= want:
            continue
        why = (
            f"its model {row['key']} has {model_links}"
            if row and model_links >= best_peer
            else f"its peers have {best_peer}"
        )
        down = _ranges(list(g.get("nvlink_down") or []))
        if not down and int(g.get("nvlink_links") or 0) < want:
            down = f"NVML answers for {int(g.get('nvlink_links') or 0)} links only"
        found.append(
            f"GPU{g['index']} ({g.get('pci_bus_id') or '?'}) has {active} of {want} NVLinks"
            f" active ({why}); links down: {down or 'not listed by NVML'}"
        )
    if found and (switch := nvswitch_why(nvswitch)):
        found.append(switch)
    return found


def world(ctx: Context, node: NodeInfo) -> int:
    return 1


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    payload = payloads[0]
    info = payload["probe"]
    versions = dict(payload.get("versions", {}))
    pci = payload.get("pci_gpus")
    on_bus = list(pci) if pci is not None else []
    expected = ctx.expect_gpus if ctx.expect_gpus is not None else len(on_bus)
    source = "--expect-gpus" if ctx.expect_gpus is not None else "the PCI bus"
    pci_note = {"pci_gpus": pci, "expected": expected, "expected_from": source}
    if not info.get("available"):
        if expected:
            where = f" at {', '.join(on_bus)}" if on_bus else ""
            seen = (
                f"NVML could not be asked: {info['reason']} (pip install nvidia-ml-py in the"
                " environment gpuenv runs in)"
                if info.get("unread")
                else f"the driver sees none: {info['reason']}"
            )
            return Result(
                NAME,
                ctx.node,
                Status.FAIL,
                reason=f"{source} says {expected} NVIDIA GPU(s){where}, but {seen}",
                measurements=[Measurement("gpus", 0, "", expected, "min")],
                versions=versions,
                details=pci_note,
            )
        bus = (
            f"--expect-gpus 0 (the PCI bus shows {len(on_bus)})"
            if on_bus
            else "no NVIDIA GPU on the PCI bus"
            if pci is not None
            else "PCI bus not readable"
        )
        return Result(
            NAME,
            ctx.node,
            Status.SKIP,
            reason=f"CPU-only node: {bus}, and NVML answers: {info['reason']}",
            versions=versions,
            details=pci_note,
        )
    versions.update(driver=info["driver"], cuda_driver=info["cuda_driver"])
    gpus = info["gpus"]
    count = len(gpus)
    ms = [Measurement(**measurement("gpus", count, "", expected, "min"))]
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
    details = {"gpus": gpus, "visible": [g["index"] for g in node.gpus], **pci_note}
    summary = (
        f"{count} x {gpus[0]['name']}, driver {info['driver']}, CUDA {info['cuda_driver']}"
        if gpus
        else f"no GPU, driver {info['driver']}"
    )
    seen = {g.get("pci_bus_id") for g in gpus}
    unseen = [a for a in on_bus if a not in seen]
    failure = None
    if ctx.expect_gpus is not None and count != ctx.expect_gpus:
        failure = f"--expect-gpus {ctx.expect_gpus}, NVML sees {count}: {summary}"
    elif ctx.expect_gpus is None and (unseen or count < expected):
        missing = ", ".join(unseen) if unseen else f"{expected - count} of them"
        failure = (
            f"the PCI bus shows {expected} NVIDIA GPU(s), NVML sees {count}; not seen by the"
            f" driver: {missing} ({summary})"
        )
    elif down := nvlink_problems(ctx, gpus, payload.get("nvswitch")):
        failure = f"NVLink down: {'; '.join(down)} ({summary})"
    if hidden := list(payload.get("rdma_invisible") or []):
        said = f"RDMA adapter(s) on the PCI bus with no RDMA device: {'; '.join(hidden)}"
        failure = f"{failure}; {said}" if failure else f"{said} ({summary})"
        details["rdma_invisible"] = hidden
    if failure:
        return Result(
            NAME,
            ctx.node,
            Status.FAIL,
            reason=failure,
            measurements=ms,
            versions=versions,
            details=details,
        )
    subset = node.subset
    notes = ""
    lone = [g for g in gpus if len(gpus) < 2 and unlinked(g)]
    row = model_spec(ctx.specs, lone[0]) if lone else None
    if row and row.get("nvlink_links"):
        notes += (
            f"; NVLink not judged: NVML reports no NVLink on the one GPU (its model"
            f" {row['key']} has {row['nvlink_links']}), which has no peer to link to"
        )
    if subset:
        asked = "verified as asked (--gpu-subset)" if ctx.gpu_subset else "not asked"
        notes += f"; {subset} ({asked})"
        details["subset"] = subset
    return Result(
        NAME,
        ctx.node,
        Status.PASS,
        reason=summary + notes,
        measurements=ms,
        versions=versions,
        details=details,
    )
