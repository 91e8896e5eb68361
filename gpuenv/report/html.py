"""The cluster report as one self-contained HTML file: tables plus PNG plots embedded as data URIs.

Rendered from a ClusterReport (a saved ``--json`` file loads back into one), so it says what the
console says: the same verdict, the same SKIPs grouped by reason. No external CSS, scripts or
images.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2

from gpuenv.report import plots
from gpuenv.report.console import skips_by_reason
from gpuenv.results import CLUSTER_NODE, ClusterReport, Measurement

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
{% if problems %}<h2>Why it is not OK</h2><ul>
{% for p in problems %}<li>{{ p }}</li>{% endfor %}
</ul>{% endif %}
{% if skips %}<h2>Skipped, by reason</h2><ul>
{% for reason, checks in skips.items() %}<li><b>{{ checks|join(", ") }}</b>: {{ reason }}</li>
{% endfor %}</ul>{% endif %}
<h2>Nodes &times; checks</h2>
<table><tr><th>node</th>{% for c in grid_checks %}<th>{{ c }}</th>{% endfor %}</tr>
{% for node in grid_nodes %}<tr><td>{{ node }}</td>{% for c in grid_checks %}
{% set r = grid.get((node, c)) %}{% if r %}<td class="{{ r.status.value }}" title="{{ r.reason }}">
{{ r.status.value }}</td>{% else %}<td>&nbsp;</td>{% endif %}{% endfor %}</tr>{% endfor %}
</table>
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
<h2>Results in full</h2>
<table><tr><th>node</th><th>check</th><th>status</th><th>reason</th><th>measured</th><th>s</th></tr>
{% for r in results %}<tr><td>{{ r.node }}</td><td>{{ r.check }}</td>
<td class="{{ r.status.value }}">{{ r.status.value }}</td><td>{{ r.reason }}</td>
<td>{{ r.measurements|map("measured")|join(", ") }}</td>
<td>{{ "%.1f"|format(r.duration_s) }}</td></tr>{% endfor %}</table>
{% if fact_keys %}<h2>Node facts</h2>
<table><tr><th>fact</th>{% for h in fact_nodes %}<th>{{ h }}</th>{% endfor %}</tr>
{% for k in fact_keys %}<tr{% if k in odd_keys %} class="odd"{% endif %}><td>{{ k }}</td>
{% for h in fact_nodes %}<td>{{ facts[h].get(k, "—") }}</td>{% endfor %}</tr>{% endfor %}
</table>{% endif %}
</body></html>
"""


def _measured(m: Measurement) -> str:
    text = f"{m.name}={m.value}" + (f" {m.unit}" if m.unit else "")
    if m.threshold is not None and m.bound:
        text += f" ({m.bound} {m.threshold:g})"
    return text


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def figures(report: ClusterReport) -> list[dict[str, str]]:
    figs = []
    local: dict[str, list[Mapping[str, Any]]] = {}
    local_mark = None
    for r in report.results:
        sweep = r.details.get("sweep") if r.check == "nccl" else None
        if sweep:
            local[r.node] = sweep
            busbw = next((m for m in r.measurements if m.name == "busbw"), None)
            local_mark = busbw.threshold if busbw is not None else local_mark
    if local:
        figs.append({
            "title": "busbw against message size within each node (gpuenv check nccl)",
            "png": _b64(plots.busbw_vs_size(local, "all-reduce within the node", local_mark)),
        })  # fmt: skip
    if report.sweeps:
        mark = report.thresholds.get("busbw_floor_gbps")
        figs.append({
            "title": "busbw against message size across all nodes (torchrun), as each node saw it",
            "png": _b64(plots.busbw_vs_size(report.sweeps, "all-reduce across nodes", mark)),
        })  # fmt: skip
    matrix = dict(report.matrix)
    iso = report.isolation or {}
    if not matrix and iso.get("rounds"):
        matrix = {(m["a"], m["b"]): m["busbw_gbps"] for r in iso["rounds"] for m in r}
    if matrix:
        names = [h for h in report.hosts if any(h in pair for pair in matrix)]
        if len(names) <= 64:
            mark = report.thresholds.get("pair_floor_gbps") or iso.get("threshold_gbps")
            figs.append({"title": "node-pair bandwidth matrix",
                         "png": _b64(plots.pair_matrix(names, matrix, mark))})  # fmt: skip
    return figs


def render(report: ClusterReport) -> str:
    results = report.results
    verdict = report.verdict
    consistency = next((r for r in results if r.check == "consistency"), None)
    disagreements = consistency.details.get("disagreements", []) if consistency else []
    facts = report.facts
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["measured"] = _measured
    checks = list(dict.fromkeys(r.check for r in results))
    nodes = [*report.hosts, CLUSTER_NODE]
    if verdict is None:
        banner, problems = "NOT OK: no verdict", ["the run ended before its verdict"]
    else:
        gpu = "GPUs verified" if verdict.gpu_verified else "no GPU verified"
        words = "OK" if verdict.ok else "NOT OK"
        banner = f"{words}: profile {verdict.profile}, {verdict.node_kind} cluster, {gpu}"
        problems = verdict.problems
    return env.from_string(_TEMPLATE).render(
        verdict=banner,
        ok=report.ok,
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        hosts=report.hosts,
        duration=report.duration_s,
        problems=problems,
        skips=skips_by_reason(results),
        grid={(r.node, r.check): r for r in results},
        grid_nodes=[n for n in nodes if any(r.node == n for r in results)],
        grid_checks=checks,
        isolation=report.isolation,
        figures=figures(report),
        disagreements=disagreements,
        results=results,
        facts=facts,
        fact_nodes=list(facts),
        fact_keys=sorted({k for f in facts.values() for k in f}),
        odd_keys={d["key"] for d in disagreements},
    )


def write(report: ClusterReport, path: str | Path) -> None:
    Path(path).write_text(render(report), encoding="utf-8")
