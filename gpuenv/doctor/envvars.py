"""Class 10: global ``NCCL_*``/``CUDA_*`` settings that force a slow or broken path.

Every job on a node inherits what ``/etc/environment`` (pam_env), ``/etc/profile``,
``/etc/profile.d/*.sh`` and ``/etc/bash.bashrc`` set, and NCCL reads ``/etc/nccl.conf`` for
whatever the environment leaves unset. A setting left there from a debugging session
(``NCCL_P2P_DISABLE=1``, ``NCCL_IB_DISABLE=1``) silently slows every run. The environment
doctor itself runs in is read too: a login shell's profile or a launcher may set them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gpuenv.doctor.findings import ClassReading, Finding
from gpuenv.doctor.system import System

PROCESS = "the environment gpuenv doctor runs in"
_ASSIGN_RE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*?)\s*$")
_PREFIXES = ("NCCL_", "CUDA_", "LD_LIBRARY_PATH")


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    source: str  # a file, or PROCESS
    line: int = 0

    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line else self.source


def _unquote(value: str) -> str:
    value = value.split(" #", 1)[0].strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _files(system: System) -> list[str]:
    files = ["/etc/environment", "/etc/profile", "/etc/bash.bashrc", "/etc/nccl.conf"]
    return files + system.glob("/etc/profile.d/*.sh")


def global_settings(system: System, with_process: bool = True) -> list[Setting]:
    """NCCL_*, CUDA_* and LD_LIBRARY_PATH set node-wide, in the order a login applies them."""
    found: list[Setting] = []
    for path in _files(system):
        for no, line in enumerate((system.read(path) or "").splitlines(), 1):
            m = _ASSIGN_RE.match(line)
            if m and m.group(1).startswith(_PREFIXES):
                found.append(Setting(m.group(1), _unquote(m.group(2)), path, no))
    if with_process:
        for name, value in sorted(system.env.items()):
            if name.startswith(_PREFIXES):
                found.append(Setting(name, value, PROCESS))
    return found


def effective(settings: list[Setting], name: str) -> Setting | None:
    """The value a job gets: the environment's, else the profile files', else /etc/nccl.conf."""
    ordered = sorted(
        (s for s in settings if s.name == name),
        key=lambda s: (s.source == PROCESS, s.source != "/etc/nccl.conf"),
    )
    return ordered[-1] if ordered else None


def _true(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on")


def _few(v: str) -> bool:
    return v.strip().isdigit() and int(v) <= 2


# name -> (is it harmful for this value, what it does)
_P2P = "turns off NVLink/PCIe peer-to-peer: GPU traffic goes through host memory"
_IB = "turns off InfiniBand/RoCE: traffic between nodes falls back to TCP sockets"
RULES: dict[str, tuple[Callable[[str], bool], str]] = {
    "NCCL_P2P_DISABLE": (_true, _P2P),
    "NCCL_SHM_DISABLE": (_true, "turns off the shared-memory transport within a node"),
    "NCCL_IB_DISABLE": (_true, _IB),
    "NCCL_NET": (lambda v: v.strip().lower() == "socket", "forces TCP sockets between nodes"),
    "NCCL_P2P_LEVEL": (lambda v: v.strip().upper() in ("LOC", "0"), "LOC: no peer-to-peer"),
    "NCCL_NET_GDR_LEVEL": (lambda v: v.strip().upper() in ("LOC", "0"), "LOC: GPUDirect RDMA off"),
    "NCCL_ALGO": (bool, "forces one algorithm for every size and topology"),
    "NCCL_PROTO": (bool, "forces the protocol for every size"),
    "NCCL_MAX_NCHANNELS": (_few, "caps NCCL to very few channels"),
    "NCCL_MAX_CTAS": (_few, "caps NCCL to very few thread blocks"),
    "NCCL_DEBUG": (lambda v: v.strip().upper() == "TRACE", "traces every call"),
    "CUDA_LAUNCH_BLOCKING": (_true, "makes every kernel launch synchronous"),
}
# Set in a node-wide file (not in a job's own environment), this hides GPUs from every job.
_FILE_ONLY = {"CUDA_VISIBLE_DEVICES": "hides GPUs from every job on the node"}


def _fix(s: Setting) -> str:
    if s.source == PROCESS:
        return f"unset {s.name} where the shell profile or the job's launcher sets it"
    return f"sed -i '{s.line}{{/{s.name}=/d}}' {s.source}  (line {s.line}), then log in again"


def stray_env(system: System) -> ClassReading:
    settings = [s for s in global_settings(system) if s.name != "LD_LIBRARY_PATH"]
    facts = {"settings": [f"{s.name}={s.value} ({s.where()})" for s in settings]}
    reading = ClassReading(10, facts=facts)
    by_name: dict[str, list[Setting]] = {}
    for s in settings:
        rule = RULES.get(s.name)
        harmful = bool(rule and rule[0](s.value)) or (s.name in _FILE_ONLY and s.source != PROCESS)
        if harmful:
            by_name.setdefault(s.name, []).append(s)
    for name, hits in by_name.items():
        effect = RULES[name][1] if name in RULES else _FILE_ONLY[name]
        files = [s for s in hits if s.source != PROCESS]
        shown = files or hits
        reading.findings.append(
            Finding(
                10,
                f"{name}={hits[0].value} set in {', '.join(s.where() for s in shown)}",
                f"{name}={hits[0].value} {effect}; every job started here inherits it",
                tuple(f"{s.where()}: {s.name}={s.value}" for s in hits),
                tuple(dict.fromkeys(_fix(s) for s in shown)),
            )
        )
    return reading
