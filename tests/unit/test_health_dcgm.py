"""`gpuenv health --dcgm LEVEL`: dcgmi diag's table read from published outputs
(tests/fixtures/health-dcgm/SOURCES.md); no dcgmi or no host engine is a SKIP, never a pass."""

import json
from pathlib import Path

import pytest

from gpuenv.health import dcgm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health-dcgm"


def _text(name):
    return (FIXTURES / name).read_text()


def _run(rc, name=None, seen=None):
    def run(argv, timeout_s=0.0):
        if seen is not None:
            seen.append((argv, timeout_s))
        return rc, _text(name) if name else ""

    return run


def _actions(result):
    return {(f.signal, f.gpu): f.action for f in result.findings}


def test_a_clean_level_1_passes_every_deployment_test():
    seen = []
    result = dcgm.diagnose(1, _run(0, "r1-pass.txt", seen))
    assert seen == [(["dcgmi", "diag", "-r", "1"], dcgm.DEADLINE_S[1])]
    assert set(_actions(result).values()) == {"none"} and not result.skipped
    assert len(result.findings) == 9
    assert "dcgm.page_retirement_row_remap" in {f.signal for f in result.findings}
    assert "(DCGM 3.3.9)" in result.findings[0].evidence


def test_a_failed_gpu_is_named_with_its_wrapped_warning():
    diag = dcgm.parse_diag(_text("r2-gpu-memory-fail.txt"))
    memory = next(t for t in diag.tests if t.name == "GPU Memory")
    assert memory.category == "Hardware"
    assert memory.by_status() == {"pass": [1, 2, 3, 4, 5, 6, 7], "fail": [0]}
    assert memory.messages == [
        "Warning: GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds into the"
        " test for GPU 0 Verify that the cooling on this machine is functional, including"
        " external, thermal material interface, fans, and any other components."
    ]
    assert [t.name for t in diag.tests if t.messages] == ["GPU Memory"]  # not a test of its own
    actions = _actions(dcgm.findings_of(diag, 2))
    assert actions[("dcgm.gpu_memory", 0)] == "drain"
    assert actions[("dcgm.gpu_memory", 3)] == "none"
    assert actions[("dcgm.pcie", None)] == "none"
    assert diag.metadata["GPU Device IDs Detected"].startswith("20b2,")


def test_a_pending_remap_asks_for_a_reset_with_dcgms_words():
    result = dcgm.diagnose(2, _run(0, "r2-remap-pending.txt"))
    bad = [f for f in result.findings if f.action != "none"]
    assert [(f.signal, f.action) for f in bad] == [("dcgm.page_retirement_row_remap", "reset")]
    assert "Error: GPU 3 had memory errors and row remappings are pending" in bad[0].evidence


def test_an_error_row_before_any_test_is_a_failure_not_ignored():
    result = dcgm.diagnose(3, _run(0, "deployment-error.txt"))
    assert [f.action for f in result.findings] == ["drain"]
    assert "GPU 3 has uncorrectable memory errors and row remappings" in result.findings[0].evidence


def test_skipped_tests_are_skips_and_warnings_watch():
    result = dcgm.diagnose(3, _run(0, "r3-skipped.txt"))
    assert [s["signal"] for s in result.skipped] == ["dcgm.gpu_memory"]
    assert "ECC is not enabled" in result.skipped[0]["reason"]
    actions = _actions(result)
    assert actions[("dcgm.targeted_stress", 2)] == "watch"
    assert actions[("dcgm.targeted_stress", 0)] == "none"
    assert ("dcgm.gpu_memory", None) not in actions  # skipped is not passed


@pytest.mark.parametrize(
    ("rc", "name", "words"),
    [
        (127, None, "dcgmi is not installed"),
        (255, "no-host-engine.txt", "no DCGM host engine answers"),
        (1, None, "gave no result table (exit status 1)"),
    ],
)
def test_no_tool_or_no_host_engine_is_a_skip_with_the_reason(rc, name, words):
    result = dcgm.diagnose(1, _run(rc, name))
    assert result.findings == []
    assert result.skipped[0]["signal"] == "dcgm.diag" and words in result.skipped[0]["reason"]


def test_past_the_deadline_is_a_finding_not_a_pass():
    result = dcgm.diagnose(2, _run(124), deadline_s=5)
    assert [(f.signal, f.action) for f in result.findings] == [("dcgm.diag", "watch")]
    assert "did not finish within 5 s" in result.findings[0].evidence


def test_the_cli_merges_dcgm_and_says_skip(tmp_path, monkeypatch, capsys):
    from healthnode import build

    from gpuenv import proc
    from gpuenv.cli import main
    from gpuenv.report.health import parse_exposition

    node = build(tmp_path, "hgx8")
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(node.nvml_data))
    log = tmp_path / "kernel.log"
    log.write_text(node.kernel_log or "")
    base = ["health", "--root", node.root, "--nvml-fixture", str(nvml), "--kernel-log", str(log),
            "--no-state", "--node", "n1", "--dcgm", "2"]  # fmt: skip
    monkeypatch.setattr(proc, "command_output", _run(0, "r2-gpu-memory-fail.txt"))
    report = tmp_path / "r.json"
    assert main([*base, "--json", str(report)]) == 1  # GPU 0's memory test failed: drain
    data = json.loads(report.read_text())
    assert any(f["signal"] == "dcgm.gpu_memory" and f["gpu"] == 0 and f["action"] == "drain"
               for f in data["findings"])  # fmt: skip
    monkeypatch.setattr(proc, "command_output", _run(127))
    prom = tmp_path / "g.prom"
    assert main([*base, "--prometheus", str(prom)]) == 0
    assert "SKIP dcgm.diag: dcgmi is not installed" in capsys.readouterr().out
    samples = parse_exposition(prom.read_text())
    assert samples[("gpuenv_health_skipped", '{signal="dcgm.diag"}')] == 1
