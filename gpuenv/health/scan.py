"""One passive scan of one node: NVML once, the kernel log once, sysfs, then the rules and the
escalation ladder. ``scan`` is the API a cluster fan-out calls on each node; it returns data and
prints nothing (the console, JSON and Prometheus forms live in gpuenv/report/health.py).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from typing import Any

from gpuenv.floor import fabric, pci
from gpuenv.floor import health as floor
from gpuenv.floor.node import Run
from gpuenv.health import expect, history, rules
from gpuenv.health.findings import Finding, HealthReport
from gpuenv.health.nvml import GpuReading, Nvml


def _counters(reading: Any) -> dict[str, Any]:
    return {
        "pcie_replays": reading.pcie_replays,
        "nvlink_errors": rules.nvlink_total(reading),
        "ecc_volatile_uncorrected": reading.ecc_volatile_uncorrected,
        "violation_power_ns": reading.violation_power_ns,
        "violation_thermal_ns": reading.violation_thermal_ns,
    }


def _fresh_events(
    log: floor.KernelLog,
    state: Mapping[str, Any],
    boot: str,
    boot_unix: float | None,
    by_bus: Mapping[str, Any],
) -> tuple[list[floor.KernelEvent], set[int], float]:
    """This boot's events not hidden by a clear after them, which of them are new since the
    last scan, and the newest stamp read."""
    same_boot = bool(boot) and state.get("boot_id") == boot
    seen_s = float(state.get("kernel_log_s", -1.0)) if same_boot else -1.0
    cleared = state.get("cleared", {})
    kept = []
    for event in log.events:
        if boot_unix is not None and event.since_boot_s >= 0:
            # An Xid older than a recorded repair of its finding (or of everything) is history.
            at_unix = boot_unix + event.since_boot_s
            if cleared.get(_finding_id(event, by_bus), -1.0) > at_unix:
                continue
        kept.append(event)
    new = {i for i, e in enumerate(kept) if e.since_boot_s > seen_s or e.since_boot_s < 0}
    newest = max([seen_s, *(e.since_boot_s for e in log.events)])
    return kept, new, newest


def _finding_id(event: floor.KernelEvent, by_bus: Mapping[str, Any]) -> str:
    """The id of the finding an event becomes (rules.xid_findings)."""
    if event.kind == "sxid":
        return f"sxid:node:{event.bus}/{event.code}"
    gpu = by_bus.get(event.bus)
    return f"xid:{gpu.uuid if gpu else 'node'}:{event.code}"


def scan(
    root: str,
    run: Run,
    nvml: Nvml,
    thresholds: Mapping[str, Any],
    state: Mapping[str, Any] | None = None,
    now_unix: float | None = None,
    node: str | None = None,
    escalation: tuple[history.Rule, ...] | list[history.Rule] | None = None,
) -> HealthReport:
    """Scan the node under ``root``: ``run`` reads the kernel log, ``nvml`` the GPUs,
    ``thresholds`` is the whole thresholds file (its ``health`` section is used), ``state`` what
    the last scan left (history.load). The report's ``state`` is what to save for the next."""
    started_at = time.monotonic()
    now_unix = time.time() if now_unix is None else now_unix
    state = dict(state or history.empty_state())
    th = thresholds["health"]
    reading = nvml.read()
    log = floor.kernel_log(run)
    devices = pci.devices(root)
    pci_gpus = None if devices is None else [d.bdf for d in devices if d.is_gpu]
    nvswitch_node = any(d.is_nvswitch for d in devices or [])
    module = floor.module_version(root)
    boot = floor.boot_id(root)
    uptime = floor.uptime_s(root)
    boot_unix = None if uptime is None else now_unix - uptime
    interval_s = None
    if state.get("last_scan_unix") is not None and state.get("boot_id") == boot:
        interval_s = now_unix - float(state["last_scan_unix"])
    counters = state.get("counters", {})

    findings: list[Finding] = rules.node_findings(pci_gpus, module, reading, state.get("gpus", {}))
    findings.append(rules.kernel_log_finding(log.source, log.reason))
    good = [g for g in reading.gpus if not g.error]
    device_ids = {d.bdf: f"0x{d.device:04x}" for d in devices or [] if d.is_gpu}
    exps = expect.expectations(good, device_ids, expect.specs_for(thresholds), nvswitch_node)
    for gpu in good:
        prev = counters.get(gpu.uuid, {}) if state.get("boot_id") == boot else {}
        findings += rules.gpu_findings(gpu, prev, th, interval_s, exps[gpu.index])
    findings += rules.nvlink_state_findings(good, nvswitch_node, exps)
    fm_running = floor.running(root) if nvswitch_node else False
    findings += rules.fabric_findings(good, nvswitch_node, fm_running)
    # A GPU NVML lost is still known by what an earlier scan saw at its address, so that its Xid
    # 79 and its loss count against the same UUID after the reboot that brings it back.
    known = {
        bus: GpuReading(int(i), uuid=u, bus_id=bus) for bus, (i, u) in state.get("gpus", {}).items()
    }
    known.update({g.bus_id: g for g in good if g.bus_id})
    by_bus = {bus[:-2]: g for bus, g in known.items()}
    events, new, newest_s = _fresh_events(log, state, boot, boot_unix, by_bus)
    findings += rules.xid_findings(events, new, by_bus)
    ports = floor.ib_ports(root)
    findings += rules.ib_device_findings(fabric.invisible_named(fabric.adapters(root, devices)))
    prev_ib = counters.get("ib", {}) if state.get("boot_id") == boot else {}
    findings += rules.ib_findings(ports, prev_ib, th)

    next_state = history.escalate(findings, state, now_unix, escalation)
    next_state.update(
        boot_id=boot,
        kernel_log_s=newest_s,
        gpus={bus: [g.index, g.uuid] for bus, g in known.items()},
        counters={
            **{g.uuid: _counters(g) for g in good},
            "ib": {p.name: sum(p.counters.values()) for p in ports if p.counters},
        },
    )
    return HealthReport(
        node=node or socket.gethostname().split(".")[0],
        findings=findings,
        gpus=[{"index": g.index, "uuid": g.uuid, "name": g.name, "bus_id": g.bus_id} for g in good],
        kernel_log=log.source,
        scan_s=time.monotonic() - started_at,
        at_unix=now_unix,
        state=next_state,
    )
