"""`gpuenv health --slurm` and `--prolog` (docs/slurm.md): the drain/resume decisions against a
fake slurmctld (a table of cases), the exact reasons, fail-closed scans, and the prolog's cache.
The end-to-end cases run the real scanner on recorded nodes with a fake `scontrol` on PATH."""

import json
import os
import stat

import pytest
from healthnode import build

from gpuenv.cli import main
from gpuenv.health import slurm
from gpuenv.health.findings import Finding, HealthReport

ADMIN = "disk replaced, do not use"
UPGRADE = "gpuenv: upgrade batch 2 to 3f2a9c01d4e5"
OURS = "gpuenv: pcie.width gpu0 0000:18:00.0: link x8, expected x16"
NEW = "gpuenv: xid gpu1 79: Xid 79 (fell off the bus)"


class FakeSlurmctld:
    """scontrol as the node floor's run sees it: `show node -o NAME` and `update`."""

    def __init__(self, state: str = "IDLE", reason: str = "", rc: int = 0) -> None:
        self.state, self.reason, self.rc = state, reason, rc
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout_s: float = 0.0) -> tuple[int, str]:
        assert argv[0] == "scontrol" and 0 < timeout_s <= slurm.SCONTROL_DEADLINE_S
        self.calls.append(argv)
        if self.rc:
            return self.rc, ""
        if argv[1] == "show":
            reason = f" Reason={self.reason} [root@2026-12-02T00:10:00]" if self.reason else ""
            return (
                0,
                f"NodeName={argv[-1]} Arch=x86_64 CoresPerSocket=2 State={self.state}{reason}\n",
            )
        assert argv[1:3] == ["update", "nodename=n1"]
        if argv[3] == "state=drain":
            self.state = self.state.split("+")[0] + "+DRAIN"
            self.reason = argv[4].removeprefix("reason=")
        else:
            assert argv[3:] == ["state=resume"]
            self.state, self.reason = self.state.split("+")[0], ""
        return 0, ""

    @property
    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[1] == "update"]


CASES = [
    # (node state, its reason, the scan's problem, verb, reason left on the node)
    ("IDLE", "", OURS, slurm.DRAIN, OURS),
    ("MIXED", "", OURS, slurm.DRAIN, OURS),
    ("IDLE+DRAIN", OURS, OURS, slurm.KEEP, OURS),  # no call when nothing changed
    ("IDLE+DRAIN", OURS, NEW, slurm.DRAIN, NEW),  # our own reason follows the finding
    (
        "IDLE+DRAIN",
        ADMIN,
        OURS,
        slurm.KEEP,
        ADMIN,
    ),  # an administrator's reason is never overwritten
    ("IDLE+DRAIN", ADMIN, None, slurm.KEEP, ADMIN),  # ... nor lifted
    ("DOWN+DRAIN", "Prolog error", None, slurm.KEEP, "Prolog error"),  # slurmd's is not ours
    ("IDLE+DRAIN", OURS, None, slurm.RESUME, ""),
    ("DOWN+DRAIN", OURS, None, slurm.RESUME, ""),
    ("IDLE", "", None, slurm.KEEP, ""),
    ("DOWN", "Not responding", None, slurm.KEEP, "Not responding"),  # not a drain: not ours
    ("IDLE+DRAIN", "gpuenvish: not ours", None, slurm.KEEP, "gpuenvish: not ours"),
    # The rolling upgrade's drain is the upgrade's to resume (docs/upgrade.md): kept either way.
    ("IDLE+DRAIN", UPGRADE, None, slurm.KEEP, UPGRADE),
    ("IDLE+DRAIN", UPGRADE, OURS, slurm.KEEP, UPGRADE),
]


@pytest.mark.parametrize(("state", "reason", "problem", "verb", "left"), CASES)
def test_drain_and_resume_decisions(state, reason, problem, verb, left):
    ctld = FakeSlurmctld(state, reason)
    decision = slurm.enforce("n1", problem, ctld)
    assert decision.verb == verb
    assert ctld.reason == left
    assert len(ctld.updates) == (0 if verb == slurm.KEEP else 1)
    if verb == slurm.DRAIN:
        assert ctld.updates[0] == [
            "scontrol", "update", "nodename=n1", "state=drain", f"reason={problem}"
        ]  # fmt: skip


@pytest.mark.parametrize(
    ("rc", "words"), [(124, "no answer within"), (127, "not found"), (1, "exit 1")]
)
def test_a_slurmctld_that_does_not_answer_is_an_error_not_a_pass(rc, words):
    with pytest.raises(RuntimeError, match=words):
        slurm.enforce("n1", OURS, FakeSlurmctld(rc=rc))


def test_the_reason_is_read_without_the_user_and_time_stamp():
    line = "NodeName=n1 State=IDLE+DRAIN Reason=gpuenv: a b: c [slurm@2026-12-02T00:01:02]"
    node = slurm.parse_node("n1", line)
    assert (node.drained, node.ours, node.reason) == (True, True, "gpuenv: a b: c")
    with pytest.raises(ValueError, match="no State="):
        slurm.parse_node("n1", "Node n1 not found")


