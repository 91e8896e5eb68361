"""gpuenv cluster --launcher srun and the slurm stage (gpuenv.cluster.slurm), without Slurm: the
command lines, the per-node split of one srun's output, hung and missing nodes named, the
stage's judging, and bad input. End-to-end cases run the real launcher on an emulated submit
host with the fake srun and scontrol of tests/unit/fakeslurm on PATH."""

import ast
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from gpuenv.cluster import pipeline, slurm
from gpuenv.cluster.fanout import NodeAnswer
from gpuenv.cluster.inventory import Host
from gpuenv.errors import BadInput, EnvironmentProblem
from gpuenv.results import Status

FAKES = Path(__file__).parent / "fakeslurm"
NODES = """\
NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 CPULoad=0.01 Gres=gpu:hopper:2(S:0) NodeAddr=10.0.0.11 NodeHostName=n1 State=IDLE Reason=admin: two words=here
NodeName=n2 CPUTot=4 Gres=gpu:hopper:2 NodeAddr=10.0.0.12 NodeHostName=n2 State=IDLE
NodeName=gpu-c CPUTot=8 Gres=(null) NodeAddr=10.0.0.13 NodeHostName=gpu-c State=IDLE
"""  # noqa: E501
CONFIG = """\
Configuration data as of 2026-12-02T03:00:00
MpiDefault              = pmix
TaskPlugin              = task/cgroup,task/affinity

Cgroup Support Configuration:
ConstrainDevices        = yes
"""


def emulated(name, address="127.0.0.1"):
    return Host(name, address, address, local=True, python=sys.executable)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    (tmp_path / "nodes").write_text(NODES)
    (tmp_path / "config").write_text(CONFIG)
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SCONTROL_NODES", str(tmp_path / "nodes"))
    monkeypatch.setenv("FAKE_SCONTROL_CONFIG", str(tmp_path / "config"))
    monkeypatch.setenv("FAKE_SRUN_LOG", str(tmp_path / "srun.log"))
    # The tasks run `bash -lc` as on a node; a home of their own keeps the login away from this
    # machine's ~/.profile (pyenv's rehash there takes a lock that a killed task leaves behind,
    # and every later login then waits 60 s for it).
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def calls(tmp_path):
    return [ast.literal_eval(line) for line in (tmp_path / "srun.log").read_text().splitlines()]


# ---------------------------------------------------------------- reading Slurm


def test_scontrol_nodes_are_read_with_their_gpus_and_cpus():
    nodes = slurm.parse_nodes(NODES)
    assert list(nodes) == ["n1", "n2", "gpu-c"]
    assert nodes["n1"] == slurm.SlurmNode("n1", "10.0.0.11", "n1", "IDLE", 8, "gpu:hopper:2(S:0)")
    assert [n.gpus for n in nodes.values()] == [2, 2, 0]
    assert slurm.gres_gpus("gpu:a100:4(S:0-1),gpu:h100:2,shard:8") == 6


def test_config_and_mpi_plugins_are_read():
    config = slurm.parse_config(CONFIG)
    assert config["TaskPlugin"] == "task/cgroup,task/affinity"
    assert config["ConstrainDevices"] == "yes"
    listed = "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n\tpmix\nspecific pmix plugin versions available: pmix_v4\n"  # noqa: E501
    assert slurm.parse_mpi_list(listed) == ("none", "cray_shasta", "pmi2", "pmix")
    assert slurm.parse_mpi_list("srun: MPI types are...\nsrun: none\nsrun: pmi2\n") == (
        "none",
        "pmi2",
    )


