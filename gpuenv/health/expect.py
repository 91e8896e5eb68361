"""What each GPU of a node should answer, and what its readings should be.

Two questions the rules ask before judging a reading (issue 32, items 2 and 3):

- **Does this reading exist here?** NVML answers None for a value a GPU does not support (page
  retirement on Ampere and newer, NVLink on a PCIe card): that is not a finding. But where the
  GPU's model (gpu_specs.yaml), its own other answers or its peers say the reading exists, None
  is a missing answer, and an NVML error other than NOT_SUPPORTED is a failed read: each is a
  ``nvml.read`` finding naming the call (``READS`` below, one row per call).
- **What should it be?** A reading with an expected value is judged against what the hardware
  should do: its model's figure, else the majority of its peers of the same model on the node
  (ties go to the higher value), never against a degraded reading of its own alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from gpuenv.health.findings import NVML_API, Finding
from gpuenv.health.nvml import GpuReading


@dataclass(frozen=True)
class Read:
    name: str  # the reading, as the nvml.read finding's subject and docs/health.md name it
    call: str  # the NVML call(s) that answer it, ", " between two
    fields: tuple[str, ...]  # the GpuReading fields it fills
    action: str  # the action when it is expected and missing, or failed
    expected_when: str  # besides peers that answer it: when it must exist (docs/health.md)


# One row per NVML call gpuenv health makes of a GPU. ``action``: a read that can hide a fault
# a job must not meet (the memory's state, the GPU's identity, its fabric, its host link) is as
# serious as that fault; the rest hide watch-level signals and are watch. NVLinks are judged
# by nvlink.state (a missing NVLink answer is as serious as links down, drain).
READS = (
    Read("name", "nvmlDeviceGetName", ("name",), "reset", "always"),
    Read("uuid", "nvmlDeviceGetUUID", ("uuid",), "reset", "always"),
    Read("pci", "nvmlDeviceGetPciInfo", ("bus_id",), "reset", "always"),
    Read(
        "ecc.mode",
        "nvmlDeviceGetEccMode",
        ("ecc_current", "ecc_pending"),
        "reset",
        "the GPU answers its row remapper or page retirement (it has ECC memory)",
    ),
    Read(
        "ecc.counters",
        "nvmlDeviceGetTotalEccErrors",
        (
            "ecc_volatile_corrected",
            "ecc_volatile_uncorrected",
            "ecc_aggregate_corrected",
            "ecc_aggregate_uncorrected",
        ),
        "watch",
        "ECC is on",
    ),
    Read(
        "row_remap",
        "nvmlDeviceGetRemappedRows",
        ("remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure"),
        "reset",
        "ECC is on and page retirement does not answer (Ampere and newer repair rows)",
    ),
    Read(
        "row_remap.histogram",
        "nvmlDeviceGetRowRemapperHistogram",
        ("remap_histogram",),
        "watch",
        "the row remapper answers",
    ),
    Read(
        "retired_pages",
        "nvmlDeviceGetRetiredPages",
        ("retired_sbe", "retired_dbe"),
        "reset",
        "the retirement's pending status answers",
    ),
    Read(
        "retired_pages.pending",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        ("retired_pending",),
        "reset",
        "the retired pages answer",
    ),
    Read(
        "clocks",
        "nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetCurrentClocksThrottleReasons",
        ("clock_reasons",),
        "watch",
        "peers only",
    ),
    Read(
        "violation",
        "nvmlDeviceGetViolationStatus",
        ("violation_power_ns", "violation_thermal_ns"),
        "watch",
        "peers only",
    ),
    Read("temperature", "nvmlDeviceGetTemperature", ("temperature_c",), "watch", "always"),
    Read(
        "temperature.thresholds",
        "nvmlDeviceGetTemperatureThreshold",
        ("slowdown_c", "shutdown_c"),
        "watch",
        "the GPU reports a temperature (a hot GPU without them is judged on its peers')",
    ),
    Read("power", "nvmlDeviceGetPowerUsage", ("power_w",), "watch", "the power limit answers"),
    Read(
        "power.limit",
        "nvmlDeviceGetEnforcedPowerLimit",
        ("power_limit_w",),
        "watch",
        "the power draw answers",
    ),
    Read(
        "pcie.link",
        "nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetCurrPcieLinkWidth",
        ("pcie_gen", "pcie_width"),
        "drain",
        "always (every GPU has a host link)",
    ),
    Read(
        "pcie.max",
        "nvmlDeviceGetMaxPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkWidth",
        ("pcie_max_gen", "pcie_max_width"),
        "watch",
        "always (every GPU has a host link)",
    ),
    Read(
        "pcie.replay",
        "nvmlDeviceGetPcieReplayCounter",
        ("pcie_replays",),
        "watch",
        "peers only",
    ),
    Read(
        "nvlink.errors",
        "nvmlDeviceGetNvLinkErrorCounter",
        (),
        "watch",
        "an active link of a GPU whose other links or peers answer the counters",
    ),
    Read(
        "persistence",
        "nvmlDeviceGetPersistenceMode",
        ("persistence",),
        "watch",
        "peers only",
    ),
    Read("mig", "nvmlDeviceGetMigMode", ("mig_current", "mig_pending"), "watch", "peers only"),
    Read(
        "fabric",
        "nvmlDeviceGetGpuFabricInfo",
        ("fabric_state", "fabric_status"),
        "drain",
        "peers only (on an NVSwitch node)",
    ),
    Read(
        "utilization",
        "nvmlDeviceGetUtilizationRates",
        ("utilization_pct",),
        "watch",
        "peers only",
    ),
    Read(
        "memory",
        "nvmlDeviceGetMemoryInfo",
        ("memory_used_mib", "memory_total_mib"),
        "watch",
        "peers only",
    ),
    Read(
        "nvlinks",
        "nvmlDeviceGetNvLinkState",
        (),
        "drain",
        "its model has NVLinks (gpu_specs.yaml nvlink_links), or the node has NVSwitches",
    ),
)
# Whole-GPU queries NVML does not serve while MIG mode is on (the NVML API reference's notes on
# nvmlDeviceGetUtilizationRates; the recorded mig-enabled fixture for the remapper histogram).
MIG_UNSERVED = ("utilization", "row_remap.histogram")
READ_BY_NAME = {r.name: r for r in READS}
READ_BY_CALL = {call: r for r in READS for call in r.call.split(", ")}
_LOST = "gpu is lost"  # NVML_ERROR_GPU_IS_LOST's words: the GPU fell off the bus (Xid 79)


@dataclass
class Expected:
    """What one GPU should answer and read, from its model and its peers of the same model."""

    model: str  # the gpu_specs.yaml key, else the NVML name, else the PCI device id
    peers: int = 0  # other GPUs of the same model on the node
    spec: Mapping[str, Any] = field(default_factory=dict)  # its gpu_specs.yaml row, or {}
    answered: dict[str, int] = field(default_factory=dict)  # field -> peers that answer it
    majority: dict[str, Any] = field(default_factory=dict)  # field -> the peers' majority value
    nvlink_links: int | None = None  # links the model has (gpu_specs.yaml), None: not said
    nvswitch_node: bool = False
    nvlink_counters: bool = False  # some link of this GPU or of its peers answers counters

    def peer_value(self, name: str) -> Any:
        return self.majority.get(name)


def data_table(name: str) -> Any:
    """A table of gpuenv/data, parsed by libyaml where PyYAML has it (a scan reads three tables;
    the pure-Python parser alone takes longer than the whole scan should)."""
    from gpuenv.checks.thresholds import DATA_DIR

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((DATA_DIR / name).read_text(encoding="utf-8"), Loader=loader)


@lru_cache(maxsize=1)
def shipped_specs() -> dict[str, Any]:
    """gpu_specs.yaml as load_specs gives it without a thresholds file's rows."""
    return data_table("gpu_specs.yaml") or {}


