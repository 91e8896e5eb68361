"""The signals of `gpuenv health` turned into findings (docs/health.md lists each with its source).

Every function here is pure: readings in, findings out. ``prev`` is what the state file kept of
the GPU's counters at the last scan (empty on the first), so counters are judged on their growth.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from gpuenv.floor.health import IbPort, KernelEvent
from gpuenv.health import nvml as nv
from gpuenv.health.expect import Expected, data_table, read_findings
from gpuenv.health.findings import (
    FABRIC_MANAGER,
    GPUENV,
    IB_SYSFS,
    MEMORY_GUIDE,
    NVML_API,
    PAGE_RETIREMENT,
    PERSISTENCE,
    XID_CATALOGUE,
    Finding,
)
from gpuenv.health.nvml import GpuReading

_RECOVERY = re.compile(r"to 0x[0-9a-f]+ \(([^)]+)\)", re.IGNORECASE)
# Xid 154's words for the driver's recovery action, most disruptive first ("Drain and Reset").
_RECOVERY_WORDS = (("drain", "drain"), ("reboot", "reboot"), ("reset", "reset"), ("none", "none"))


@lru_cache(maxsize=1)
def xid_table() -> dict[str, Any]:
    return data_table("xid.yaml")


def growth(now: int | None, before: int | None) -> int | None:
    """What a counter grew by since the last scan; all of it on the first scan or after a reset."""
    if now is None:
        return None
    if before is None or now < before:
        return now
    return now - before


def _f(gpu: GpuReading, signal: str, action: str, evidence: str, source: str, **kw: Any) -> Finding:
    return Finding(signal, action, evidence, source, gpu=gpu.index, uuid=gpu.uuid, **kw)


def gpu_findings(
    gpu: GpuReading,
    prev: Mapping[str, Any],
    th: Mapping[str, Any],
    interval_s: float | None,
    exp: Expected | None = None,
) -> list[Finding]:
    """Every signal NVML answered for one GPU (a signal it does not support gives no finding).
    ``exp`` (expect.expectations): what the GPU should answer and read, from its model and its
    peers; with it, a missing or failed read is a finding and values are judged against it."""
    exp = exp or Expected(model=gpu.name)
    out: list[Finding] = read_findings(gpu, exp)
    out += _ecc(gpu, prev, th)
    out += _memory(gpu, th)
    out += _throttle(gpu, prev, th, interval_s)
    out += _thermal_power(gpu, th, exp)
    out += _pcie(gpu, prev, th, exp)
    out += _nvlink_errors(gpu, prev, th, exp)
    out += _memory_size(gpu, exp)
    if gpu.persistence is not None:
        out.append(
            _f(
                gpu,
                "persistence.mode",
                "none" if gpu.persistence else "watch",
                f"persistence mode {'on' if gpu.persistence else 'off'}"
                + ("" if gpu.persistence else ": the driver tears the GPU down between jobs"),
                PERSISTENCE,
            )
        )
    if gpu.mig_current is not None:
        bad = gpu.mig_current or bool(gpu.mig_pending)
        out.append(
            _f(
                gpu,
                "mig.mode",
                "reset" if bad else "none",
                f"MIG mode {'on' if gpu.mig_current else 'off'}, pending"
                f" {'on' if gpu.mig_pending else 'off'}"
                + (
                    ": whole-GPU jobs cannot use it; nvidia-smi -i N -mig 0, then reset"
                    if bad
                    else ""
                ),
                NVML_API,
            )
        )
    return out


def _ecc(gpu: GpuReading, prev: Mapping[str, Any], th: Mapping[str, Any]) -> list[Finding]:
    out = []
    if gpu.ecc_current is not None:
        bad = not gpu.ecc_current or gpu.ecc_pending != gpu.ecc_current
        mode, pending = ("on" if v else "off" for v in (gpu.ecc_current, gpu.ecc_pending))
        text = f"ECC {mode}, pending {pending}"
        if bad:
            text += (
                ": memory errors go undetected or a mode change waits; nvidia-smi -e 1, then reset"
            )
        out.append(_f(gpu, "ecc.mode", "reset" if bad else "none", text, MEMORY_GUIDE))
    for scope, span in (("volatile", "since the last reset"), ("aggregate", "over the GPU's life")):
        n = getattr(gpu, f"ecc_{scope}_corrected")
        if n is None:
            continue
        limit = th[f"ecc_{scope}_corrected_watch"]
        out.append(
            _f(
                gpu,
                f"ecc.{scope}_corrected",
                "watch" if n >= limit else "none",
                f"{n} corrected ECC errors {span} (watch at {limit})",
                MEMORY_GUIDE,
                value=n,
            )
        )
    if gpu.ecc_volatile_uncorrected is not None:
        n = gpu.ecc_volatile_uncorrected
        grew = growth(n, prev.get("ecc_volatile_uncorrected")) or 0
        out.append(
            _f(
                gpu,
                "ecc.volatile_uncorrected",
                "watch" if n else "none",
                f"{n} uncorrectable ECC errors since the last reset"
                + (" (the row remapper and the Xid say what to do)" if n else ""),
                MEMORY_GUIDE,
                value=n,
                new=grew > 0 and n > 0,
            )
        )
    if gpu.ecc_aggregate_uncorrected is not None:
        n = gpu.ecc_aggregate_uncorrected
        out.append(
            _f(
                gpu,
                "ecc.aggregate_uncorrected",
                "none",
                f"{n} uncorrectable ECC errors over the GPU's life (recorded; the remap and"
                " retirement state judge them)",
                MEMORY_GUIDE,
                value=n,
            )
        )
    return out


def _memory(gpu: GpuReading, th: Mapping[str, Any]) -> list[Finding]:
    out = []
    if gpu.retired_sbe is not None or gpu.retired_dbe is not None:
        n = (gpu.retired_sbe or 0) + (gpu.retired_dbe or 0)
        limit = th["retired_pages_replace"]
        action = "replace" if n >= limit else "watch" if n else "none"
        out.append(
            _f(
                gpu,
                "retired_pages.count",
                action,
                f"{n} retired pages ({gpu.retired_sbe or 0} single-bit, {gpu.retired_dbe or 0}"
                f" double-bit; replace at {limit})",
                PAGE_RETIREMENT,
                value=n,
            )
        )
    if gpu.retired_pending is not None:
        out.append(
            _f(
                gpu,
                "retired_pages.pending",
                "reset" if gpu.retired_pending else "none",
                "page retirement pending: it takes effect when the GPU is reset or the driver"
                " reloaded"
                if gpu.retired_pending
                else "no page retirement pending",
                PAGE_RETIREMENT,
                new=bool(gpu.retired_pending),
            )
        )
    if gpu.remap_pending is not None:
        out.append(
            _f(
                gpu,
                "row_remap.pending",
                "reset" if gpu.remap_pending else "none",
                f"row remap pending ({gpu.remap_uncorrectable} rows remapped for uncorrectable,"
                f" {gpu.remap_correctable} for correctable errors): reset the GPU, then scan again"
                if gpu.remap_pending
                else f"no remap pending ({gpu.remap_uncorrectable} uncorrectable,"
                f" {gpu.remap_correctable} correctable rows remapped)",
                MEMORY_GUIDE,
                value=gpu.remap_uncorrectable,
                new=bool(gpu.remap_pending),
            )
        )
    if gpu.remap_failure is not None:
        out.append(
            _f(
                gpu,
                "row_remap.failure",
                "replace" if gpu.remap_failure else "none",
                "a row remapping failed: the GPU meets NVIDIA's RMA policy"
                if gpu.remap_failure
                else "no row remapping failure",
                MEMORY_GUIDE,
                new=bool(gpu.remap_failure),
            )
        )
    if gpu.remap_histogram is not None:
        h = gpu.remap_histogram
        exhausted = h.get("none", 0)
        out.append(
            _f(
                gpu,
                "row_remap.histogram",
                "watch" if exhausted else "none",
                f"banks by spare rows left: max {h.get('max', 0)}, high {h.get('high', 0)},"
                f" partial {h.get('partial', 0)}, low {h.get('low', 0)}, none {exhausted}"
                + (
                    ": a new error in a bank without spares cannot be remapped" if exhausted else ""
                ),
                MEMORY_GUIDE,
                value=exhausted,
                detail=dict(h),
            )
        )
    return out


_REASONS = (
    ("throttle.hw_slowdown", nv.REASON_HW_SLOWDOWN, "hardware slowdown (clocks halved or worse)"),
    ("throttle.hw_thermal", nv.REASON_HW_THERMAL, "hardware thermal slowdown"),
    ("throttle.hw_power_brake", nv.REASON_HW_POWER_BRAKE, "hardware power brake (external signal)"),
    ("throttle.sw_thermal", nv.REASON_SW_THERMAL, "software thermal slowdown"),
)


def _throttle(
    gpu: GpuReading, prev: Mapping[str, Any], th: Mapping[str, Any], interval_s: float | None
) -> list[Finding]:
    out = []
    if gpu.clock_reasons is not None:
        for signal, bit, words in _REASONS:
            on = bool(gpu.clock_reasons & bit)
            out.append(
                _f(
                    gpu,
                    signal,
                    "watch" if on else "none",
                    f"{words} {'engaged' if on else 'not engaged'}"
                    f" (clocks event reasons 0x{gpu.clock_reasons:x})",
                    NVML_API,
                    value=int(on),
                    new=on,
                )
            )
    if gpu.violation_power_ns is None and gpu.violation_thermal_ns is None:
        return out
    shares = {}
    for kind in ("power", "thermal"):
        grown = growth(getattr(gpu, f"violation_{kind}_ns"), prev.get(f"violation_{kind}_ns"))
        if interval_s and grown is not None and prev.get(f"violation_{kind}_ns") is not None:
            shares[kind] = grown / 1e9 / interval_s
    limit = th["throttle_watch_fraction"]
    if not shares:
        text, action, worst = (
            "first scan: no interval to judge the violation counters on",
            "none",
            None,
        )
    else:
        worst = max(shares.values())
        action = "watch" if worst >= limit else "none"
        text = ", ".join(f"{k} {v:.0%}" for k, v in shares.items()) + (
            f" of the {interval_s:.0f} s since the last scan clocked down (watch at {limit:.0%})"
        )
    out.append(
        _f(gpu, "throttle.duration", action, text, NVML_API, value=worst, new=action != "none")
    )
    return out


def _thermal_power(gpu: GpuReading, th: Mapping[str, Any], exp: Expected) -> list[Finding]:
    """Temperature against the GPU's own thresholds, else its peers' (a GPU that does not answer
    its thresholds is still judged); thresholds and the power cap against the peers' majority."""
    out = []
    t = gpu.temperature_c
    for signal, kind, action, key in (
        ("temperature.slowdown", "slowdown", "watch", "temperature_margin_c"),
        ("temperature.shutdown", "shutdown", "drain", "shutdown_margin_c"),
    ):
        own = getattr(gpu, f"{kind}_c")
        limit = own or exp.peer_value(f"{kind}_c")
        if t is None or not limit:
            continue
        margin = th[key]
        near = t >= limit - margin
        whose = "" if own else " (its own threshold unanswered: its peers')"
        out.append(
            _f(
                gpu,
                signal,
                action if near else "none",
                f"{t} C, {kind} at {limit} C{whose} ({action} within {margin} C)",
                NVML_API,
                value=t,
                new=near,
            )
        )
    differ = [
        f"{kind} {getattr(gpu, f'{kind}_c')} C, its peers' {exp.peer_value(f'{kind}_c')} C"
        for kind in ("slowdown", "shutdown")
        if getattr(gpu, f"{kind}_c") is not None
        and exp.peer_value(f"{kind}_c") is not None
        and getattr(gpu, f"{kind}_c") != exp.peer_value(f"{kind}_c")
    ]
    if differ:
        out.append(
            _f(
                gpu,
                "temperature.thresholds",
                "watch",
                f"thresholds differ from its peers of the same model ({exp.model}): "
                + "; ".join(differ),
                NVML_API,
                new=True,
            )
        )
    if gpu.power_w is not None and gpu.power_limit_w:
        fraction = th["power_over_limit_fraction"]
        over = gpu.power_w > gpu.power_limit_w * fraction
        out.append(
            _f(
                gpu,
                "power.limit",
                "watch" if over else "none",
                f"{gpu.power_w:.0f} W of a {gpu.power_limit_w:.0f} W limit"
                + (": the cap is not holding" if over else ""),
                NVML_API,
                value=gpu.power_w,
                new=over,
            )
        )
    peers_limit = exp.peer_value("power_limit_w")
    if gpu.power_limit_w is not None and peers_limit:
        capped = gpu.power_limit_w < peers_limit * POWER_CAP_FRACTION
        out.append(
            _f(
                gpu,
                "power.cap",
                "watch" if capped else "none",
                f"enforced power limit {gpu.power_limit_w:.0f} W, its peers'"
                f" {peers_limit:.0f} W"
                + (": it runs capped below its peers (nvidia-smi -i N -pl)" if capped else ""),
                NVML_API,
                value=gpu.power_limit_w,
                new=capped,
            )
        )
    return out