def test_inventory_hosts_map_to_slurm_nodes_by_name_hostname_or_address():
    nodes = slurm.parse_nodes(NODES)
    hosts = [
        Host("n1.example.org", "203.0.113.1", "203.0.113.1"),  # short name
        Host("second", "10.0.0.12", "10.0.0.12"),  # NodeAddr
        Host("third", "203.0.113.3", "203.0.113.3"),  # the probe's hostname
        Host("stranger", "203.0.113.9", "203.0.113.9"),
    ]
    found, missing = slurm.match_nodes(hosts, nodes, {"third": "gpu-c.cluster"})
    assert found == {"n1.example.org": "n1", "second": "n2", "third": "gpu-c"}
    assert missing == ["stranger"]


# ---------------------------------------------------------------- command lines


def test_srun_command_line_asks_one_task_per_node_with_gpus_and_a_time_limit():
    argv = slurm.srun_argv(
        "/usr/bin/srun",
        ["n1", "n2"],
        130,
        "torchrun all nodes",
        gpus=8,
        cpus=64,
        kill_on_bad_exit=True,
    )
    assert argv == [
        "/usr/bin/srun",
        "-N",
        "2",
        "-w",
        "n1,n2",
        "--ntasks-per-node=1",
        "--exclusive",
        "--cpus-per-task=64",
        "--gres=gpu:8",
        "--time=3",
        f"--immediate={slurm.ALLOC_WAIT_S}",
        "--job-name=gpuenv-torchrun-all-nodes",
        "--mpi=none",
        "--label",
        "--kill-on-bad-exit=1",
    ]
    plain = slurm.srun_argv("srun", ["n1"], 10, "x", exclusive=False)
    assert "--exclusive" not in plain and "--gres" not in " ".join(plain)
    assert "--time=1" in plain and "--kill-on-bad-exit=0" in plain


def test_the_task_script_picks_its_nodes_command_and_groups_equal_ones():
    script = slurm.task_script({"n1": "torchrun --host=1", "n2": "torchrun", "n3": "torchrun"}, 30)
    assert "  n1) c='torchrun --host=1' ;;" in script
    assert "  n2|n3) c=torchrun ;;" in script
    assert 'timeout -k 5 30 bash -lc "cd && $c"' in script
    assert script.index(slurm.TASK_MARK) < script.index(slurm.RC_MARK)


def test_mpi_goes_through_pmix_when_slurm_offers_it_else_mpirun_in_an_allocation():
    hosts = [Host("a", "a", "a"), Host("b", "b", "b")]
    found = slurm.Slurm(
        Host("head", "h", "h"),
        "/usr/bin/srun",
        slurm.parse_nodes(NODES),
        mpi_plugins=("none", "pmi2", "pmix"),
        names={"a": "n1", "b": "n2"},
    )
    worker = ["python3", "-m", "gpuenv.cluster.worker", "mpi"]
    words = shlex.split(found.mpi_command(hosts, worker, 60))
    assert words[:5] == ["/usr/bin/srun", "-N", "2", "-w", "n1,n2"]
    assert "--mpi=pmix" in words and "--kill-on-bad-exit=1" in words
    assert words[-3:] == ["bash", "-lc", "cd && exec python3 -m gpuenv.cluster.worker mpi"]
    found.mpi_plugins = ("none", "pmi2")
    words = shlex.split(found.mpi_command(hosts, worker, 60))
    assert words[:5] == ["/usr/bin/salloc", "-N", "2", "-w", "n1,n2"]
    assert words[words.index("mpirun") :] == [
        "mpirun",
        "--map-by",
        "ppr:1:node",
        "-np",
        "2",
        *worker,
    ]


# ---------------------------------------------------------------- splitting the output


