"""Classes 1, 3, 4 and 5: the NVIDIA driver's pieces agree with each other and with the boot.

1. The user-space driver library (``libnvidia-ml.so.<version>``, ``libcuda.so.<version>``
   behind the ld cache's ``.so.1`` links) must be the loaded module's version
   (``/proc/driver/nvidia/version``); otherwise NVML says "Driver/library version mismatch".
   With no module loaded, the module file for the running kernel (``modinfo``) stands in:
   an upgrade that changed the libraries but built no new module shows there.
   The package upgrade that changed the library is looked up in dpkg's log.
3. The open kernel module drives Turing and newer only; Blackwell needs it. The proprietary
   one drives everything up to Ada/Hopper, not Blackwell nor Grace Hopper. GPU generations by
   PCI device ID come from nvidia_hw, the table the collection's roles read too.
4. With Secure Boot on, an unsigned module is refused (kernel log) or taints the kernel.
5. The kernel the next boot starts must have an NVIDIA module (``nvidia.ko``, or Debian's
   ``nvidia-current.ko``) under ``/lib/modules``.
Secure Boot, the next-boot kernel and the module files are the node floor's readings
(gpuenv.floor.boot, the rules the driver role's preflight applies too).
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass

from gpuenv.doctor import pci
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor import boot
from gpuenv.floor.nvidia_hw import generation

_MODULE_RE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")
_LIB_RE = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)$")
_DPKG_RE = re.compile(r"^(\S+ \S+) (install|upgrade) (\S+) (\S+) (\S+)$")
_RELOAD = (
    "with no process on the GPUs: modprobe -r nvidia_peermem nvidia_uvm nvidia_drm "
    "nvidia_modeset nvidia && modprobe nvidia"
)


@dataclass(frozen=True)
class Module:
    version: str
    flavour: str  # "open" or "proprietary"
    source: str  # where it was read


def loaded_module(system: System) -> Module | None:
    text = system.read("/proc/driver/nvidia/version")
    if text:
        m = _MODULE_RE.search(text)
        if m:
            flavour = "open" if "Open Kernel Module" in text else "proprietary"
            return Module(m.group(1), flavour, "/proc/driver/nvidia/version")
    version = (system.read("/sys/module/nvidia/version") or "").strip()
    if version:
        return Module(version, installed_flavour(system) or "unknown", "/sys/module/nvidia/version")
    return None


def installed_flavour(system: System) -> str | None:
    """From the module file's license: the open module is "Dual MIT/GPL"."""
    out = system.run("modinfo-license", ["modinfo", "-F", "license", "nvidia"])
    if not out.ok or not out.stdout.strip():
        return None
    return "open" if "GPL" in out.stdout else "proprietary"


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def ld_cache(system: System) -> list[tuple[str, str]] | None:
    """(library name, path) pairs of ``ldconfig -p``; None when it cannot be read."""
    out = system.run("ldconfig-p", ["ldconfig", "-p"])
    if not out.ok:
        return None
    pairs = []
    for line in out.stdout.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep:
            pairs.append((name.split(" (")[0].strip(), path.strip()))
    return pairs


def _user_libs(system: System) -> tuple[dict[str, str], list[str]]:
    """{library: version} of libnvidia-ml and libcuda, and the evidence lines."""
    versions: dict[str, str] = {}
    evidence: list[str] = []
    cache = ld_cache(system) or []
    for lib in ("libnvidia-ml.so.1", "libcuda.so.1"):
        for name, path in cache:
            # cuda-compat's libcuda (.../compat/) is meant to be newer than the module
            if name != lib or "/compat/" in path:
                continue
            target = system.resolve(path)
            m = _LIB_RE.search(target)
            if m:
                versions[lib] = m.group(1)
                evidence.append(f"ld cache: {path} -> {target.rsplit('/', 1)[-1]}")
                break
    return versions, evidence


