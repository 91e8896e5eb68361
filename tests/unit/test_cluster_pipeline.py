import sys
import time
import uuid
from pathlib import Path

from test_cluster_fanout import processes_with

from gpuenv.cluster import pipeline
from gpuenv.cluster.inventory import Host
from gpuenv.results import Status


def emulated(name, python=sys.executable, **kw):
    return Host(name, name, "127.0.0.1", local=True, python=python, **kw)


def by(run, check, node="cluster"):
    return next(r for r in run.results if r.check == check and r.node == node)


FAST = pipeline.Options(stages=("consistency", "rendezvous"), probe_deadline_s=3, port=0)


def opts(**kw):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return pipeline.Options(**{**FAST.__dict__, "port": port, **kw})


def test_a_node_with_another_nccl_setting_is_named():
    hosts = [
        emulated("a", env={"NCCL_IB_DISABLE": "1"}),
        emulated("b", env={"NCCL_IB_DISABLE": "0"}),
        emulated("c", env={"NCCL_IB_DISABLE": "1"}),
    ]
    run = pipeline.validate(hosts, opts())
    r = by(run, "consistency")
    assert r.status is Status.FAIL
    assert "env.NCCL_IB_DISABLE: 1 on a, c; 0 on b" in r.reason
    assert by(run, "rendezvous").status is Status.PASS
    assert any(r.status.failed for r in run.results)


def test_a_stopped_node_is_named_by_the_deadline_and_the_rest_go_on(tmp_path):
    marker = f"gpuenv-stopped-{uuid.uuid4().hex}"
    frozen = tmp_path / "python"
    frozen.write_text(f"#!/bin/bash\nexec -a {marker} sleep 600\n")
    frozen.chmod(0o755)
    hosts = [emulated("a"), emulated("b"), emulated("dead", python=str(frozen))]
    start = time.monotonic()
    run = pipeline.validate(hosts, opts())
    assert time.monotonic() - start < 20
    reach = by(run, "reach", "dead")
    assert reach.status is Status.FAIL and "did not finish within 3 s" in reach.reason
    assert by(run, "consistency").status is Status.PASS
    rdzv = by(run, "rendezvous")
    assert rdzv.status is Status.PASS and "without dead" in rdzv.reason
    assert any(r.status.failed for r in run.results)
    assert processes_with(marker) == []


def test_multi_node_stages_skip_with_one_node():
    run = pipeline.validate([emulated("solo")], opts(stages=("rendezvous", "torch")))
    assert by(run, "rendezvous").status is Status.SKIP
    assert "need 2" in by(run, "torch").reason


def test_a_host_that_does_not_resolve_is_named_and_the_others_go_on():
    hosts = [
        emulated("a"),
        emulated("b"),
        emulated("ghost", problem="address 'ghost.invalid' does not resolve"),
    ]
    run = pipeline.validate(hosts, opts())
    reach = by(run, "reach", "ghost")
    assert reach.status is Status.FAIL and "does not resolve" in reach.reason
    assert by(run, "reach", "a").status is Status.PASS
    assert by(run, "rendezvous").status is Status.PASS


def test_stages_are_data_and_their_needs_are_said():
    names = [s.name for s in pipeline.STAGES]
    assert names == list(pipeline.STAGE_NAMES)
    assert all(need in names for s in pipeline.STAGES for need in s.needs)
    run = pipeline.validate(
        [emulated("a", env={"NCCL_SOCKET_IFNAME": "nosuch0"}), emulated("b")],
        opts(stages=("rendezvous", "mpi")),
    )
    assert by(run, "rendezvous").status is Status.FAIL
    assert by(run, "mpi").reason == "the rendezvous stage did not pass"


