"""A failed rank shows its own cause (issue 32, item 9): the rank's error lines out of the real,
recorded outputs of torchrun and mpirun (tests/fixtures/launchers/README.md says how each was
made), never the launcher's boilerplate, and the login file that set what the failing library
reads, in `gpuenv check` and `gpuenv cluster` verdicts."""

from __future__ import annotations

import pytest
from launcher_outputs import GLOO_NOSUCH, no_boilerplate, node_tree, recorded

from gpuenv.checks import rank_cause
from gpuenv.floor import login_env


def test_torchrun_s_report_gives_way_to_the_failed_rank_s_exception_root_cause_first():
    lines = rank_cause.own_lines(recorded("torchrun-gloo-rank-raises.txt"))
    # torchrun names rank 1 as the root cause; rank 0 only lost its peer.
    assert lines[0] == "rank 1: ValueError: rank 1 was told to fail"
    assert lines[1].startswith("rank 0: RuntimeError:") and "Connection closed by peer" in lines[1]
    assert len(lines) == 2
    no_boilerplate(lines)


def test_the_library_s_message_is_quoted_once_for_ranks_that_said_the_same():
    lines = rank_cause.own_lines(recorded("torchrun-gloo-socket-ifname-nosuch.txt"))
    assert len(lines) == 1 and lines[0].startswith("RuntimeError: [enforce fail at ")
    assert lines[0].endswith(GLOO_NOSUCH)
    no_boilerplate(lines)


@pytest.mark.parametrize("name", ["mpirun-rank-raises.txt", "mpirun-rank-aborts.txt"])
def test_mpirun_s_boxes_give_way_to_the_rank_s_exception(name):
    lines = rank_cause.own_lines(recorded(name))
    assert lines == ["ValueError: rank 1 was told to fail"]


def test_an_open_mpi_help_box_is_the_library_s_message_in_one_line():
    lines = rank_cause.own_lines(recorded("mpirun-mca-pml-nosuch.txt"))
    assert lines[0] == (
        "A requested component was not found, or was unable to be opened"
        " (Host: vm, Framework: pml, Component: nosuch)"
    )
    assert "An error occurred in MPI_Init_thread" in lines
    no_boilerplate(lines)


def test_posted_errors_and_the_output_are_one_list_by_rank():
    posted = {1: {"error": "ValueError: rank 1 was told to fail"}}
    lines = rank_cause.own_lines(recorded("mpirun-rank-raises.txt"), posted)
    assert lines == ["rank 1: ValueError: rank 1 was told to fail"]


def test_a_stray_gloo_variable_in_a_login_file_is_named_with_its_value_file_and_the_error(
    tmp_path,
):
    root, environ = node_tree(tmp_path, "GLOO_SOCKET_IFNAME", "nosuch")
    login = login_env.job_variables(str(root), "/home/u", environ)
    cause = rank_cause.find(recorded("torchrun-gloo-socket-ifname-nosuch.txt"), None, login)
    assert GLOO_NOSUCH in cause.text
    assert (
        "login files set what gloo reads:"
        " GLOO_SOCKET_IFNAME='nosuch' (set in /etc/profile.d/zz-site.sh)"
    ) in cause.text
    # NCCL did not fail: its setting in the same file is not named.
    assert "NCCL_DEBUG" not in cause.text
    assert cause.details()["login_env"] == {
        "GLOO_SOCKET_IFNAME": {"value": "nosuch", "set_in": ["/etc/profile.d/zz-site.sh"]}
    }


def test_mpirun_s_libraries_are_open_mpi_s_and_ucx_s_whatever_the_ranks_said(tmp_path):
    root, environ = node_tree(tmp_path, "UCX_NET_DEVICES", "mlx5_9:1")
    login = login_env.job_variables(str(root), "/home/u", environ)
    cause = rank_cause.find(recorded("mpirun-rank-raises.txt"), None, login, ["mpirun", "-n"])
    assert "UCX_NET_DEVICES='mlx5_9:1' (set in /etc/profile.d/zz-site.sh)" in cause.text
    assert "login files set what UCX reads" in cause.text
    # torchrun's ranks do not go through UCX: a gloo failure does not name it.
    other = rank_cause.find(recorded("torchrun-gloo-socket-ifname-nosuch.txt"), None, login)
    assert "UCX" not in other.text


def test_open_mpi_5_s_runtime_variables_in_a_login_file_are_named(tmp_path):
    """Open MPI 5 reads its launcher's settings through PMIx (PMIX_MCA_*) and PRRTE."""
    root, environ = node_tree(tmp_path, "PMIX_MCA_gds", "nosuch")
    login = login_env.job_variables(str(root), "/home/u", environ)
    cause = rank_cause.find(recorded("mpirun-rank-raises.txt"), None, login, ["mpirun"])
    assert "PMIX_MCA_gds='nosuch' (set in /etc/profile.d/zz-site.sh)" in cause.text


def test_torchrun_s_report_alone_is_no_message_of_a_library():
    """The recorded output without torchrun's own traceback above its report (as when its agent
    logs the report instead of raising): the report's 60-dash rules are not an Open MPI box."""
    text = recorded("torchrun-gloo-rank-raises.txt")
    agent = text.index('Traceback (most recent call last):\n  File "<frozen runpy>"')
    report = text.index("=" * 60)
    # Rank 0's error first in the output: the report's root cause (rank 1) still comes first.
    rank1 = text.index("[rank1]: Traceback")
    rank0 = text.index("[rank0]: Traceback")
    lines = rank_cause.own_lines(
        text[:rank1] + text[rank0:agent] + text[rank1:rank0] + text[report:]
    )
    assert lines[0] == "rank 1: ValueError: rank 1 was told to fail"
    assert lines[1].startswith("rank 0: RuntimeError:")
    no_boilerplate(lines)


def test_torchrun_s_agent_stopped_by_its_deadline_is_not_a_rank_s_error():
    """torchrun's agent raises its own SignalException when the deadline's SIGTERM reaches it
    (the shape of torch 2.13's traceback, as `gpuenv cluster` met it on an overloaded node)."""
    agent = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/torch/distributed/run.py", line 1032, in <module>\n'
        "    main()\n"
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 21006 got signal:"
        " 15\n"
    )
    text = recorded("torchrun-gloo-socket-ifname-nosuch.txt")
    assert rank_cause.own_lines(agent) == []
    assert rank_cause.own_lines(text + agent) == rank_cause.own_lines(text)