def dpkg_log(system: System) -> list[str]:
    """dpkg's log lines, oldest first (rotated logs included)."""
    lines: list[str] = []
    for path in sorted(system.glob("/var/log/dpkg.log*"), key=_rotation, reverse=True):
        if path.endswith(".gz"):
            data = system.read_bytes(path)
            try:
                text = gzip.decompress(data).decode("utf-8", "replace") if data else ""
            except OSError:
                text = ""
        else:
            text = system.read(path) or ""
        lines += text.splitlines()
    return lines


def _rotation(path: str) -> int:
    m = re.search(r"dpkg\.log(?:\.(\d+))?", path)
    return int(m.group(1)) if m and m.group(1) else 0


def last_change(log: list[str], package_re: str, version: str | None = None) -> str | None:
    """The last dpkg install/upgrade line of a matching package (to ``version`` if given)."""
    pattern = re.compile(package_re)
    for line in reversed(log):
        m = _DPKG_RE.match(line.strip())
        if not m or not pattern.search(m.group(3)):
            continue
        if version is None or m.group(5).startswith(version):
            return line.strip()
    return None


def installed_module(system: System) -> Module | None:
    """The module file modprobe would load for the running kernel (``modinfo``)."""
    out = system.run("modinfo-version", ["modinfo", "-F", "version", "nvidia"])
    version = out.stdout.strip() if out.ok else ""
    if not version:
        return None
    flavour = installed_flavour(system) or "unknown"
    return Module(version, flavour, "modinfo -F version nvidia (not loaded)")


def driver_version(system: System) -> ClassReading:
    module = loaded_module(system)
    loaded = module is not None
    if module is None:
        # No module loaded (a node whose module failed to load, or a container): the module
        # file for the running kernel is what the next load or boot gets.
        module = installed_module(system)
    if module is None:
        return skipped(1, "no NVIDIA kernel module loaded or installed for the running kernel")
    libs, evidence = _user_libs(system)
    facts = {"module": module.version, "loaded": loaded, "flavour": module.flavour}
    facts["libraries"] = libs
    if not libs:
        if ld_cache(system) is None:
            return skipped(1, "ldconfig -p cannot be read: driver library version unknown", **facts)
        return skipped(1, "no libnvidia-ml.so.1 or libcuda.so.1 in the ld cache", **facts)
    wrong = {lib: v for lib, v in libs.items() if v != module.version}
    reading = ClassReading(1, facts=facts)
    if not wrong:
        return reading
    lib_version = sorted(set(wrong.values()), key=version_key)[-1]
    evidence.insert(0, f"{module.source}: kernel module {module.version} ({module.flavour})")
    log = dpkg_log(system)
    # The package that ships the library first (Ubuntu libnvidia-compute-N, Debian
    # libnvidia-ml1/libcuda1, NVIDIA's repo nvidia-driver-*), then any driver package.
    change = last_change(
        log, r"^(libnvidia-compute|libnvidia-ml|libcuda|nvidia-driver)", lib_version
    ) or last_change(log, r"nvidia|cuda-drivers", lib_version)
    what = "loaded kernel module" if loaded else "kernel module installed for the running kernel"
    if loaded:
        fixes = [
            f"reboot, so that the {lib_version} kernel module the upgrade installed is loaded",
            _RELOAD,
        ]
    else:
        fixes = [
            f"build and install the {lib_version} module: dkms autoinstall (or reinstall the "
            "driver's kernel module package), then reboot"
        ]
    cause = (
        f"the driver library is {lib_version} but the {what} is {module.version}: NVML and "
        "CUDA fail with 'Driver/library version mismatch'"
    )
    if change:
        when, _action, pkg, old, new = _DPKG_RE.match(change).groups()  # type: ignore[union-attr]
        evidence.append(f"/var/log/dpkg.log: {change}")
        done = f"installed at {new}" if old == "<none>" else f"upgraded {old} -> {new}"
        cause += f"; {pkg.split(':')[0]} was {done} at {when}"
        cause += " without a reboot" if loaded else " without a matching module"
        if old != "<none>":
            fixes.append(
                f"or go back to the {module.version} library: apt-get install --allow-downgrades "
                f"{pkg.split(':')[0]}={old}"
            )
        fixes.append(f"keep it from recurring: apt-mark hold {pkg.split(':')[0]}")
    reading.findings.append(
        Finding(
            1,
            f"driver library {lib_version} != {what} {module.version}",
            cause,
            tuple(evidence),
            tuple(fixes),
        )
    )
    return reading


