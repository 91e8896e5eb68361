"""`gpuenv doctor -i`: run the node diagnosis on every inventory node at once, then compare.

Each node runs ``<its python> -m gpuenv doctor --json - --node NAME --address ADDR`` over the
transport ``gpuenv cluster`` uses (the OpenSSH client as Ansible calls it, host keys verified,
or local process groups), under one deadline. Its JSON report carries every class's findings
and facts; the controller rebuilds the readings, runs the cross-node comparison (classes 7 and
9) and returns one Result per class and node, plus an ERROR per node that gave no report.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from gpuenv.cluster.fanout import NodeAnswer, fan_out
from gpuenv.cluster.inventory import Host
from gpuenv.doctor import diagnosis
from gpuenv.doctor.findings import ClassReading, from_result, to_result
from gpuenv.progress import Progress
from gpuenv.results import Result, RunReport, Status

# How long each node gets to answer, unless --deadline says otherwise.
DEADLINE_S = 60.0


@dataclass
class Fleet:
    results: list[Result] = field(default_factory=list)
    outcomes: dict[str, NodeAnswer] = field(default_factory=dict)


def peer_address(address: str) -> str:
    """A name resolved here, as the other nodes would (a node may map its own name to
    127.0.1.1 in /etc/hosts); an address, or a name that does not resolve, as it is."""
    try:
        return socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError, IndexError):
        return address


def node_command(host: Host, only: Sequence[int] | None, become: bool) -> str:
    argv = [host.python, "-m", "gpuenv", "doctor", "--json", "-", "--node", host.name]
    argv += ["--address", peer_address(host.rendezvous_address)]
    if only:
        argv += ["--only", ",".join(str(n) for n in only)]
    command = shlex.join(argv)
    # As root in a login shell: the node's own python3 and its login environment (class 10).
    return shlex.join(["sudo", "-n", "-H", "bash", "-lc", command]) if become else command


def parse(outcome: NodeAnswer) -> RunReport:
    """The node's report; ValueError saying why when there is none."""
    if outcome.rc not in (0, 1):
        raise ValueError(outcome.why())
    return RunReport.from_dict(outcome.json())


def diagnose(
    hosts: Sequence[Host],
    deadline_s: float,
    only: Sequence[int] | None = None,
    become: bool = False,
    progress: Progress | None = None,
) -> Fleet:
    # The doctor reads the node as the connection's user (root with --become), not in the
    # cluster user's login that the validation's commands get.
    outcomes = fan_out(
        [replace(h, become_user=None) for h in hosts],
        lambda h: node_command(h, only, become),
        deadline_s,
        label="doctor",
        progress=progress,
    )
    by_node: dict[str, list[ClassReading]] = {}
    fleet = Fleet(outcomes=outcomes)
    failed: list[Result] = []
    for host in hosts:
        outcome = outcomes[host.name]
        try:
            report = parse(outcome)
        except (ValueError, KeyError) as exc:
            failed.append(Result("doctor", host.name, Status.ERROR, f"no doctor report: {exc}"))
            continue
        by_node[host.name] = [v for r in report.results if (v := from_result(r)) is not None]
    diagnosis.compare(by_node)
    for node, readings in by_node.items():
        fleet.results += [to_result(node, v) for v in readings]
    fleet.results += failed
    return fleet
