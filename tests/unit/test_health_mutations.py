"""Every reading of the recorded healthy 8 x H100 SXM node, degraded one at a time (halved,
down-trained, null, removed, an NVML error), must not leave the node HEALTHY, unless
docs/health.md says why that reading cannot matter (issue 32, "Verified when").

Each mutation is scanned as the monitoring timer would see it: the healthy base is scanned
first, then the degraded node 300 s later with the state the first scan left (so counters are
judged on their growth). The table of readings x mutations x verdict is generated into
docs/health-mutations.md; the test fails when that file is stale. Regenerate it with:

    GPUENV_REGENERATE_DOCS=1 .venv/bin/python -m pytest -q tests/unit/test_health_mutations.py
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from healthnode import build

from gpuenv.checks.thresholds import load_thresholds
from gpuenv.health.findings import VERDICT_WORDS, rank
from gpuenv.health.nvml import FakeNvml
from gpuenv.health.scan import scan

ROOT = Path(__file__).resolve().parents[2]
HEALTH_DOC = ROOT / "docs" / "health.md"
TABLE_DOC = ROOT / "docs" / "health-mutations.md"
NOW_UNIX = 1_780_000_000.0
INTERVAL_S = 300.0
THRESHOLDS = load_thresholds()
GPU = 3  # the GPU a per-GPU mutation degrades (its 7 peers stay healthy)
ALL = "all"  # a mutation of every GPU at once: no peer to compare with
COMMAND = (
    "GPUENV_REGENERATE_DOCS=1 .venv/bin/python -m pytest -q tests/unit/test_health_mutations.py"
)


@dataclass
class Degraded:
    """The node being degraded: NVML's data, the root tree, the kernel log."""

    nvml: dict[str, Any]
    base_root: Path
    copy_to: Path
    log: str | None
    copied: bool = False

    @property
    def root(self) -> Path:
        """The node's tree, copied on first use (most mutations change only NVML's answers)."""
        if not self.copied:
            shutil.copytree(self.base_root, self.copy_to, symlinks=True)
            self.copied = True
        return self.copy_to

    def scan_root(self) -> Path:
        return self.copy_to if self.copied else self.base_root

    def gpus(self, which: int | str = GPU) -> list[dict[str, Any]]:
        """The GPU entries to change, each with the defaults copied in (so nested values can be
        changed in place without touching the other GPUs)."""
        out = []
        for gpu in self.nvml["gpus"]:
            if which == ALL or gpu["index"] == which:
                for key, value in self.nvml["gpu_defaults"].items():
                    gpu.setdefault(key, _copy(value))
                out.append(gpu)
        return out

    def set(self, which: int | str = GPU, **values: Any) -> None:
        for gpu in self.gpus(which):
            gpu.update(values)

    def error(self, call: str, *fields: str, which: int | str = GPU) -> None:
        """``call`` answered an NVML error (not NOT_SUPPORTED): its fields are unknown."""
        for gpu in self.gpus(which):
            gpu.update(dict.fromkeys(fields))
            gpu["errors"] = {call: "Unknown Error"}

    def link(self, n: int) -> dict[str, Any]:
        return self.gpus()[0]["nvlinks"][n]


def _copy(value: Any) -> Any:
    import copy

    return copy.deepcopy(value)


Mutate = Callable[[Degraded], None]
MUTATIONS: list[tuple[str, str, Mutate]] = []
DEGRADED_FIELDS: set[str] = {"nvlinks"}  # the GpuReading fields some mutation degrades


def mutation(reading: str, how: str) -> Callable[[Mutate], Mutate]:
    def add(fn: Mutate) -> Mutate:
        MUTATIONS.append((reading, how, fn))
        return fn

    return add


def _field_mutations(
    reading: str,
    call: str,
    fields: tuple[str, ...],
    values: dict[str, dict[str, Any]],
    null: bool = True,
) -> None:
    """``values``: a mutation's name -> the fields it sets on GPU 3; plus null (where the base
    answers the reading) and error."""
    DEGRADED_FIELDS.update(fields)
    for how, changes in values.items():
        MUTATIONS.append((reading, how, lambda d, c=changes: d.set(**c)))
    if null:
        MUTATIONS.append((reading, "null", lambda d: d.set(**dict.fromkeys(fields))))
    MUTATIONS.append((reading, "error", lambda d: d.error(call, *fields)))