FAKE_NODE = r"""#!/usr/bin/env python3
# A node's python3 for the pipeline: its probe reports an active InfiniBand port, and its
# torchrun reports an NCCL all-reduce whose connections went over TCP sockets.
import json, sys
args = sys.argv[1:]
if args[:2] == ["-m", "gpuenv.cluster.probe"]:
    if args[2] != "facts":
        sys.exit(subprocess.call([REAL, *args]))
    print(json.dumps({"hostname": "x", "interfaces": ["lo", "ib0"],
                      "links": {"ib.active_ports": ["mlx5_0/1"], "ib.rate_gbps": 25.0,
                                "net.speed_gbps": 12.5},
                      "facts": {"pkg.torch": "2.13.0", "gpu.count": "8"}}))
elif args[:2] == ["-m", "torch.distributed.run"]:
    sweep = [{"bytes": 64 << 20, "busbw_gbps": 3.1, "correct": True}]
    ddp = {"param_max_diff": 0.0, "loss_first": 1.0, "loss_last": 0.3, "step_time_s": 0.01}
    line = "NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"
    transport = {"nccl_version": "2.28.9", "families": {"NET/Socket": 2}, "gdrdma": False,
                 "evidence": [line]}
    print("GPUENV_RESULT " + json.dumps({"kind": "torch", "backend": "nccl", "sweep": sweep,
                                         "ddp": ddp, "transport": transport}))
"""


def _fake_python(tmp_path):
    path = tmp_path / "python3"
    path.write_text(
        FAKE_NODE.replace(
            "import json, sys", f"import json, subprocess, sys\nREAL = {sys.executable!r}"
        )
    )
    path.chmod(0o755)
    return str(path)


def test_nccl_falling_back_to_sockets_beside_active_infiniband_fails_busbw(tmp_path):
    python = _fake_python(tmp_path)
    hosts = [emulated("a", python=python), emulated("b", python=python)]
    run = pipeline.validate(hosts, opts(stages=("rendezvous", "torch")))
    assert by(run, "allreduce").status is Status.PASS
    busbw = by(run, "busbw")
    assert busbw.status is Status.FAIL
    assert "fell back to TCP sockets" in busbw.reason and "a: mlx5_0/1" in busbw.reason
    assert busbw.details["transport"]["families"] == {"NET/Socket": 4}


def test_busbw_below_the_floor_of_its_transport_fails_and_above_passes(tmp_path):
    python = _fake_python(tmp_path)
    hosts = [emulated("a", python=python), emulated("b", python=python)]
    # A floor given by the user replaces the derived one; the Socket fallback still fails.
    run = pipeline.validate(hosts, opts(stages=("rendezvous", "torch"), min_busbw=10.0))
    assert "busbw 3.10 GB/s at 64 MiB < 10.00 GB/s (--min-busbw)" in by(run, "busbw").reason


FABRIC_NODE = r"""#!/usr/bin/env python3
# A node with two 400 Gb/s rails for the pipeline: its probe reports the ports, settings,
# counters and ib_write_bw; its torchrun reports NCCL over both rails with GPUDirect RDMA (node a)
# or over one rail (node b); node b's link_downed counter grows during the runs.
import json, os, subprocess, sys
args = sys.argv[1:]
me = os.environ["GPUENV_FAKE_NODE"]
ports = [{"device": f"mlx5_{i}", "port": "1", "state": "ACTIVE", "phys_state": "LinkUp",
          "rate": "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"} for i in (0, 1)]
if args[:3] == ["-m", "gpuenv.cluster.probe", "facts"]:
    print(json.dumps({"hostname": me, "interfaces": ["lo", "ib0"],
                      "links": {"ib.active_ports": ["mlx5_0/1", "mlx5_1/1"], "ib.rate_gbps": 50.0,
                                "ib.ports": ports, "ib.settings": {},
                                "ib.counters": {"mlx5_0/1": {"link_downed": 0}},
                                "ib.verbs": "/usr/lib/libibverbs.so.1", "gdr.peermem": True,
                                "tools.ib_write_bw": os.environ["GPUENV_FAKE_PERF"]},
                      "facts": {"pkg.torch": "2.13.0", "gpu.count": "2"}}))
elif args[:3] == ["-m", "gpuenv.cluster.probe", "counters"]:
    print(json.dumps({"counters": {"mlx5_0/1": {"link_downed": 1 if me == "b" else 0}}}))
elif args[:2] == ["-m", "gpuenv.cluster.probe"]:
    sys.exit(subprocess.call([REAL, *args]))
elif args[:2] == ["-m", "torch.distributed.run"]:
    sweep = [{"bytes": 64 << 20, "busbw_gbps": 60.0, "correct": True}]
    ddp = {"param_max_diff": 0.0, "loss_first": 1.0, "loss_last": 0.3, "step_time_s": 0.01}
    used = [0, 1] if me == "a" else [0]
    transport = {"nccl_version": "2.21.5", "families": {"NET/IB": 4}, "gdrdma": True,
                 "evidence": [], "net_devices": {"0": "mlx5_0:1/IB", "1": "mlx5_1:1/IB"},
                 "net_used": used, "gdr_lines": [], "settings": {}}
    print("GPUENV_RESULT " + json.dumps({"kind": "torch", "backend": "nccl", "sweep": sweep,
                                         "ddp": ddp, "transport": transport}))
"""