def specs_for(thresholds: Mapping[str, Any]) -> dict[str, Any]:
    """The GPU spec table, with a thresholds file's gpu_specs rows where it has any."""
    rows = thresholds.get("gpu_specs")
    if not rows:
        return shipped_specs()
    from gpuenv.checks.thresholds import load_specs

    return load_specs(rows)


def _model(gpu: GpuReading, device_ids: Mapping[str, str], specs: Mapping[str, Any]) -> tuple:
    from gpuenv.checks.thresholds import model_spec

    device_id = device_ids.get(gpu.bus_id, "")
    row = model_spec(specs, {"pci_device_id": device_id, "name": gpu.name}) if specs else None
    key = (row or {}).get("key") or gpu.name or device_id or "unknown"
    return key, row or {}


def _majority(values: list[Any]) -> Any:
    """The most common value; a tie goes to the higher (what the hardware should do)."""
    counts = Counter(values)
    top = max(counts.values())
    return max(v for v, n in counts.items() if n == top)


PEER_FIELDS = (
    "pcie_max_gen",
    "pcie_max_width",
    "slowdown_c",
    "shutdown_c",
    "power_limit_w",
    "memory_total_mib",
)


def expectations(
    gpus: list[GpuReading],
    device_ids: Mapping[str, str],
    specs: Mapping[str, Any],
    nvswitch_node: bool,
) -> dict[int, Expected]:
    """NVML index -> what that GPU should answer and read. ``device_ids``: bus id -> PCI device
    id as sysfs reads it (``0x2330``), ``specs``: the GPU spec table (load_specs)."""
    models = {g.index: _model(g, device_ids, specs) for g in gpus}
    fields = [name for r in READS for name in r.fields]
    # Per model: how many of its GPUs answer each field (a GPU's peers: the rest of them).
    groups: dict[str, list[GpuReading]] = {}
    for g in gpus:
        groups.setdefault(models[g.index][0], []).append(g)
    said = {
        key: {name: sum(_answered(p, name) for p in group) for name in fields}
        for key, group in groups.items()
    }
    out = {}
    for g in gpus:
        key, row = models[g.index]
        group = groups[key]
        peers = [p for p in group if p.index != g.index]
        answered = {name: said[key][name] - _answered(g, name) for name in fields}
        majority = {}
        for name in PEER_FIELDS:
            values = [getattr(p, name) for p in group if getattr(p, name) is not None]
            if values:
                majority[name] = _majority(values)
        links = row.get("nvlink_links")
        out[g.index] = Expected(
            model=key,
            peers=len(peers),
            spec=row,
            answered=answered,
            majority=majority,
            nvlink_links=int(links) if links else None,
            nvswitch_node=nvswitch_node,
            nvlink_counters=any(
                link.counters for p in group for link in (p.nvlinks or []) if link.active
            ),
        )
    return out


