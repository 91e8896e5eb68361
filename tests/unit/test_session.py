"""The engine (gpuenv.checks.session) driven through the check contract with fake checks."""

import os
import time
from pathlib import Path

import pytest
from fakechecks import gpusum, launched, probe

from gpuenv import proc
from gpuenv.checks.base import Context
from gpuenv.checks.session import run_checks
from gpuenv.progress import Recorder
from gpuenv.results import Status

HERE = Path(__file__).resolve().parent
REGISTRY = {c.NAME: c for c in (probe, gpusum, launched)}
DEADLINES = {"probe": 20, "gpusum": 20, "launched": 30}


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    """The ranks are child processes: they must import the fake checks too."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("GPUENV_FAULT", raising=False)
    monkeypatch.delenv("FAKE_EARLY_GPUS", raising=False)
    monkeypatch.delenv("FAKE_LAUNCHED_NEEDS_GPU", raising=False)


def _ctx(deadlines=None, **params):
    thresholds = {
        "deadlines_s": {**DEADLINES, **(deadlines or {})},
        "profiles": {"quick": {"gpusum": params}},
    }
    return Context(node="n1", thresholds=thresholds)


def _run(names, deadlines=None, **params):
    progress = Recorder()
    run = run_checks(REGISTRY, _ctx(deadlines, **params), names, progress)
    return {r.check: r for r in run.results}, run, progress


def test_every_placement_runs_through_the_contract_and_reports_progress():
    results, run, progress = _run(["probe", "gpusum", "launched"])
    assert [r.check for r in run.results] == ["probe", "gpusum", "launched"]
    assert {n: r.status for n, r in results.items()} == dict.fromkeys(results, Status.PASS)
    assert results["gpusum"].reason == "2 ranks summed to 3"
    assert results["launched"].reason == "2 ranks posted [1, 2]"
    assert len(run.node.gpus) == 2
    ends = [(c[1], c[3]) for c in progress.calls if c[0] == "end"]
    assert ends == [("probe", "PASS"), ("gpusum", "PASS"), ("launched", "PASS")]


def test_a_wrong_rank_value_fails_through_the_judge():
    results, _, _ = _run(["gpusum"], offset=1)
    assert results["gpusum"].status is Status.FAIL
    assert "sum 5 != 3" in results["gpusum"].reason


def test_gpu_checks_skip_with_the_probe_s_reason_when_there_is_no_gpu(monkeypatch):
    monkeypatch.setenv("FAKE_GPUS", "0")
    results, _, _ = _run(["gpusum", "launched"])
    assert results["gpusum"].status is Status.SKIP
    assert results["gpusum"].reason == "no fake GPU"
    assert results["launched"].status is Status.PASS  # a launched check needs no GPU here


def test_a_hung_gpu_rank_is_named_and_nothing_is_left_running(monkeypatch):
    fault = "hang:rank=1:check=gpusum"
    monkeypatch.setenv("GPUENV_FAULT", fault)
    t0 = time.monotonic()
    results, _, _ = _run(["gpusum"], deadlines={"gpusum": 2})
    r = results["gpusum"]
    assert r.status is Status.FAIL
    assert "deadline 2 s expired: rank 1 (last: start) did not keep up" in r.reason
    assert r.details["ranks_behind"] == [1]
    assert time.monotonic() - t0 < 2 + 12
    assert proc.processes_with_env("GPUENV_FAULT", fault) == []


def test_a_killed_gpu_rank_is_seen_when_it_dies(monkeypatch):
    monkeypatch.setenv("GPUENV_FAULT", "kill:rank=1:check=gpusum")
    t0 = time.monotonic()
    results, _, _ = _run(["gpusum"], deadlines={"gpusum": 30})
    assert results["gpusum"].reason.startswith("rank 1 exited with signal SIGKILL during gpusum")
    assert time.monotonic() - t0 < 10  # not the 30 s deadline


def test_a_rank_frozen_in_the_same_stage_as_its_peer_is_named(monkeypatch):
    """Both ranks reach 'meet'; rank 1 is stopped there (SIGSTOP), rank 0 waits and beats."""
    fault = "freeze:rank=1:check=launched:stage=meet"
    monkeypatch.setenv("GPUENV_FAULT", fault)
    results, _, _ = _run(["launched"], deadlines={"launched": 5})
    r = results["launched"]
    assert r.status is Status.FAIL
    assert r.details["ranks_behind"] == [1]
    assert "rank 1 (frozen in 'meet'" in r.reason
    assert proc.processes_with_env("GPUENV_FAULT", fault) == []


def test_a_frozen_rank_is_named_although_the_launcher_wakes_it_when_killed(monkeypatch):
    """Open MPI 4.1: SIGTERM to mpirun sends SIGCONT to its ranks; the stopped rank wakes and
    beats on its way out. The ranks' events are taken before anything is killed, so that late
    beat cannot hide the freeze (read after the kill, this said "none fell behind")."""
    fault = "freeze:rank=1:check=launched:stage=meet"
    monkeypatch.setenv("GPUENV_FAULT", fault)
    monkeypatch.setenv("FAKE_LAUNCHER_WAKES_RANKS", "1")
    results, _, _ = _run(["launched"], deadlines={"launched": 5})
    r = results["launched"]
    assert r.status is Status.FAIL
    assert r.details["ranks_behind"] == [1], r.reason
    assert "rank 1 (frozen in 'meet'" in r.reason
    assert proc.processes_with_env("GPUENV_FAULT", fault) == []


def test_launchers_start_during_the_probe_on_its_guess(monkeypatch):
    monkeypatch.setenv("FAKE_EARLY_GPUS", "2")
    results, _, _ = _run(["launched"])
    assert results["launched"].reason == "2 ranks posted [1, 2]"
    assert results["launched"].details["launcher_started"] == "during the probe"


def test_without_a_guess_launchers_start_after_the_probe():
    results, _, _ = _run(["launched"])
    assert results["launched"].status is Status.PASS
    assert results["launched"].details["launcher_started"] == "after the probe"


def test_a_wrong_guess_is_killed_and_the_launcher_started_again_on_the_probe_s_answer(monkeypatch):
    monkeypatch.setenv("FAKE_EARLY_GPUS", "3")  # the probe will say 2: world 3 becomes 2
    results, _, _ = _run(["launched"])
    r = results["launched"]
    assert r.status is Status.PASS, r.reason
    assert r.reason == "2 ranks posted [1, 2]"
    assert r.details["launcher_started"] == "after the probe"
    assert proc.processes_with_env("FAKE_LAUNCHED_FOR", "3 GPUs") == []


def test_a_launch_started_on_a_guess_is_killed_when_the_probe_says_it_cannot_run(monkeypatch):
    monkeypatch.setenv("FAKE_EARLY_GPUS", "2")
    monkeypatch.setenv("FAKE_GPUS", "0")
    monkeypatch.setenv("FAKE_LAUNCHED_NEEDS_GPU", "1")
    results, _, _ = _run(["launched"])
    assert results["launched"].reason == "needs a GPU"
    assert proc.processes_with_env("FAKE_LAUNCHED_FOR", "2 GPUs") == []


def test_the_probe_is_required_exactly_once():
    with pytest.raises(ValueError, match="exactly one PROBE"):
        run_checks({"gpusum": gpusum}, _ctx(), ["gpusum"])


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown check"):
        run_checks(REGISTRY, _ctx(), ["nope"])


_CONTRACT = ("NAME", "DESCRIPTION", "PLACEMENT", "OPTIONAL", "needed", "unavailable", "world",
             "judge")  # fmt: skip
_BY_PLACEMENT = {
    "probe": ("rank_main", "node_info", "early_node"),
    "gpu": ("rank_main",),
    "launcher": ("command", "environment", "main"),
}


@pytest.mark.parametrize("registry", ["gpuenv", "fakes"])
def test_every_check_has_the_whole_contract(registry):
    """What the engine and the profiles read of a check is in the Protocol, for every check:
    one ``rank_main(rank)`` signature, ``OPTIONAL`` and ``needed`` declared, never looked up."""
    import inspect

    from gpuenv.checks import REGISTRY as CHECKS
    from gpuenv.checks.base import NodeInfo, Placement

    checks = CHECKS if registry == "gpuenv" else REGISTRY
    for name, check in checks.items():
        assert name == check.NAME
        assert isinstance(check.PLACEMENT, Placement)
        missing = [a for a in (*_CONTRACT, *_BY_PLACEMENT[check.PLACEMENT.value])
                   if not hasattr(check, a)]  # fmt: skip
        assert not missing, f"{name} lacks {missing}"
        assert isinstance(check.OPTIONAL, bool), name
        assert isinstance(check.needed(NodeInfo(gpus=[{}, {}])), bool), name
        if check.PLACEMENT is not Placement.LAUNCHER:
            assert list(inspect.signature(check.rank_main).parameters) == ["rank"], name
        else:
            assert not hasattr(check, "rank_main"), f"{name}: a launched rank runs main(argv)"


def test_the_engine_is_handed_its_registry():
    """gpuenv.checks.session never reaches for REGISTRY: its caller hands it the checks."""
    import ast

    import gpuenv.checks.session as session

    tree = ast.parse(Path(session.__file__).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "REGISTRY" not in names | imported


def test_a_python_that_compiles_torch_every_time_is_named_and_its_ranks_get_a_cache(
    monkeypatch, tmp_path
):
    from gpuenv import bytecode
    from gpuenv.checks import session as session_mod

    reading = bytecode.Reading(
        "torch", "/site/torch/__init__.py", False, "PYTHONDONTWRITEBYTECODE=1"
    )
    monkeypatch.setattr(session_mod.bytecode, "read", lambda: reading)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    results, _, _ = _run(["probe", "launched"])
    assert results["probe"].status is Status.PASS
    assert "note: Python compiles torch in every process" in results["probe"].reason
    assert results["launched"].status is Status.PASS  # ranks run from the private cache
    # the children wrote their bytecode there (the prefix reached them)
    assert any((tmp_path / "gpuenv" / "pycache").rglob("*.pyc"))