_field_mutations("name", "nvmlDeviceGetName", ("name",), {"empty": {"name": ""}})
_field_mutations("uuid", "nvmlDeviceGetUUID", ("uuid",), {"empty": {"uuid": ""}})
_field_mutations("pci bus id", "nvmlDeviceGetPciInfo", ("bus_id",), {"empty": {"bus_id": ""}})
_field_mutations(
    "ecc mode",
    "nvmlDeviceGetEccMode",
    ("ecc_current", "ecc_pending"),
    {"off": {"ecc_current": False, "ecc_pending": False}, "pending off": {"ecc_pending": False}},
)
for _name, _raised in (
    ("ecc_volatile_corrected", 1000),
    ("ecc_volatile_uncorrected", 1),
    ("ecc_aggregate_corrected", 10000),
    ("ecc_aggregate_uncorrected", 1),
):
    _field_mutations(
        _name.replace("_", " "),
        "nvmlDeviceGetTotalEccErrors",
        (_name,),
        {"raise": {_name: _raised}},
    )
_field_mutations(
    "row remap",
    "nvmlDeviceGetRemappedRows",
    ("remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure"),
    {
        "pending": {"remap_pending": True, "remap_uncorrectable": 1},
        "failure": {"remap_failure": True},
        "raise uncorrectable rows": {"remap_uncorrectable": 8},
        "raise correctable rows": {"remap_correctable": 8},
    },
)
_field_mutations(
    "row remap histogram",
    "nvmlDeviceGetRowRemapperHistogram",
    ("remap_histogram",),
    {
        "a bank without spares": {"remap_histogram": {"max": 639, "none": 1}},
        "halve max": {"remap_histogram": {"max": 320, "high": 320}},
    },
)
_field_mutations(
    "retired pages",
    "nvmlDeviceGetRetiredPages",
    ("retired_sbe", "retired_dbe"),
    {
        "raise": {"retired_sbe": 2, "retired_dbe": 0, "retired_pending": False},
        "to replace": {"retired_sbe": 60, "retired_dbe": 0, "retired_pending": False},
    },
    null=False,  # H100 does not support page retirement: the base answers nothing already
)
MUTATIONS.append(
    (
        "retired pages pending",
        "pending",
        lambda d: d.set(retired_pending=True, retired_sbe=1, retired_dbe=0),
    )
)
DEGRADED_FIELDS.add("retired_pending")
MUTATIONS.append(
    (
        "retired pages pending",
        "error",
        lambda d: d.error("nvmlDeviceGetRetiredPagesPendingStatus", "retired_pending"),
    )
)
_field_mutations(
    "clock event reasons",
    "nvmlDeviceGetCurrentClocksEventReasons",
    ("clock_reasons",),
    {
        "hw slowdown": {"clock_reasons": 0x8},
        "hw thermal": {"clock_reasons": 0x40},
        "hw power brake": {"clock_reasons": 0x80},
        "sw thermal": {"clock_reasons": 0x20},
    },
)
_field_mutations(
    "violation time",
    "nvmlDeviceGetViolationStatus",
    ("violation_power_ns", "violation_thermal_ns"),
    {
        "power grows 50% of the interval": {"violation_power_ns": int(INTERVAL_S * 0.5e9)},
        "thermal grows 50% of the interval": {"violation_thermal_ns": int(INTERVAL_S * 0.5e9)},
    },
)
_field_mutations(
    "temperature",
    "nvmlDeviceGetTemperature",
    ("temperature_c",),
    {
        "near slowdown": {"temperature_c": 84},
        "near shutdown": {"temperature_c": 90},
        "halve": {"temperature_c": 20},
    },
)
_field_mutations(
    "temperature thresholds",
    "nvmlDeviceGetTemperatureThreshold",
    ("slowdown_c", "shutdown_c"),
    {
        "halve slowdown": {"slowdown_c": 43},
        "halve shutdown": {"shutdown_c": 46},
        "null, GPU near shutdown": {"slowdown_c": None, "shutdown_c": None, "temperature_c": 90},
    },
)
_field_mutations(
    "power draw",
    "nvmlDeviceGetPowerUsage",
    ("power_w",),
    {"over the limit": {"power_w": 760.0}, "halve": {"power_w": 59.2}},
)
_field_mutations(
    "power limit",
    "nvmlDeviceGetEnforcedPowerLimit",
    ("power_limit_w",),
    {"halve": {"power_limit_w": 350.0}},
)
_field_mutations(
    "pcie link",
    "nvmlDeviceGetCurrPcieLinkWidth",
    ("pcie_gen", "pcie_width"),
    {"down-train width": {"pcie_width": 8}, "down-train gen": {"pcie_gen": 4}},
)
_field_mutations(
    "pcie max",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    ("pcie_max_gen", "pcie_max_width"),
    {"halve max width": {"pcie_max_width": 8}, "halve max gen": {"pcie_max_gen": 2}},
)
MUTATIONS.append(
    (
        "pcie link",
        "down-train width and max width",
        lambda d: d.set(pcie_width=8, pcie_max_width=8),
    )
)
_field_mutations(
    "pcie replays",
    "nvmlDeviceGetPcieReplayCounter",
    ("pcie_replays",),
    {"raise": {"pcie_replays": 100}},
)
_field_mutations(
    "persistence mode",
    "nvmlDeviceGetPersistenceMode",
    ("persistence",),
    {"off": {"persistence": False}},
)
_field_mutations(
    "mig mode",
    "nvmlDeviceGetMigMode",
    ("mig_current", "mig_pending"),
    {"on": {"mig_current": True, "mig_pending": True}, "pending on": {"mig_pending": True}},
)
_field_mutations(
    "fabric",
    "nvmlDeviceGetGpuFabricInfo",
    ("fabric_state", "fabric_status"),
    {
        "in progress": {"fabric_state": "in_progress"},
        "status error": {"fabric_status": "error 6"},
    },
)
_field_mutations(
    "utilization",
    "nvmlDeviceGetUtilizationRates",
    ("utilization_pct",),
    {"busy": {"utilization_pct": 100}},
)
_field_mutations(
    "memory",
    "nvmlDeviceGetMemoryInfo",
    ("memory_used_mib", "memory_total_mib"),
    {"halve total": {"memory_total_mib": 71885.5}, "halve used": {"memory_used_mib": 2.0}},
)


