"""Class 6: PCIe ACS on the bridges between GPUs (and between GPUs and NICs), and the IOMMU mode.

With ACS source validation or request/completion redirect on, a PCIe switch port sends
peer-to-peer traffic up to the root complex instead of straight across: GPU-to-GPU copies and
GPUDirect RDMA slow down or hang (NCCL's troubleshooting guide). The bridges that matter for
a pair of devices are those on their sysfs paths below the last bridge both paths share (two
devices under different root ports meet in the root complex: their traffic goes up anyway).
Each bridge's ACS Control register is read by the floor (``gpuenv.floor.pci.acs_control``) from
sysfs ``config``; that needs root, since sysfs shows a user other than root only the first 64 bytes
of configuration space and ACS is an extended capability (past 256 bytes). Where ``config`` cannot
be read that far, ``lspci -vvv`` (root only too) is the fallback, and a user other than root gets a
SKIP saying so.
"""

from __future__ import annotations

import itertools
import re

from gpuenv.doctor import pci
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor import fabric as floor_fabric
from gpuenv.floor import pci as floor_pci

_HEADER_RE = re.compile(r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (.*)$")
_ON_FLAGS = ("SrcValid+", "ReqRedir+", "CmpltRedir+")


def acs_controls(lspci_text: str) -> dict[str, tuple[str, str]]:
    """{BDF: (description, ACSCtl flags)}; flags "<access denied>" when not root."""
    out: dict[str, tuple[str, str]] = {}
    bdf, desc = "", ""
    for line in lspci_text.splitlines():
        m = _HEADER_RE.match(line)
        if m:
            bdf, desc = m.groups()
            continue
        stripped = line.strip()
        if bdf and stripped.startswith("ACSCtl:"):
            out[bdf] = (desc, stripped[len("ACSCtl:") :].strip())
        elif bdf and stripped == "Capabilities: <access denied>":
            out[bdf] = (desc, "<access denied>")
    return out


NOT_ROOT = (
    "not run as root: sysfs config shows only the first 64 bytes of configuration space to other"
    " users and lspci cannot read the bridges' ACS capability either"
)


def _sysfs_acs(system: System, crossing: dict[str, list[str]]) -> dict[str, str] | None:
    """{bridge: evidence} for the bridges whose ACS Control has a peer-to-peer
    flag on, from sysfs config; None when some bridge's extended config space cannot be read."""
    root = str(system.root)
    if not all(floor_pci.config_readable(root, b) for b in crossing):
        return None
    on = {}
    for b in sorted(crossing):
        control = floor_pci.acs_control(root, b)  # None: the bridge has no ACS capability
        flags = floor_pci.acs_flags(control or 0)
        if flags:
            said = " ".join(f"{f}+" for f in flags)
            on[b] = f"sysfs {b}/config: ACS Control 0x{control:04x}: ACSCtl: {said}"
    return on


def iommu_mode(system: System) -> tuple[str, str]:
    cmdline = (system.read("/proc/cmdline") or "").split()
    units = system.listdir("/sys/class/iommu")
    if not units:
        return "off", "/sys/class/iommu is empty"
    passthrough = {"iommu=pt", "iommu.passthrough=1", "amd_iommu=pt"} & set(cmdline)
    if passthrough:
        return (
            "passthrough",
            f"/sys/class/iommu: {', '.join(units)}; /proc/cmdline: {passthrough.pop()}",
        )
    return "translated", f"/sys/class/iommu: {', '.join(units)}; no iommu=pt in /proc/cmdline"


def path_bridges(devices: list[pci.Device]) -> dict[str, list[str]]:
    """{bridge BDF: [the device pairs whose peer-to-peer path crosses it]}."""
    crossing: dict[str, list[str]] = {}
    for a, b in itertools.combinations(devices, 2):
        if not (a.is_gpu or b.is_gpu):
            continue
        below = floor_fabric.path_bridges(a.bridges, b.bridges)
        for bridge in below:
            crossing.setdefault(bridge, []).append(f"{a.bdf}<->{b.bdf}")
    return crossing


def pcie_acs(system: System) -> ClassReading:
    devices = pci.devices(system)
    endpoints = [d for d in devices if d.is_gpu or d.is_nic]
    if not any(d.is_gpu for d in endpoints) or len(endpoints) < 2:
        return skipped(6, "fewer than two GPUs/NICs with a GPU among them: no peer-to-peer path")
    mode, mode_evidence = iommu_mode(system)
    crossing = path_bridges(endpoints)
    facts = {"iommu": mode, "path_bridges": sorted(crossing)}
    if not crossing:
        return ClassReading(6, facts=facts)
    on = _sysfs_acs(system, crossing)
    if on is None:
        out = system.run("lspci-vvv", ["lspci", "-D", "-vvv"])
        if out.rc is None:
            return skipped(6, out.why("lspci (pciutils)"), **facts)
        controls = acs_controls(out.stdout)
        if any(controls.get(b, ("", ""))[1] == "<access denied>" for b in crossing):
            return skipped(6, NOT_ROOT, **facts)
        on = {
            b: f"lspci -vvv {b} ({controls[b][0]}): ACSCtl: {controls[b][1]}"
            for b in sorted(crossing)
            if b in controls and any(f in controls[b][1] for f in _ON_FLAGS)
        }
    facts["acs_on"] = sorted(on)
    reading = ClassReading(6, facts=facts)
    if not on:
        return reading
    evidence = list(on.values())
    evidence += [f"{b} is on the path {', '.join(crossing[b][:3])}" for b in on]
    evidence.append(f"IOMMU: {mode} ({mode_evidence})")
    bdfs = ";".join(on)
    reading.findings.append(
        Finding(
            6,
            f"PCIe ACS on between GPUs/NICs at {', '.join(on)} (IOMMU {mode})",
            "ACS sends peer-to-peer PCIe traffic up to the root complex: GPU-to-GPU and "
            "GPUDirect RDMA bandwidth drops or NCCL hangs",
            tuple(evidence),
            (
                "BIOS: set PCIe ACS control to disabled (persistent; the vendor's PCIe/IIO menu)",
                f"kernel parameter: add pci=disable_acs_redir={bdfs}"
                + (" and iommu=pt" if mode == "translated" else "")
                + " to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub, reboot",
                "until the next boot: "
                + "; ".join(f"setpci -s {b} ECAP_ACS+0x6.w=0000" for b in on),
            ),
        )
    )
    return reading
