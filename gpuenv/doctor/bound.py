"""Class 11: every NVIDIA GPU on the PCI bus is driven by the NVIDIA driver.

A GPU that no NVIDIA driver holds is invisible to CUDA and NVML, whatever else is installed: the
module is not loaded, or no module was built for the running kernel (the kernel was upgraded
without DKMS building for it, or the headers were missing), or nouveau took the GPU first, or
another driver (vfio-pci for a passthrough) holds it. sysfs says who drives each function
(``/sys/bus/pci/devices/<BDF>/driver``, the node floor's ``pci.Device.driver``).
"""

from __future__ import annotations

from gpuenv.doctor import pci
from gpuenv.doctor.driver import kernel_log, loaded_module
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor import boot

NUMBER = 11
_NOUVEAU_FIXES = (
    "blacklist nouveau: printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
    "/etc/modprobe.d/blacklist-nouveau.conf",
    "rebuild the initramfs without it and reboot: update-initramfs -u && reboot",
)


def _bound_by(gpus: list[pci.Device]) -> str:
    return ", ".join(f"{g.bdf} ({g.driver or 'no driver'})" for g in gpus)


def driver_bound(system: System) -> ClassReading:
    gpus = pci.gpus(system)
    if not gpus:
        return skipped(NUMBER, "no NVIDIA GPU on the PCI bus")
    loose = [g for g in gpus if g.driver != "nvidia"]
    facts = {"gpus": len(gpus), "drivers": {g.bdf: g.driver or None for g in gpus}}
    reading = ClassReading(NUMBER, facts=facts)
    if not loose:
        return reading
    evidence = [f"/sys/bus/pci/devices/<BDF>/driver: {_bound_by(loose)}"]
    held = sorted({g.driver for g in loose if g.driver and g.driver != "nvidia"})
    if "nouveau" in held:
        title = f"nouveau drives {len([g for g in loose if g.driver == 'nouveau'])} GPU(s)"
        cause = "the open-source nouveau driver took the GPUs before the NVIDIA module could"
        fixes = _NOUVEAU_FIXES
    elif held:
        title = f"{', '.join(held)} holds {len(loose)} GPU(s), not the NVIDIA driver"
        cause = (
            "another driver holds the GPUs (vfio-pci: set aside for a virtual machine): CUDA "
            "on this node cannot use them"
        )
        fixes = (
            f"if the node should run CUDA: echo <BDF> > /sys/bus/pci/drivers/{held[0]}/unbind, "
            "and remove the driver_override or vfio-pci.ids= that bound it",
        )
    else:
        title, cause, fixes, more = _unbound(system)
        evidence += more
    reading.findings.append(Finding(NUMBER, title, cause, tuple(evidence), fixes))
    return reading


def _unbound(system: System) -> tuple[str, str, tuple[str, ...], list[str]]:
    """No driver at all: the module is not loaded, has no build for this kernel, or refused."""
    root = str(system.root)
    running = boot.running_kernel(root)
    if loaded_module(system) is not None:
        log, source = kernel_log(system)
        nvrm = [ln.strip() for ln in log or [] if "NVRM" in ln][-3:]
        return (
            "the NVIDIA module is loaded but drives no GPU",
            "the module refused the GPU (an unsupported GPU for this branch, or a probe failure)",
            (
                "read the module's reason: dmesg | grep NVRM",
                "install a driver branch that supports the GPU (see the nvidia_driver role)",
            ),
            [f"{source}: {ln}" for ln in nvrm] or ["the kernel log has no NVRM line"],
        )
    files = boot.module_files(root, running)
    if not files:
        return (
            f"no NVIDIA module for the running kernel {running}",
            "the kernel was changed (an upgrade, or a different boot entry) and no NVIDIA module "
            "was built for it, so nothing drives the GPUs",
            (
                f"apt-get install linux-headers-{running} && dkms autoinstall -k {running}",
                "or boot the kernel the module was built for (dkms status lists it)",
            ),
            [f"/lib/modules/{running}: no nvidia.ko or nvidia-current.ko"],
        )
    return (
        "the NVIDIA module is not loaded",
        "the module exists for the running kernel but was not loaded (or failed to load)",
        ("modprobe nvidia, then read why it fails if it does: dmesg | grep -i nvidia",),
        [f"module file: {files[0]}", "no /proc/driver/nvidia/version, no /sys/module/nvidia"],
    )