@mutation("nvlinks", "one link down")
def _link_down(d: Degraded) -> None:
    d.link(5).update(active=False, counters={})


@mutation("nvlinks", "remove one link")
def _link_removed(d: Degraded) -> None:
    d.gpus()[0]["nvlinks"].pop(5)


@mutation("nvlinks", "empty")
def _links_empty(d: Degraded) -> None:
    d.set(nvlinks=[])


@mutation("nvlinks", "null")
def _links_null(d: Degraded) -> None:
    d.set(nvlinks=None)


@mutation("nvlinks", "error")
def _links_error(d: Degraded) -> None:
    d.gpus()[0]["nvlinks"].pop(5)
    d.gpus()[0]["errors"] = {"nvmlDeviceGetNvLinkState(link 5)": "Unknown Error"}


@mutation("nvlink error counters", "raise")
def _link_errors(d: Degraded) -> None:
    d.link(0)["counters"]["crc_flit"] = 100


@mutation("nvlink error counters", "remove one link's")
def _link_counters_removed(d: Degraded) -> None:
    d.link(0)["counters"] = {}


@mutation("nvlink error counters", "error")
def _link_counters_error(d: Degraded) -> None:
    d.link(0)["counters"] = {}
    d.gpus()[0]["errors"] = {"nvmlDeviceGetNvLinkErrorCounter": "Unknown Error"}


# Every GPU at once: nothing on the node to compare with, only the model and the GPU itself.
for _reading, _fields in (
    ("ecc mode", ("ecc_current", "ecc_pending")),
    ("ecc counters", ("ecc_volatile_corrected", "ecc_volatile_uncorrected",
                      "ecc_aggregate_corrected", "ecc_aggregate_uncorrected")),
    ("row remap", ("remap_correctable", "remap_uncorrectable", "remap_pending", "remap_failure")),
    ("row remap histogram", ("remap_histogram",)),
    ("temperature", ("temperature_c",)),
    ("temperature thresholds", ("slowdown_c", "shutdown_c")),
    ("power limit", ("power_limit_w",)),
    ("pcie link", ("pcie_gen", "pcie_width")),
    ("pcie max", ("pcie_max_gen", "pcie_max_width")),
    ("nvlinks", ("nvlinks",)),
):  # fmt: skip
    MUTATIONS.append(
        (_reading, "null on every GPU", lambda d, f=_fields: d.set(ALL, **dict.fromkeys(f)))
    )
MUTATIONS.append(("nvlinks", "empty on every GPU", lambda d: d.set(ALL, nvlinks=[])))


@mutation("gpu", "gone from NVML (still on the bus)")
def _gpu_gone(d: Degraded) -> None:
    d.nvml["gpus"] = [g for g in d.nvml["gpus"] if g["index"] != GPU]


@mutation("gpu", "error (cannot be opened)")
def _gpu_error(d: Degraded) -> None:
    d.set(error="GPU requires reset")


