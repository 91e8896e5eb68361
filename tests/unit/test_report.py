import json
import xml.etree.ElementTree as ET

import pytest
from rich.console import Console

from gpuenv.report import console, jsonreport, junit, live
from gpuenv.results import SCHEMA_VERSION, Measurement, Result, RunReport, RunVerdict, Status


def _results():
    return [
        Result(
            "system",
            "n1",
            Status.PASS,
            "2 x H200",
            [Measurement("gpus", 2)],
            {"driver": "580.159.04"},
            0.3,
        ),
        Result(
            "nccl",
            "n1",
            Status.FAIL,
            "busbw 100 GB/s < 270",
            [Measurement("busbw", 100.0, "GB/s", 270.0, "min")],
            {"nccl": "2.28.9"},
            4.0,
            {"sweep": [{"bytes": 1, "busbw_gbps": 100.0}], "ranks_behind": [1]},
        ),
        Result("cupy", "n1", Status.SKIP, "cupy not installed"),
        Result(
            "mpi", "n1", Status.ERROR, "boom", measurements=[Measurement("t", float("nan"), "s")]
        ),
    ]


def _report():
    return RunReport(
        node="n1",
        profile="quick",
        verdict=RunVerdict(False, "quick", "gpu", ["system"], ["nccl FAIL: busbw 100 GB/s < 270"]),
        results=_results(),
        started_at="2026-11-30T16:00:00Z",
        duration_s=5.0,
        command=["gpuenv", "check"],
        gpuenv_version="0.1.0",
    )


def test_json_document_has_the_documented_fields():
    data = json.loads(jsonreport.dumps(_report()))
    assert set(data) == {
        "schema_version",
        "kind",
        "gpuenv_version",
        "node",
        "profile",
        "started_at",
        "duration_s",
        "command",
        "ok",
        "exit_code",
        "verdict",
        "results",
    }
    assert data["schema_version"] == SCHEMA_VERSION and data["kind"] == "gpuenv-check"
    assert data["ok"] is False and data["exit_code"] == 1
    first = data["results"][0]
    assert set(first) == {
        "check",
        "node",
        "status",
        "reason",
        "measurements",
        "versions",
        "duration_s",
        "details",
    }
    assert set(first["measurements"][0]) == {"name", "value", "unit", "threshold", "bound"}


def test_json_never_contains_nan():
    text = jsonreport.dumps(_report())
    assert "NaN" not in text
    assert json.loads(text)["results"][3]["measurements"][0]["value"] is None


def test_json_round_trip_through_a_file(tmp_path):
    report = _report()
    report.results = report.results[:3]  # NaN is written as null, so leave it out here
    path = tmp_path / "r.json"
    jsonreport.write(report, str(path))
    assert jsonreport.load(path) == report


def test_foreign_documents_are_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"kind": "something-else", "schema_version": 1}))
    with pytest.raises(ValueError, match="not a gpuenv-check report"):
        jsonreport.load(path)
    path.write_text(json.dumps({"kind": "gpuenv-check", "schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version 99"):
        jsonreport.load(path)


def test_junit_counts_and_elements(tmp_path):
    path = tmp_path / "r.xml"
    junit.write(_results(), path)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "1"
    assert suite.get("errors") == "1" and suite.get("skipped") == "1"
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["nccl"].find("failure").get("message") == "busbw 100 GB/s < 270"
    assert cases["cupy"].find("skipped").get("message") == "cupy not installed"
    assert cases["mpi"].find("error") is not None
    assert cases["system"].find("failure") is None
    props = {p.get("name"): p.get("value") for p in cases["nccl"].iter("property")}
    assert props["busbw"] == "100.0 GB/s (min 270)" and props["version.nccl"] == "2.28.9"


def test_console_summary_names_failures_groups_skips_and_ends_on_the_verdict():
    con = Console(record=True, width=120)
    console.print_summary(_report(), con)
    lines = con.export_text().strip().splitlines()
    text = "\n".join(lines)
    assert "1 passed, 2 failed, 1 skipped" in text
    assert "SKIP cupy: cupy not installed" in text
    assert lines[-1].startswith("verdict: NOT OK") and "no GPU verified" in lines[-1]


GLOO_LINE = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "unbound_buffer.cc:129] Timed out waiting 20000ms for recv operation to complete"
)


def test_live_table_and_steps_show_a_reason_that_looks_like_markup_as_it_is():
    """A failed rank's reason quotes gloo's own line, whose "[/path:129]" rich would take for a
    closing tag: the live table died with MarkupError instead of showing the verdict."""
    con = Console(record=True, width=300)
    with live.CheckTable(["ddp"], con, "n1") as table:
        table.begin("ddp", "")
        table.end("ddp", GLOO_LINE, "FAIL")
    assert GLOO_LINE in con.export_text()
    err = Console(record=True, width=300)
    with live.Steps(err) as steps:
        steps.begin("n1", "torch [stage]")
        steps.update("n1", GLOO_LINE)
        steps.end("n1", GLOO_LINE, "FAIL")
    text = err.export_text()
    assert "torch [stage]" in text and GLOO_LINE in text


def test_live_table_shows_progress():
    con = Console(record=True, width=120)
    with live.CheckTable(["system", "nccl"], con, "n1") as table:
        table.begin("system", "")
        table.end("system", "2 x H200", "PASS")
        table.begin("nccl", "")
    text = con.export_text()
    assert "PASS" in text and "running" in text
