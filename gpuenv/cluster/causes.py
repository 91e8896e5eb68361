"""Why a multi-node launch failed on a node, in its ranks' own words.

A node's torchrun or the first node's mpirun that fails ends its output with the launcher's
report (torchrun's ``error_file: <N/A>`` block, mpirun's ``Primary job terminated normally``
box): the last lines of stderr say nothing of the cause. The ranks' own lines above it do
(gpuenv.checks.rank_cause), and so does the login environment the probe read on each node
(``login_env``: the job variables a login file sets, with the file): where the failing library's
variables are set there, the reason names them, their value, the file and the node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.checks import rank_cause
from gpuenv.cluster import launch
from gpuenv.cluster.fanout import NodeAnswer
from gpuenv.cluster.inventory import Host


def _login(probe: Mapping[str, Any] | None) -> dict[str, dict[str, object]]:
    found = (probe or {}).get("login_env") or {}
    return dict(found) if isinstance(found, Mapping) else {}


def _output(out: NodeAnswer) -> str:
    return f"{out.stderr}\n{out.stdout}"


def launch_failure(out: NodeAnswer, probe: Mapping[str, Any] | None) -> str:
    """Why one node's part of a launch failed: how it ended (``exit status 1``, or why it never
    finished) and its ranks' own errors, with the login settings of the library that failed on
    that node (``probe``: what the node's probe answered); ``NodeAnswer.why`` where the output
    holds no error of a rank."""
    cause = rank_cause.find(_output(out), None, _login(probe))
    if not cause.lines:
        return out.why()
    return f"{out.error or f'exit status {out.rc}'}: {cause.text}"


def mpirun_failure(
    out: NodeAnswer,
    hosts: Sequence[Host],
    probes: Mapping[str, Mapping[str, Any]],
    local: bool,
) -> str:
    """Why the mpirun from the first node failed: the rank (and its node) mpirun names first,
    the ranks' own errors, and, on each node, the login settings of Open MPI, UCX or the other
    library that failed (the remote ranks start in their own node's environment)."""
    text = _output(out)
    cause = rank_cause.find(text, None, {}, ["mpirun"])
    settings = []
    for host in hosts:
        found = rank_cause.login_settings_of(cause.libraries, _login(probes.get(host.name)))
        if found:
            settings.append(rank_cause.login_sentence(cause.libraries, found, f" on {host.name}"))
    # Emulated nodes share one machine: mpirun's rank numbers name no node there.
    where = None if local else launch.mpirun_failed_rank(text, hosts)
    if not cause.lines and not settings:
        return f"{where} failed ({out.why()})" if where else out.why()
    said = "; ".join([*cause.lines, *settings])
    ended = out.error or f"exit status {out.rc}"
    return f"{where} failed: {said} ({ended})" if where else f"{said} ({ended})"
