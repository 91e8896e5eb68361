"""`gpuenv health`'s three forms: the console table (rich), JSON, and the Prometheus text
exposition format for node-exporter's textfile collector (written atomically: the collector
must never read half a file)."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuenv.health.findings import MUST_NOT_RUN_JOBS, HealthReport, rank

if TYPE_CHECKING:
    from gpuenv.health.fleet import FleetHealth

STYLES = {"none": "green", "watch": "yellow", "reset": "bold red", "reboot": "bold red",
          "drain": "bold red", "replace": "bold magenta"}  # fmt: skip
PREFIX = "gpuenv_health_"


def console(
    report: HealthReport, fail_on: str, verbose: bool = False, file: TextIO | None = None
) -> None:
    out = Console(file=file, width=160 if file is not None else None)
    shown = [f for f in report.findings if verbose or f.action != "none"]
    shown.sort(key=lambda f: (-rank(f.action), f.gpu if f.gpu is not None else -1, f.signal))
    table = Table(title=f"gpuenv health: {report.node}", show_lines=False)
    for column in ("GPU", "signal", "subject", "action", "evidence"):
        table.add_column(column, overflow="fold")
    for f in shown:
        table.add_row(
            "-" if f.gpu is None else str(f.gpu),
            f.signal,
            f.subject,
            f"[{STYLES[f.action]}]{f.action}[/]"
            + (f" ({f.escalated_by})" if f.escalated_by else ""),
            f.evidence,
        )
    if shown:
        out.print(table)
    signals = len({f.signal for f in report.findings})
    worst = report.worst
    out.print(
        f"{len(report.gpus)} GPUs, {signals} signals, {len(report.findings)} findings read in"
        f" {report.scan_s:.2f} s (kernel log: {report.kernel_log or 'unreadable'});"
        f" worst action [{STYLES[worst]}]{worst}[/]"
    )
    for skip in report.skipped:
        out.print(f"[yellow]SKIP[/] {skip['signal']}: {skip['reason']}")
    style = "bold green" if rank(worst) < rank(MUST_NOT_RUN_JOBS) else "bold red"
    out.print(f"[{style}]{escape(report.verdict(fail_on))}[/]", soft_wrap=True)


def to_json(report: HealthReport) -> str:
    return json.dumps(report.to_dict(), indent=1, sort_keys=True, default=str) + "\n"


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs.items()) + "}"


def prometheus(report: HealthReport) -> str:
    """The text exposition format (version 0.0.4): one series per finding."""
    lines = [
        f"# HELP {PREFIX}finding Action level of a finding: 0 none, 1 watch, 2 reset, 3 reboot,"
        " 4 drain, 5 replace (docs/health.md).",
        f"# TYPE {PREFIX}finding gauge",
    ]
    values = [
        f"# HELP {PREFIX}value The number a finding was judged on (count, degrees C, W, lanes).",
        f"# TYPE {PREFIX}value gauge",
    ]
    for f in sorted(report.findings, key=lambda f: (f.signal, f.gpu or -1, f.subject)):
        gpu = "" if f.gpu is None else f.gpu
        common = {"gpu": gpu, "uuid": f.uuid, "signal": f.signal, "subject": f.subject}
        judged = {**common, "severity": f.severity, "action": f.action}
        lines.append(f"{PREFIX}finding{_labels(judged)} {rank(f.action)}")
        if f.value is not None and math.isfinite(float(f.value)):
            values.append(f"{PREFIX}value{_labels(common)} {float(f.value):g}")
    node = {"node": report.node}
    lines += values
    lines += [
        f"# HELP {PREFIX}worst_action Highest action level of the node's findings.",
        f"# TYPE {PREFIX}worst_action gauge",
        f"{PREFIX}worst_action{_labels(node)} {rank(report.worst)}",
        f"# HELP {PREFIX}gpus GPUs NVML answered for.",
        f"# TYPE {PREFIX}gpus gauge",
        f"{PREFIX}gpus{_labels(node)} {len(report.gpus)}",
        f"# HELP {PREFIX}scan_seconds Wall time of the scan.",
        f"# TYPE {PREFIX}scan_seconds gauge",
        f"{PREFIX}scan_seconds{_labels(node)} {report.scan_s:.6f}",
        f"# HELP {PREFIX}last_scan_timestamp_seconds When the scan ran (Unix time).",
        f"# TYPE {PREFIX}last_scan_timestamp_seconds gauge",
        f"{PREFIX}last_scan_timestamp_seconds{_labels(node)} {report.at_unix:.3f}",
    ]
    if report.skipped:
        lines += [
            f"# HELP {PREFIX}skipped A check asked for and not run (docs/health.md, --dcgm).",
            f"# TYPE {PREFIX}skipped gauge",
        ]
        signals = sorted({s["signal"] for s in report.skipped})
        lines += [f"{PREFIX}skipped{_labels({'signal': s})} 1" for s in signals]
    return "\n".join(lines) + "\n"


_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*)?\})? (\S+)$'
)


def parse_exposition(text: str) -> dict[tuple[str, str], float]:
    """A strict reader of what ``prometheus`` writes: every line a comment of HELP/TYPE or a
    sample of a declared metric, no series twice. Raises ValueError naming the bad line."""
    declared: dict[str, str] = {}
    samples: dict[tuple[str, str], float] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# "):
            parts = line.split(" ", 3)
            if parts[1] not in ("HELP", "TYPE") or len(parts) < 4:
                raise ValueError(f"line {n}: bad comment {line!r}")
            if parts[1] == "TYPE":
                if parts[3] not in ("gauge", "counter", "untyped"):
                    raise ValueError(f"line {n}: bad type {parts[3]!r}")
                declared[parts[2]] = parts[3]
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"line {n}: not a sample: {line!r}")
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        if name not in declared:
            raise ValueError(f"line {n}: {name} has no TYPE line before it")
        key = (name, labels)
        if key in samples:
            raise ValueError(f"line {n}: series {name}{labels} twice")
        samples[key] = float(value)
    if not text.endswith("\n"):
        raise ValueError("the exposition must end with a newline")
    return samples


# ---------------------------------------------------------------- the fleet (gpuenv health -i)


def fleet_console(
    fleet: FleetHealth, fail_on: str, verbose: bool = False, file: TextIO | None = None
) -> None:
    """The node x signal table: each cell the worst action of that signal on that node."""
    out = Console(file=file, width=200 if file is not None else None)
    cells = fleet.cells()
    signals = fleet.signals(verbose)
    table = Table(title=f"gpuenv health: {len(fleet.nodes)} nodes")
    table.add_column("node")
    table.add_column("GPUs", justify="right")
    table.add_column("worst")
    for signal in signals:
        table.add_column(signal, overflow="fold")
    for node in fleet.nodes:
        if node in fleet.errors:
            row = [node, "-", "[bold red]no report[/]", *("" for _ in signals)]
            table.add_row(*row)
            continue
        report = fleet.reports[node]
        worst = fleet.worst(node)
        row = [node, str(len(report["gpus"])), f"[{STYLES[worst]}]{worst}[/]"]
        for signal in signals:
            action = cells[node].get(signal)
            row.append("" if action is None else f"[{STYLES[action]}]{action}[/]")
        table.add_row(*row)
    out.print(table)
    for node, why in sorted(fleet.errors.items()):
        out.print(f"[bold red]{node}: no report[/]: {why}")
    line = fleet.verdict(fail_on)
    style = "bold green" if line.startswith("HEALTHY") else "bold red"
    out.print(f"[{style}]{escape(line)}[/]", soft_wrap=True)


def fleet_json(fleet: FleetHealth, fail_on: str) -> str:
    return json.dumps(fleet.to_dict(fail_on), indent=1, sort_keys=True, default=str) + "\n"


_FLEET_HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpuenv health: {{ nodes|length }} nodes</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
.none { color: #146c14; } .watch { color: #8a6d00; font-weight: bold; }
.reset, .reboot, .drain, .error { color: #b00000; font-weight: bold; }
.replace { color: #7a0a7a; font-weight: bold; }
</style></head><body>
<h1>gpuenv health</h1>
<p>{{ verdict }} (fails on {{ fail_on }} and above) &middot; {{ nodes|length }} node(s)</p>
<table><tr><th>node</th><th>GPUs</th><th>worst</th>
{%- for s in signals %}<th>{{ s }}</th>{% endfor %}</tr>
{%- for node in nodes %}
<tr><td>{{ node }}</td>
{%- if node in errors %}<td>-</td><td class="error">no report: {{ errors[node] }}</td>
{%- for s in signals %}<td></td>{% endfor %}
{%- else %}<td>{{ reports[node].gpus|length }}</td>
<td class="{{ reports[node].worst_action }}">{{ reports[node].worst_action }}</td>
{%- for s in signals %}{% set a = cells[node].get(s) %}<td class="{{ a or '' }}">{{ a or '' }}</td>
{%- endfor %}{% endif %}</tr>
{%- endfor %}
</table>
<h2>Findings above none</h2>
<table><tr><th>node</th><th>GPU</th><th>signal</th><th>subject</th><th>action</th><th>evidence</th>
<th>source</th></tr>
{%- for node in nodes if node in reports %}{% for f in reports[node].findings
    if f.action != "none" %}
<tr><td>{{ node }}</td><td>{{ "-" if f.gpu is none else f.gpu }}</td><td>{{ f.signal }}</td>
<td>{{ f.subject }}</td><td class="{{ f.action }}">{{ f.action }}</td><td>{{ f.evidence }}</td>
<td>{{ f.source }}</td></tr>
{%- endfor %}{% endfor %}
</table></body></html>
"""


def fleet_html(fleet: FleetHealth, fail_on: str) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_FLEET_HTML).render(
        nodes=fleet.nodes,
        signals=fleet.signals(),
        cells=fleet.cells(),
        reports=fleet.reports,
        errors=fleet.errors,
        fail_on=fail_on,
        verdict=fleet.verdict(fail_on),
    )