# A GPU's enforced limit below this share of its peers' is capped (an administrator's cap on
# every GPU alike is no finding: the peers share it).
POWER_CAP_FRACTION = 0.95
# A GPU showing less memory than this share of its peers' (same model) lost some of it.
MEMORY_FRACTION = 0.99


def _memory_size(gpu: GpuReading, exp: Expected) -> list[Finding]:
    peers = exp.peer_value("memory_total_mib")
    if gpu.memory_total_mib is None or not peers:
        return []
    short = gpu.memory_total_mib < peers * MEMORY_FRACTION
    return [
        _f(
            gpu,
            "memory.total",
            "watch" if short else "none",
            f"{gpu.memory_total_mib:.0f} MiB of memory, its peers' {peers:.0f} MiB"
            + (": part of the memory is not visible" if short else ""),
            NVML_API,
            value=gpu.memory_total_mib,
            new=short,
        )
    ]


def _pcie(
    gpu: GpuReading, prev: Mapping[str, Any], th: Mapping[str, Any], exp: Expected
) -> list[Finding]:
    """The link against what it should train to: the higher of the GPU's own maximum and its
    peers' (the majority of the same model), so a degraded maximum does not lower its own bar."""
    out = []
    want_width = max(gpu.pcie_max_width or 0, exp.peer_value("pcie_max_width") or 0)
    want_gen = max(gpu.pcie_max_gen or 0, exp.peer_value("pcie_max_gen") or 0)
    if gpu.pcie_width is not None and want_width:
        narrow = gpu.pcie_width < want_width
        out.append(
            _f(
                gpu,
                "pcie.width",
                "drain" if narrow else "none",
                f"PCIe x{gpu.pcie_width} of x{want_width}"
                + ("" if want_width == gpu.pcie_max_width else " (its peers' maximum)")
                + (": the link trained narrow (reseat the GPU or its riser)" if narrow else ""),
                NVML_API,
                value=gpu.pcie_width,
                new=narrow,
            )
        )
    if gpu.pcie_gen is not None and want_gen:
        idle = bool((gpu.clock_reasons or 0) & nv.REASON_GPU_IDLE)
        slow = gpu.pcie_gen < want_gen and not idle
        text = f"PCIe gen {gpu.pcie_gen} of {want_gen}"
        if want_gen != gpu.pcie_max_gen:
            text += " (its peers' maximum)"
        if gpu.pcie_gen < want_gen:
            text += (
                ": the GPU is idle, and an idle link trains down to save power"
                if idle
                else " while the GPU is busy"
            )
        out.append(
            _f(
                gpu,
                "pcie.generation",
                "watch" if slow else "none",
                text,
                NVML_API,
                value=gpu.pcie_gen,
                new=slow,
            )
        )
    below = [
        f"{what} {own} where its peers' is {peer}"
        for what, own, peer in (
            ("max gen", gpu.pcie_max_gen, exp.peer_value("pcie_max_gen")),
            ("max width x", gpu.pcie_max_width, exp.peer_value("pcie_max_width")),
        )
        if own is not None and peer is not None and own < peer
    ]
    if below:
        out.append(
            _f(
                gpu,
                "pcie.max",
                "watch",
                "the GPU's PCIe maximum is below its peers' of the same model"
                f" ({exp.model}): " + "; ".join(below).replace("x ", "x"),
                NVML_API,
                new=True,
            )
        )
    if gpu.pcie_replays is not None:
        grown = growth(gpu.pcie_replays, prev.get("pcie_replays")) or 0
        limit = th["pcie_replay_watch"]
        out.append(
            _f(
                gpu,
                "pcie.replay",
                "watch" if grown >= limit else "none",
                f"{grown} PCIe replays since the last scan ({gpu.pcie_replays} in all; watch at"
                f" {limit})",
                NVML_API,
                value=gpu.pcie_replays,
                new=grown >= limit,
            )
        )
    return out


