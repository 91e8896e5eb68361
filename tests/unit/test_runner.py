import os
import signal
import sys
import time
import uuid

from gpuenv.checks import base as B
from gpuenv.runner import processes_with_env, run_with_deadline


def test_hanging_process_tree_is_killed_at_the_deadline(tmp_path):
    key, value = "GPUENV_TEST_TAG", str(uuid.uuid4())
    # A child that starts a grandchild in its own process group, then both hang.
    script = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " preexec_fn=os.setpgrp)\n"
        "time.sleep(600)\n"
    )
    t0 = time.monotonic()
    outcome = run_with_deadline(
        [sys.executable, "-c", script], 1.5, tmp_path / "log", env={**os.environ, key: value}
    )
    elapsed = time.monotonic() - t0
    assert outcome.timed_out
    assert elapsed < 1.5 + 4  # SIGTERM, grace, SIGKILL: well inside deadline + 10 s
    time.sleep(0.2)
    assert processes_with_env(key, value) == []


def test_process_that_is_killed_reports_the_signal(tmp_path):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    outcome = run_with_deadline([sys.executable, "-c", script], 10, tmp_path / "log")
    assert not outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL
    assert outcome.elapsed_s < 5


def test_process_that_ignores_sigterm_is_killed(tmp_path):
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    t0 = time.monotonic()
    outcome = run_with_deadline([sys.executable, "-c", script], 1.0, tmp_path / "log")
    assert outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 1.0 + 4


def test_finished_process_passes_and_output_is_logged(tmp_path):
    outcome = run_with_deadline([sys.executable, "-c", "print('hello')"], 10, tmp_path / "log")
    assert (outcome.returncode, outcome.timed_out) == (0, False)
    assert (tmp_path / "log").read_text().strip() == "hello"


def _events(tmp_path, marks):
    for rank, stages in marks.items():
        log = B.RankLog(tmp_path, rank)
        for stage in stages:
            log.mark("nccl", stage)
    return B.read_events(tmp_path)


def test_the_rank_that_never_joined_is_named(tmp_path):
    events = _events(
        tmp_path,
        {0: ["start", "communicator", "64 MiB enqueued"], 1: ["start", "communicator"]},
    )
    behind, last = B.ranks_behind(events, "nccl", 2)
    assert behind == [1]
    assert last[1] == "communicator"


def test_a_rank_without_any_event_is_behind(tmp_path):
    events = _events(tmp_path, {0: ["start"], 2: ["start"]})
    behind, last = B.ranks_behind(events, "nccl", 3)
    assert behind == [1]
    assert last[1] == "not started"


def test_torn_event_line_is_ignored(tmp_path):
    B.RankLog(tmp_path, 0).mark("ddp", "start")
    with open(tmp_path / "rank0.jsonl", "a") as fh:
        fh.write('{"ev": "mark", "che')
    assert len(B.read_events(tmp_path)[0]) == 1


def test_fault_switch_parsing():
    faults = B.parse_faults("hang:rank=1:check=nccl; kill:rank=0:check=ddp")
    assert faults == [B.Fault("hang", 1, "nccl"), B.Fault("kill", 0, "ddp")]
    assert B.parse_faults("") == []


def test_fault_switch_rejects_garbage():
    import pytest

    with pytest.raises(ValueError, match="GPUENV_FAULT"):
        B.parse_faults("explode:rank=1")


def _gpu_stage(tmp_path, monkeypatch, fault, deadline):
    """The one-process-per-GPU stage, with the NVML probe as its (GPU-free) check."""
    from gpuenv import runner
    from gpuenv.checks.thresholds import load_specs, load_thresholds

    monkeypatch.setenv("GPUENV_FAULT", fault)
    ctx = B.Context(node="n1", thresholds=load_thresholds(), specs=load_specs(),
                    deadline_override=deadline)  # fmt: skip
    run = runner._Run(ctx, tmp_path, lambda name, state: None)
    results = {}
    t0 = time.monotonic()
    runner._gpu_stage(run, ["system"], [], 2, results)
    return results["system"], time.monotonic() - t0


def test_gpu_stage_names_the_hung_rank_and_kills_all(tmp_path, monkeypatch):
    result, elapsed = _gpu_stage(tmp_path, monkeypatch, "hang:rank=1:check=system", 2.0)
    assert result.status.value == "FAIL"
    assert "rank 1 (last: start) did not join" in result.reason
    assert result.details["ranks_behind"] == [1]
    assert elapsed < 2.0 + 10
    assert processes_with_env("GPUENV_FAULT", "hang:rank=1:check=system") == []


def test_gpu_stage_names_a_killed_rank_at_once(tmp_path, monkeypatch):
    result, elapsed = _gpu_stage(tmp_path, monkeypatch, "kill:rank=1:check=system", 30.0)
    assert result.status.value == "FAIL"
    assert result.reason.startswith("rank 1 exited with signal SIGKILL during system")
    assert elapsed < 10  # not the 30 s deadline: a dead rank is seen when it dies
    assert processes_with_env("GPUENV_FAULT", "kill:rank=1:check=system") == []