def _finding(signal, action, gpu=None, subject="", evidence="seen"):
    return Finding(
        signal=signal, action=action, evidence=evidence, source="s", gpu=gpu, subject=subject
    )


def test_the_reason_names_the_top_finding_and_how_many_more():
    report = HealthReport("n1", [
        _finding("persistence", "watch", 0),
        _finding("pcie.width", "drain", 0, "0000:18:00.0", "link x8,\n expected x16"),
        _finding("row_remap.failure", "replace", 3, evidence="a remap failed"),
        _finding("ib.state", "drain", subject="mlx5_0/1", evidence="Down"),
    ], [], "journal", 0.1, 0.0, {})  # fmt: skip
    assert slurm.problem_of(report, "drain") == (
        "gpuenv: row_remap.failure gpu3: a remap failed (+2 more)"
    )
    assert slurm.problem_of(report, "replace") == "gpuenv: row_remap.failure gpu3: a remap failed"
    healthy = HealthReport("n1", [_finding("persistence", "watch", 0)], [], "", 0.1, 0.0, {})
    assert slurm.problem_of(healthy, "drain") is None
    long = slurm.scan_failed("x" * 500)
    assert len(long) == slurm.REASON_MAX and long.startswith("gpuenv: health scan failed: xx")


@pytest.mark.parametrize(
    ("content", "age_s", "usable", "problem"),
    [
        ({"problem": None}, 10, True, None),
        ({"problem": OURS}, 10, True, OURS),
        ({"problem": None}, 301, False, None),  # stale: scan again
        ({"problem": None}, -60, False, None),  # from the future: clock stepped back
        ({"problem": 3}, 10, False, None),
        ("not json", 10, False, None),
        (None, 10, False, None),  # no file
    ],
)
def test_the_prolog_cache_is_trusted_only_fresh_and_well_formed(
    tmp_path, content, age_s, usable, problem
):
    path = tmp_path / "verdict.json"
    if isinstance(content, dict):
        slurm.write_verdict(str(path), content["problem"], 1000.0)
        if content["problem"] == 3:
            path.write_text(json.dumps({"at_unix": 1000.0, "problem": 3}))
    elif content is not None:
        path.write_text(content)
    assert slurm.cached_verdict(str(path), slurm.CACHE_S, 1000.0 + age_s) == (usable, problem)


# End to end: the real scanner on a recorded node, a fake scontrol on PATH.

SCONTROL = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in
  show) echo "NodeName=n1 State=$(cat {state}) Reason=$(cat {reason}) [root@2026-12-02T00:10:00]" ;;
  update) case "$3" in
            state=drain) echo "IDLE+DRAIN" > {state}; echo "${{4#reason=}}" > {reason} ;;
            state=resume) echo IDLE > {state}; : > {reason} ;;
          esac ;;
