# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""What the next boot brings: Secure Boot, the kernel GRUB starts, the NVIDIA module built for it.

One order, one rule, read by the driver role (nvidia_platform_info) and ``gpuenv doctor`` alike:

- Secure Boot: no ``/sys/firmware/efi`` means the node booted without UEFI, so without Secure
  Boot. Otherwise the ``SecureBoot`` EFI variable (readable without any tool: 4 bytes of
  attributes, then the value) decides; ``mokutil --sb-state`` is asked only when the variable
  cannot be read.
- The next-boot kernel: with ``GRUB_DEFAULT=saved`` in /etc/default/grub, grubenv's
  ``next_entry`` (a one-time ``grub-reboot``), else its ``saved_entry``, when it names an
  installed kernel; a ``GRUB_DEFAULT`` that names a menu entry holding a kernel release, that
  kernel; otherwise the newest ``/boot/vmlinuz-*`` by version, which is the first entry
  grub-mkconfig writes on Debian and Ubuntu (a ``/boot/vmlinuz`` link is not what GRUB reads).
- The NVIDIA module of a kernel: ``nvidia.ko`` (NVIDIA's and Ubuntu's packages) or
  ``nvidia-current.ko`` (Debian's DKMS package renames it), compressed or not, anywhere under
  ``/lib/modules/<release>`` (``updates/dkms/`` for DKMS, ``kernel/`` for prebuilt packages).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from .node import Run, read_under

# EFI_GLOBAL_VARIABLE's GUID (UEFI specification): SecureBoot's fifth byte is 1 when it is on.
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
MODULE_FILE = re.compile(r"^nvidia(-current)?\.ko(\.(xz|zst|gz))?$")


@dataclass(frozen=True)
class SecureBoot:
    uefi: bool  # booted through UEFI (/sys/firmware/efi exists)
    enabled: bool | None  # None: UEFI, but neither the variable nor mokutil answered
    evidence: str


def secure_boot(root: str, run: Run) -> SecureBoot:
    if not os.path.isdir(os.path.join(root, "sys/firmware/efi")):
        return SecureBoot(False, False, "no /sys/firmware/efi: booted without UEFI")
    var = f"/sys/firmware/efi/efivars/{SECURE_BOOT_VAR}"
    try:
        with open(os.path.join(root, var.lstrip("/")), "rb") as handle:
            data = handle.read()
    except OSError:
        data = b""
    if len(data) >= 5:
        return SecureBoot(True, data[4] == 1, f"{var}: {data[4]}")
    rc, out = run(["mokutil", "--sb-state"])
    if "SecureBoot enabled" in out:
        return SecureBoot(True, True, "mokutil --sb-state: SecureBoot enabled")
    if "SecureBoot disabled" in out:
        return SecureBoot(True, False, "mokutil --sb-state: SecureBoot disabled")
    why = "not installed" if rc == 127 else f"exit status {rc}"
    return SecureBoot(True, None, f"no readable {var}, and mokutil --sb-state: {why}")


def version_key(release: str) -> list[tuple[int, int, str]]:
    """Sort kernel releases as versions: 6.1.0-10 after 6.1.0-9."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.+~-]", release)]


def running_kernel(root: str) -> str:
    return (read_under(root, "/proc/sys/kernel/osrelease") or "").strip()


def installed_kernels(root: str) -> list[str]:
    """The kernel releases with an image in /boot, oldest first."""
    names = glob.glob(os.path.join(root, "boot/vmlinuz-*"))
    return sorted((os.path.basename(p)[len("vmlinuz-") :] for p in names), key=version_key)


def _named(entry: str, kernels: list[str]) -> str:
    """The kernel a menu entry (an id or a title) names: the longest release it holds."""
    hits = [k for k in kernels if re.search(rf"(^|[-\s>']){re.escape(k)}($|[-\s>'])", entry)]
    return max(hits, key=len) if hits else ""


def next_boot_kernel(root: str) -> tuple[str, str]:
    """The kernel release the next boot starts ("" when /boot has none), and how it was found."""
    kernels = installed_kernels(root)
    if not kernels:
        return "", "no /boot/vmlinuz-* (a container, or a network boot)"
    grub = read_under(root, "/etc/default/grub") or ""
    default = re.search(r"^GRUB_DEFAULT=(.*)$", grub, re.M)
    value = default.group(1).strip().strip("'\"") if default else "0"
    if value == "saved":
        env = read_under(root, "/boot/grub/grubenv") or ""
        for key in ("next_entry", "saved_entry"):
            found = re.search(rf"^{key}=(.+)$", env, re.M)
            kernel = _named(found.group(1).strip(), kernels) if found else ""
            if kernel:
                return kernel, f"GRUB_DEFAULT=saved, /boot/grub/grubenv {key}={found.group(1)}"
    elif not value.isdigit():
        kernel = _named(value, kernels)
        if kernel:
            return kernel, f"/etc/default/grub GRUB_DEFAULT={value}"
    newest = kernels[-1]
    return newest, f"the newest of /boot/vmlinuz-* ({len(kernels)} kernel(s)): GRUB's first entry"


def module_files(root: str, release: str) -> list[str]:
    """The NVIDIA core module files built or packaged for a kernel release (node paths)."""
    if not release:
        return []
    base = os.path.join(root, "lib/modules", release)
    return sorted(
        "/" + os.path.relpath(os.path.join(folder, name), root)
        for folder, _, names in os.walk(base)
        for name in names
        if MODULE_FILE.match(name)
    )