def os_id(system: System) -> str:
    for line in (system.read("/etc/os-release") or "").splitlines():
        if line.startswith("ID="):
            return line[3:].strip().strip('"')
    return ""


def _flavour_fix(system: System, flavour: str, branch: str) -> str:
    distro = os_id(system)
    if distro == "ubuntu":
        pkg = f"nvidia-driver-{branch}-open" if flavour == "open" else f"nvidia-driver-{branch}"
    elif distro == "debian":
        pkg = "nvidia-open-kernel-dkms" if flavour == "open" else "nvidia-kernel-dkms"
    else:
        pkg = "nvidia-open" if flavour == "open" else "cuda-drivers"
    return f"apt-get install {pkg}  (then reboot)"


def module_flavour(system: System) -> ClassReading:
    gpus = pci.gpus(system)
    if not gpus:
        return skipped(3, "no NVIDIA GPU on the PCI bus")
    module = loaded_module(system)
    flavour = module.flavour if module else installed_flavour(system)
    if flavour in (None, "unknown"):
        return skipped(3, "no NVIDIA kernel module loaded or installed (modinfo nvidia)")
    source = module.source if module else "modinfo -F license nvidia"
    facts = {"flavour": flavour, "gpus": [f"{g.bdf} 0x{g.device:04x}" for g in gpus]}
    reading = ClassReading(3, facts=facts)
    wrong = [(g, *generation(g.device)) for g in gpus if flavour not in generation(g.device)[1]]
    if not wrong:
        return reading
    gen = wrong[0][1]
    need = "open" if "open" in wrong[0][2] else "proprietary"
    branch = module.version.split(".")[0] if module else "<branch>"
    evidence = [f"{source}: {flavour} kernel module"]
    evidence += [
        f"GPU {g.bdf}: PCI ID 10de:{g.device:04x} ({gen_name})" for g, gen_name, _ in wrong
    ]
    reading.findings.append(
        Finding(
            3,
            f"{flavour} kernel module loaded for {gen} GPUs that need the {need} one",
            f"the {flavour} NVIDIA module does not drive {gen} GPUs: they are missing "
            "from nvidia-smi or fail to initialise",
            tuple(evidence),
            (_flavour_fix(system, need, branch),),
        )
    )
    return reading


_KLOG_RE = re.compile(
    r"module verification failed|Loading of (?:unsigned )?module (?:with unavailable key )?is "
    r"rejected|"
    r"Lockdown:.*unsigned module|Key was rejected by service|Required key not available",
    re.IGNORECASE,
)


def kernel_log(system: System) -> tuple[list[str] | None, str]:
    out = system.run("dmesg", ["dmesg"])
    if out.ok and out.stdout.strip():
        return out.stdout.splitlines(), "dmesg"
    out = system.run("journalctl-k", ["journalctl", "-k", "-b", "--no-pager", "-q"])
    if out.ok and out.stdout.strip():
        return out.stdout.splitlines(), "journalctl -k -b"
    return None, out.why("kernel log")


