"""The console view of the lab: which labs are up, their nodes, and the cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def print_status(
    console: Console,
    cache_line: str,
    labs: Sequence[Any],
    wanted: str | None,
    rel: Callable[[Any], str],
) -> None:
    """``gpuenv lab status``: one row per node of every lab (``labs`` from lab.cluster.status)."""
    console.print(cache_line)
    if not labs:
        console.print("no lab is up" + (f" named {wanted!r}" if wanted else ""))
        return
    table = Table("lab", "node", "state", "address", "distro", "inventory")
    for lab in labs:
        for node in lab.nodes:
            table.add_row(
                lab.name,
                node.name,
                node.state,
                node.ip or "-",
                node.distro,
                rel(lab.hosts_file) if lab.hosts_file else "-",
            )
    console.print(table)
