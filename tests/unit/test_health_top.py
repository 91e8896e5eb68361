"""`gpuenv top`: frames from the health reader and rules, the JSON-line stream, and the
controller's streams from nodes emulated on this machine (the real process path)."""

import json
import sys
import time
from pathlib import Path

from healthnode import BASES, nvml_patch

from gpuenv.checks.thresholds import load_thresholds
from gpuenv.cli import main
from gpuenv.cluster.inventory import Host
from gpuenv.health import top
from gpuenv.health.nvml import FakeNvml, NoNvml
from gpuenv.report.top import table

TH = load_thresholds(None)["health"]


def _fixture(tmp_path: Path) -> Path:
    base = json.loads((BASES / "hgx8" / "nvml.json").read_text())
    hot = {"gpus": {"2": {"clock_reasons": 0x48, "temperature_c": 88, "utilization_pct": 97}}}
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps(nvml_patch(base, hot)))
    return path


def test_a_frame_has_every_gpu_with_its_throttle_and_health(tmp_path):
    got = top.frame("n1", FakeNvml.from_file(_fixture(tmp_path)), TH)
    assert [g["gpu"] for g in got["gpus"]] == list(range(8))
    hot = got["gpus"][2]
    assert hot["throttle"] == "hw slowdown, hw thermal" and hot["util_pct"] == 97
    assert hot["health"] == "drain" and "temperature.shutdown: drain" in hot["why"]
    assert got["gpus"][0]["health"] == "none" and got["gpus"][0]["mem_total_mib"] == 143771.0
    assert top.reasons(0) == "none" and top.reasons(None) == "?"


def test_a_node_without_nvml_is_a_row_saying_so():
    view = top.NodeView(frame=top.frame("c1", NoNvml("no nvidia-ml-py"), TH), at=time.monotonic())
    assert list(top.rows({"c1": view}, 1.0)) == [{"node": "c1", "state": "NVML: no nvidia-ml-py"}]


def test_lines_arrive_in_pieces_and_the_newest_whole_one_wins():
    view = top.NodeView()
    view.feed('{"node": "a", "gpus": [], "n": 1}\n{"node": "a", "gp')
    assert view.frame["n"] == 1
    view.feed('us": [], "n": 2}\nnoise\n')
    assert view.frame["n"] == 2


def test_a_stale_node_is_marked():
    old = top.NodeView(
        frame={"node": "a", "gpus": [{"gpu": 0}], "error": ""}, at=time.monotonic() - 10
    )
    assert next(iter(top.rows({"a": old}, 1.0)))["state"] == "stale"


def test_once_and_stream_from_the_cli(tmp_path, capsys):
    fixture = str(_fixture(tmp_path))
    assert main(["top", "--once", "--nvml-fixture", fixture, "--node", "n1"]) == 0
    out = capsys.readouterr().out
    assert "drain" in out and out.count("│ n1 ") == 8  # a row per GPU
    assert main(["top", "--stream", "--count", "2", "--interval", "0.05", "--nvml-fixture",
                 fixture, "--node", "n1"]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(json.loads(x)["node"] == "n1" for x in lines)
    assert main(["top", "--count", "2"]) == 2


def test_streams_from_emulated_nodes_refresh_every_interval(tmp_path):
    """Three nodes on this machine, each one long-lived `gpuenv top --stream` (the node of the
    middle one answers NVML from a fixture through a wrapper python)."""
    wrapper = tmp_path / "python-b"
    fixture = _fixture(tmp_path)
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" --nvml-fixture {fixture}\n')
    wrapper.chmod(0o755)
    pythons = {"a": sys.executable, "b": str(wrapper), "c": sys.executable}
    hosts = [Host(n, "127.0.0.1", "127.0.0.1", local=True, python=p) for n, p in pythons.items()]
    streams = top.Streams(hosts, interval_s=0.25).start()
    try:
        streams.wait_first(60.0)
        first = {n: v.frame["at_unix"] for n, v in streams.views.items() if v.frame}
        assert set(first) == {"a", "b", "c"}, {n: v.error for n, v in streams.views.items()}
        time.sleep(1.0)
        later = {n: v.frame["at_unix"] for n, v in streams.views.items()}
        assert all(later[n] > first[n] for n in first)  # the same processes kept streaming
        rows = list(top.rows(streams.views, 0.25))
        assert [r["gpu"] for r in rows if r["node"] == "b"] == list(range(8))
        assert {r["node"] for r in rows if "gpu" not in r} == {"a", "c"}  # no GPU here
        assert table(rows, "t").row_count == len(rows)
    finally:
        streams.close()
