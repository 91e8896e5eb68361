"""The verdicts of `gpuenv check` and `gpuenv cluster` when a launched job fails (issue 32,
item 9): the failed rank's own error line, out of the recorded launcher outputs in
tests/fixtures/launchers, and the login file that set what the failing library reads (a stray
GLOO_SOCKET_IFNAME, OMPI_MCA_pml), never the launcher's boilerplate."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from launcher_outputs import BOILERPLATE, FIXTURES, GLOO_NOSUCH, node_tree, recorded

from gpuenv.floor import login_env

GLOO_FIXTURE = "torchrun-gloo-socket-ifname-nosuch.txt"


# ---------------------------------------------------------------- gpuenv check's verdict


def replaying_check(output: Path) -> object:
    """A launched check whose launcher prints a recorded torchrun failure and exits 1 (its ranks
    never post), as the real ddp launch did."""
    from types import ModuleType

    from gpuenv.checks.base import Placement, always_needed

    def command(ctx, node, world):
        code = f"import sys; sys.stdout.write(open({str(output)!r}).read()); sys.exit(1)"
        return [sys.executable, "-c", code]

    check = ModuleType("replay")
    check.__dict__.update(
        NAME="replay", DESCRIPTION="replays a launcher's output", PLACEMENT=Placement.LAUNCHER,
        OPTIONAL=False, needed=always_needed, unavailable=lambda ctx, node: None,
        world=lambda ctx, node: 2, command=command, environment=lambda ctx, node: {},
        judge=lambda *a: None, main=lambda argv: 0,
    )  # fmt: skip
    return check


def test_gpuenv_check_s_verdict_names_the_login_setting_and_the_rank_s_error(tmp_path, monkeypatch):
    from fakechecks import probe

    from gpuenv.checks.base import Context
    from gpuenv.checks.session import run_checks

    # The probe's rank is a child process: it imports the fake checks too.
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text("export GLOO_SOCKET_IFNAME=nosuch\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch")
    registry = {"probe": probe, "replay": replaying_check(FIXTURES / GLOO_FIXTURE)}
    ctx = Context(node="n1", thresholds={"deadlines_s": {"probe": 20, "replay": 20}})
    result = next(r for r in run_checks(registry, ctx, ["probe", "replay"]).results
                  if r.check == "replay")  # fmt: skip
    assert result.status.failed
    assert GLOO_NOSUCH in result.reason
    assert f"GLOO_SOCKET_IFNAME='nosuch' (set in {home}/.profile)" in result.reason
    for word in BOILERPLATE:
        assert word not in result.reason
    assert result.details["rank_errors"][0].endswith(GLOO_NOSUCH)


# ---------------------------------------------------------------- gpuenv cluster's verdict


def _cluster_state(tmp_path):
    from gpuenv.cluster import pipeline
    from gpuenv.cluster.inventory import Host
    from gpuenv.results import ClusterReport

    hosts = [Host(n, n, "127.0.0.1", local=True) for n in ("n1", "n2")]
    state = pipeline.State(
        hosts, pipeline.Options(stages=("torch", "mpi")), ClusterReport(hosts=["n1", "n2"])
    )
    state.alive = hosts
    root, environ = node_tree(tmp_path, "GLOO_SOCKET_IFNAME", "nosuch")
    state.probes = {
        "n1": {"facts": {"gpu.count": "0"}, "login_env": {}},
        "n2": {"facts": {"gpu.count": "0"},
               "login_env": login_env.job_variables(str(root), "/home/u", environ)},
    }  # fmt: skip
    return state


def test_the_cluster_s_torch_failure_names_the_node_s_login_setting_and_its_rank_s_error(
    tmp_path, monkeypatch
):
    from gpuenv.cluster import pipeline
    from gpuenv.cluster.fanout import NodeAnswer

    state = _cluster_state(tmp_path)
    answers = {
        "n1": NodeAnswer("n1", None, error="stopped because n2 failed first"),
        "n2": NodeAnswer("n2", 1, stderr=recorded(GLOO_FIXTURE)),
    }
    monkeypatch.setattr(state, "launch", lambda *a, **k: answers)
    pipeline.torch_stage(state)
    allreduce = next(r for r in state.report.results if r.check == "allreduce")
    assert allreduce.status.failed
    reason = allreduce.reason
    assert "n2: exit status 1: RuntimeError: [enforce fail at" in reason
    assert GLOO_NOSUCH in reason
    assert "GLOO_SOCKET_IFNAME='nosuch' (set in /etc/profile.d/zz-site.sh)" in reason
    assert "n1: stopped because n2 failed first" in reason
    for word in BOILERPLATE:
        assert word not in reason


def test_the_cluster_s_mpirun_failure_quotes_the_rank_and_each_node_s_open_mpi_setting(
    tmp_path, monkeypatch
):
    from gpuenv.cluster import pipeline
    from gpuenv.cluster.fanout import NodeAnswer

    state = _cluster_state(tmp_path)
    root, environ = node_tree(tmp_path / "n1", "OMPI_MCA_pml", "nosuch")
    state.probes["n1"]["login_env"] = login_env.job_variables(str(root), "/home/u", environ)
    answer = NodeAnswer("n1", 1, stderr=recorded("mpirun-mca-pml-nosuch.txt"))
    monkeypatch.setattr(state, "fan_out", lambda *a, **k: {"n1": answer})
    pipeline.mpi_stage(state)
    mpi = next(r for r in state.report.results if r.check == "mpi")
    assert mpi.status.failed
    assert "A requested component was not found" in mpi.reason
    assert (
        "login files on n1 set what Open MPI reads:"
        " OMPI_MCA_pml='nosuch' (set in /etc/profile.d/zz-site.sh)"
    ) in mpi.reason
    # n2's login sets a gloo variable, which Open MPI does not read.
    assert "GLOO" not in mpi.reason
    for word in BOILERPLATE:
        assert word not in mpi.reason


def test_a_node_check_that_named_its_login_setting_is_not_given_the_note_again():
    from types import SimpleNamespace

    from gpuenv.cluster import pipeline
    from gpuenv.results import Result, Status

    login = {"GLOO_SOCKET_IFNAME": {"value": "nosuch", "set_in": ["/etc/profile.d/zz-site.sh"]}}
    named = Result("ddp", "n2", Status.FAIL, "RuntimeError: ...; login files set what gloo reads:"
                   " GLOO_SOCKET_IFNAME='nosuch' (set in /etc/profile.d/zz-site.sh)",
                   details={"login_env": login})  # fmt: skip
    other = Result("system", "n2", Status.FAIL, "no GPU")
    report = SimpleNamespace(results=[named, other])
    pipeline._name_login_settings(report, {"login_env": login})  # type: ignore[arg-type]
    assert named.reason.count("GLOO_SOCKET_IFNAME") == 1
    assert other.reason.endswith("[login environment: GLOO_SOCKET_IFNAME='nosuch' (set in"
                                 " /etc/profile.d/zz-site.sh)]")  # fmt: skip


def _dying(tmp_path, monkeypatch):
    """The fake GPU check ``dying`` on 2 fake GPUs, in a login whose ~/.bashrc exports
    NCCL_SOCKET_IFNAME=nosuch: its result, and the home."""
    from fakechecks import dying, probe

    from gpuenv.checks.base import Context
    from gpuenv.checks.session import run_checks

    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_GPUS", "2")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("export NCCL_SOCKET_IFNAME=nosuch\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "nosuch")
    ctx = Context(node="n1", thresholds={"deadlines_s": {"probe": 20, "dying": 20}})
    run = run_checks({"probe": probe, "dying": dying}, ctx, ["probe", "dying"])
    return next(r for r in run.results if r.check == "dying"), home


def test_a_gpu_worker_rank_that_died_shows_nccl_s_warning_and_the_login_setting(
    tmp_path, monkeypatch
):
    result, home = _dying(tmp_path, monkeypatch)
    assert result.status.failed
    assert result.reason.startswith(
        "rank 1: NCCL WARN Bootstrap : no socket interface found;"
        f" login files set what NCCL reads: NCCL_SOCKET_IFNAME='nosuch' (set in {home}/.bashrc);"
        " rank 1 exited with exit code 1 during dying"
    ), result.reason
    assert "NCCL INFO" not in result.reason


def test_a_gpu_worker_rank_s_posted_error_names_the_login_setting_of_its_library(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_DYING_RAISES", "1")
    result, home = _dying(tmp_path, monkeypatch)
    assert result.status.failed
    assert result.reason == (
        "rank 1: RuntimeError: NCCL error: unhandled system error, Last error: Bootstrap : no"
        " socket interface found; login files set what NCCL reads:"
        f" NCCL_SOCKET_IFNAME='nosuch' (set in {home}/.bashrc)"
    )
