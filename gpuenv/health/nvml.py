"""The NVML side of `gpuenv health`: one facade, two backends.

``Nvml.read()`` answers everything the scan needs of every GPU in one pass (NVML is opened and
closed once per scan). ``PynvmlNvml`` reads it through nvidia-ml-py, handed its module (tests hand
a fake module); ``FakeNvml`` answers from a JSON fixture (tests/fixtures/health/*/nvml.json). A
value NVML does not support on this GPU (page retirement on Ampere and newer, NVLink on a PCIe
card) is None, never 0: the rules judge only what was read. Any other NVML error is kept in the
reading's ``errors`` (the call and NVML's words): a call that failed is a finding, not a pass.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# nvmlClocksEventReasons bits (NVML API reference, "NvmlClocksEventReasons").
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
# NVLink error counters (nvmlNvLinkErrorCounter_t), by the name a finding shows.
NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
NVLINK_MAX_LINKS = 18
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
# nvmlReturn_t codes that mean "this GPU or this library has no such value": not an error.
NVML_ERROR_INVALID_ARGUMENT = 2  # nvmlDeviceGetNvLinkState of a link the GPU does not have
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15


@dataclass
class NvLink:
    link: int
    active: bool
    counters: dict[str, int] = field(default_factory=dict)  # NVLINK_COUNTERS' names


@dataclass
class GpuReading:
    index: int
    name: str = ""
    uuid: str = ""
    bus_id: str = ""  # 0000:3b:00.0, as sysfs spells it
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remap_correctable: int | None = None
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remap_histogram: dict[str, int] | None = None  # max, high, partial, low, none
    clock_reasons: int | None = None
    violation_power_ns: int | None = None
    violation_thermal_ns: int | None = None
    temperature_c: int | None = None
    slowdown_c: int | None = None
    shutdown_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pcie_gen: int | None = None
    pcie_max_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_width: int | None = None
    pcie_replays: int | None = None
    nvlinks: list[NvLink] | None = None
    persistence: bool | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    fabric_state: str | None = None  # FABRIC_STATES' values
    fabric_status: str | None = None  # "success" or NVML's error text
    utilization_pct: int | None = None  # GPU busy over NVML's last sample period (gpuenv top)
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    error: str = ""  # the GPU could not be opened (then nothing else was read)
    # NVML calls that answered an error other than NOT_SUPPORTED: call -> NVML's words. The
    # values they would have filled are None, and each is a finding (rules: nvml.read).
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class NvmlReading:
    driver_version: str | None
    gpus: list[GpuReading]
    error: str = ""  # NVML could not be initialised (no driver, no library)
    errors: dict[str, str] = field(default_factory=dict)  # the system calls' errors, as a GPU's


class Nvml(Protocol):
    def read(self) -> NvmlReading: ...


def _gpu_from(data: dict[str, Any]) -> GpuReading:
    known = {f.name for f in dataclasses.fields(GpuReading)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown GPU field(s) {', '.join(unknown)}")
    values = dict(data)
    if values.get("nvlinks") is not None:
        values["nvlinks"] = [NvLink(**link) for link in values["nvlinks"]]
    return GpuReading(**values)


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _deep_merge(base.get(key), value) if key in base else value
        return merged
    return copy.deepcopy(over)


class FakeNvml:
    """NVML answering from data: ``{"driver_version", "error", "gpu_defaults", "gpus": [...]}``;
    each GPU is ``gpu_defaults`` with its own fields over it (index, bus_id, uuid at least)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.calls = 0

    @classmethod
    def from_file(cls, path: str | Path, patch: dict[str, Any] | None = None) -> FakeNvml:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(_deep_merge(data, patch) if patch else data)

    def read(self) -> NvmlReading:
        self.calls += 1
        if self.data.get("error"):
            return NvmlReading(None, [], str(self.data["error"]))
        defaults = self.data.get("gpu_defaults", {})
        gpus = [_gpu_from(_deep_merge(defaults, gpu)) for gpu in self.data.get("gpus", [])]
        errors = dict(self.data.get("errors") or {})
        return NvmlReading(self.data.get("driver_version"), gpus, errors=errors)