FAKE_PERF = """#!/bin/bash
# ib_write_bw: a client (its last argument an address) prints a perftest summary; a server ends.
case "${@: -1}" in
  127.0.0.1) cat "$GPUENV_PERF_OUTPUT" ;;
esac
"""


def test_the_fabric_is_judged_across_nodes_by_the_rails_nccl_used(tmp_path):
    from pathlib import Path

    python = tmp_path / "python3"
    python.write_text(FABRIC_NODE.replace("import json, os, subprocess, sys",
                      f"import json, os, subprocess, sys\nREAL = {sys.executable!r}"))  # fmt: skip
    python.chmod(0o755)
    perf = tmp_path / "bin" / "ib_write_bw"
    perf.parent.mkdir()
    perf.write_text(FAKE_PERF)
    perf.chmod(0o755)
    output = (
        Path(__file__).resolve().parents[1] / "fixtures/fabric-logs/ib_write_bw-ndr-slow-gbits.txt"
    )
    env = {"GPUENV_FAKE_PERF": str(perf), "GPUENV_PERF_OUTPUT": str(output),
           "PATH": f"{perf.parent}:/usr/bin:/bin"}  # fmt: skip
    hosts = [emulated(n, python=str(python), env={**env, "GPUENV_FAKE_NODE": n}) for n in "ab"]
    run = pipeline.validate(hosts, opts(stages=("rendezvous", "torch", "fabric")))
    busbw = by(run, "busbw")
    assert busbw.status is Status.FAIL
    assert "b: NCCL used 1 of 2 rails; idle: mlx5_1:1" in busbw.reason
    assert busbw.details["floor_from"] == (
        "0.5 x 1 rail(s) NCCL used on b x their rate = 0.5 x 50 GB/s"
    )
    counters = by(run, "fabric-counters")
    assert counters.status is Status.FAIL
    assert "b mlx5_0/1: error counters grew during the run: link_downed 0 -> 1" in counters.reason
    pairs = by(run, "fabric-pairs")
    assert pairs.status is Status.FAIL, pairs.reason
    assert "a -> b over mlx5_0:1: 24.6 GB/s < 0.9 x 50 GB/s port rate (GPU memory)" in pairs.reason
    assert "a -> b over mlx5_1:1" in pairs.reason


def test_the_health_stage_names_a_sick_gpu_before_any_launch(tmp_path):
    """Node b's scan reads a recorded Xid 79 (gpuenv health's test hooks, through a wrapper
    python); node a scans this GPU-less machine as it is."""
    import json

    from gpuenv.health.nvml import patch_gpus

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "health"
    base = json.loads((fixtures / "_base" / "hgx8" / "nvml.json").read_text())
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(patch_gpus(base, {"3": {"remove": True}})))
    log = fixtures / "xid79-fallen-off-bus" / "kernel.log"
    wrapper = tmp_path / "python-b"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'[ "$3" = health ] && exec {sys.executable} "$@" --nvml-fixture {nvml}'
        f" --kernel-log {log}\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    hosts = [emulated("a"), emulated("b", python=str(wrapper))]
    run = pipeline.validate(hosts, opts(stages=("health",)))
    assert by(run, "health", "a").status is Status.PASS
    sick = by(run, "health", "b")
    assert sick.status is Status.FAIL
    assert "node xid 79: reboot" in sick.reason and "GPU has fallen off the bus" in sick.reason


def _answer(name, rc, *payloads, error=""):
    import json

    from gpuenv.cluster.fanout import NodeAnswer
    from gpuenv.cluster.worker import MARK

    out = "".join(f"{MARK}{json.dumps(p)}\n" for p in payloads)
    return NodeAnswer(name, rc, stdout=out, error=error)


def _pair(a, b, node, **kw):
    return {"kind": "pair", "a": a, "b": b, "node": node, **kw}


