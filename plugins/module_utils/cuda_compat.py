# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Whether a CUDA toolkit runs on a driver: NVIDIA's compatibility rules, compared by number.

The driver reports the newest CUDA it supports (``nvidia-smi``'s "CUDA Version", NVML's
``nvmlSystemGetCudaDriverVersion``); a toolkit (``nvcc --version``) runs on it when
(https://docs.nvidia.com/deploy/cuda-compatibility/):

- it is not newer than that CUDA, major.minor compared as numbers (12.10 is newer than 12.9):
  binary backward compatibility;
- or it is of the same major family, from CUDA 11 on, and the driver is at least the family's
  minimum (11.x: 450.80.02, 12.x: 525.60.13, 13.x: 580): minor-version compatibility, with a
  limited feature set: PTX the newer toolkit emits cannot be JIT-compiled by the older driver
  (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html);
- or the CUDA forward-compatibility package ``cuda-compat-<major>-<minor>`` for a CUDA at least
  that new is installed, on a data center GPU (forward compatibility is for data center GPUs,
  select NGC Server Ready RTX SKUs and Jetson only:
  https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html).

Standard library only: the collection's modules and gpuenv share it (gpuenv.floor.cuda_compat).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

# The minimum driver of each major family for minor-version compatibility (CUDA Toolkit Release
# Notes, table 2; the 13.x row: the minor-version compatibility page).
MINOR_COMPAT_MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}
FIRST_MINOR_COMPAT_MAJOR = 11

_CUDA_RE = re.compile(r"(\d+)\.(\d+)")
# Where NVIDIA's cuda-compat-X-Y packages put their libcuda (the forward-compatibility guide).
COMPAT_GLOB = "/usr/local/cuda-*/compat/libcuda.so.*"
_COMPAT_DIR_RE = re.compile(r"/cuda-(\d+)\.(\d+)/compat/")


@dataclass(frozen=True)
class Compatibility:
    ok: bool
    how: str  # "backward", "minor-version", "forward", or "" when it does not run
    why: str


def installed_compat(root: str = "/") -> str | None:
    """The newest CUDA a cuda-compat package under ``root`` provides ('13.0'); None: none."""
    found = []
    for path in glob.glob(os.path.join(root, COMPAT_GLOB.lstrip("/"))):
        m = _COMPAT_DIR_RE.search(path)
        if m:
            found.append((int(m.group(1)), int(m.group(2))))
    return _show(max(found)) if found else None


def cuda_version(text: str) -> tuple[int, int]:
    """'12.9', '12.9.41', 'V12.9.41', 'release 12.9' -> (12, 9); ValueError otherwise."""
    found = _CUDA_RE.search(str(text))
    if not found:
        raise ValueError(f"{text!r} is not a CUDA version (major.minor)")
    return int(found.group(1)), int(found.group(2))


def driver_version(text: str) -> tuple[int, ...]:
    """'580.159.04' -> (580, 159, 4); ValueError otherwise."""
    parts = str(text).strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a driver version (such as 580.159.04)")
    return tuple(int(p) for p in parts)


def _show(version: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in version)


def compatible(
    toolkit: str,
    driver_cuda: str,
    driver: str | None = None,
    compat: str | None = None,
    datacenter_gpu: bool = True,
) -> Compatibility:
    """Whether CUDA ``toolkit`` runs on a driver that supports CUDA ``driver_cuda`` (its version
    ``driver`` where known), with the forward-compatibility package for CUDA ``compat`` if one
    is installed."""
    t, d = cuda_version(toolkit), cuda_version(driver_cuda)
    tk, dc = _show(t), _show(d)
    if compat and t > d:
        c = cuda_version(compat)
        if c > d:  # a package no newer than the driver's own CUDA changes nothing
            if not datacenter_gpu:
                why = (
                    f"cuda-compat {_show(c)} is for data center GPUs only; on this GPU the "
                    f"driver's CUDA {dc} is what runs"
                )
                return _without_compat(t, d, driver, why)
            forward = _without_compat(t, c, None, "")
            if forward.ok:
                return Compatibility(
                    True, "forward", f"CUDA {tk} through cuda-compat {_show(c)} ({forward.why})"
                )
            return Compatibility(
                False, "", f"CUDA {tk} is newer than cuda-compat {_show(c)} as well"
            )
    return _without_compat(t, d, driver, "")


def _without_compat(
    t: tuple[int, int], d: tuple[int, int], driver: str | None, note: str
) -> Compatibility:
    tk, dc = _show(t), _show(d)
    suffix = f"; {note}" if note else ""
    if t <= d:
        return Compatibility(True, "backward", f"CUDA {tk} <= CUDA {dc}{suffix}")
    if t[0] != d[0]:
        return Compatibility(
            False,
            "",
            f"CUDA {tk} needs a CUDA {t[0]}.x driver; the driver supports CUDA {dc} (another "
            f"major: install a newer driver, or cuda-compat-{t[0]}-{t[1]} on a data center "
            f"GPU){suffix}",
        )
    if t[0] < FIRST_MINOR_COMPAT_MAJOR:
        return Compatibility(
            False,
            "",
            f"CUDA {tk} on a CUDA {dc} driver: minor-version compatibility starts with CUDA 11"
            f"{suffix}",
        )
    least = MINOR_COMPAT_MIN_DRIVER.get(t[0])
    if driver and least and driver_version(driver) < least:
        return Compatibility(
            False,
            "",
            f"CUDA {tk} on driver {driver}: minor-version compatibility within CUDA {t[0]}.x "
            f"needs driver >= {_show(least)}{suffix}",
        )
    return Compatibility(
        True,
        "minor-version",
        f"CUDA {tk} on a CUDA {dc} driver by minor-version compatibility (limited: PTX it "
        f"emits does not JIT on this driver){suffix}",
    )
