"""``gpuenv lab``: a local cluster of systemd containers that behave like nodes."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from gpuenv.lab import settings

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID


def register(subparsers: argparse._SubParsersAction) -> None:
    lab = subparsers.add_parser(
        "lab",
        help="local container cluster for trying and testing gpuenv",
        description="A local cluster of systemd containers built from Debian's archive.",
    )
    sub = lab.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    build = sub.add_parser("build", help="build the node images, the cache and molecule network")
    build.add_argument(
        "--distro",
        action="append",
        metavar="DISTRO",
        help=f"node image to build ({', '.join(settings.DISTROS)}); repeatable; default: all",
    )
    _add_ca_bundle(build)
    build.set_defaults(func=_build)


def _add_ca_bundle(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-bundle",
        type=Path,
        default=settings.DEFAULT_CA_BUNDLE,
        help="PEM bundle the nodes trust (default: %(default)s)",
    )


class _RichProgress:
    """gpuenv.lab.progress.Progress on a rich progress display (thread-safe)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress: RichProgress = Progress(
            SpinnerColumn(finished_text="[green]✓"),
            TextColumn("{task.description}"),
            TextColumn("[dim]{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> _RichProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def begin(self, key: str, description: str) -> None:
        with self._lock:
            self._tasks[key] = self._progress.add_task(description, total=1, detail="")

    def update(self, key: str, detail: str) -> None:
        with self._lock:
            if key in self._tasks:
                self._progress.update(self._tasks[key], detail=detail)

    def end(self, key: str, detail: str = "") -> None:
        with self._lock:
            if key in self._tasks:
                self._progress.update(self._tasks[key], completed=1, detail=detail)


def _build(args: argparse.Namespace) -> int:
    from gpuenv.lab import build, engine

    distros = [settings.validate_distro(d) for d in (args.distro or settings.DISTROS)]
    names = settings.Names.from_env()
    client = engine.connect()
    with _RichProgress() as progress:
        states = build.build(client, names, Path.cwd(), distros, args.ca_bundle, progress)
    for state in states:
        print(f"{state.tag}  recipe {state.digest}  {'built' if state.built else 'up to date'}")
    print(f"cache {names.cache_container} on network {names.molecule_network} as apt-cache")
    return 0
