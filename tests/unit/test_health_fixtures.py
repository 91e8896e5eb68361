"""Every recorded node under tests/fixtures/health gives exactly the findings its expected.yml
lists (signal, GPU, severity, action; the clean signals are not listed), and the scan is fast."""

import time

import pytest
from healthnode import CASES, build

from gpuenv.checks.thresholds import load_thresholds
from gpuenv.floor.health import parse_kernel_log
from gpuenv.health import history
from gpuenv.health.scan import scan

NOW_UNIX = 1_780_000_000.0
THRESHOLDS = load_thresholds()


# The signals whose subject an expected.yml names (an Xid code, an NVSwitch and SXid code).
SUBJECTS = ("xid", "sxid")


def _got(report):
    return sorted(
        (f.signal, -1 if f.gpu is None else f.gpu, f.subject if f.signal in SUBJECTS else "",
         f.severity, f.action)
        for f in report.findings
        if f.action != "none"
    )  # fmt: skip


def test_there_are_at_least_30_fixtures_and_each_has_expectations():
    assert len(CASES) >= 30
    for case in CASES:
        assert case.replace("-", "").isalnum(), case


@pytest.mark.parametrize("case", CASES)
def test_fixture_gives_its_expected_findings(tmp_path, case):
    node = build(tmp_path, "", case)
    state = node.state or history.empty_state()
    report = scan(node.root, node.run(), node.nvml(), THRESHOLDS, state, NOW_UNIX, node="n1")
    want = sorted(
        (f["signal"], f.get("gpu", -1), str(f.get("subject", "")), f["severity"], f["action"])
        for f in node.spec.get("findings") or []
    )
    assert _got(report) == want, [f.evidence for f in report.findings if f.action != "none"]
    worst = max((w[4] for w in want), key=("none", "watch", "reset", "reboot", "drain",
                                           "replace").index, default="none")  # fmt: skip
    assert report.worst == worst


def test_every_kernel_log_line_of_the_fixtures_is_parsed(tmp_path):
    """A line naming an Xid that the parser drops would hide a fault: each fixture's kernel.log
    gives as many events as it has Xid/SXid lines."""
    from healthnode import FIXTURES

    for case in CASES:
        log = FIXTURES / case / "kernel.log"
        if log.is_file():
            text = log.read_text(encoding="utf-8")
            lines = [line for line in text.splitlines() if "Xid (PCI:" in line]
            assert len(parse_kernel_log(text)) == len(lines), case


def test_an_8_gpu_scan_takes_well_under_a_second(tmp_path):
    """The scan's own work (NVML answered by the fake, so this is the floor, the rules, the
    kernel log and the history) on the 8-GPU NVSwitch base with a fault-rich kernel log."""
    node = build(tmp_path, "hgx8")
    log = node.kernel_log + "".join(
        f"[{100 + i}.000000] node-a kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=python,"
        " Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address\n"
        for i in range(2000)
    )
    scan(node.root, node.run(log), node.nvml(), THRESHOLDS, None, NOW_UNIX)  # warm the caches
    best = min(
        _timed(lambda: scan(node.root, node.run(log), node.nvml(), THRESHOLDS, None, NOW_UNIX))
        for _ in range(3)
    )
    assert best < 0.5, f"scan took {best:.3f} s"


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_nvml_is_read_once_per_scan(tmp_path):
    node = build(tmp_path, "hgx8")
    nvml = node.nvml()
    calls = []

    def run(argv, timeout_s=0.0):
        calls.append(argv[0])
        return 0, node.kernel_log

    scan(node.root, run, nvml, THRESHOLDS, None, NOW_UNIX)
    assert nvml.calls == 1
    assert calls == ["journalctl"]