def test_one_sruns_output_is_split_per_node_by_the_tasks_own_names():
    by_node = {"n1": Host("a", "a", "a"), "n2": Host("b", "b", "b"), "n3": Host("c", "c", "c")}
    out = NodeAnswer(
        "head",
        1,
        stdout="1: GPUENV_TASK n1\n0: GPUENV_TASK n2\n1: hello from a\n0: GPUENV_RESULT {}\n"
        "1: GPUENV_TASK_RC 0 1500\n0: GPUENV_TASK_RC 3 200\n",
        stderr="0: Traceback\nsrun: error: n2: task 0: Exited with exit code 3\n"
        "srun: error: Task launch for StepId=7.0 failed on node n3: Connection refused\n",
        duration_s=9.0,
    )
    got = slurm.split_output(out, by_node, 30)
    assert got["a"].ok and got["a"].stdout == "hello from a" and got["a"].duration_s == 1.5
    assert got["b"].rc == 3 and got["b"].stdout == "GPUENV_RESULT {}"
    assert got["b"].stderr.startswith("Traceback\nsrun: error: n2: task 0: Exited")
    assert got["c"].rc is None
    assert "its Slurm task (node n3) never started" in got["c"].error
    assert "failed on node n3" in got["c"].error


# ---------------------------------------------------------------- the launcher, end to end


def launcher(tmp_path, hosts, names):
    return slurm.Slurm(
        emulated("head"),
        str(FAKES / "srun"),
        slurm.parse_nodes(NODES),
        names=dict(zip([h.name for h in hosts], names, strict=True)),
    )


def test_a_launch_runs_each_nodes_command_and_answers_per_node(fake_slurm):
    hosts = [emulated("a"), emulated("b")]
    found = launcher(fake_slurm, hosts, ["n1", "n2"])
    got = found.launch(hosts, lambda h: f"echo I am {h.name} on $SLURMD_NODENAME", "hello", 20)
    assert got["a"].ok and got["a"].stdout == "I am a on n1"
    assert got["b"].ok and got["b"].stdout == "I am b on n2"
    argv = calls(fake_slurm)[0]
    # n1 has 8 CPUs and n2 4: the task gets the smaller whole node.
    assert argv[:5] == ["-N", "2", "-w", "n1,n2", "--ntasks-per-node=1"]
    assert "--cpus-per-task=4" in argv


def test_a_hung_node_is_named_within_the_deadline(fake_slurm):
    hosts = [emulated("a"), emulated("b")]
    found = launcher(fake_slurm, hosts, ["n1", "n2"])
    start = time.monotonic()
    got = found.launch(hosts, lambda h: "sleep 60" if h.name == "b" else "true", "hang", 2)
    assert time.monotonic() - start < 15
    assert got["a"].ok
    assert (
        got["b"].rc == 124
        and "did not finish within 2 s; killed on the node (n2)" in got["b"].error
    )


def test_the_first_failure_stops_the_others_and_is_named(fake_slurm):
    hosts = [emulated("a"), emulated("b")]
    found = launcher(fake_slurm, hosts, ["n1", "n2"])
    start = time.monotonic()
    got = found.launch(
        hosts, lambda h: "exit 7" if h.name == "a" else "sleep 60", "stop", 30, stop_others=True
    )
    assert time.monotonic() - start < 15
    assert got["a"].rc == 7
    assert got["b"].rc is None and got["b"].error == "stopped because a failed first"


def test_a_node_whose_task_never_started_is_named(fake_slurm, monkeypatch):
    monkeypatch.setenv("FAKE_SRUN_ABSENT", "n2")
    hosts = [emulated("a"), emulated("b")]
    got = launcher(fake_slurm, hosts, ["n1", "n2"]).launch(hosts, lambda h: "true", "gone", 10)
    assert got["a"].ok
    assert got["b"].rc is None and "its Slurm task (node n2) never started" in got["b"].error


# ---------------------------------------------------------------- the submit host, bad input


def test_connect_reads_slurm_and_maps_the_hosts(fake_slurm):
    found = slurm.connect(
        emulated("head"), [Host("n1", "x", "x", local=True), emulated("b", "10.0.0.12")]
    )
    assert found.srun == str(FAKES / "srun")
    assert found.names == {"n1": "n1", "b": "n2"}
    assert found.mpi == "pmix" and found.device_constraint_off() is None