def _answered(gpu: GpuReading, name: str) -> bool:
    value = getattr(gpu, name)
    return value is not None and value != ""


def _why_expected(read: Read, gpu: GpuReading, exp: Expected, missing: list[str]) -> str:
    """Why ``missing`` fields of ``read`` should have been answered; "" when nothing says so."""
    # At least half of its peers of the same model answer it: one odd GPU answering what the
    # rest do not support does not make the rest look broken.
    said = [n for n in missing if exp.peers and 2 * exp.answered.get(n, 0) >= exp.peers]
    if said:
        n = max(exp.answered[m] for m in said)
        return f"{n} of its {exp.peers} peer(s) of the same model ({exp.model}) answer it"
    name = read.name
    if read.expected_when.startswith("always"):
        return "NVML answers it for every GPU"
    if name == "ecc.mode" and (gpu.remap_pending is not None or gpu.retired_pending is not None):
        return "the GPU answers its memory repair state, so it has ECC memory"
    if name == "ecc.counters" and gpu.ecc_current:
        return "ECC is on"
    if name == "row_remap" and gpu.ecc_current and gpu.retired_pending is None:
        return "ECC is on and page retirement does not answer either: the memory's repair state"
    if name == "row_remap.histogram" and gpu.remap_pending is not None:
        return "the row remapper answers"
    if name == "retired_pages" and gpu.retired_pending is not None:
        return "the retirement's pending status answers"
    if name == "retired_pages.pending" and (gpu.retired_sbe is not None):
        return "the retired pages answer"
    if name == "temperature.thresholds" and gpu.temperature_c is not None:
        return "the GPU reports a temperature"
    if name == "power" and gpu.power_limit_w is not None:
        return "the power limit answers"
    if name == "power.limit" and gpu.power_w is not None:
        return "the power draw answers"
    return ""