@mutation("nvml", "error (cannot start)")
def _nvml_error(d: Degraded) -> None:
    d.nvml["error"] = "Driver Not Loaded"


@mutation("driver version", "null")
def _driver_null(d: Degraded) -> None:
    d.nvml["driver_version"] = None


@mutation("driver version", "differs from the module")
def _driver_differs(d: Degraded) -> None:
    d.nvml["driver_version"] = "550.144.03"


@mutation("driver version", "error")
def _driver_error(d: Degraded) -> None:
    d.nvml["driver_version"] = None
    d.nvml["errors"] = {"nvmlSystemGetDriverVersion": "Unknown Error"}


# The node's own readings: sysfs, procfs, the kernel log.
IB_PORT = "sys/class/infiniband/mlx5_2/ports/1"
PCI = "sys/bus/pci/devices"


def _write(d: Degraded, rel: str, text: str) -> None:
    (d.root / rel).write_text(text, encoding="utf-8")


def _remove(d: Degraded, rel: str) -> None:
    target = d.root / rel
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        target.unlink()


for _reading, _how, _fn in (
    ("module version", "remove", lambda d: _remove(d, "sys/module/nvidia/version")),
    ("module version", "differs", lambda d: _write(d, "sys/module/nvidia/version", "550.90.07\n")),
    ("fabric manager process", "remove", lambda d: _remove(d, "proc/2113")),
    ("nvswitch", "remove one from the bus", lambda d: _remove(d, f"{PCI}/0000:08:00.0")),
    ("boot id", "remove", lambda d: _remove(d, "proc/sys/kernel/random/boot_id")),
    ("uptime", "remove", lambda d: _remove(d, "proc/uptime")),
    ("kernel log", "unreadable", lambda d: setattr(d, "log", None)),
    ("ib port state", "down", lambda d: _write(d, f"{IB_PORT}/state", "1: DOWN\n")),
    ("ib port state", "init", lambda d: _write(d, f"{IB_PORT}/state", "2: INIT\n")),
    ("ib port state", "remove", lambda d: _remove(d, f"{IB_PORT}/state")),
    ("ib port phys_state", "polling", lambda d: _write(d, f"{IB_PORT}/phys_state", "2: Polling\n")),
    ("ib port counters", "raise", lambda d: _write(d, f"{IB_PORT}/counters/symbol_error", "10\n")),
    ("ib port counters", "remove", lambda d: _remove(d, f"{IB_PORT}/counters")),
    ("ib device", "remove", lambda d: _remove(d, "sys/class/infiniband/mlx5_2")),
    ("ib port rate", "halve", lambda d: _write(d, f"{IB_PORT}/rate", "200 Gb/sec (4X HDR)\n")),
    ("ib port link_layer", "ethernet", lambda d: _write(d, f"{IB_PORT}/link_layer", "Ethernet\n")),
):  # fmt: skip
    MUTATIONS.append((_reading, _how, _fn))


@dataclass
class Outcome:
    reading: str
    how: str
    verdict: str  # the verdict word
    worst: str  # the worst finding: signal, subject, GPU


def _scan(node_root: Path, data: dict[str, Any], log: str | None, state: Any, at: float) -> Any:
    from healthnode import recorded_run

    return scan(str(node_root), recorded_run(log), FakeNvml(data), THRESHOLDS, state, at, node="n")


def _word(findings: list[Any]) -> str:
    worst = max((f.action for f in findings), key=rank, default="none")
    return VERDICT_WORDS[worst]


def _outcomes(tmp: Path) -> list[Outcome]:
    base = build(tmp / "base", "hgx8")
    first = _scan(Path(base.root), base.nvml_data, base.kernel_log, None, NOW_UNIX)
    assert first.worst == "none", [f.evidence for f in first.findings if f.action != "none"]
    out = []
    for i, (reading, how, mutate) in enumerate(MUTATIONS):
        degraded = Degraded(_copy(base.nvml_data), Path(base.root), tmp / f"m{i}", base.kernel_log)
        mutate(degraded)
        root = degraded.scan_root()
        report = _scan(root, degraded.nvml, degraded.log, first.state, NOW_UNIX + INTERVAL_S)
        top = max(report.findings, key=lambda f: rank(f.action))
        worst = (
            ""
            if top.action == "none"
            else top.signal
            + (f" {top.subject}" if top.subject else "")
            + (f" on GPU {top.gpu}" if top.gpu is not None else "")
        )
        out.append(Outcome(reading, how, _word(report.findings), worst))
        if degraded.copied:
            shutil.rmtree(root)
    return out


