"""Command-line entry point: argument parsing only.

Each subcommand lives in its own module here and exposes ``register(subparsers)``.
Handlers import the heavy libraries they need lazily, so that ``gpuenv check`` on a
node never imports the controller's dependencies (docker SDK, matplotlib).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from gpuenv import __version__
from gpuenv.errors import GpuenvError

# Subcommand modules, in the order they appear in --help.
_SUBCOMMANDS = ("lab", "check", "cluster", "doctor", "health", "top", "cloud_init", "bundle")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuenv",
        description="Provision and validate multi-GPU, multi-node NVIDIA clusters.",
    )
    parser.add_argument("--version", action="version", version=f"gpuenv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"gpuenv.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"gpuenv.cli.{name}":
                continue  # subcommand not part of this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except GpuenvError as exc:
        print(f"gpuenv {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"gpuenv {args.command}: interrupted", file=sys.stderr)
        return 130