def test_a_host_slurm_does_not_know_stops_the_run_by_name(fake_slurm):
    with pytest.raises(BadInput, match=r"stranger not a Slurm node on head \(Slurm has gpu-c, n1,"):
        slurm.connect(emulated("head"), [emulated("n1"), emulated("stranger")])
    assert not (fake_slurm / "srun.log").exists() or all(
        a == ["--mpi=list"] for a in calls(fake_slurm)
    )


def test_srun_missing_on_the_submit_host_is_bad_input():
    out = NodeAnswer("head", 0, stdout="GPUENV_SECTION srun\nGPUENV_SECTION nodes\n" + NODES)
    with pytest.raises(BadInput, match="srun not found in the login of head"):
        slurm.parse_query(Host("head", "h", "h", become_user="gpuenv"), out)
    failed = NodeAnswer(
        "head",
        0,
        stdout="GPUENV_SECTION srun\n/usr/bin/srun\nGPUENV_SECTION "
        "nodes\nGPUENV_SECTION failed scontrol\n",
        stderr="Munge decode failed",
    )
    with pytest.raises(EnvironmentProblem, match=r"gave no nodes.*Munge decode failed"):
        slurm.parse_query(Host("head", "h", "h"), failed)


def test_the_submit_host_is_the_controller_group_or_named():
    hosts = [Host("a", "a", "a")]
    head = Host("head", "h", "h")
    assert slurm.submit_host(hosts, None, [head]) is head
    assert slurm.submit_host(hosts, "a", []) is hosts[0]
    with pytest.raises(BadInput, match="no slurm_controller group; name one with --slurm-host"):
        slurm.submit_host(hosts, None, [])
    with pytest.raises(BadInput, match="--slurm-host nowhere: not a host of the inventory"):
        slurm.submit_host(hosts, "nowhere", [head])


def test_the_cli_refuses_srun_without_a_submit_host_and_slurm_host_without_srun(
    tmp_path, monkeypatch, capsys
):
    from gpuenv.cli import main
    from gpuenv.cluster import inventory

    def load(sources, limit=None):
        if limit == slurm.SUBMIT_GROUP:
            raise BadInput(f"limit {limit!r} matches no host")
        return [Host("a", "a", "a")]

    monkeypatch.setattr(inventory, "load", load)
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n")
    assert main(["cluster", "-i", str(inv), "--launcher", "srun", "--no-progress"]) == 2
    assert "no slurm_controller group; name one with --slurm-host" in capsys.readouterr().err
    assert main(["cluster", "-i", str(inv), "--slurm-host", "a", "--no-progress"]) == 2
    assert "--slurm-host goes with --launcher srun" in capsys.readouterr().err


# ---------------------------------------------------------------- the slurm stage's judging


def answer(name, stdout, rc=0):
    return NodeAnswer(name, rc, stdout)


def test_reach_passes_when_every_node_answered_and_names_the_one_that_did_not():
    ok = slurm.reach_result({"a": answer("a", "n1"), "b": answer("b", "n2")}, {}, 1.0)
    assert ok.status is Status.PASS and ok.check == "slurm-reach"
    bad = slurm.reach_result(
        {"a": answer("a", "n1"), "b": NodeAnswer("b", None, error="gone")}, {}, 1.0
    )
    assert bad.status is Status.FAIL and "did not reach 1 node(s): b: gone" in bad.reason


SEES_ONE = "CVD=0\nOPEN /dev/nvidia2\nSMI 1\n"
SEES_ALL = "CVD=unset\nOPEN /dev/nvidia0\nOPEN /dev/nvidia1\nSMI 2\n"


def test_a_job_that_sees_exactly_what_it_asked_for_passes():
    assert slurm.asked_gpus({"a": 8, "b": 2}) == 1 and slurm.asked_gpus({"a": 1}) == 1
    r = slurm.gpu_result({"a": answer("a", SEES_ONE)}, 1, {"a": 2}, 1.0)
    assert r.status is Status.PASS and "saw exactly 1" in r.reason


