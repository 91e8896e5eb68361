"""`gpuenv health -i`: every node's scan gathered over the fan-out into a node x signal table
(console, JSON, HTML); a node without a report is an error, never healthy."""

import io
import json
import sys
import tempfile
from pathlib import Path

from healthnode import build

from gpuenv.cli import main
from gpuenv.cluster.fanout import NodeAnswer
from gpuenv.cluster.inventory import Host
from gpuenv.health import fleet
from gpuenv.health.findings import ACTIONS
from gpuenv.report import health as render
from gpuenv.results import Status


def _scan_json(tmp_path, name, case=None):
    node = build(Path(tempfile.mkdtemp(dir=tmp_path)), "hgx8", case)
    nvml = tmp_path / f"{name}.json"
    nvml.write_text(json.dumps(node.nvml_data))
    log = tmp_path / f"{name}.log"
    log.write_text(node.kernel_log or "")
    out = io.StringIO()
    stdout, sys.stdout = sys.stdout, out
    try:
        rc = main(["health", "--root", node.root, "--nvml-fixture", str(nvml), "--kernel-log",
                   str(log), "--node", name, "--no-state", "--json", "-"])  # fmt: skip
    finally:
        sys.stdout = stdout
    return rc, out.getvalue()


def _fake_fan_out(tmp_path, cases, commands):
    def fan_out(hosts, command, deadline_s, **_kw):
        answers = {}
        for h in hosts:
            commands[h.name] = command(h)
            if h.name in cases:
                rc, text = _scan_json(tmp_path, h.name, cases[h.name])
                answers[h.name] = NodeAnswer(h.name, rc, text, "", 0.5)
            else:
                answers[h.name] = NodeAnswer(h.name, None, error="unreachable: timed out")
        return answers

    return fan_out


HOSTS = [Host(n, f"10.0.0.{i}", f"10.0.0.{i}") for i, n in enumerate(["n1", "n2", "n3"], 1)]
CASES = {"n1": None, "n2": "xid79-fallen-off-bus"}


def test_the_table_names_each_node_signal_and_the_node_without_a_report(tmp_path, monkeypatch):
    commands = {}
    monkeypatch.setattr(fleet, "fan_out", _fake_fan_out(tmp_path, CASES, commands))
    scanned = fleet.scan_fleet(HOSTS, 30.0)
    assert commands["n1"] == "python3 -m gpuenv health --json - --node n1 --no-state"
    assert scanned.nodes == ["n1", "n2", "n3"]
    assert scanned.errors == {"n3": "unreachable: timed out"}
    cells = scanned.cells()
    assert cells["n2"]["xid"] == "reboot" and "xid" not in cells["n1"]
    assert set(cells["n1"].values()) <= set(ACTIONS)
    assert scanned.signals() == ["gpu.lost", "xid"]  # the only signals above none anywhere
    assert len(scanned.signals(verbose=True)) >= 24
    assert scanned.worst("n1") == "none" and scanned.worst("n2") == "reboot"
    assert scanned.failing("drain")  # n3 gave no report
    by_node = {r.node: r for r in fleet.results(scanned, "reboot")}
    assert by_node["n1"].status is Status.PASS and by_node["n1"].duration_s == 0.5
    assert by_node["n2"].status is Status.FAIL and "xid 79: reboot" in by_node["n2"].reason
    assert by_node["n3"].status is Status.ERROR and "timed out" in by_node["n3"].reason


def test_become_scans_as_root_with_the_state_file(tmp_path, monkeypatch):
    commands = {}
    monkeypatch.setattr(fleet, "fan_out", _fake_fan_out(tmp_path, CASES, commands))
    fleet.scan_fleet(HOSTS[:1], 30.0, become=True)
    assert commands["n1"].startswith("sudo -n -H bash -lc 'python3 -m gpuenv health --json -")
    assert "--no-state" not in commands["n1"]


def test_bad_answers_are_errors_not_health(tmp_path):
    answers = {
        "a": NodeAnswer("a", 2, "", "error: --thresholds x: not a file"),
        "b": NodeAnswer("b", 0, '{"kind": "gpuenv.run"}'),
        "c": NodeAnswer("c", 0, "no json here"),
    }
    scanned = fleet.gather(answers)
    assert set(scanned.errors) == {"a", "b", "c"} and not scanned.reports
    assert "thresholds" in scanned.errors["a"] and "not a gpuenv health" in scanned.errors["b"]


def test_the_three_outputs(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "fan_out", _fake_fan_out(tmp_path, CASES, {}))
    scanned = fleet.scan_fleet(HOSTS, 30.0)
    out = io.StringIO()
    render.fleet_console(scanned, "drain", file=out)
    text = out.getvalue()
    assert "n2" in text and "reboot" in text and "n3: no report" in text
    assert "NOT HEALTHY" in text
    data = json.loads(render.fleet_json(scanned, "drain"))
    assert data["kind"] == "gpuenv.health.fleet" and data["table"]["n2"]["xid"] == "reboot"
    assert data["reports"]["n2"]["node"] == "n2" and data["errors"]["n3"]
    html = render.fleet_html(scanned, "drain")
    table = html.split("<h2>")[0]
    assert table.count("<tr><td>n") == 3 and 'class="reboot">reboot' in table
    assert "Xid 79" in html and "no report: unreachable" in html


def test_cli_with_an_inventory(tmp_path, monkeypatch, capsys):
    from gpuenv.cluster import inventory

    monkeypatch.setattr(inventory, "load", lambda source, limit: HOSTS[:2])
    monkeypatch.setattr(fleet, "fan_out", _fake_fan_out(tmp_path, CASES, {}))
    report, page = tmp_path / "fleet.json", tmp_path / "fleet.html"
    args = ["health", "-i", "inv.yml", "--json", str(report), "--html", str(page)]
    assert main(args) == 1  # a node that needs a reboot must not take the next job
    out = capsys.readouterr().out
    assert "NOT HEALTHY: NEEDS REBOOT: n2" in out and "xid" in out
    assert main([*args, "--fail-on", "drain"]) == 0  # loosened on purpose
    assert "exit 0 only because --fail-on drain accepts it" in capsys.readouterr().out
    assert json.loads(report.read_text())["nodes"] == ["n1", "n2"]
    assert page.read_text().startswith("<!DOCTYPE html>")


def test_cli_refuses_one_node_options_with_an_inventory(capsys):
    assert main(["health", "-i", "inv.yml", "--prometheus", "x.prom"]) == 2
    assert "--prometheus is for one node" in capsys.readouterr().err
    assert main(["health", "--limit", "n1"]) == 2
    assert "--limit needs -i" in capsys.readouterr().err


def test_the_real_fan_out_on_local_nodes(tmp_path):
    """Two nodes emulated on this machine (ansible_connection=local): the real transport, the
    real scan of this GPU-less machine."""
    hosts = [Host(n, "127.0.0.1", "127.0.0.1", local=True, python=sys.executable)
             for n in ("l1", "l2")]  # fmt: skip
    scanned = fleet.scan_fleet(hosts, 60.0)
    assert scanned.errors == {}, scanned.errors
    assert {n: r["node"] for n, r in scanned.reports.items()} == {"l1": "l1", "l2": "l2"}