def _start(a, b, node):
    return {"kind": "pair-start", "a": a, "b": b, "node": node}


def test_the_pair_phase_lines_make_measured_failed_and_unreached_pairs():
    """Rounds of n1..n4: (n1,n4),(n2,n3) / (n1,n3),(n4,n2) / (n1,n2),(n3,n4). Round 1 measured;
    in round 2 n4 reported wrong values and n3 never joined n1's pair; round 3 never started
    (the launch was stopped): those pairs are left to launches of their own."""
    from gpuenv.cluster import pairs
    from gpuenv.cluster.worker import PairPhase
    from gpuenv.results import ClusterReport

    nodes = ("n1", "n2", "n3", "n4")
    assert pairs.all_pairs_rounds(nodes) == [
        [("n1", "n4"), ("n2", "n3")], [("n1", "n3"), ("n4", "n2")], [("n1", "n2"), ("n3", "n4")]
    ]  # fmt: skip
    torch = {"kind": "torch", "sweep": []}
    ok = dict(correct=True)
    outcomes = {
        "n1": _answer("n1", 1, torch, _start("n1", "n4", "n1"),
                      _pair("n1", "n4", "n1", busbw_gbps=5.0, **ok), _start("n1", "n3", "n1"),
                      _pair("n1", "n3", "n1", error="RuntimeError after 9.0 s: timed out")),
        "n2": _answer("n2", None, torch, _start("n2", "n3", "n2"),
                      _pair("n2", "n3", "n2", busbw_gbps=6.0, **ok), _start("n4", "n2", "n2"),
                      _pair("n4", "n2", "n2", busbw_gbps=6.0, **ok),
                      error="stopped because n1 failed first"),
        "n3": _answer("n3", None, torch, _start("n2", "n3", "n3"),
                      _pair("n2", "n3", "n3", busbw_gbps=4.0, **ok),
                      error="stopped because n1 failed first"),
        "n4": _answer("n4", None, torch, _start("n1", "n4", "n4"),
                      _pair("n1", "n4", "n4", busbw_gbps=7.0, **ok), _start("n4", "n2", "n4"),
                      _pair("n4", "n2", "n4", busbw_gbps=6.0, correct=False),
                      error="stopped because n1 failed first"),
    }  # fmt: skip
    state = pipeline.State([emulated(n) for n in nodes], opts(), ClusterReport(hosts=list(nodes)))
    pipeline._gather_pairs(state, PairPhase(nodes, 1 << 20, 2, 10.0), outcomes)
    assert state.launch_pairs == {("n1", "n4"): 5.0, ("n2", "n3"): 4.0, ("n1", "n3"): None,
                                  ("n4", "n2"): None}  # fmt: skip
    assert state.launch_pair_notes[("n1", "n3")] == (
        "n1: RuntimeError after 9.0 s: timed out;"
        " n3 never joined the pair (n1 waited) (stopped because n1 failed first)"
    )
    assert state.launch_pair_notes[("n4", "n2")] == "n4: all-reduce gave wrong values"
    assert state.launch_failures == {
        "n1": "exit status 1",
        **{n: "stopped because n1 failed first" for n in ("n2", "n3", "n4")},
    }


def test_a_node_that_joined_a_pair_and_never_finished_is_named():
    from gpuenv.cluster.worker import PairPhase
    from gpuenv.results import ClusterReport

    nodes = ("a", "b")
    torch = {"kind": "torch", "sweep": []}
    outcomes = {
        "a": _answer("a", None, torch, _start("a", "b", "a"), error="did not finish within 40 s"),
        "b": _answer("b", None, torch, _start("a", "b", "b"), error="stopped because a failed"),
    }
    state = pipeline.State([emulated(n) for n in nodes], opts(), ClusterReport(hosts=list(nodes)))
    pipeline._gather_pairs(state, PairPhase(nodes, 1 << 20, 2, 10.0), outcomes)
    assert state.launch_pairs == {("a", "b"): None}
    assert state.launch_pair_notes[("a", "b")] == (
        "a joined the pair and never finished it (did not finish within 40 s);"
        " b joined the pair and never finished it (stopped because a failed)"
    )