def read_findings(gpu: GpuReading, exp: Expected) -> list[Finding]:
    """A ``nvml.read`` finding for each call that failed (an NVML error other than
    NOT_SUPPORTED) or answered nothing where the reading exists, naming the call."""
    out = []
    by_read: dict[str, list[tuple[str, str]]] = {}
    for call, words in sorted(gpu.errors.items(), key=lambda kv: _call_order(kv[0])):
        read = _read_of(call)
        by_read.setdefault(read.name if read else call, []).append((call, words))
    failed = set(by_read)
    for name, calls in by_read.items():
        read = READ_BY_NAME.get(name)
        lost = any(_LOST in words.lower() for _, words in calls)
        action = "reboot" if lost else _action(read, exp) if read else "watch"
        said = "; ".join(f"{call} failed: {words}" for call, words in calls[:4])
        if len(calls) > 4:
            said += f"; and {len(calls) - 4} more"
        out.append(
            Finding(
                "nvml.read",
                action,
                f"{said} (an NVML error, not NOT_SUPPORTED: what it reads is unknown)",
                NVML_API,
                gpu=gpu.index,
                uuid=gpu.uuid,
                subject=name,
                new=True,
            )
        )
    for read in READS:
        if not read.fields or read.name in failed:
            continue
        missing = [n for n in read.fields if not _answered(gpu, n)]
        if not missing or (read.name == "ecc.counters" and not gpu.ecc_current):
            continue  # the ECC counters are read only where ECC is on (ecc.mode judges off)
        if gpu.mig_current and read.name in MIG_UNSERVED:
            continue  # a whole-GPU query MIG mode does not serve (mig.mode judges MIG)
        why = _why_expected(read, gpu, exp, missing)
        if not why:
            continue
        out.append(
            Finding(
                "nvml.read",
                _action(read, exp),
                f"{read.call} answered nothing for {', '.join(missing)} although {why}",
                NVML_API,
                gpu=gpu.index,
                uuid=gpu.uuid,
                subject=read.name,
                new=True,
            )
        )
    return out


def _action(read: Read, exp: Expected) -> str:
    """The read's action; the fabric matters only where NVSwitches join the GPUs (fabric_findings
    judges it nowhere else), so its failed read elsewhere is watch."""
    if read.name == "fabric" and not exp.nvswitch_node:
        return "watch"
    return read.action


def _call_order(call: str) -> tuple[str, int]:
    """``nvmlDeviceGetNvLinkState(link 10)`` after ``(link 9)``."""
    base, _, rest = call.partition("(link ")
    return base, int(rest.rstrip(")")) if rest.rstrip(")").isdigit() else -1


def _read_of(call: str) -> Read | None:
    """The row of a failed call (``nvmlDeviceGetNvLinkState(link 3)`` is nvlinks')."""
    return READ_BY_CALL.get(call.split("(")[0])
