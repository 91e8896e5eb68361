"""`gpuenv doctor`: name what is wrong with a node's driver, fabric, PCIe and NCCL setup, and the
fix (docs/doctor.md). On a node, or across an inventory with -i.

Exit 0 when nothing was found, 1 when something was (or a node gave no report), 2 on bad
input (nothing run). The node side imports the standard library and gpuenv only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gpuenv.cli.argtypes import output_target, positive
from gpuenv.errors import BadInput


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="diagnose driver, Fabric Manager, PCIe ACS, GPUDirect and NCCL setup faults",
        description="Name each fault's cause, evidence and fix command. Exit 0 when nothing "
        "was found, 1 when something was, 2 on bad input.",
    )
    p.add_argument("-i", "--inventory", help="diagnose every node of this Ansible inventory")
    p.add_argument("-l", "--limit", help="with -i: Ansible host pattern restricting the nodes")
    p.add_argument(
        "--deadline",
        type=positive(float, "seconds > 0"),
        metavar="SECONDS",
        help="with -i: deadline of each node's diagnosis (default 60)",
    )
    p.add_argument(
        "--become", action="store_true", help="with -i: run as root on the nodes (sudo -n)"
    )
    p.add_argument("--root", metavar="DIR", help="read a recorded node under DIR (tests)")
    p.add_argument(
        "--run-commands",
        action="store_true",
        help="with --root: run the real commands instead of reading DIR/cmd/*.out",
    )
    p.add_argument("--address", help="this node's inventory address (for NCCL_SOCKET_IFNAME)")
    p.add_argument("--node", help="node name in the results (default: short host name)")
    p.add_argument(
        "--only",
        metavar="CLASSES",
        help="comma-separated class numbers or names (1-10, e.g. 9,stray-env; docs/doctor.md)",
    )
    p.add_argument("--json", metavar="FILE", help="write the JSON report ('-': stdout)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    p.add_argument("-v", "--verbose", action="store_true", help="list the clean classes too")
    p.set_defaults(func=handler)


def _validate(args: argparse.Namespace) -> list[int] | None:
    from gpuenv.doctor.diagnosis import class_numbers

    only = None
    if args.only is not None:
        try:
            only = class_numbers(args.only)
        except ValueError as exc:
            raise BadInput(f"--only: {exc}") from exc
    output_target("--json", args.json, stdout_ok=True)
    output_target("--junit", args.junit)
    if args.inventory:
        for option in ("root", "address", "node"):
            if getattr(args, option):
                raise BadInput(f"--{option} is for one node; with -i each node gets its own")
    else:
        for option in ("limit", "become", "deadline"):
            if getattr(args, option):
                raise BadInput(f"--{option} needs -i INVENTORY")
        if args.root is not None and not Path(args.root).is_dir():
            raise BadInput(f"--root {args.root}: not a folder")
        if args.run_commands and args.root is None:
            raise BadInput("--run-commands needs --root")
    return only


def _system(args: argparse.Namespace) -> Any:
    from gpuenv.doctor.nccl import python_site_dirs
    from gpuenv.doctor.system import System, fixture, real_runner

    if args.root is None:
        return System(python_paths=python_site_dirs())
    if not args.run_commands:
        return fixture(args.root)
    return System(
        root=Path(args.root),
        runner=real_runner(),
        python_paths=python_site_dirs(),
    )


def handler(args: argparse.Namespace) -> int:
    only = _validate(args)
    from gpuenv import __version__
    from gpuenv.doctor import render
    from gpuenv.results import CLUSTER_NODE, RunReport, RunVerdict

    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    if args.inventory:
        from gpuenv.cluster import inventory
        from gpuenv.doctor import fleet

        hosts = inventory.load(args.inventory, args.limit)  # BadInput before anything runs
        node = CLUSTER_NODE
        results = _fleet(fleet, hosts, args, only)
    else:
        from gpuenv.doctor import diagnosis

        node = args.node or socket.gethostname().split(".")[0]
        results = diagnosis.results(node, diagnosis.diagnose(_system(args), args.address, only))
    wall = time.monotonic() - t0
    # With the JSON on stdout, stdout holds nothing else.
    stream = sys.stderr if args.json == "-" else sys.stdout
    for line in render.lines(results, wall, verbose=args.verbose):
        print(line, file=stream)
    problems = [f"{r.node} {r.check} {r.status.value}: {r.reason}" for r in results
                if r.status.failed]  # fmt: skip
    report = RunReport(
        node=node,
        profile="doctor",
        verdict=RunVerdict(ok=not problems, profile="doctor", node_kind="", problems=problems),
        results=results,
        started_at=started,
        duration_s=round(wall, 3),
        command=["gpuenv", *sys.argv[1:]],
        gpuenv_version=__version__,
    )
    if args.json:
        from gpuenv.report import jsonreport

        jsonreport.write(report, args.json)
    if args.junit:
        from gpuenv.report import junit

        junit.write(results, args.junit, "gpuenv.doctor")
    return report.verdict.exit_code


def _fleet(fleet: Any, hosts: list[Any], args: argparse.Namespace, only: Any) -> list[Any]:
    """Every node of the inventory, with progress on the console unless JSON goes to stdout."""
    deadline_s = args.deadline or fleet.DEADLINE_S
    if args.json == "-":
        return list(fleet.diagnose(hosts, deadline_s, only, args.become).results)
    from gpuenv.report.live import Steps

    with Steps() as steps:
        return list(fleet.diagnose(hosts, deadline_s, only, args.become, steps).results)
