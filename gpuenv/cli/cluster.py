"""`gpuenv cluster`: validate every node of an Ansible inventory, together (docs/cluster.md)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from gpuenv.cli.argtypes import positive
from gpuenv.errors import BadInput

STAGES = ("check", "consistency", "rendezvous", "torch", "mpi", "pairs")


def _sizes(text: str) -> list[int]:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for word in text.split(","):
        word = word.strip().upper().removesuffix("IB").removesuffix("B")
        scale = units.get(word[-1:], 1) if word else 1
        number = word[:-1] if word[-1:] in units else word
        try:
            value = int(float(number) * scale)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad size {word!r} (e.g. 1M,64M,1G)") from None
        if value < 4 or value % 4:
            raise argparse.ArgumentTypeError(f"size {word!r}: must be a multiple of 4 bytes")
        out.append(value)
    return sorted(out)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cluster",
        help="validate all nodes of an inventory: checks, consistency, multi-node runs, pairs",
        description="Fan out `gpuenv check` to every node, compare their stacks, run NCCL/gloo, "
        "DDP and MPI across nodes, and isolate bad nodes. Exit 0 when nothing failed, 1 when "
        "something did, 2 on bad input (nothing launched).",
    )
    p.add_argument("-i", "--inventory", required=True, help="Ansible inventory (file or folder)")
    p.add_argument("-l", "--limit", help="Ansible host pattern restricting the nodes")
    p.add_argument("--json", metavar="FILE", help="write the cluster report as JSON ('-': stdout)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testsuite per node)")
    p.add_argument("--html", metavar="FILE", help="write the self-contained HTML report")
    p.add_argument(
        "--deadline",
        type=positive(float, "seconds > 0"),
        default=300.0,
        help="deadline of each node's command and of each launch (default 300)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=29400,
        help="rendezvous port on the first node; pair runs use the next ones",
    )
    p.add_argument(
        "--min-busbw",
        type=positive(float, "GB/s > 0"),
        metavar="GBPS",
        help="all-node busbw below this fails and starts bad-node isolation",
    )
    p.add_argument(
        "--pair-relative",
        type=positive(float, "a fraction > 0"),
        default=0.5,
        help="without --min-busbw, a pair fails below this x the median (default 0.5)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=positive(int, "a whole number > 0"),
        help="ranks per node for torchrun (default: its GPUs, 1 without GPUs)",
    )
    p.add_argument(
        "--sizes",
        type=_sizes,
        default=_sizes("1M,8M,64M"),
        help="all-reduce sizes across nodes (default 1M,8M,64M)",
    )
    p.add_argument(
        "--pair-size",
        type=_sizes,
        default=_sizes("64M"),
        help="all-reduce size of each pair test (default 64M)",
    )
    p.add_argument(
        "--matrix-max-nodes",
        type=int,
        default=8,
        help="measure the full pair matrix up to this many nodes (default 8)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="STAGES",
        help=f"comma-separated stages to leave out: {','.join(STAGES)}",
    )
    p.add_argument(
        "--check-args",
        default="--profile quick",
        help="arguments for `gpuenv check` on the nodes (default '--profile quick')",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=handler)


def _stages(skip: list[str]) -> tuple[str, ...]:
    wanted = [s.strip() for item in skip for s in item.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STAGES]
    if unknown:
        raise BadInput(f"--skip: unknown stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    return tuple(s for s in STAGES if s not in wanted)


def _check_outputs(args: argparse.Namespace) -> None:
    for option in ("json", "junit", "html"):
        target = getattr(args, option)
        if target is None or (target == "-" and option == "json"):
            continue
        parent = Path(target).resolve().parent
        if not parent.is_dir():
            raise BadInput(f"--{option} {target}: folder {parent} does not exist")


def handler(args: argparse.Namespace) -> int:
    stages = _stages(args.skip)
    if not 1024 <= args.port <= 65000:
        raise BadInput(f"--port {args.port}: expected 1024..65000")
    if args.matrix_max_nodes < 0:
        raise BadInput("--matrix-max-nodes: expected a whole number >= 0")
    try:
        check_args = shlex.split(args.check_args)
    except ValueError as exc:
        raise BadInput(f"--check-args: {exc}") from exc
    if {"--json", "--junit", "--node"} & set(check_args):
        raise BadInput("--check-args: --json, --junit and --node are set by gpuenv cluster")
    _check_outputs(args)

    from rich.console import Console

    from gpuenv.cluster import inventory, runner
    from gpuenv.report import console as console_report
    from gpuenv.report import junit
    from gpuenv.results import Status

    hosts = inventory.load(args.inventory, args.limit)  # BadInput before anything is launched
    out = Console(stderr=args.json == "-")
    out.print(f"gpuenv cluster: {len(hosts)} node(s): {', '.join(h.name for h in hosts)}")
    opts = runner.Options(
        check_args=check_args,
        deadline_s=args.deadline,
        probe_deadline_s=min(30.0, args.deadline),
        port=args.port,
        nproc_per_node=args.nproc_per_node,
        sizes=args.sizes,
        pair_bytes=args.pair_size[-1],
        min_busbw=args.min_busbw,
        pair_relative=args.pair_relative,
        matrix_max_nodes=args.matrix_max_nodes,
        stages=stages,
        show_progress=not args.no_progress,
    )
    start = time.monotonic()
    run = runner.validate(hosts, opts)
    data = run.to_dict()
    if args.json:
        text = json.dumps(data, indent=2, default=str) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text, encoding="utf-8")
    if args.junit:
        tree = junit.ET.ElementTree(junit.to_xml(run.results, "gpuenv.cluster"))
        junit.ET.indent(tree)
        tree.write(args.junit, encoding="utf-8", xml_declaration=True)
    if args.html:
        from gpuenv.report import html

        html.write(data, args.html)
        out.print(f"HTML report: {args.html}")
    for r in run.results:
        if r.node == "cluster" or r.status.failed:
            style = console_report.STYLES[r.status]
            out.print(
                f"{r.status.value:5} {r.node} {r.check}: {r.reason}",
                style=style,
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    counts = {st: sum(r.status is st for r in run.results) for st in Status}
    out.print(
        f"verdict: {'OK' if data['ok'] else 'FAILED'}  "
        + ", ".join(f"{n} {st.value}" for st, n in counts.items() if n)
        + f" on {len(hosts)} node(s) in {time.monotonic() - start:.1f}s",
        style="bold green" if data["ok"] else "bold red",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 0 if data["ok"] else 1
