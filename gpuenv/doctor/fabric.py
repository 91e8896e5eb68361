"""Class 2: on NVSwitch systems Fabric Manager must run at the driver's exact version.

NVSwitch systems (HGX) need the ``nvidia-fabricmanager`` service of the same version as the
loaded driver; without it, or at another version, the GPUs stay in fabric state "In Progress"
or report an error and CUDA initialisation fails. NVSwitches show on the PCI bus as NVIDIA
bridges of class 0x0680. ``nvidia-smi -q`` gives each GPU's fabric State and Status.
"""

from __future__ import annotations

import re

from gpuenv.doctor import pci
from gpuenv.doctor.driver import loaded_module
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor.nvidia_hw import fabric_states, fabric_unhealthy

_FM_VERSION_RE = re.compile(r"version is\s*:\s*(\S+)", re.IGNORECASE)


def fm_version(system: System) -> tuple[str | None, str]:
    out = system.run("nv-fabricmanager-version", ["nv-fabricmanager", "--version"])
    m = _FM_VERSION_RE.search(out.stdout)
    if out.ok and m:
        return m.group(1), f"nv-fabricmanager --version: {m.group(1)}"
    query = ["dpkg-query", "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\\n"]
    out = system.run("dpkg-query-fabricmanager", [*query, "*fabricmanager*"])
    for line in out.stdout.splitlines() if out.ok else []:
        words = line.split()
        if len(words) >= 3 and words[2].startswith("ii"):
            version = words[1].split(":")[-1].split("-")[0]
            return version, f"dpkg: {words[0]} {words[1]}"
    return None, ""


def fabric_manager(system: System) -> ClassReading:
    switches = [d for d in pci.devices(system) if d.is_nvswitch]
    if not switches:
        return skipped(2, "no NVSwitch on the PCI bus")
    module = loaded_module(system)
    if module is None:
        return skipped(2, "no NVIDIA kernel module loaded: driver version unknown")
    version, version_evidence = fm_version(system)
    service = system.run(
        "systemctl-fabricmanager", ["systemctl", "is-active", "nvidia-fabricmanager"]
    )
    smi = system.run("nvidia-smi-q", ["nvidia-smi", "-q"])
    states = fabric_states(smi.stdout) if smi.ok else []
    facts = {
        "nvswitches": [s.bdf for s in switches],
        "driver": module.version,
        "fabric_manager": version,
        # empty when systemd is not PID 1 (a container): not known
        "service": service.stdout.strip() or None,
        "fabric": [list(s) for s in states],
    }
    reading = ClassReading(2, facts=facts)
    branch = module.version.split(".")[0]
    if version is None:
        reading.findings.append(
            Finding(
                2,
                "Fabric Manager is not installed on an NVSwitch system",
                "without Fabric Manager the NVSwitch fabric is never set up: CUDA fails to "
                "initialise on the GPUs",
                (f"NVSwitches on the PCI bus: {', '.join(facts['nvswitches'])}",
                 "nv-fabricmanager --version: not found; no *fabricmanager* package installed"),
                (f"apt-get install nvidia-fabricmanager-{branch}={module.version}-1 "
                 "&& systemctl enable --now nvidia-fabricmanager",),
            )
        )  # fmt: skip
        return reading
    active = facts["service"]
    bad = fabric_unhealthy(states)
    down = []
    if active is not None and active != "active":
        down.append(f"systemctl is-active nvidia-fabricmanager: {active}")
    down += [f"nvidia-smi -q: GPU {g} fabric State {st}, Status {su}" for g, st, su in bad]
    if version != module.version:
        # The mismatch is the cause; the fabric being down is its consequence (evidence).
        reading.findings.append(
            Finding(
                2,
                f"Fabric Manager {version} != driver {module.version}",
                "Fabric Manager refuses to start against a driver of another version: the "
                "NVSwitch fabric stays down and CUDA cannot use the GPUs",
                (version_evidence, f"{module.source}: kernel module {module.version}", *down),
                (f"apt-get install --allow-downgrades nvidia-fabricmanager-{branch}="
                 f"{module.version}-1 && systemctl restart nvidia-fabricmanager",
                 f"apt-mark hold nvidia-fabricmanager-{branch}"),
            )
        )  # fmt: skip
    elif down:
        reading.findings.append(
            Finding(
                2,
                "NVSwitch fabric is not up"
                + (f" (nvidia-fabricmanager {active})" if active and active != "active" else ""),
                "until Fabric Manager has trained the fabric (State Completed, Status "
                "Success) the GPUs cannot run CUDA work",
                tuple(down),
                ("systemctl enable --now nvidia-fabricmanager",
                 "journalctl -u nvidia-fabricmanager -b; cat /var/log/fabricmanager.log"),
            )
        )  # fmt: skip
    return reading
