"""`gpuenv top`: a refreshing table of every GPU of this node, or of every inventory node
(docs/health.md "gpuenv top"). ``--once`` prints one frame; ``--stream`` is the node side of
``-i``: a JSON line per frame.

Exit 0, or 2 on bad input (nothing run).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from gpuenv.cli.argtypes import positive
from gpuenv.errors import BadInput


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "top",
        help="live table of every GPU (utilization, memory, temperature, power, throttle, health)",
        description="NVML read every --interval seconds, the health rules applied to each GPU;"
        " with -i every node streams its frames over one connection.",
    )
    p.add_argument("-i", "--inventory", help="every node of this Ansible inventory")
    p.add_argument("-l", "--limit", help="with -i: Ansible host pattern restricting the nodes")
    p.add_argument("--interval", type=positive(float, "seconds > 0"), metavar="SECONDS",
                   help="seconds between two frames (default 1)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--stream", action="store_true",
                   help="print a JSON line per frame (the node side of -i)")  # fmt: skip
    p.add_argument("--count", type=positive(int, "a whole number > 0"), metavar="N",
                   help="with --stream: stop after N frames")  # fmt: skip
    p.add_argument("--node", help="node name in the frames (default: short host name)")
    p.add_argument("--nvml-fixture", metavar="FILE", help="answer NVML from this JSON (tests)")
    p.set_defaults(func=handler)


def _validate(args: argparse.Namespace) -> None:
    if args.inventory and (args.stream or args.node or args.nvml_fixture):
        raise BadInput("--stream, --node and --nvml-fixture are a node's; -i shows every node")
    if args.limit and not args.inventory:
        raise BadInput("--limit needs -i INVENTORY")
    if args.count and not args.stream:
        raise BadInput("--count goes with --stream")
    if args.stream and args.once:
        raise BadInput("--stream and --once together")


def _reader(args: argparse.Namespace) -> Any:
    from gpuenv.health.nvml import FakeNvml, NoNvml, PynvmlNvml

    if args.nvml_fixture:
        return FakeNvml.from_file(args.nvml_fixture)
    try:
        return PynvmlNvml()
    except ImportError:
        return NoNvml("nvidia-ml-py is not installed")


def handler(args: argparse.Namespace) -> int:
    _validate(args)
    from rich.console import Console
    from rich.live import Live

    from gpuenv.checks.thresholds import load_thresholds
    from gpuenv.health import top
    from gpuenv.report.top import table

    th = load_thresholds(None)["health"]
    interval_s = args.interval or top.INTERVAL_S
    if args.stream:
        node = args.node or top.this_node()

        def write(line: str) -> None:
            sys.stdout.write(line)
            sys.stdout.flush()

        try:
            top.stream(node, _reader(args), th, write, interval_s, args.count)
        except (BrokenPipeError, KeyboardInterrupt):
            return 0  # the controller went away: the stream ends with it
        return 0

    console = Console()
    if not args.inventory:
        node = args.node or top.this_node()
        reader = _reader(args)

        def local_rows() -> list[dict[str, Any]]:
            got = top.frame(node, reader, th)
            view = top.NodeView(frame=got, at=time.monotonic())
            return list(top.rows({node: view}, interval_s))

        if args.once:
            console.print(table(local_rows(), f"gpuenv top: {node}"))
            return 0
        with Live(table(local_rows(), f"gpuenv top: {node}"), console=console) as live:
            try:
                while True:
                    time.sleep(interval_s)
                    live.update(table(local_rows(), f"gpuenv top: {node}"))
            except KeyboardInterrupt:
                return 0

    from gpuenv.cluster import inventory

    hosts = inventory.load(args.inventory, args.limit)  # BadInput before anything runs
    streams = top.Streams(hosts, interval_s).start()
    title = f"gpuenv top: {len(hosts)} nodes"
    try:
        streams.wait_first(30.0)
        if args.once:
            console.print(table(top.rows(streams.views, interval_s), title))
            return 0
        with Live(table(top.rows(streams.views, interval_s), title), console=console) as live:
            try:
                while True:
                    time.sleep(interval_s)
                    live.update(table(top.rows(streams.views, interval_s), title))
            except KeyboardInterrupt:
                return 0
    finally:
        streams.close()
