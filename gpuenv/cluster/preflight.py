"""Rendezvous preflight, before any multi-node launch: can every node reach the master's port,
and does the socket interface NCCL (and gloo) are told to use exist on each node?

A launch that fails these would hang until its rendezvous timeout and then blame nobody in
particular; the preflight names the node and what is wrong in seconds.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.cluster.fanout import GRACE_S, NodeAnswer, fan_out
from gpuenv.cluster.inventory import Host
from gpuenv.floor import cuda_compat
from gpuenv.results import CLUSTER_NODE, Measurement, Result, Status

IFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
# The listener starts this much before the nodes connect (they retry until their deadline).
LISTENER_HEAD_START_S = 0.2
# It listens this much longer than the nodes try, so it sees the last of them.
LISTENER_MARGIN_S = 5.0


def iface_matches(spec: str, interfaces: Sequence[str]) -> bool:
    """Whether an interface of the node fits a NCCL_SOCKET_IFNAME value (NCCL's syntax:
    comma-separated prefixes; ``=`` for exact names; ``^`` to exclude)."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [n for n in spec.lstrip("=").split(",") if n]

    def hit(iface: str) -> bool:
        return any(iface == n if exact else iface.startswith(n) for n in names)

    if exclude:
        return any(not hit(i) and i != "lo" for i in interfaces)
    return any(hit(i) for i in interfaces)


def iface_problems(host: Host, probe: Mapping[str, Any]) -> list[str]:
    facts = probe.get("facts", {})
    interfaces = list(probe.get("interfaces", []))
    problems = []
    for var in IFACE_VARS:
        spec = host.env.get(var) or facts.get(f"env.{var}") or facts.get(f"nccl.conf.{var}")
        if spec and not iface_matches(str(spec), interfaces):
            problems.append(f"{var}={spec} matches no interface (has: {', '.join(interfaces)})")
    return problems


def nccl_versions(facts: Mapping[str, Any]) -> dict[str, str]:
    """Where each NCCL of a node comes from and its version: the nvidia-nccl wheels and the
    system's libnccl2 (the probe's facts)."""
    found = {
        k.removeprefix("pkg."): str(v) for k, v in facts.items() if k.startswith("pkg.nvidia-nccl-")
    }
    if facts.get("nccl.system"):
        found["libnccl2"] = str(facts["nccl.system"])
    return found


def nccl_known_bad_result(hosts: Sequence[Host], probes: Mapping[str, Mapping[str, Any]]) -> Result:
    """NCCL versions known to hang or corrupt (gpuenv/data/nccl_known_bad.yaml) on any node:
    FAIL for a fault in any use, named in the reason with the fixed version; a fault that needs
    particular conditions (NVLS, symmetric memory) is named and the run goes on."""
    from gpuenv.known_issues import nccl_findings

    start = time.monotonic()
    broken: list[str] = []
    conditional: list[str] = []
    seen: dict[str, dict[str, str]] = {}
    for h in hosts:
        versions = nccl_versions(probes.get(h.name, {}).get("facts", {}))
        seen[h.name] = versions
        for where, version in versions.items():
            for issue in nccl_findings(version):
                line = f"{h.name}: {where} {issue.describe(version)}"
                (broken if issue.severity == "error" else conditional).append(line)
    details = {"versions": seen, "known_bad": broken, "conditional": conditional}
    measurements = [Measurement("known_bad_nccl", len(broken), threshold=0, bound="max")]
    duration = time.monotonic() - start
    if broken:
        reason = "NCCL known to fail: " + "; ".join(broken)
        return Result(
            "nccl-versions", CLUSTER_NODE, Status.FAIL, reason, measurements,
            duration_s=duration, details=details,
        )  # fmt: skip
    reason = "no NCCL version known to hang or corrupt in any use"
    if conditional:
        reason += "; under conditions: " + "; ".join(conditional)
    return Result(
        "nccl-versions", CLUSTER_NODE, Status.PASS, reason, measurements,
        duration_s=duration, details=details,
    )  # fmt: skip


