"""Class 9: one NCCL per node, and the same NCCL and net plugins on every node.

NCCL libraries are looked for where the dynamic loader and the Python frameworks find them:
the ld cache (``ldconfig -p``), each ``LD_LIBRARY_PATH`` folder (searched before a library's
RUNPATH and the cache, so a copy there replaces the one a wheel ships), the
``nvidia/nccl/lib`` folder of the nvidia-nccl wheels and ``torch/lib`` in every
site-packages. Which one torch and CuPy really load is read from ``/proc/self/maps`` of a
Python process that imports them (``python -m gpuenv.doctor.nccl_probe``). Findings on a node:

* a libnccl in an ``LD_LIBRARY_PATH`` folder next to another NCCL (it shadows that one);
* torch and CuPy loading different NCCL versions;
* two libnccl files in the ld cache (which one a program gets depends on its order).

Across nodes, the version torch loads, the system's NCCL and the set of net plugins
(``libnccl-net*.so``) must agree; the odd node is named.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpuenv.doctor import nccl_probe
from gpuenv.doctor.driver import ld_cache
from gpuenv.doctor.envvars import PROCESS, global_settings
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System

_VERSION_RE = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")
_WHEEL_RE = re.compile(r"nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)[^/]*\.dist-info$")
_SITE_GLOBS = (
    "/usr/lib/python3*/dist-packages",
    "/usr/lib/python3/dist-packages",
    "/usr/local/lib/python3*/dist-packages",
    "/opt/*/lib/python3*/site-packages",
    "/opt/*/*/lib/python3*/site-packages",
)


def _site_dirs(system: System) -> list[str]:
    dirs = list(system.python_paths)
    for pattern in _SITE_GLOBS:
        dirs += system.glob(pattern)
    return list(dict.fromkeys(dirs))


def _wheel_version(system: System, path: str) -> str | None:
    # <site>/nvidia/nccl/lib/libnccl.so.2 -> <site>/nvidia_nccl_cu*-<version>.dist-info
    site = path.rsplit("/nvidia/nccl/lib/", 1)[0]
    for info in system.glob(f"{site}/nvidia_nccl_cu*.dist-info"):
        m = _WHEEL_RE.search(info)
        if m:
            return m.group(1)
    return None


def find_libraries(system: System) -> list[dict[str, str]]:
    """Every distinct NCCL library file: {path, file, version, via}."""
    # First source wins for a file: a wheel's NCCL that LD_LIBRARY_PATH also lists is the
    # framework's own, the system's in a listed folder is the system's; only a file found
    # through LD_LIBRARY_PATH alone counts as an LD_LIBRARY_PATH library.
    candidates: list[tuple[str, str]] = []
    for site in _site_dirs(system):
        for sub in ("nvidia/nccl/lib", "torch/lib"):
            candidates += [
                (p, f"python {site}/{sub}") for p in system.glob(f"{site}/{sub}/libnccl.so*")
            ]
    for name, path in ld_cache(system) or []:
        if name.startswith("libnccl.so"):
            candidates.append((path, "ld cache"))
    for folder in ld_library_path(system):
        candidates += [
            (p, f"LD_LIBRARY_PATH {folder}") for p in system.glob(f"{folder}/libnccl.so*")
        ]
    found: dict[str, dict[str, str]] = {}
    for path, via in candidates:
        real = system.resolve(path)
        if real in found or not system.exists(real):
            continue
        m = _VERSION_RE.search(real.rsplit("/", 1)[-1])
        version = m.group(1) if m else (_wheel_version(system, real) or "unknown")
        found[real] = {"path": path, "file": real, "version": version, "via": via}
    return list(found.values())


def ld_library_path(system: System) -> list[str]:
    """LD_LIBRARY_PATH folders: the environment's, and those node-wide files set for logins."""
    values = [s.value for s in global_settings(system) if s.name == "LD_LIBRARY_PATH"]
    folders = [f for v in values for f in v.split(":") if f and "$" not in f]
    return list(dict.fromkeys(folders))


def find_plugins(system: System, libraries: list[dict[str, str]]) -> list[str]:
    names = {n for n, _ in ld_cache(system) or [] if n.startswith("libnccl-net")}
    folders = {lib["file"].rsplit("/", 1)[0] for lib in libraries}
    folders |= set(ld_library_path(system))
    for folder in folders:
        names |= {p.rsplit("/", 1)[-1] for p in system.glob(f"{folder}/libnccl-net*.so*")}
    return sorted(names)


def probe_frameworks(system: System) -> dict[str, Any]:
    # Which libnccl torch and CuPy load, each in a process of its own (gpuenv.doctor.nccl_probe).
    out = system.run("python-nccl", [sys.executable, "-m", nccl_probe.MODULE])
    if not out.ok:
        return {"error": out.why("python probe")}
    try:
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        return {"error": "python probe printed no JSON"}


def _where_ldlp(system: System) -> str:
    places = [s.where() for s in global_settings(system) if s.name == "LD_LIBRARY_PATH"]
    places = list(dict.fromkeys(places))
    files = [p for p in places if p != PROCESS]
    return ", ".join(files) if files else PROCESS


