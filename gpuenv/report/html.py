"""The cluster report as one self-contained HTML file: tables plus PNG plots embedded as data URIs.

Rendered from the cluster run's JSON document (``ClusterRun.to_dict()``), so a saved
``--json`` file can be turned into HTML again later. No external CSS, scripts or images.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from gpuenv.report import plots

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>gpuenv cluster report: {{ verdict }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { margin-bottom: .2em; } .meta { color: #666; }
.banner { padding: .6em 1em; font-size: 1.3em; font-weight: bold; border-radius: 4px; }
.ok { background: #d9f2d9; color: #145214; } .bad { background: #f8d7d7; color: #7a1010; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.PASS { color: #146c14; font-weight: bold; } td.SKIP { color: #8a6d00; font-weight: bold; }
td.FAIL, td.ERROR { color: #b00000; font-weight: bold; }
tr.odd td { background: #fff1f1; }
img { max-width: 100%; border: 1px solid #ddd; margin: .5em 0; }
</style></head><body>
<h1>gpuenv cluster report</h1>
<p class="meta">{{ generated }} &middot; {{ hosts|length }} node(s): {{ hosts|join(", ") }}
 &middot; {{ "%.1f"|format(duration) }} s</p>
<div class="banner {{ 'ok' if ok else 'bad' }}">{{ verdict }}</div>
{% if problems %}<h2>What failed</h2><ul>
{% for r in problems %}
<li><b>{{ r.node }}</b> &middot; {{ r.check }}: {{ r.reason }}</li>{% endfor %}
</ul>{% endif %}
{% if isolation %}<h2>Bad-node isolation</h2>
<p>{{ isolation.rounds|length }} round(s) of node pairs, pass mark
{{ "%.2f"|format(isolation.threshold_gbps or 0) }} GB/s.
Bad nodes: <b>{{ isolation.bad_nodes|join(", ") or "none" }}</b>;
bad links: <b>{{ isolation.bad_links|map("join", "-")|join(", ") or "none" }}</b>;
undecided: {{ isolation.unresolved|join(", ") or "none" }}.</p>{% endif %}
{% for fig in figures %}<h2>{{ fig.title }}</h2>
<img alt="{{ fig.title }}" src="data:image/png;base64,{{ fig.png }}">{% endfor %}
{% if disagreements %}<h2>Consistency: disagreements</h2>
<table><tr><th>fact</th><th>value</th><th>nodes</th></tr>
{% for d in disagreements %}{% for value, nodes in d["values"].items() %}
<tr{% if not loop.first %} class="odd"{% endif %}><td>{{ d.key }}</td><td>{{ value }}</td>
<td>{{ nodes|join(", ") }}</td></tr>{% endfor %}{% endfor %}</table>{% endif %}
<h2>Results</h2>
<table><tr><th>node</th><th>check</th><th>status</th><th>reason</th><th>measured</th><th>s</th></tr>
{% for r in results %}<tr><td>{{ r.node }}</td><td>{{ r.check }}</td>
<td class="{{ r.status }}">{{ r.status }}</td><td>{{ r.reason }}</td>
<td>{{ r.measurements|map("measured")|join(", ") }}</td>
<td>{{ "%.1f"|format(r.duration_s) }}</td></tr>{% endfor %}</table>
{% if fact_keys %}<h2>Node facts</h2>
<table><tr><th>fact</th>{% for h in fact_nodes %}<th>{{ h }}</th>{% endfor %}</tr>
{% for k in fact_keys %}<tr{% if k in odd_keys %} class="odd"{% endif %}><td>{{ k }}</td>
{% for h in fact_nodes %}<td>{{ facts[h].get(k, "—") }}</td>{% endfor %}</tr>{% endfor %}
</table>{% endif %}
</body></html>
"""


def _measured(m: Mapping[str, Any]) -> str:
    text = f"{m['name']}={m['value']}" + (f" {m['unit']}" if m.get("unit") else "")
    if m.get("threshold") is not None and m.get("bound"):
        text += f" ({m['bound']} {m['threshold']:g})"
    return text


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def _node_sweeps(results: list[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Each node's own NCCL sweep, from its `gpuenv check` nccl result."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        sweep = r.get("details", {}).get("sweep") if r.get("check") == "nccl" else None
        if sweep:
            out[r["node"]] = sweep
    return out


def figures(data: Mapping[str, Any]) -> list[dict[str, str]]:
    figs = []
    local = _node_sweeps(data.get("results", []))
    if local:
        figs.append({
            "title": "busbw against message size within each node (gpuenv check nccl)",
            "png": _b64(plots.busbw_vs_size(local, "all-reduce within the node")),
        })  # fmt: skip
    if data.get("sweeps"):
        figs.append({
            "title": "busbw against message size across all nodes (torchrun), as each node saw it",
            "png": _b64(plots.busbw_vs_size(data["sweeps"], "all-reduce across nodes")),
        })  # fmt: skip
    matrix = {(m["a"], m["b"]): m["busbw_gbps"] for m in data.get("matrix", [])}
    iso = data.get("isolation") or {}
    if not matrix and iso.get("rounds"):
        matrix = {(m["a"], m["b"]): m["busbw_gbps"] for r in iso["rounds"] for m in r}
    if matrix:
        names = [h for h in data.get("hosts", []) if any(h in pair for pair in matrix)]
        if len(names) <= 64:
            figs.append(
                {
                    "title": "node-pair bandwidth matrix",
                    "png": _b64(plots.pair_matrix(names, matrix)),
                }
            )
    return figs


def render(data: Mapping[str, Any]) -> str:
    results = list(data.get("results", []))
    ok = bool(data.get("ok"))
    problems = [r for r in results if r.get("status") in ("FAIL", "ERROR")]
    consistency = next((r for r in results if r.get("check") == "consistency"), {})
    disagreements = consistency.get("details", {}).get("disagreements", [])
    facts: dict[str, dict[str, str]] = data.get("facts", {})
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["measured"] = _measured
    return env.from_string(_TEMPLATE).render(
        verdict="PASS: the cluster validated" if ok else f"FAIL: {len(problems)} problem(s)",
        ok=ok,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        hosts=data.get("hosts", []),
        duration=float(data.get("duration_s", 0.0)),
        problems=problems,
        isolation=data.get("isolation"),
        figures=figures(data),
        disagreements=disagreements,
        results=results,
        facts=facts,
        fact_nodes=list(facts),
        fact_keys=sorted({k for f in facts.values() for k in f}),
        odd_keys={d["key"] for d in disagreements},
    )


def write(data: Mapping[str, Any], path: str | Path) -> None:
    Path(path).write_text(render(data), encoding="utf-8")