def nvlink_total(gpu: GpuReading) -> int | None:
    """The NVLink error counters summed; None when NVML answered none of them (not 0: a GPU
    whose driver no longer serves the per-link counters is not judged clean)."""
    if gpu.nvlinks is None or not any(link.counters for link in gpu.nvlinks):
        return None
    return sum(sum(link.counters.values()) for link in gpu.nvlinks)


def _nvlink_errors(
    gpu: GpuReading, prev: Mapping[str, Any], th: Mapping[str, Any], exp: Expected
) -> list[Finding]:
    out = []
    unread = [str(link.link) for link in gpu.nvlinks or [] if link.active and not link.counters]
    if unread and exp.nvlink_counters:
        out.append(
            _f(
                gpu,
                "nvml.read",
                "watch",
                "nvmlDeviceGetNvLinkErrorCounter answered nothing for active link(s)"
                f" {', '.join(unread)} although other links of the GPU or its peers answer:"
                " their errors are unknown",
                NVML_API,
                subject="nvlink.errors",
                new=True,
            )
        )
    total = nvlink_total(gpu)
    if total is None:
        return out
    grown = growth(total, prev.get("nvlink_errors")) or 0
    limit = th["nvlink_errors_watch"]
    by_link = {
        str(link.link): sum(link.counters.values()) for link in gpu.nvlinks or [] if link.counters
    }
    noisy = ", ".join(f"link {k}: {v}" for k, v in by_link.items() if v)
    return [
        *out,
        _f(
            gpu,
            "nvlink.errors",
            "watch" if grown >= limit else "none",
            f"{grown} NVLink CRC/replay/recovery errors since the last scan ({total} in all"
            + (f"; {noisy}" if noisy else "")
            + f"; watch at {limit})",
            NVML_API,
            value=total,
            new=grown >= limit,
        ),
    ]


