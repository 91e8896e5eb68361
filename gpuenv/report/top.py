"""`gpuenv top`'s table (rich): one row a GPU of a node, refreshed in place by rich's Live."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.table import Table

from gpuenv.report.health import STYLES

RIGHT = ("GPU", "util", "memory MiB", "temp", "power W")


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: Iterable[Mapping[str, Any]], title: str) -> Table:
    t = Table(title=title, expand=False)
    for column in ("node", "GPU", "name", "util", "memory MiB", "temp", "power W", "throttle",
                   "health"):  # fmt: skip
        t.add_column(column, justify="right" if column in RIGHT else "left")
    for r in rows:
        if "gpu" not in r:
            t.add_row(r["node"], "", f"[yellow]{r.get('state', '')}[/]", *([""] * 6))
            continue
        if r.get("error"):
            t.add_row(r["node"], str(r["gpu"]), r.get("name", ""), "", "", "", "", "",
                      f"[bold red]{r['error']}[/]")  # fmt: skip
            continue
        health = r.get("health", "none")
        state = f" [yellow]({r['state']})[/]" if r.get("state") else ""
        mem = f"{_num(r.get('mem_used_mib'), '.0f')} / {_num(r.get('mem_total_mib'), '.0f')}"
        power = f"{_num(r.get('power_w'), '.0f')} / {_num(r.get('power_limit_w'), '.0f')}"
        util = "-" if r.get("util_pct") is None else f"{r['util_pct']}%"
        temp = "-" if r.get("temp_c") is None else f"{r['temp_c']} C"
        t.add_row(r["node"] + state, str(r["gpu"]), r.get("name", ""), util, mem, temp, power,
                  r.get("throttle", ""), f"[{STYLES[health]}]{health}[/]")  # fmt: skip
    return t
