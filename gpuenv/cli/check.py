"""`gpuenv check`: validate this node's GPUs, CUDA, NCCL, DDP and MPI (docs/checks.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpuenv.cli.argtypes import output_target, positive, visible_devices
from gpuenv.errors import BadInput


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
        description="Run the node checks under deadlines; exit 0 when the run is OK by its"
        " profile's rules, 1 when not, 2 on bad input (nothing run).",
    )
    _options(p)
    p.set_defaults(func=handler)


class _Refusing(argparse.ArgumentParser):
    """A parser whose error is BadInput (one line, exit 2) instead of usage text and an exit."""

    def error(self, message: str) -> Any:
        raise BadInput(message)


def validate_node_args(option: str, argv: list[str]) -> None:
    """Refuse, on the controller and before anything is launched, arguments that `gpuenv check`
    on the nodes would refuse: an unknown option or check name, a bad number. Files named in
    them (``--thresholds``) are the nodes' and are read there."""
    from gpuenv.checks import REGISTRY

    parser = _Refusing(prog="gpuenv check", add_help=False)
    _options(parser)
    try:
        args = parser.parse_args(argv)
        if args.list:
            raise BadInput("--list lists the checks and runs none")
        resolve_names(args.only, list(REGISTRY))
    except BadInput as exc:
        raise BadInput(f"{option} {shlex.join(argv)!r}: {exc}") from None


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--only", action="append", metavar="NAMES", help="comma-separated checks (see --list)"
    )
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument(
        "--profile",
        default="quick",
        help="quick (seconds), full (large sizes, sweeps), cpu (CPU-only nodes), frameworks"
        " (quick plus the optional pycuda, horovod, tensorflow, dask checks) or examples (quick"
        " plus the seed documents' methods from examples/, run as users run them); default quick",
    )
    p.add_argument(
        "--expect-gpus",
        type=_non_negative_int,
        metavar="N",
        help="fail `system` unless NVML sees exactly N GPUs (default: what the PCI bus shows)",
    )
    p.add_argument(
        "--gpu-subset",
        action="store_true",
        help="verify only the GPUs CUDA_VISIBLE_DEVICES shows (default: a run that sees fewer"
        " GPUs than the node has is not 'GPUs verified')",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="a measurement without a threshold FAILs (default: SKIP naming what is missing)",
    )
    p.add_argument(
        "--mpi-host-staging",
        action="store_true",
        help="accept a GPU node whose MPI does not carry device buffers: the mpi check passes on"
        " buffers staged through host memory, and the verdict line says that MPI code handing"
        " GPU arrays to MPI will crash there (default: such a node FAILs)",
    )
    given = p.add_mutually_exclusive_group()
    given.add_argument(
        "--thresholds",
        metavar="FILE",
        help="YAML overriding gpuenv/data/thresholds.yaml and adding or filling GPU spec rows",
    )
    given.add_argument(
        "--thresholds-text",
        metavar="YAML",
        help="the same, given as text (gpuenv cluster --thresholds hands a file to the nodes so)",
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
    p.add_argument(
        "--left-to-cluster",
        action="append",
        metavar="NAMES",
        help="comma-separated checks not run here because gpuenv cluster runs them across the"
        " nodes with every rank of this node, and requires them there (gpuenv cluster sets it)",
    )


def _left_to_cluster(given: list[str] | None, registry: Any) -> list[str]:
    """The checks ``--left-to-cluster`` names, in registry order (never the probe: every run
    needs it); an unknown name is bad input, as in ``--only``."""
    from gpuenv.checks.base import Placement

    if not given:
        return []
    left = resolve_names(given, list(registry), option="--left-to-cluster")
    probe = [n for n in left if registry[n].PLACEMENT is Placement.PROBE]
    if probe:
        raise BadInput(f"--left-to-cluster: {probe[0]} is the probe; every node run needs it")
    return left


def resolve_names(
    only: list[str] | None,
    known: list[str],
    default: list[str] | None = None,
    option: str = "--only",
) -> list[str]:
    """The checks ``--only`` (or ``option``) names, in registry order; without it, ``default``
    (every check that is not optional, and the optional ones the profile requires)."""
    if not only:
        return list(known if default is None else default)
    wanted = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise BadInput(
            f"{option}: unknown check(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
        )
    if not wanted:
        raise BadInput(f"{option}: no check named")
    return [n for n in known if n in wanted]


def handler(args: argparse.Namespace) -> int:
    from gpuenv.checks import REGISTRY

    if args.list:
        from gpuenv.report import console as console_report

        console_report.print_check_list(REGISTRY)
        return 0
    # Everything the run needs is loaded and validated before anything runs.
    from gpuenv.checks.base import Context
    from gpuenv.checks.profiles import default_names, requirements, with_probe
    from gpuenv.checks.thresholds import load_specs, load_thresholds

    thresholds = load_thresholds(args.thresholds, args.thresholds_text)
    requirements(thresholds, args.profile, gpu_node=True)  # an unknown profile stops here
    names = with_probe(
        REGISTRY,
        resolve_names(args.only, list(REGISTRY), default_names(REGISTRY, thresholds, args.profile)),
    )
    left = _left_to_cluster(args.left_to_cluster, REGISTRY)
    names = [n for n in names if n not in left]
    output_target("--json", args.json, stdout_ok=True)
    output_target("--junit", args.junit)
    visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if args.gpu_subset and os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        raise BadInput(
            "--gpu-subset: CUDA_VISIBLE_DEVICES is not set, so every GPU is visible and there"
            " is no subset to accept; set it to the GPUs to verify, or leave --gpu-subset out"
        )
    node = args.node or socket.gethostname().split(".")[0]
    ctx = Context(
        node=node,
        profile=args.profile,
        expect_gpus=args.expect_gpus,
        thresholds=thresholds,
        specs=load_specs(thresholds.get("gpu_specs")),
        deadline_override_s=args.deadline,
        strict=args.strict,
        gpu_subset=args.gpu_subset,
        mpi_host_staging=args.mpi_host_staging,
    )
    report = run(ctx, names, args.json == "-", left)
    if args.json:
        from gpuenv.report import jsonreport

        jsonreport.write(report, args.json)
    if args.junit:
        from gpuenv.report import junit

        junit.write(report.results, args.junit, verdicts={node: report.verdict})
    return report.verdict.exit_code


def run(ctx: Any, names: list[str], json_on_stdout: bool, left: Sequence[str] = ()) -> Any:
    """Run the checks with the live table, print the verdict, return the RunReport."""
    from rich.console import Console

    from gpuenv import __version__
    from gpuenv.checks import REGISTRY
    from gpuenv.checks.profiles import assess
    from gpuenv.checks.session import run_checks
    from gpuenv.report import console as console_report
    from gpuenv.report.live import CheckTable
    from gpuenv.results import RunReport

    # With the JSON on stdout, stdout must hold nothing else.
    console = Console(stderr=json_on_stdout)
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    began_at = time.monotonic()
    with CheckTable(names, console, ctx.node) as table:
        done = run_checks(REGISTRY, ctx, names, table)
    wall_s = time.monotonic() - began_at
    verdict = assess(
        ctx.thresholds,
        ctx.profile,
        done.node,
        done.results,
        REGISTRY,
        ctx.expect_gpus,
        ctx.gpu_subset,
        left,
    )
    report = RunReport(
        node=ctx.node,
        profile=ctx.profile,
        verdict=verdict,
        results=done.results,
        started_at=started,
        duration_s=round(wall_s, 3),
        command=["gpuenv", *sys.argv[1:]],
        gpuenv_version=__version__,
    )
    console_report.print_summary(report, console)
    return report