def nvlink_state_findings(
    gpus: list[GpuReading], nvswitch_node: bool, exps: Mapping[int, Expected] | None = None
) -> list[Finding]:
    """A GPU with fewer active links than it should have: its model's count (gpu_specs.yaml),
    every link NVML lists on an NVSwitch node, else the node's best GPU. A GPU whose links NVML
    does not answer at all where its model or the node says it has them is as bad as links down
    (gpud once reported such a node healthy, issue 23; an empty answer too, issue 32). A lone
    GPU on a node without NVSwitches that answers no link (one SXM GPU passed to a VM) has no
    peer to link to and is not judged, as the system check does."""
    exps = exps or {}

    def model(g: GpuReading) -> str:
        exp = exps.get(g.index)
        return exp.model if exp else ""

    out = []
    for g in gpus:
        exp = exps.get(g.index)
        model_links = exp.nvlink_links if exp else None
        links = g.nvlinks or []
        best = max(
            (sum(x.active for x in p.nvlinks or []) for p in gpus if model(p) == model(g)),
            default=0,
        )
        if not links and not nvswitch_node and (len(gpus) < 2 or not model_links) and not best:
            continue
        active = sum(link.active for link in links)
        want = [best, model_links or 0, len(links) if nvswitch_node else 0]
        expected = max(want)
        if not links and nvswitch_node and not expected:
            expected = 1  # an NVSwitch node's GPUs reach each other through their links
        down = [str(link.link) for link in links if not link.active]
        bad = active < expected
        if not links:
            why = (
                f"NVML answered {'an empty list' if g.nvlinks == [] else 'nothing'} for the"
                " NVLinks"
                + (f" (its model {exp.model} has {model_links})" if model_links and exp else "")
                + (" on an NVSwitch node" if nvswitch_node else "")
                + ": as bad as every link down"
            )
        else:
            why = f"{active} of {len(links)} NVLinks active"
            if bad:
                whose = (
                    f"its model {exp.model}'s"
                    if exp and model_links and expected == model_links
                    else "the node's best GPU's"
                    if expected == best and not nvswitch_node
                    else "every link listed"
                )
                why += f" (expected {expected}, {whose}; down: {', '.join(down) or 'none listed'})"
        out.append(
            _f(g, "nvlink.state", "drain" if bad else "none", why, NVML_API, value=active, new=bad)
        )
    return out