def patch_gpus(data: dict[str, Any], patches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``data`` with the GPUs of these indexes (as strings) changed; ``remove`` drops one."""
    merged = copy.deepcopy(data)
    kept = []
    for gpu in merged.get("gpus", []):
        change = patches.get(str(gpu["index"]))
        if change is not None and change.get("remove"):
            continue
        kept.append(_deep_merge(gpu, change) if change else gpu)
    merged["gpus"] = kept
    return merged


class NoNvml:
    """No NVML to ask (nvidia-ml-py is not installed): a reading with that error. The scan then
    judges the bus and the module alone: a node with neither an NVIDIA GPU nor the module has
    nothing to find (a CPU node); one with either gets its driver.loaded finding."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> NvmlReading:
        return NvmlReading(None, [], self.reason)


class PynvmlNvml:
    """NVML through nvidia-ml-py; ``module`` is ``pynvml`` (or a fake of it)."""

    def __init__(self, module: Any = None) -> None:
        if module is None:
            import pynvml as module  # the heavy import only where NVML is used
        self.nv = module
        self._errors: dict[str, str] = {}

    def _call(self, fn_name: str, *args: Any) -> Any:
        """The answer, or None when this NVML lacks the call or the GPU does not support it;
        any other NVML error is None too, and kept (``_errors``: call -> NVML's words)."""
        fn = getattr(self.nv, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            if not _unsupported(exc):
                self._errors.setdefault(fn_name, str(exc) or type(exc).__name__)
            return None

    def read(self) -> NvmlReading:
        nv = self.nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            return NvmlReading(None, [], f"NVML could not start: {exc}")
        try:
            self._errors = {}
            driver = _text(self._call("nvmlSystemGetDriverVersion"))
            count = self._call("nvmlDeviceGetCount") or 0
            errors = dict(self._errors)
            return NvmlReading(driver, [self._gpu(i) for i in range(count)], errors=errors)
        finally:
            nv.nvmlShutdown()

    def _gpu(self, index: int) -> GpuReading:
        nv = self.nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            return GpuReading(index, error=str(exc))
        self._errors = {}
        c = self._call
        gpu = GpuReading(index, name=_text(c("nvmlDeviceGetName", h)) or "")
        gpu.uuid = _text(c("nvmlDeviceGetUUID", h)) or ""
        pci = c("nvmlDeviceGetPciInfo", h)
        if pci is not None:
            from gpuenv.floor.pci import normal_bus_id

            gpu.bus_id = normal_bus_id(_text(pci.busId) or "")
        ecc = c("nvmlDeviceGetEccMode", h)
        if ecc is not None:
            gpu.ecc_current, gpu.ecc_pending = bool(ecc[0]), bool(ecc[1])
        if gpu.ecc_current:
            for kind, err in (("corrected", 0), ("uncorrected", 1)):
                for scope, counter in (("volatile", 0), ("aggregate", 1)):
                    value = c("nvmlDeviceGetTotalEccErrors", h, err, counter)
                    setattr(gpu, f"ecc_{scope}_{kind}", None if value is None else int(value))
        sbe = c("nvmlDeviceGetRetiredPages", h, 0)
        dbe = c("nvmlDeviceGetRetiredPages", h, 1)
        gpu.retired_sbe = None if sbe is None else len(sbe)
        gpu.retired_dbe = None if dbe is None else len(dbe)
        pending = c("nvmlDeviceGetRetiredPagesPendingStatus", h)
        gpu.retired_pending = None if pending is None else bool(pending)
        rows = c("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            gpu.remap_correctable, gpu.remap_uncorrectable = int(rows[0]), int(rows[1])
            gpu.remap_pending, gpu.remap_failure = bool(rows[2]), bool(rows[3])
        hist = c("nvmlDeviceGetRowRemapperHistogram", h)
        if hist is not None:
            gpu.remap_histogram = {
                k: int(getattr(hist, k)) for k in ("max", "high", "partial", "low", "none")
            }
        reasons = c("nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:  # the older name of the same call (nvidia-ml-py before 12.535)
            reasons = c("nvmlDeviceGetCurrentClocksThrottleReasons", h)
            if reasons is not None:
                self._errors.pop("nvmlDeviceGetCurrentClocksEventReasons", None)
        gpu.clock_reasons = None if reasons is None else int(reasons)
        for policy, attr in ((0, "violation_power_ns"), (1, "violation_thermal_ns")):
            status = c("nvmlDeviceGetViolationStatus", h, policy)
            setattr(gpu, attr, None if status is None else int(status.violationTime))
        gpu.temperature_c = c("nvmlDeviceGetTemperature", h, 0)
        gpu.shutdown_c = c("nvmlDeviceGetTemperatureThreshold", h, 0)
        gpu.slowdown_c = c("nvmlDeviceGetTemperatureThreshold", h, 1)
        power = c("nvmlDeviceGetPowerUsage", h)
        limit = c("nvmlDeviceGetEnforcedPowerLimit", h)
        gpu.power_w = None if power is None else power / 1000.0
        gpu.power_limit_w = None if limit is None else limit / 1000.0
        gpu.pcie_gen = c("nvmlDeviceGetCurrPcieLinkGeneration", h)
        gpu.pcie_max_gen = c("nvmlDeviceGetMaxPcieLinkGeneration", h)
        gpu.pcie_width = c("nvmlDeviceGetCurrPcieLinkWidth", h)
        gpu.pcie_max_width = c("nvmlDeviceGetMaxPcieLinkWidth", h)
        gpu.pcie_replays = c("nvmlDeviceGetPcieReplayCounter", h)
        gpu.nvlinks = self._nvlinks(h)
        persistence = c("nvmlDeviceGetPersistenceMode", h)
        gpu.persistence = None if persistence is None else persistence == 1
        mig = c("nvmlDeviceGetMigMode", h)
        if mig is not None:
            gpu.mig_current, gpu.mig_pending = bool(mig[0]), bool(mig[1])
        rates = c("nvmlDeviceGetUtilizationRates", h)
        gpu.utilization_pct = None if rates is None else int(rates.gpu)
        memory = c("nvmlDeviceGetMemoryInfo", h)
        if memory is not None:
            gpu.memory_used_mib = memory.used / 2**20
            gpu.memory_total_mib = memory.total / 2**20
        fabric = self._fabric(h)
        if fabric is not None:
            gpu.fabric_state = FABRIC_STATES.get(int(fabric.state), str(fabric.state))
            gpu.fabric_status = "success" if int(fabric.status) == 0 else f"error {fabric.status}"
        gpu.errors = dict(self._errors)
        return gpu

    def _fabric(self, h: Any) -> Any:
        """nvmlGpuFabricInfo_t (state, status) or None; nvidia-ml-py wants the struct handed in."""
        struct = getattr(self.nv, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            return None
        info = struct()
        found = self._call("nvmlDeviceGetGpuFabricInfo", h, self.nv.byref(info))
        return None if found is None else info

    def _nvlinks(self, h: Any) -> list[NvLink] | None:
        links = []
        for link in range(int(getattr(self.nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS))):
            try:
                state = self.nv.nvmlDeviceGetNvLinkState(h, link)
            except self.nv.NVMLError as exc:
                if not _unsupported(exc) and _code(exc) != NVML_ERROR_INVALID_ARGUMENT:
                    self._errors.setdefault(f"nvmlDeviceGetNvLinkState(link {link})", str(exc))
                continue  # a link this GPU does not have
            found = NvLink(link, state == 1)
            if found.active:
                for name, counter in NVLINK_COUNTERS.items():
                    value = self._call("nvmlDeviceGetNvLinkErrorCounter", h, link, counter)
                    if value is not None:
                        found.counters[name] = int(value)
            links.append(found)
        return links or None


def _code(exc: Exception) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _unsupported(exc: Exception) -> bool:
    """NOT_SUPPORTED (or a library without the function): the GPU has no such value."""
    code = _code(exc)
    if code is None:  # an NVMLError without its code: NVML's words decide
        return str(exc).strip().lower() in ("not supported", "function not found")
    return code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