def cuda_compat_result(hosts: Sequence[Host], probes: Mapping[str, Mapping[str, Any]]) -> Result:
    """Each node's CUDA toolkit (nvcc) against its driver's CUDA, by NVIDIA's compatibility rules
    compared as numbers (gpuenv.floor.cuda_compat), with a cuda-compat package where there is
    one. A node without a toolkit or without a driver is not judged here (the checks are)."""
    start = time.monotonic()
    failing: dict[str, str] = {}
    judged: dict[str, str] = {}
    for h in hosts:
        facts = probes.get(h.name, {}).get("facts", {})
        toolkit, driver_cuda = facts.get("cuda.toolkit"), facts.get("cuda.driver_api")
        if not toolkit or not driver_cuda:
            continue
        driver = str(facts.get("driver") or "").split(",")[0] or None
        try:
            answer = cuda_compat.compatible(
                str(toolkit), str(driver_cuda), driver, facts.get("cuda.compat")
            )
        except ValueError as exc:
            failing[h.name] = str(exc)
            continue
        (judged if answer.ok else failing)[h.name] = answer.why
    details = {"failing": failing, "judged": judged}
    measurements = [Measurement("nodes_failing", len(failing), threshold=0, bound="max")]
    duration = time.monotonic() - start
    if failing:
        reason = "; ".join(f"{n}: {why}" for n, why in failing.items())
        return Result(
            "cuda-compat", CLUSTER_NODE, Status.FAIL, reason, measurements,
            duration_s=duration, details=details,
        )  # fmt: skip
    if not judged:
        return Result(
            "cuda-compat", CLUSTER_NODE, Status.SKIP,
            "no node reported both a CUDA toolkit (nvcc) and a driver (nvidia-smi)",
            duration_s=duration, details=details,
        )  # fmt: skip
    reason = "; ".join(f"{n}: {why}" for n, why in judged.items())
    return Result(
        "cuda-compat", CLUSTER_NODE, Status.PASS, reason, measurements,
        duration_s=duration, details=details,
    )  # fmt: skip


def _probe(host: Host, *words: str) -> str:
    return shlex.join([host.python, "-m", "gpuenv.cluster.probe", *words])


def port_reachability(
    hosts: Sequence[Host], master: Host, port: int, deadline_s: float
) -> tuple[dict[str, str], NodeAnswer]:
    """Listen on the master's port; every node (the master too) connects to it.

    Returns the nodes that could not reach it, with why, and the listener's outcome.
    """
    listener: dict[str, NodeAnswer] = {}

    def listen() -> None:
        cmd = _probe(
            master,
            "listen",
            f"--port={port}",
            f"--expect={len(hosts)}",
            f"--seconds={deadline_s}",
        )
        listener.update(fan_out([master], lambda _h: cmd, deadline_s + LISTENER_MARGIN_S))

    thread = threading.Thread(target=listen, name="gpuenv-rdzv-listen", daemon=True)
    thread.start()
    time.sleep(LISTENER_HEAD_START_S)
    addr = master.rendezvous_address
    outcomes = fan_out(
        hosts,
        lambda h: _probe(
            h,
            "connect",
            f"--host={addr}",
            f"--port={port}",
            f"--name={h.name}",
            f"--seconds={deadline_s}",
        ),
        deadline_s + LISTENER_MARGIN_S,
    )
    thread.join(deadline_s + LISTENER_MARGIN_S + GRACE_S)
    failed: dict[str, str] = {}
    for name, out in outcomes.items():
        try:
            answer = out.json() if out.ok else {"reached": False, "error": out.why()}
        except ValueError as exc:
            answer = {"reached": False, "error": str(exc)}
        if not answer.get("reached"):
            failed[name] = f"cannot reach {addr}:{port} ({answer.get('error', '')})"
    return failed, listener.get(master.name, NodeAnswer(master.name, None, error="listener lost"))


def rendezvous_result(
    hosts: Sequence[Host],
    master: Host,
    port: int,
    probes: Mapping[str, Mapping[str, Any]],
    deadline_s: float,
) -> Result:
    start = time.monotonic()
    problems: dict[str, list[str]] = {}
    for h in hosts:
        found = iface_problems(h, probes.get(h.name, {}))
        if found:
            problems.setdefault(h.name, []).extend(found)
    unreachable, listener = port_reachability(hosts, master, port, deadline_s)
    if not listener.ok:
        problems.setdefault(master.name, []).append(
            f"cannot listen on port {port}: {listener.why()}"
        )
    for name, why in unreachable.items():
        problems.setdefault(name, []).append(why)
    details = {
        "master": master.name,
        "address": master.rendezvous_address,
        "port": port,
        "problems": problems,
    }
    measurements = [Measurement("nodes_failing", len(problems), threshold=0, bound="max")]
    duration = time.monotonic() - start
    if problems:
        reason = "; ".join(f"{n}: {', '.join(p)}" for n, p in problems.items())
        return Result(
            "rendezvous",
            CLUSTER_NODE,
            Status.FAIL,
            reason,
            measurements,
            duration_s=duration,
            details=details,
        )
    return Result(
        "rendezvous",
        CLUSTER_NODE,
        Status.PASS,
        f"{len(hosts)} nodes reach {master.rendezvous_address}:{port}; socket interfaces exist",
        measurements,
        duration_s=duration,
        details=details,
    )