def fabric_findings(gpus: list[GpuReading], nvswitch_node: bool, fm_running: bool) -> list[Finding]:
    """On an NVSwitch node every GPU's fabric must be trained and Fabric Manager running."""
    if not nvswitch_node:
        return []
    out = [
        Finding(
            "fabric.manager",
            "none" if fm_running else "drain",
            "nv-fabricmanager runs"
            if fm_running
            else "NVSwitches on the bus but no nv-fabricmanager process: CUDA cannot use"
            " the GPUs (start nvidia-fabricmanager)",
            FABRIC_MANAGER,
        )
    ]
    for g in gpus:
        if g.fabric_state is None or g.fabric_state == "not_supported":
            continue
        ok = g.fabric_state == "completed" and g.fabric_status == "success"
        out.append(
            _f(
                g,
                "fabric.state",
                "none" if ok else "drain",
                f"fabric state {g.fabric_state}, status {g.fabric_status}",
                FABRIC_MANAGER,
                new=not ok,
            )
        )
    return out


def _xid_action(
    row: Mapping[str, Any] | None, gpu: GpuReading | None, text: str
) -> tuple[str, str]:
    if row is None:
        return "watch", "not in gpuenv's Xid table: look it up in NVIDIA's catalogue"
    action = str(row["action"])
    why = f"{row['name']}; catalogue bucket {row['bucket']}"
    if row["code"] == 154:
        match = _RECOVERY.search(text)
        words = match.group(1).lower() if match else ""
        for word, ladder in _RECOVERY_WORDS:
            if word in words:
                action, why = (
                    ladder,
                    why + f"; the driver asks for: {match.group(1) if match else ''}",
                )
                break
    remap = row.get("remap") or {}
    if gpu is not None and remap:
        if gpu.remap_failure and "failure" in remap:
            action, why = remap["failure"], why + "; the row remapper reports a failure"
        elif gpu.remap_pending and "pending" in remap:
            action, why = remap["pending"], why + "; a row remap is pending: reset, then scan again"
        elif gpu.remap_pending is False and "done" in remap:
            action, why = remap["done"], why + "; no remap pending: it was applied"
    return action, why


