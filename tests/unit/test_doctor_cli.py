"""`gpuenv doctor` on the command line: exit codes, report files, bad input refused first."""

import json
import xml.etree.ElementTree as ET

import pytest
from test_doctor import node

from gpuenv.cli import main
from gpuenv.doctor.findings import CLASSES


def test_clean_node_exits_0_and_writes_reports(tmp_path, capsys):
    root = node(tmp_path)
    out_json, out_xml = tmp_path / "d.json", tmp_path / "d.xml"
    rc = main(["doctor", "--root", str(root), "--address", "10.0.0.11", "--node", "n1",
               "--json", str(out_json), "--junit", str(out_xml)])  # fmt: skip
    assert rc == 0
    data = json.loads(out_json.read_text())
    assert data["node"] == "n1" and data["profile"] == "doctor" and data["ok"] is True
    assert len(data["results"]) == len(CLASSES)
    assert {r["status"] for r in data["results"]} == {"PASS"}
    suite = ET.parse(out_xml).getroot().find("testsuite")
    assert suite.get("tests") == str(len(CLASSES)) and suite.get("failures") == "0"
    assert "verdict: CLEAN" in capsys.readouterr().out


def test_fault_exits_1_and_console_names_node_class_cause_evidence_fix(tmp_path, capsys):
    root = node(tmp_path, "10-stray-env")
    rc = main(["doctor", "--root", str(root), "--address", "10.0.0.11", "--node", "n3"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "FAIL  n3 [10 stray-env] NCCL_P2P_DISABLE=1 set in /etc/environment:2" in out
    assert "cause:" in out and "evidence: /etc/environment:2" in out and "fix:" in out


def test_json_on_stdout_holds_only_the_report(tmp_path, capsys):
    root = node(tmp_path, "08-nccl-socket-ifname")
    assert main(["doctor", "--root", str(root), "--address", "10.0.0.11", "--json", "-"]) == 1
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    (bad,) = [r for r in data["results"] if r["status"] == "FAIL"]
    assert bad["check"] == "doctor.nccl-socket-ifname"
    assert bad["details"]["findings"][0]["fixes"] == [
        "set NCCL_SOCKET_IFNAME=eth0 in /etc/nccl.conf"
    ]
    assert "FAIL" in captured.err


def test_only_runs_the_named_classes(tmp_path):
    root = node(tmp_path)
    out = tmp_path / "o.json"
    assert main(["doctor", "--root", str(root), "--only", "8,stray-env", "--json", str(out)]) == 0
    checks = [r["check"] for r in json.loads(out.read_text())["results"]]
    assert checks == ["doctor.nccl-socket-ifname", "doctor.stray-env"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "99"], "unknown class(es) 99"),
        (["--only", "nope,1"], "unknown class(es) nope"),
        (["--root", "/no/such/dir"], "--root /no/such/dir: not a folder"),
        (["--run-commands"], "--run-commands needs --root"),
        (["--limit", "n1"], "--limit needs -i INVENTORY"),
        (["--become"], "--become needs -i INVENTORY"),
        (["--deadline", "5"], "--deadline needs -i INVENTORY"),
        (["-i", "inv.yml", "--root", "/tmp"], "--root is for one node"),
        (["-i", "inv.yml", "--address", "10.0.0.1"], "--address is for one node"),
        (["--json", "/no/such/dir/r.json"], "folder /no/such/dir does not exist"),
        (["--junit", "-"], "--junit -: this report needs a file"),
        (["-i", "/no/such/inventory.yml"], "inventory /no/such/inventory.yml does not exist"),
    ],
)
def test_bad_input_exits_2_naming_it(argv, message, capsys):
    assert main(["doctor", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bad_deadline_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "-i", "x", "--deadline", "0"])
    assert exc.value.code == 2


def test_verdict_line_counts_findings_and_errors():
    from gpuenv.doctor.render import lines
    from gpuenv.results import Result, Status

    results = [
        Result("doctor.stray-env", "n1", Status.FAIL, "x",
               details={"findings": [{"class": 10, "title": "t", "cause": "c",
                                      "evidence": ["e"], "fixes": ["f"]}]}),
        Result("doctor", "n2", Status.ERROR, "no doctor report: unreachable"),
        Result("doctor.stray-env", "n3", Status.PASS),
    ]  # fmt: skip
    out = lines(results, 1.0)
    assert out[-1] == "verdict: FINDINGS  1 finding(s), 1 error(s) on 2 of 3 node(s) in 1.0s"
    assert "ERROR n2 [doctor] no doctor report: unreachable" in out
    assert "      fix:      f" in out
