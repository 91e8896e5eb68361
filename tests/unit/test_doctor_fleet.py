"""`gpuenv doctor -i`: node reports gathered over the fan-out, compared, failures named."""

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

from test_doctor import node

from gpuenv.cli import main
from gpuenv.cluster.fanout import NodeAnswer
from gpuenv.cluster.inventory import Host
from gpuenv.doctor import fleet
from gpuenv.doctor.findings import CLASSES
from gpuenv.results import Status

REPO = Path(__file__).resolve().parents[2]


def _report(root, name):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["doctor", "--root", str(root), "--address", "10.0.0.11",
                   "--node", name, "--json", "-"])  # fmt: skip
    return rc, buf.getvalue()


def test_fleet_compares_nodes_and_names_the_one_without_a_report(tmp_path, monkeypatch, capsys):
    roots = {"n1": node(tmp_path, None, "n1"), "n2": node(tmp_path, "07-gpudirect-rdma", "n2")}
    hosts = [Host(n, f"10.0.0.{i}", f"10.0.0.{i}") for i, n in enumerate(["n1", "n2", "n3"], 1)]
    commands = {}

    def fake_fan_out(hosts, command, deadline_s, **_kw):
        out = {}
        for h in hosts:
            commands[h.name] = command(h)
            if h.name in roots:
                rc, text = _report(roots[h.name], h.name)
                out[h.name] = NodeAnswer(h.name, rc, text, "", 1.0)
            else:
                out[h.name] = NodeAnswer(
                    h.name, None, error="unreachable at 10.0.0.3:22: timed out"
                )
        return out

    monkeypatch.setattr(fleet, "fan_out", fake_fan_out)
    capsys.readouterr()
    results = fleet.diagnose(hosts, 30.0, become=True).results
    assert commands["n3"].startswith("sudo -n -H bash -lc 'python3 -m gpuenv doctor --json -")
    assert "--node n3 --address 10.0.0.3" in commands["n3"]
    by = {(r.node, r.check): r for r in results}
    rdma = by[("n2", "doctor.gpudirect-rdma")]
    assert rdma.status is Status.FAIL
    assert rdma.reason == "GPUDirect RDMA is off on n2 but on on n1"
    assert by[("n1", "doctor.gpudirect-rdma")].status is Status.PASS
    lost = by[("n3", "doctor")]
    assert lost.status is Status.ERROR and "unreachable at 10.0.0.3" in lost.reason
    assert len(results) == 2 * len(CLASSES) + 1  # every class on n1 and n2, one ERROR for n3


def test_fleet_runs_doctor_on_a_local_node_for_real(tmp_path):
    env = {"PYTHONPATH": str(REPO), "NCCL_P2P_DISABLE": "1"}
    host = Host("local1", "127.0.0.1", "127.0.0.1", local=True, python=sys.executable, env=env)
    got = fleet.diagnose([host], 60.0, only=[8, 10])
    assert got.outcomes["local1"].rc == 1, got.outcomes["local1"].why()
    by = {r.check: r for r in got.results}
    assert by["doctor.stray-env"].status is Status.FAIL
    assert "NCCL_P2P_DISABLE=1" in by["doctor.stray-env"].reason
    assert by["doctor.nccl-socket-ifname"].status is not Status.ERROR
    assert json.loads(got.outcomes["local1"].stdout)["node"] == "local1"


def test_node_names_are_resolved_on_the_controller():
    host = Host("n1", "localhost", "localhost")
    command = fleet.node_command(host, None, False)
    assert "--address 127.0.0.1" in command or "--address ::1" in command
    odd = Host("n2", "10.0.0.2", "no-such-host.invalid")
    assert "--address no-such-host.invalid" in fleet.node_command(odd, [8], False)