def xid_findings(
    events: list[KernelEvent], new: set[int], by_bus: Mapping[str, GpuReading]
) -> list[Finding]:
    """One finding per GPU and Xid code; ``new``: indexes into ``events`` not seen before."""
    table = xid_table()
    rows = {int(r["code"]): r for r in table["xid"]}
    groups: dict[tuple[str, str, int], list[int]] = {}
    for i, event in enumerate(events):
        groups.setdefault((event.kind, event.bus, event.code), []).append(i)
    out = []
    for (kind, bus, code), indexes in groups.items():
        last = events[indexes[-1]]
        fresh = sum(1 for i in indexes if i in new)
        if kind == "xid":
            gpu = by_bus.get(bus)
            row = rows.get(code)
            action, why = _xid_action(row, gpu, last.text)
            source = (
                table["memory_guide"] if row and row["source"] == "memory_guide" else XID_CATALOGUE
            )
            out.append(
                Finding(
                    "xid",
                    action,
                    f"Xid {code} on PCI {bus} x{len(indexes)} this boot ({fresh} new): {why};"
                    f" last: {last.text[:160]}",
                    source,
                    gpu=gpu.index if gpu else None,
                    uuid=gpu.uuid if gpu else "",
                    subject=str(code),
                    value=len(indexes),
                    new=fresh > 0,
                    detail={"bus": bus, "since_boot_s": last.since_boot_s, "fresh": fresh},
                )
            )
        else:
            sxid = table["sxid"]
            fatal = "non-fatal" not in last.text.lower() and "fatal" in last.text.lower()
            action = sxid["fatal"] if fatal else sxid["non_fatal"]
            out.append(
                Finding(
                    "sxid",
                    action,
                    f"SXid {code} on NVSwitch {bus} x{len(indexes)} this boot ({fresh} new,"
                    f" {'fatal' if fatal else 'non-fatal'}): {last.text[:160]}",
                    sxid["source"],
                    subject=f"{bus}/{code}",
                    value=len(indexes),
                    new=fresh > 0,
                    detail={"fresh": fresh},
                )
            )
    return out