def secure_boot(system: System) -> ClassReading:
    state = boot.secure_boot(str(system.root), system.floor_run)
    if not state.uefi:
        return skipped(4, "not booted through UEFI (no /sys/firmware/efi): no Secure Boot")
    enabled, sb_evidence = state.enabled, state.evidence
    if enabled is None:
        return skipped(4, f"Secure Boot state unreadable: {sb_evidence}")
    facts = {"secure_boot": enabled}
    if not enabled:
        return ClassReading(4, facts=facts)
    signer = system.run("modinfo-signer", ["modinfo", "-F", "signer", "nvidia"])
    log, log_source = kernel_log(system)
    if signer.rc is None and log is None:
        return skipped(4, f"Secure Boot on, but neither modinfo nor the {log_source}", **facts)
    evidence = [sb_evidence]
    unsigned = signer.ok and not signer.stdout.strip()
    if unsigned:
        evidence.append("modinfo -F signer nvidia: (empty) - the module file is not signed")
    rejected = [ln.strip() for ln in log or [] if _KLOG_RE.search(ln)]
    if loaded_module(system) is not None:
        # Loaded means accepted: a refusal that does not name nvidia was another module's.
        rejected = [ln for ln in rejected if "nvidia" in ln.lower()]
    evidence += [f"{log_source}: {ln}" for ln in rejected[-3:]]
    taint = (system.read("/sys/module/nvidia/taint") or "").strip()
    if "E" in taint:
        evidence.append(f"/sys/module/nvidia/taint: {taint} (E: unsigned module loaded)")
    facts["signer"] = signer.stdout.strip() if signer.ok else None
    if not (unsigned or rejected) and log is None and loaded_module(system) is None:
        # A signed module whose key is not enrolled is refused too; only the log says so.
        return skipped(
            4,
            f"Secure Boot on and the nvidia module not loaded, but the {log_source} "
            "(not root?): cannot tell whether the kernel refused it",
            **facts,
        )
    reading = ClassReading(4, facts=facts)
    if not (unsigned or rejected):
        return reading
    reading.findings.append(
        Finding(
            4,
            "Secure Boot is on and the NVIDIA module is unsigned or rejected",
            "the firmware only lets signed modules load: the nvidia module is refused "
            "(no GPU after boot) or loads only while lockdown is not enforced",
            tuple(evidence),
            (
                "enroll the DKMS signing key: mokutil --import /var/lib/dkms/mok.pub, reboot "
                "and confirm the enrollment in MokManager, then: dkms autoinstall",
                "or sign the module: /usr/src/linux-headers-$(uname -r)/scripts/sign-file "
                "sha256 MOK.priv MOK.der $(modinfo -n nvidia)",
                "or turn Secure Boot off in the firmware setup",
            ),
        )
    )
    return reading


def next_boot_module(system: System) -> ClassReading:
    root = str(system.root)
    running = boot.running_kernel(root)
    installed = boot.installed_kernels(root)
    if not installed:
        return skipped(5, "no kernel image in /boot (container or network boot): next boot unknown")
    if not system.is_dir(f"/lib/modules/{running}"):
        return skipped(
            5,
            f"/lib/modules/{running} is missing: the running kernel is not this system's own "
            "(a container, or a VM booted with an external kernel)",
        )
    running_files = boot.module_files(root, running)
    if not running_files and loaded_module(system) is None:
        return skipped(5, f"no NVIDIA module installed for the running kernel {running}")
    nxt, source = boot.next_boot_kernel(root)
    facts = {"running": running, "next_boot": nxt, "installed": installed, "how": source}
    reading = ClassReading(5, facts=facts)
    if nxt == running or boot.module_files(root, nxt):
        return reading
    evidence = [
        source,
        f"/lib/modules/{nxt}: no nvidia.ko or nvidia-current.ko"
        + ("" if system.is_dir(f"/lib/modules/{nxt}") else " (folder missing)"),
        f"running kernel {running} has {', '.join(running_files) or 'it loaded'}",
    ]
    change = last_change(dpkg_log(system), r"^linux-(image|modules)", None)
    if change and nxt in change:
        evidence.append(f"/var/log/dpkg.log: {change}")
    reading.findings.append(
        Finding(
            5,
            f"next-boot kernel {nxt} has no NVIDIA module",
            f"after a reboot into {nxt} the nvidia module is missing and no GPU is usable",
            tuple(evidence),
            (
                f"apt-get install linux-headers-{nxt} && dkms autoinstall -k {nxt}",
                f"check: dkms status; ls /lib/modules/{nxt}/updates/dkms/",
                f"or keep booting {running}: grub-set-default <its menu entry>, update-grub",
            ),
        )
    )
    return reading