def nccl_libraries(system: System) -> ClassReading:
    libs = find_libraries(system)
    loaded = probe_frameworks(system)
    frameworks = {
        k: v for k, v in loaded.items() if isinstance(v, dict) and v.get("version") is not None
    }
    if not libs and not frameworks:
        # facts for the comparison: on a cluster whose other nodes have NCCL, it is a fault
        return skipped(
            9,
            "no NCCL on this node (ld cache, LD_LIBRARY_PATH, site-packages)",
            libraries=[],
            torch=None,
            system=None,
            plugins=[],
        )
    cached = [lib for lib in libs if lib["via"] == "ld cache"]
    system_versions = sorted({lib["version"] for lib in cached})
    facts: dict[str, Any] = {
        "libraries": libs,
        "frameworks": loaded,
        "torch": frameworks.get("torch", {}).get("version"),
        "system": ",".join(system_versions) or None,
        "plugins": find_plugins(system, libs),
    }
    reading = ClassReading(9, facts=facts)
    listing = [f"{lib['file']} ({lib['version']}, via {lib['via']})" for lib in libs]
    listing += [
        f"{name} loads {', '.join(info.get('paths', [])) or '?'} (NCCL {info['version']})"
        for name, info in frameworks.items()
    ]
    ldlp = [lib for lib in libs if lib["via"].startswith("LD_LIBRARY_PATH")]
    others = [lib for lib in libs if not lib["via"].startswith("LD_LIBRARY_PATH")]
    if ldlp and others:
        folders = sorted({lib["via"].split(" ", 1)[1] for lib in ldlp})
        reading.findings.append(
            Finding(
                9,
                f"a second NCCL in LD_LIBRARY_PATH ({', '.join(lib['file'] for lib in ldlp)})",
                "a library in an LD_LIBRARY_PATH folder is found before the NCCL a framework "
                "ships and before the system's: programs load a different NCCL than the one "
                "tested",
                tuple(listing),
                (
                    f"remove {', '.join(folders)} from LD_LIBRARY_PATH"
                    f" (set in {_where_ldlp(system)})",
                    "or delete the stray copy: rm "
                    + " ".join(
                        dict.fromkeys(p for lib in ldlp for p in (lib["path"], lib["file"]))
                    ),
                ),
            )
        )
    versions = {name: info["version"] for name, info in frameworks.items()}
    if len(set(versions.values())) > 1:
        reading.findings.append(
            Finding(
                9,
                "torch and CuPy load different NCCL versions: "
                + ", ".join(f"{k} {v}" for k, v in versions.items()),
                "two NCCL versions in one job: collectives between them can mismatch or hang",
                tuple(listing),
                ("install the same nvidia-nccl-cu* wheel version for both (pip install "
                 f"nvidia-nccl-cu12=={max(versions.values())} or the matching cu13 wheel)",),
            )
        )  # fmt: skip
    if len(cached) > 1:
        reading.findings.append(
            Finding(
                9,
                f"{len(cached)} NCCL libraries in the ld cache: "
                + ", ".join(f"{lib['file']} ({lib['version']})" for lib in cached),
                "which libnccl.so.2 a program gets depends on the order of the ld cache",
                tuple(listing),
                ("keep one: dpkg -S <file> names the package of each; remove the other file or "
                 "its /etc/ld.so.conf.d entry, then run ldconfig",),
            )
        )  # fmt: skip
    return reading


def _odd(values: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The majority value and the nodes that differ from it (none when all agree or a tie)."""
    counts = Counter(json.dumps(v, sort_keys=True) for v in values.values())
    if len(counts) < 2:
        return None, []
    (top, n1), (_, n2) = counts.most_common(2)
    if n1 == n2:
        return None, []  # no majority: every node is named as differing below
    return json.loads(top), [k for k, v in values.items() if json.dumps(v, sort_keys=True) != top]


def compare(readings: Mapping[str, ClassReading]) -> None:
    """Add, on each node that differs from the others, a finding naming the difference."""
    live = {n: v for n, v in readings.items() if "system" in v.facts}
    if len(live) < 2:
        return
    for key, what in (
        ("torch", "NCCL torch loads"),
        ("system", "system NCCL"),
        ("plugins", "NCCL net plugins"),
    ):
        values = {n: v.facts.get(key) for n, v in live.items()}
        majority, odd = _odd(values)
        if not odd and len({json.dumps(v) for v in values.values()}) > 1:
            odd, majority = sorted(values), None  # a tie: name every node's value
        for node in odd:
            mine = values[node]
            others = ", ".join(f"{n}: {_show(values[n])}" for n in sorted(values) if n != node)
            live[node].skip = ""  # a node with no NCCL at all differs too
            live[node].findings.append(
                Finding(
                    9,
                    f"{what} on {node} ({_show(mine)}) differs from the other nodes"
                    + (f" ({_show(majority)})" if majority is not None else ""),
                    f"nodes running one job with different {what}: NCCL may pick different "
                    "transports or protocols per node, or fail at connection setup",
                    (f"{node}: {_show(mine)}", f"others: {others}"),
                    (f"install the same {what} on every node (the gpuenv nccl role pins it: "
                     "nccl_version) and re-run site.yml",),
                )
            )  # fmt: skip


def _show(value: Any) -> str:
    if value is None or value == []:
        return "none"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def python_site_dirs() -> list[str]:
    """The running interpreter's site-packages folders (real nodes)."""
    return [
        p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)
    ]