def ib_device_findings(invisible: list[str]) -> list[Finding]:
    """One ``ib.device`` drain per RDMA-capable adapter on the PCI bus without its RDMA device
    (/sys/class/infiniband): a card the node cannot use for RDMA (its RDMA module not loaded or
    not built for the running kernel, no driver bound, the device lost), and NCCL falls back to
    sockets. ``invisible`` is the floor's one rule (``fabric.invisible_named``), which the
    ``fabric`` check, ``system`` and the doctor share: each entry names the card, its address and
    the cause; the card carrying the default route (a management port) is not among them."""
    return [
        Finding(
            "ib.device",
            "drain",
            f"{said}; NCCL would fall back to sockets",
            IB_SYSFS,
            subject=said.split(": no RDMA device", 1)[0],
            new=True,
        )
        for said in invisible
    ]


def ib_findings(
    ports: list[IbPort], prev: Mapping[str, Any], th: Mapping[str, Any]
) -> list[Finding]:
    out = []
    limit = th["ib_errors_watch"]
    counted = any(port.counters for port in ports)
    for port in ports:
        if counted and not port.counters:
            out.append(
                Finding(
                    "ib.errors",
                    "watch",
                    f"{port.name}: its error counters could not be read although other ports'"
                    " can: its errors are unknown",
                    IB_SYSFS,
                    subject=port.name,
                    new=True,
                )
            )
        up = port.state.upper() == "ACTIVE" and port.phys_state.lower() == "linkup"
        out.append(
            Finding(
                "ib.state",
                "none" if up else "drain",
                f"{port.name} ({port.link_layer or 'unknown layer'}): {port.state or '?'},"
                f" {port.phys_state or '?'}",
                IB_SYSFS,
                subject=port.name,
                new=not up,
            )
        )
        if port.counters:
            total = sum(port.counters.values())
            grown = growth(total, prev.get(port.name)) or 0
            named = ", ".join(f"{k} {v}" for k, v in port.counters.items() if v)
            out.append(
                Finding(
                    "ib.errors",
                    "watch" if grown >= limit else "none",
                    f"{port.name}: {grown} port errors since the last scan ({total} in all"
                    + (f": {named}" if named else "")
                    + f"; watch at {limit})",
                    IB_SYSFS,
                    subject=port.name,
                    value=total,
                    new=grown >= limit,
                )
            )
    return out


