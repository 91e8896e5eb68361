import json
import shutil
import subprocess
import sys
import time

import pytest

from gpuenv.checks import ranklog as R


def _events(tmp_path, marks, check="nccl"):
    for rank, stages in marks.items():
        log = R.RankLog(tmp_path, rank)
        for stage in stages:
            log.mark(check, stage)
    return R.read_events(tmp_path)


def test_the_rank_that_never_joined_is_named(tmp_path):
    events = _events(
        tmp_path,
        {0: ["start", "communicator", "64 MiB enqueued"], 1: ["start", "communicator"]},
    )
    behind = R.ranks_behind(events, "nccl", 2)
    assert behind.ranks == [1]
    assert behind.last_stage[1] == "communicator"


def test_a_rank_without_any_event_is_behind(tmp_path):
    events = _events(tmp_path, {0: ["start"], 2: ["start"]})
    behind = R.ranks_behind(events, "nccl", 3)
    assert behind.ranks == [1]
    assert behind.last_stage[1] == "not started"


def _write(path, rank, items):
    with open(path / f"rank{rank}.jsonl", "a") as fh:
        for ev in items:
            fh.write(json.dumps({"rank": rank, **ev}) + "\n")


def test_a_frozen_rank_in_the_same_stage_is_named_by_its_silence(tmp_path):
    """Both ranks reached 'bcast'; rank 1 froze there, rank 0 went on beating while it waited."""
    t = 1000.0
    for rank in (0, 1):
        _write(tmp_path, rank, [
            {"ev": "mark", "check": "mpi", "stage": "bcast", "t": t},
        ])  # fmt: skip
    _write(tmp_path, 0, [{"ev": "beat", "check": "mpi", "stage": "bcast", "t": t + k}
                         for k in range(1, 9)])  # fmt: skip
    _write(tmp_path, 1, [{"ev": "beat", "check": "mpi", "stage": "bcast", "t": t + 0.5}])
    events = R.read_events(tmp_path)
    behind = R.ranks_behind(events, "mpi", 2)
    assert behind.ranks == [1]
    assert "frozen in 'bcast'" in behind.why[1]
    text, details = R.hang_reason("mpi", events, 2, "deadline 10 s expired")
    assert "rank 1 (frozen in 'bcast'" in text
    assert details["ranks_behind"] == [1]


def test_ranks_all_waiting_and_beating_are_not_blamed(tmp_path):
    for rank in (0, 1):
        _write(tmp_path, rank, [{"ev": "mark", "check": "mpi", "stage": "bcast", "t": 1000.0}]
               + [{"ev": "beat", "check": "mpi", "stage": "bcast", "t": 1000.0 + k}
                  for k in range(1, 6)])  # fmt: skip
    text, details = R.hang_reason("mpi", R.read_events(tmp_path), 2, "deadline expired")
    assert details["ranks_behind"] == []
    assert "none fell behind" in text


def test_torn_event_line_is_ignored(tmp_path):
    R.RankLog(tmp_path, 0).mark("ddp", "start")
    with open(tmp_path / "rank0.jsonl", "a") as fh:
        fh.write('{"ev": "mark", "che')
    assert len(R.read_events(tmp_path)[0]) == 1


def test_heartbeat_thread_beats_with_the_current_stage(tmp_path):
    log = R.RankLog(tmp_path, 0)
    with R.Heartbeat(log, "mpi"):
        log.mark("mpi", "gather")
        time.sleep(R.BEAT_EVERY_S * 2.5)
    beats = [e for e in R.read_events(tmp_path)[0] if e["ev"] == "beat"]
    assert len(beats) >= 2 and {b["stage"] for b in beats} == {"gather"}


def test_fault_switch_parsing():
    faults = R.parse_faults(
        "hang:rank=1:check=nccl; kill:rank=0:check=ddp;freeze:rank=1:check=mpi:stage=bcast"
    )
    assert faults == [
        R.Fault("hang", 1, "nccl"),
        R.Fault("kill", 0, "ddp"),
        R.Fault("freeze", 1, "mpi", "bcast"),
    ]
    assert R.parse_faults("") == []


def test_fault_switch_rejects_garbage():
    with pytest.raises(ValueError, match="GPUENV_FAULT"):
        R.parse_faults("explode:rank=1")


def test_rank_config_round_trip_and_missing_env(tmp_path, monkeypatch):
    path = R.RankConfig(2, str(tmp_path), {"x": {"params": {"a": 1}, "deadline_s": 7}}).write(
        tmp_path / "c.json"
    )
    monkeypatch.setenv(R.CONFIG_ENV, str(path))
    config = R.RankConfig.load()
    assert (config.world, config.deadline_s("x"), config.params("x")) == (2, 7.0, {"a": 1})
    monkeypatch.delenv(R.CONFIG_ENV)
    with pytest.raises(RuntimeError, match=R.CONFIG_ENV):
        R.RankConfig.load()


def test_a_launched_rank_s_deadline_runs_from_the_gate(tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    gate.touch()
    opened = time.time() - 5  # the gate opened 5 s ago
    import os

    os.utime(gate, (opened, opened))
    path = R.RankConfig(2, str(tmp_path), {"x": {"deadline_s": 20}}, str(gate)).write(
        tmp_path / "c.json"
    )
    monkeypatch.setenv(R.CONFIG_ENV, str(path))
    rc = R.launched_rank("x", 1, 2)
    left = rc.deadline_at - time.monotonic()
    assert 20 - 5 - R.RANK_MARGIN_S - 1 < left < 20 - 5 - R.RANK_MARGIN_S + 0.5


MPI_RANK = """
import sys
from mpi4py import MPI
from gpuenv.checks import ranklog

comm = MPI.COMM_WORLD
ranklog.report_uncaught(ranklog.RankLog(sys.argv[1], comm.Get_rank()), "mpi", comm.Abort)
if comm.Get_rank() == 1:
    raise ValueError("rank 1 was told to fail")
comm.Barrier()  # rank 0 waits here for a peer that is gone
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not on PATH (openmpi-bin)")
def test_an_mpi_rank_s_exception_is_its_result_and_ends_the_job_at_once(tmp_path):
    """Without the hook the job outlives the exception (the raising rank waits in MPI_Finalize,
    its peer in the barrier) until mpirun's deadline, and no rank says why."""
    pytest.importorskip("mpi4py")
    from gpuenv.checks.base import mpirun_flags

    script = tmp_path / "rank.py"
    script.write_text(MPI_RANK)
    argv = ["mpirun", "-n", "2", *mpirun_flags(True), sys.executable, str(script), str(tmp_path)]
    began_at = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert time.monotonic() - began_at < 60
    results = R.rank_results(R.read_events(tmp_path), "mpi")
    assert list(results) == [1]
    assert results[1]["error"] == "ValueError: rank 1 was told to fail"
    assert "ValueError: rank 1 was told to fail" in done.stderr  # printed too
