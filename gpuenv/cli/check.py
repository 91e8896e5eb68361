"""`gpuenv check`: validate this node's GPUs, CUDA, NCCL, DDP and MPI (docs/checks.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gpuenv.cli.argtypes import positive
from gpuenv.errors import BadInput

CHECK_NAMES = ("system", "cupy", "streams", "nccl", "ddp", "mpi")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check",
        help="validate this node: GPUs, CuPy, streams, NCCL, DDP, MPI",
        description="Run the node checks under deadlines; exit 0 when nothing failed, "
        "1 when a check failed, 2 on bad input (nothing run).",
    )
    p.add_argument(
        "--only",
        action="append",
        metavar="NAMES",
        help=f"comma-separated checks to run (default all: {','.join(CHECK_NAMES)})",
    )
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument(
        "--profile",
        choices=("quick", "full"),
        default="quick",
        help="quick: seconds; full: large sizes and sweeps (default quick)",
    )
    p.add_argument(
        "--expect-gpus",
        type=_non_negative_int,
        metavar="N",
        help="fail `system` unless NVML sees exactly N GPUs",
    )
    p.add_argument(
        "--thresholds", metavar="FILE", help="YAML overriding gpuenv/data/thresholds.yaml"
    )
    p.add_argument("--json", metavar="FILE", help="write the JSON run report ('-': stdout)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    p.add_argument(
        "--deadline",
        type=positive(float, "seconds (a number > 0)"),
        metavar="SECONDS",
        help="deadline of each check, replacing the per-check defaults",
    )
    p.add_argument("--node", help="node name in the results (default: short host name)")
    p.set_defaults(func=handler)


def resolve_names(only: list[str] | None) -> list[str]:
    if not only:
        return list(CHECK_NAMES)
    wanted = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in CHECK_NAMES]
    if unknown:
        raise BadInput(
            f"--only: unknown check(s) {', '.join(map(repr, unknown))};"
            f" known: {', '.join(CHECK_NAMES)}"
        )
    if not wanted:
        raise BadInput("--only: no check named")
    return [n for n in CHECK_NAMES if n in wanted]


def _check_output(option: str, target: str | None) -> None:
    if target is None or (target == "-" and option == "--json"):
        return
    parent = Path(target).resolve().parent
    if not parent.is_dir():
        raise BadInput(f"{option} {target}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise BadInput(f"{option} {target}: folder {parent} is not writable")


def handler(args: argparse.Namespace) -> int:
    if args.list:
        from gpuenv.checks import CHECKS

        for name, module in CHECKS.items():
            print(f"{name:8} {module.DESCRIPTION}")
        return 0
    names = resolve_names(args.only)
    _check_output("--json", args.json)
    _check_output("--junit", args.junit)
    if args.junit == "-":
        raise BadInput("--junit -: JUnit XML needs a file")

    # Everything the run needs is loaded and validated before anything runs.
    from gpuenv.checks.base import Context
    from gpuenv.checks.thresholds import load_specs, load_thresholds

    thresholds = load_thresholds(args.thresholds)
    node = args.node or socket.gethostname().split(".")[0]
    ctx = Context(
        node=node,
        profile=args.profile,
        expect_gpus=args.expect_gpus,
        thresholds=thresholds,
        specs=load_specs(),
        deadline_override=args.deadline,
    )

    from rich.console import Console

    from gpuenv import __version__
    from gpuenv.report import console as console_report
    from gpuenv.results import RunReport, exit_code
    from gpuenv.runner import run_checks

    # With the JSON on stdout, stdout must hold nothing else.
    console = Console(stderr=args.json == "-")
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    with console_report.LiveTable(names, console, node) as table:
        results = run_checks(ctx, names, table.update)
    wall = time.monotonic() - t0
    console_report.print_summary(results, console, wall)
    report = RunReport(
        node=node,
        profile=args.profile,
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

        junit.write(results, args.junit)
    return exit_code(results)