esac
"""


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    files = {k: tmp_path / f"ctld.{k}" for k in ("log", "state", "reason")}
    files["state"].write_text("IDLE\n")
    files["reason"].write_text("")
    script = bin_dir / "scontrol"
    script.write_text(SCONTROL.format(**files))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return files


def _node_args(tmp_path, case=None):
    node = build(tmp_path, "hgx8", case)
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(node.nvml_data))
    log = tmp_path / "kernel.log"
    log.write_text(node.kernel_log or "")
    cache = str(tmp_path / "cache" / "verdict.json")
    return ["health", "--root", node.root, "--nvml-fixture", str(nvml), "--kernel-log", str(log),
            "--node", "n1", "--no-state", "--cache", cache]  # fmt: skip


def test_a_fault_drains_with_its_finding_and_clearing_it_resumes(tmp_path, fake_scontrol, capsys):
    assert main([*_node_args(tmp_path / "bad", "pcie-width-x8"), "--slurm"]) == 1
    reason = fake_scontrol["reason"].read_text().strip()
    assert reason.startswith("gpuenv: pcie.width gpu")
    assert fake_scontrol["state"].read_text().strip() == "IDLE+DRAIN"
    assert main([*_node_args(tmp_path / "good"), "--slurm"]) == 0
    assert fake_scontrol["state"].read_text().strip() == "IDLE"
    assert "resume" in capsys.readouterr().out


def test_an_administrators_drain_stays_through_a_healthy_scan(tmp_path, fake_scontrol):
    fake_scontrol["state"].write_text("IDLE+DRAIN\n")
    fake_scontrol["reason"].write_text(f"{ADMIN}\n")
    assert main([*_node_args(tmp_path), "--slurm"]) == 0
    assert fake_scontrol["state"].read_text().strip() == "IDLE+DRAIN"
    assert fake_scontrol["reason"].read_text().strip() == ADMIN
    assert "update" not in fake_scontrol["log"].read_text()


def test_a_scan_that_cannot_run_drains_fail_closed(tmp_path, fake_scontrol):
    args = _node_args(tmp_path)
    (tmp_path / "nvml.json").write_text("{truncated")  # NVML's answers cannot be read
    assert main([*args, "--slurm"]) == 1
    assert fake_scontrol["reason"].read_text().startswith("gpuenv: health scan failed: ")
    assert json.loads((tmp_path / "cache" / "verdict.json").read_text())["problem"].startswith(
        "gpuenv: health scan failed"
    )


def test_only_a_verdict_ends_with_the_verdict_line(tmp_path, fake_scontrol, capsys):
    """The health-check script takes exit 0 or 1 for a verdict only with this last line."""
    assert main([*_node_args(tmp_path / "bad", "pcie-width-x8"), "--slurm"]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{slurm.VERDICT_MARK} unhealthy (drain: gpuenv: pcie.width gpu")
    assert main([*_node_args(tmp_path / "good"), "--slurm"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"{slurm.VERDICT_MARK} healthy (resume: healthy again (was: gpuenv: pci")


def test_a_verdict_the_cache_cannot_hold_is_a_failed_scan(tmp_path, fake_scontrol, capsys):
    args = _node_args(tmp_path)
    (tmp_path / "cache").write_text("a file where the cache's folder should be")
    assert main([*args, "--slurm"]) == 1
    assert fake_scontrol["reason"].read_text().strip() == slurm.scan_failed(
        f"cannot write the verdict cache {tmp_path / 'cache' / 'verdict.json'}: File exists"
    )


@pytest.mark.parametrize(
    ("state", "reason", "verb", "left"),
    [
        ("IDLE", "", "drain", "gpuenv: health scan failed: no answer within 30 s"),
        ("IDLE+DRAIN", OURS, "drain", "gpuenv: health scan failed: no answer within 30 s"),
        ("IDLE+DRAIN", UPGRADE, "keep", UPGRADE),
        ("IDLE+DRAIN", ADMIN, "keep", ADMIN),
    ],
)
def test_scan_failed_drains_by_the_same_rule_without_scanning(
    tmp_path, fake_scontrol, capsys, state, reason, verb, left
):
    fake_scontrol["state"].write_text(f"{state}\n")
    fake_scontrol["reason"].write_text(f"{reason}\n")
    cache = tmp_path / "verdict.json"
    argv = ["health", "--slurm", "--node", "n1", "--cache", str(cache)]
    assert main([*argv, "--scan-failed=no answer within\n30 s"]) == 1
    assert fake_scontrol["reason"].read_text().strip() == left
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith(f"{slurm.VERDICT_MARK} unhealthy ({verb}: ")
    assert json.loads(cache.read_text())["problem"] == slurm.scan_failed("no answer within 30 s")


def test_no_scontrol_is_exit_3_never_a_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert main([*_node_args(tmp_path, "pcie-width-x8"), "--slurm"]) == 3
    assert "scontrol not found" in capsys.readouterr().err


def test_the_prolog_passes_on_a_fresh_cache_without_scanning_or_calling_slurm(
    tmp_path, fake_scontrol
):
    args = _node_args(tmp_path)
    assert main([*args, "--prolog"]) == 0  # no cache: scans, writes it
    (tmp_path / "nvml.json").write_text("{truncated")  # a scan now would fail: the cache answers
    assert main([*args, "--prolog"]) == 0
    assert main([*args, "--prolog", "--cache-s", "0.000001"]) == 1  # stale: scans, fails closed
    assert not fake_scontrol["log"].exists()  # the prolog never called slurmctld


def test_the_prolog_fails_on_a_fault_and_on_its_cached_verdict(tmp_path, fake_scontrol):
    cache = str(tmp_path / "verdict.json")
    assert main([*_node_args(tmp_path / "bad", "pcie-width-x8"), "--prolog", "--cache", cache]) == 1
    good = [*_node_args(tmp_path / "good"), "--prolog", "--cache", cache]
    assert main(good) == 1  # the cached verdict answers
    assert main([*good, "--cache-s", "1e-9"]) == 0  # stale: a scan of the healthy node
    assert not fake_scontrol["log"].exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--slurm", "--prolog"], "together"),
        (["--cache", "x"], "needs --slurm or --prolog"),
        (["--slurm", "--cache-s", "5"], "needs --prolog"),
        (["--slurm", "--json", "-"], "does not go with"),
        (["--scan-failed", "x"], "goes with --slurm"),
        (["--slurm", "--scan-failed", " "], "needs the cause"),
    ],
)
def test_bad_slurm_options_are_bad_input(tmp_path, extra, words, capsys):
    args = [a for a in _node_args(tmp_path) if a != "--cache"]
    args = args[: args.index(str(tmp_path / "cache" / "verdict.json"))]
    assert main([*args, *extra]) == 2
    assert words in capsys.readouterr().err