def test_isolation_reuses_only_pairs_measured_by_their_own_launches(monkeypatch):
    from gpuenv.results import ClusterReport

    names = ["a", "b", "c", "d"]
    state = pipeline.State([emulated(n) for n in names], opts(), ClusterReport(hosts=names))
    state.alive = list(state.hosts)
    state.launch_pairs = {("a", "d"): 5.0, ("b", "c"): 5.0}
    state.report.matrix = {("a", "d"): 5.0, ("b", "c"): 5.0, ("a", "c"): 5.0}
    state.busbw_ok = False
    seen = {}

    def tester(_state, label, known=None):
        seen[label] = dict(known or {})
        return lambda round_pairs: {p: 5.0 for p in round_pairs}

    monkeypatch.setattr(pipeline, "pair_tester", tester)
    pipeline.isolation_stage(state)
    assert seen == {"isolate": {("a", "c"): 5.0}}


def test_the_all_node_launch_asks_for_the_pair_phase_only_when_the_matrix_is_wanted():
    hosts = [emulated(n) for n in ("a", "b", "c")]
    from gpuenv.results import ClusterReport

    def phase(**kw):
        state = pipeline.State(hosts, opts(**kw), ClusterReport(hosts=["a", "b", "c"]))
        state.alive = hosts
        return pipeline._pair_phase(state, 90.0)

    got = phase(stages=("rendezvous", "torch", "pairs"), pair_bytes=1 << 20, iters=3)
    assert got is not None and got.nodes == ("a", "b", "c")
    assert (got.nbytes, got.iters, got.timeout_s) == (1 << 20, 3, 30.0)
    assert phase(stages=("rendezvous", "torch")) is None
    assert phase(stages=("rendezvous", "torch", "pairs"), matrix_max_nodes=2) is None
    assert phase(stages=()) is not None  # every stage that is not optional: pairs included


QUICK_CLUSTER = {"gpu": ("consistency", "rendezvous", "allreduce", "busbw", "ddp", "mpi"),
                 "cpu": ()}  # fmt: skip
CPU_CLUSTER = {"gpu": (), "cpu": ("consistency", "rendezvous", "allreduce", "ddp", "mpi")}


def _state(gpus, n=3, **kw):
    from gpuenv.results import ClusterReport

    hosts = [emulated(f"n{i}") for i in range(n)]
    state = pipeline.State(hosts, pipeline.Options(**kw), ClusterReport(hosts=[]))
    state.probes = {h.name: {"facts": {"gpu.count": str(gpus)}} for h in hosts}
    state.alive = hosts
    return state


def test_node_checks_left_to_the_cluster_launches_only_where_those_run_every_rank():
    left = pipeline.left_to_cluster
    # CPU nodes: the all-node torchrun's DDP and the mpirun pass the same CPU buffers.
    cpu = _state(0, cluster_requires=CPU_CLUSTER, check_args=["--profile", "cpu"])
    assert left(cpu.alive[0], cpu) == ["ddp", "mpi"]
    # GPU nodes: DDP runs a rank on each GPU; the node's mpi check passes CuPy buffers, which
    # the cluster's mpirun does not, so it stays.
    gpu = _state(8, cluster_requires=QUICK_CLUSTER)
    assert left(gpu.alive[0], gpu) == ["ddp"]
    # Fewer ranks than GPUs: some GPUs never run DDP in the cluster launch.
    assert left(gpu.alive[0], _state(8, cluster_requires=QUICK_CLUSTER, nproc_per_node=4)) == []
    # The user chose the node checks, the stage is not selected, the verdict does not require
    # the covering result, or one node: nothing is left.
    only = _state(0, cluster_requires=CPU_CLUSTER, check_args=["--profile", "cpu", "--only=ddp"])
    assert left(only.alive[0], only) == []
    no_torch = _state(0, cluster_requires=CPU_CLUSTER, stages=("check", "rendezvous", "mpi"))
    assert left(no_torch.alive[0], no_torch) == ["mpi"]
    assert left(gpu.alive[0], _state(8, cluster_requires={"gpu": ("ddp",)})) == ["ddp"]
    assert left(gpu.alive[0], _state(8)) == []
    solo = _state(0, n=1, cluster_requires=CPU_CLUSTER)
    assert left(solo.alive[0], solo) == []