def node_findings(
    pci_gpus: list[str] | None,
    module_version: str | None,
    reading: nv.NvmlReading,
    known: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """The driver and the bus: the module loaded, its version against NVML's, GPUs NVML lost
    (``known``: bus id -> [index, UUID] of the GPUs earlier scans saw, to name a lost one)."""
    out = []
    on_bus = pci_gpus or []
    if on_bus or module_version:
        loaded = module_version is not None and not reading.error
        text = (
            f"nvidia module {module_version} loaded, NVML answers"
            if loaded
            else f"nvidia module {'not loaded' if module_version is None else module_version};"
            f" NVML: {reading.error or 'answers'}"
        )
        mismatch = "mismatch" in reading.error.lower()
        out.append(
            Finding(
                "driver.loaded",
                "none" if loaded else "reboot" if mismatch else "drain",
                text,
                NVML_API,
            )
        )
    if module_version and reading.driver_version:
        same = module_version == reading.driver_version
        out.append(
            Finding(
                "driver.version",
                "none" if same else "reboot",
                f"kernel module {module_version}, user-space library {reading.driver_version}"
                + ("" if same else ": an upgrade without a reboot; reboot to load the new module"),
                GPUENV,
            )
        )
    seen = {g.bus_id for g in reading.gpus}
    if not reading.error:
        for bdf in on_bus:
            if bdf not in seen:
                index, uuid = (known or {}).get(bdf, [None, ""])
                out.append(
                    Finding(
                        "gpu.lost",
                        "reboot",
                        f"GPU {bdf} is on the PCI bus but NVML does not list it"
                        + (f" (it was GPU {index}, {uuid})" if uuid else ""),
                        XID_CATALOGUE,
                        gpu=index,
                        uuid=uuid,
                        subject=bdf,
                        new=True,
                    )
                )
    for call, words in sorted(reading.errors.items()):
        out.append(
            Finding(
                "nvml.read",
                "reboot" if "gpu is lost" in words.lower() else "drain",
                f"{call} failed: {words} (an NVML error, not NOT_SUPPORTED)",
                NVML_API,
                subject=call,
                new=True,
            )
        )
    if (
        not reading.error
        and reading.driver_version is None
        and "nvmlSystemGetDriverVersion" not in reading.errors
    ):
        out.append(
            Finding(
                "nvml.read",
                "watch",
                "nvmlSystemGetDriverVersion answered nothing although NVML started: the"
                " user-space library cannot be checked against the kernel module",
                NVML_API,
                subject="nvmlSystemGetDriverVersion",
                new=True,
            )
        )
    for g in reading.gpus:
        if g.error:
            out.append(
                Finding(
                    "gpu.unreadable",
                    "reset",
                    f"NVML cannot open GPU {g.index}: {g.error}",
                    NVML_API,
                    gpu=g.index,
                    subject=str(g.index),
                    new=True,
                )
            )
    return out


def kernel_log_finding(source: str, reason: str) -> Finding:
    if source:
        return Finding("kernel_log.read", "none", f"kernel log read from {source}", GPUENV)
    return Finding(
        "kernel_log.read",
        "watch",
        f"the kernel log could not be read ({reason}): Xids and SXids are unknown",
        GPUENV,
        new=True,
    )