def test_a_job_that_sees_the_whole_node_fails_naming_what_it_saw():
    r = slurm.gpu_result(
        {"a": answer("a", SEES_ONE), "b": answer("b", SEES_ALL)}, 1, {"a": 2, "b": 2}, 1.0
    )
    assert r.status is Status.FAIL
    assert "b: opened 2 GPU device file(s) (/dev/nvidia0, /dev/nvidia1);" in r.reason
    assert "CUDA_VISIBLE_DEVICES=unset; nvidia-smi -L lists 2" in r.reason
    assert "a:" not in r.reason


def stage_slurm(config=CONFIG, nodes=NODES):
    found = slurm.Slurm(
        Host("head", "h", "h"),
        "srun",
        slurm.parse_nodes(nodes),
        slurm.parse_config(config),
        names={"a": "n1", "b": "gpu-c"},
    )
    seen = []

    def fake_launch(hosts, command, label, deadline_s, **kw):
        seen.append((label, [h.name for h in hosts], kw.get("gpus", 0)))
        return {
            h.name: answer(h.name, "n" if label == "srun hostname" else SEES_ONE) for h in hosts
        }

    found.launch = fake_launch  # type: ignore[method-assign]
    return found, seen


def test_the_gpu_check_skips_without_gpus_or_without_device_confinement():
    hosts = [Host("a", "a", "a"), Host("b", "b", "b")]
    found, seen = stage_slurm()
    reach, gpus = slurm.stage(found, hosts, {"a": 0, "b": 0}, 10)
    assert reach.status is Status.PASS
    assert gpus.status is Status.SKIP and "no GPU on the Slurm nodes" in gpus.reason
    found, seen = stage_slurm(CONFIG.replace("= yes", "= no"))
    _, gpus = slurm.stage(found, hosts, {"a": 2, "b": 0}, 10)
    assert gpus.status is Status.SKIP and "ConstrainDevices is no" in gpus.reason
    found, seen = stage_slurm(CONFIG.replace("task/cgroup,", ""))
    _, gpus = slurm.stage(found, hosts, {"a": 2, "b": 0}, 10)
    assert gpus.status is Status.SKIP and "no task/cgroup" in gpus.reason
    assert [s[0] for s in seen] == ["srun hostname"]


def test_the_gpu_check_asks_one_less_than_the_node_has_and_fails_without_gres():
    hosts = [Host("a", "a", "a"), Host("b", "b", "b")]
    found, seen = stage_slurm()
    _, gpus = slurm.stage(found, hosts, {"a": 2, "b": 0}, 10)
    assert seen[-1] == ("srun gpus", ["a"], 1)
    assert gpus.status is Status.PASS
    found, seen = stage_slurm()
    _, gpus = slurm.stage(found, hosts, {"a": 2, "b": 4}, 10)  # gpu-c has no gres in Slurm
    assert gpus.status is Status.FAIL and "no gpu gres on b" in gpus.reason


def test_the_pipelines_slurm_stage_runs_through_the_launcher(fake_slurm):
    hosts = [emulated("a"), emulated("b", "10.0.0.12")]
    found = slurm.connect(emulated("head"), [Host("a", "n1", "n1", local=True), hosts[1]])
    found.names["a"] = "n1"
    opts = pipeline.Options(stages=("slurm",), probe_deadline_s=10, deadline_s=20, slurm=found)
    run = pipeline.validate(hosts, opts)
    reach = next(r for r in run.results if r.check == "slurm-reach")
    assert reach.status is Status.PASS, reach.reason
    assert next(r for r in run.results if r.check == "slurm-gpus").status is Status.SKIP


def test_without_srun_anywhere_the_stage_skips_with_the_reason():
    opts = pipeline.Options(stages=("slurm",), probe_deadline_s=10)
    run = pipeline.validate([emulated("a")], opts)
    r = next(r for r in run.results if r.check == "slurm")
    assert r.status is Status.SKIP and "no node has srun" in r.reason
