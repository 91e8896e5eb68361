"""Figures for the cluster report, rendered to PNG bytes with matplotlib (no display needed).

Uses ``matplotlib.figure.Figure`` directly rather than pyplot: no global state, no GUI backend,
safe to call from any thread.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

Series = Sequence[Mapping[str, Any]]  # [{"bytes": int, "busbw_gbps": float}, ...]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def busbw_vs_size(
    series: Mapping[str, Series], title: str, threshold: float | None = None
) -> bytes:
    """Bus bandwidth against message size, one line per node (log-scaled size axis), with the
    threshold it was judged against as a dashed red line (or said to be missing)."""
    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    sizes: set[int] = set()
    for node, points in sorted(series.items()):
        pts = sorted((int(p["bytes"]), float(p["busbw_gbps"])) for p in points if "bytes" in p)
        if not pts:
            continue
        sizes.update(x for x, _ in pts)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=node)
    ax.set_xscale("log", base=2)
    ticks = sorted(sizes)
    ax.set_xticks(ticks, [_size_label(t) for t in ticks], rotation=30, ha="right")
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s)")
    if threshold is not None:
        ax.axhline(threshold, color="red", linestyle="--", label=f"pass mark {threshold:.2f} GB/s")
        title += f" (pass mark {threshold:.2f} GB/s)"
    else:
        title += " (not judged: no threshold)"
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_ylim(bottom=0)
    if series:
        ax.legend(fontsize="small", ncol=max(1, math.ceil(len(series) / 12)))
    return _png(fig)


def pair_matrix(
    nodes: Sequence[str],
    matrix: Mapping[tuple[str, str], float | None],
    threshold: float | None = None,
) -> bytes:
    """Node-pair bandwidth as a heat map; a failed pair is marked FAIL, an untested one blank,
    a pair below ``threshold`` (the pass mark it was judged against) marked LOW and the pass
    mark drawn on the colour bar."""
    n = len(nodes)
    index = {name: i for i, name in enumerate(nodes)}
    grid = [[math.nan] * n for _ in range(n)]
    failed: list[tuple[int, int]] = []
    for (a, b), value in matrix.items():
        if a not in index or b not in index:
            continue
        i, j = index[a], index[b]
        if value is None:
            failed += [(i, j), (j, i)]
        else:
            grid[i][j] = grid[j][i] = value
    side = max(4.0, min(12.0, 0.6 * n + 2.5))
    fig = Figure(figsize=(side + 1.2, side))
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="viridis", vmin=0)
    bar = fig.colorbar(image, ax=ax, label="busbw (GB/s)", shrink=0.8)
    if threshold is not None:
        bar.ax.axhline(threshold, color="red", linewidth=2)
    ax.set_xticks(range(n), nodes, rotation=45, ha="right")
    ax.set_yticks(range(n), nodes)
    top = max((v for row in grid for v in row if not math.isnan(v)), default=0.0)
    if n <= 16:
        for i in range(n):
            for j in range(n):
                v = grid[i][j]
                if not math.isnan(v):
                    # viridis is light at the top of its range: dark text there.
                    color = "black" if v > 0.6 * top else "white"
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", color=color, fontsize=8)
    for i, j in failed:
        ax.text(j, i, "FAIL", ha="center", va="center", color="red", fontweight="bold", fontsize=8)
    if threshold is not None and n > 16:
        for i in range(n):
            for j in range(n):
                if not math.isnan(grid[i][j]) and grid[i][j] < threshold:
                    ax.text(j, i, "LOW", ha="center", va="center", color="red", fontsize=7)
    mark = f"pass mark {threshold:.2f} GB/s" if threshold is not None else "no absolute pass mark"
    ax.set_title(f"node-pair all-reduce bandwidth ({mark})")
    return _png(fig)