def test_the_check_stage_leaves_ddp_to_the_torch_launch_and_its_result_says_so(tmp_path):
    log = tmp_path / "argv.log"
    python = tmp_path / "python3"
    python.write_text(
        FAKE_NODE.replace(
            "import json, sys",
            f"import json, subprocess, sys\nREAL = {sys.executable!r}\n"
            f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
            "if sys.argv[1:3] == ['-m', 'gpuenv']:\n"
            "    sys.exit(subprocess.call([REAL, *sys.argv[1:], '--only', 'system']))",
        )
    )
    python.chmod(0o755)
    hosts = [emulated("a", python=str(python)), emulated("b", python=str(python))]
    run = pipeline.validate(
        hosts, opts(stages=("check", "rendezvous", "torch"), cluster_requires=QUICK_CLUSTER)
    )
    checks = [line for line in log.read_text().splitlines() if line.startswith("-m gpuenv ")]
    assert len(checks) == 2 and all("--left-to-cluster ddp " in c for c in checks), checks
    ddp = by(run, "ddp")
    assert ddp.status is Status.PASS, ddp.reason
    assert ddp.reason.endswith("[stands for the ddp check of a, b]")
    assert ddp.details["node_checks_left_here"] == ["a", "b"]
    assert {r.check for r in run.results if r.node == "a"} >= {"system"}
    assert not any(r.check == "ddp" and r.node == "a" for r in run.results)


def test_a_torch_stage_that_cannot_run_names_the_node_checks_left_to_it():
    hosts = [emulated("a"), emulated("b")]
    # No rendezvous stage: the torch stage cannot run, and its SKIP is the nodes' ddp.
    run = pipeline.validate(
        hosts,
        opts(stages=("check", "torch"), cluster_requires=CPU_CLUSTER,
             check_args=["--profile", "cpu"]),
    )  # fmt: skip
    ddp = by(run, "ddp")
    assert ddp.status is Status.SKIP
    assert ddp.reason == (
        "the torch stage did not run: the rendezvous stage did not pass"
        " [stands for the ddp check of a, b]"
    )
    assert not any(r.check == "ddp" and r.node in "ab" for r in run.results)
    assert by(run, "mpi", "a").status is not Status.SKIP  # no mpi stage: the node runs it
    # --only in the node arguments: nothing is left to the cluster.
    run = pipeline.validate(
        hosts,
        opts(stages=("check", "torch"), cluster_requires=CPU_CLUSTER,
             check_args=["--profile", "cpu", "--only", "system"]),
    )  # fmt: skip
    assert "stands for" not in by(run, "ddp").reason


def test_health_check_and_rendezvous_run_at_the_same_time_and_report_in_order(tmp_path):
    """Each node's python logs when each command starts and ends; the check sleeps 2 s. The
    health scan and the rendezvous probe start before any check has ended, and the report
    keeps the stages' order."""
    log = tmp_path / "times.log"
    python = tmp_path / "python3"
    python.write_text(
        "#!/bin/bash\n"
        f'echo "start $2:$3 $(date +%s.%N)" >> {log}\n'
        '[ "$3" = check ] && sleep 2\n'
        f'{sys.executable} "$@"; rc=$?\n'
        f'echo "end $2:$3 $(date +%s.%N)" >> {log}\n'
        "exit $rc\n"
    )
    python.chmod(0o755)
    hosts = [emulated("a", python=str(python)), emulated("b", python=str(python))]
    run = pipeline.validate(
        hosts,
        opts(stages=("health", "check", "rendezvous"), check_args=["--profile", "cpu",
             "--only", "system"]),
    )  # fmt: skip
    times: dict[tuple[str, str], list[float]] = {}
    for line in log.read_text().splitlines():
        edge, what, at = line.split()
        times.setdefault((edge, what), []).append(float(at))
    checks_end = min(times[("end", "gpuenv:check")])
    assert max(times[("start", "gpuenv:health")]) < checks_end
    assert max(times[("start", "gpuenv.cluster.probe:connect")]) < checks_end
    order = [r.check for r in run.results if r.check in ("health", "system", "rendezvous")]
    first = {name: order.index(name) for name in ("health", "system", "rendezvous")}
    assert first["health"] < first["system"] < first["rendezvous"]
    assert by(run, "rendezvous").status is Status.PASS
    assert set(run.node_reports) == {"a", "b"}