def statements() -> dict[tuple[str, str], str]:
    """docs/health.md's table of readings that cannot matter: (reading, mutation) -> why."""
    text = HEALTH_DOC.read_text(encoding="utf-8")
    section = text.split("### Readings that cannot make a node unhealthy", 1)[1].split("\n#", 1)[0]
    found = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and not set(cells[0]) <= {"-"}:
            found[(cells[0].strip("`"), cells[1])] = cells[2]
    return found


def render(outcomes: list[Outcome], why: dict[tuple[str, str], str]) -> str:
    lines = [
        "# `gpuenv health`: the healthy 8-GPU node, degraded one reading at a time",
        "",
        "<!-- Generated by tests/unit/test_health_mutations.py; do not edit by hand. -->",
        "",
        "Each row takes the recorded healthy 8 x H100 SXM node (tests/fixtures/health/_base/hgx8),",
        f"degrades one reading (of GPU {GPU} unless the mutation says every GPU), and scans it",
        f"{INTERVAL_S:.0f} s after a scan of the healthy node, with the state that scan left. Only",
        'the readings docs/health.md names under "Readings that cannot make a node unhealthy" may',
        "stay `HEALTHY`, and this table quotes why. Regenerate it with:",
        "",
        "```",
        COMMAND,
        "```",
        "",
        f"{len(outcomes)} mutations; {sum(o.verdict != 'HEALTHY' for o in outcomes)} not HEALTHY.",
        "",
        "| reading | mutation | verdict | worst finding |",
        "|---|---|---|---|",
    ]
    for o in outcomes:
        worst = o.worst or f"none: {why.get((o.reading, o.how), 'NOT EXPLAINED')}"
        lines.append(f"| `{o.reading}` | {o.how} | {o.verdict} | {worst} |")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> list[Outcome]:
    return _outcomes(tmp_path_factory.mktemp("mutations"))


def _assert_every_reading_is_degraded() -> None:
    """Every field NVML answers of a GPU in the base is degraded by some mutation, and each
    mutation is named once."""
    import json

    data = json.loads((ROOT / "tests/fixtures/health/_base/hgx8/nvml.json").read_text())
    assert set(data["gpu_defaults"]) <= DEGRADED_FIELDS, set(data["gpu_defaults"]) - DEGRADED_FIELDS
    names = [(r, h) for r, h, _ in MUTATIONS]
    assert len(names) == len(set(names))
    assert len(MUTATIONS) >= 100


def test_no_degraded_reading_leaves_the_node_healthy_unless_the_docs_say_why(outcomes):
    _assert_every_reading_is_degraded()
    why = statements()
    healthy = {(o.reading, o.how) for o in outcomes if o.verdict == "HEALTHY"}
    unexplained = sorted(healthy - set(why))
    assert not unexplained, f"HEALTHY with no statement in docs/health.md: {unexplained}"
    stale = sorted(set(why) - healthy)
    assert not stale, f"docs/health.md explains mutations that are not HEALTHY (any more): {stale}"


def test_missing_and_failed_reads_name_the_read(outcomes):
    """A null or error answer never passes: its verdict is not HEALTHY, and the worst finding is
    the read that failed, or the fault it would have shown."""
    for o in outcomes:
        if o.how in ("null", "error") and (o.reading, o.how) not in statements():
            assert o.verdict != "HEALTHY", o


def test_a_missing_nvlink_answer_on_an_nvswitch_node_is_as_serious_as_links_down(outcomes):
    got = {(o.reading, o.how): o for o in outcomes if o.reading == "nvlinks"}
    down = got[("nvlinks", "one link down")]
    assert down.verdict == "NEEDS DRAIN"
    for how in ("null", "empty", "error", "remove one link", "null on every GPU"):
        assert got[("nvlinks", how)].verdict == down.verdict, got[("nvlinks", how)]


def test_the_generated_table_is_current(outcomes):
    text = render(outcomes, statements())
    if os.environ.get("GPUENV_REGENERATE_DOCS") == "1":
        TABLE_DOC.write_text(text, encoding="utf-8")
    assert TABLE_DOC.is_file() and TABLE_DOC.read_text(encoding="utf-8") == text, (
        f"docs/health-mutations.md is stale: {COMMAND}"
    )
    assert "NOT EXPLAINED" not in text


def test_the_mutation_table_is_named_in_docs_health():
    assert "health-mutations.md" in HEALTH_DOC.read_text(encoding="utf-8")
    assert re.search(r"GPUENV_REGENERATE_DOCS=1", HEALTH_DOC.read_text(encoding="utf-8"))
