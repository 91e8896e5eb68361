"""The fabric's rules (gpuenv.checks.fabric, the cluster's busbw and fabric stage), each test
named for the hole it closes, on the fixtures of tests/fixtures/fabric-logs/ (their README cites
the public output each shape comes from) and on sysfs trees built here."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuenv.checks import fabric, nccl_log
from gpuenv.checks.base import Context, NodeInfo
from gpuenv.checks.thresholds import load_specs, load_thresholds
from gpuenv.cli import main
from gpuenv.cluster import judge
from gpuenv.floor import net
from gpuenv.results import Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric-logs"
NDR = "400 Gb/sec (4X NDR)"


def log(name: str) -> nccl_log.Transports:
    return nccl_log.parse((FIXTURES / name).read_text(encoding="utf-8").splitlines())


def port(device: str, state: str = "ACTIVE", phys: str = "LinkUp", rate: str = NDR,
         layer: str = "InfiniBand", number: str = "1") -> net.Port:  # fmt: skip
    return net.Port(device, number, state, phys, rate, layer)


def hgx(state: str = "ACTIVE", phys: str = "LinkUp", **kw) -> fabric.NodeFabric:
    """An HGX node: eight 400 Gb/s rails mlx5_0..7 and a storage port mlx5_8."""
    ports = [port(f"mlx5_{i}", state, phys) for i in range(8)]
    ports.append(port("mlx5_8", "ACTIVE", "LinkUp", "200 Gb/sec (2X NDR)", "Ethernet"))
    settings = kw.pop("settings", None) or {
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"
    }
    return fabric.NodeFabric(ports=ports, settings=settings, verbs="/usr/lib/libibverbs.so.1",
                             gdr=fabric.GdrFacts(peermem=True), **kw)  # fmt: skip


def bandwidth(t_by_node, nodes, value, gdr_required=True, min_busbw=None):
    merged = nccl_log.merge(t.to_dict() for t in t_by_node.values())
    sweeps = {n: [{"bytes": 1 << 30, "busbw_gbps": value}] for n in t_by_node}
    return judge.busbw(judge.Bandwidth(
        sweeps, "nccl", merged, 50.0, {n: [] for n in nodes}, min_busbw, 1 << 30,
        nodes=nodes, per_node=t_by_node, gpu_nodes=frozenset(nodes), gdr_required=gdr_required,
    ))  # fmt: skip


# ---------------------------------------------------------------- NCCL_IB_HCA


@pytest.mark.parametrize(
    ("spec", "selected"),
    [
        ("mlx5", ["mlx5_0/1", "mlx5_1/1", "mlx5_1/2", "mlx5_10/1"]),  # prefixes
        ("=mlx5_1", ["mlx5_1/1", "mlx5_1/2"]),  # exact name
        ("=mlx5_1:2", ["mlx5_1/2"]),  # one port
        ("mlx5_1:1,mlx5_10", ["mlx5_1/1", "mlx5_10/1"]),
        ("^mlx5_1", ["mlx5_0/1"]),  # exclusion by prefix: mlx5_10 goes too
        ("^=mlx5_1", ["mlx5_0/1", "mlx5_10/1"]),  # exclusion of the exact name
        ("", ["mlx5_0/1", "mlx5_1/1", "mlx5_1/2", "mlx5_10/1"]),  # unset: every IB/RoCE port
    ],
)
def test_nccl_ib_hca_is_read_as_nccl_reads_it(spec, selected):
    ports = [port("mlx5_0"), port("mlx5_1"), port("mlx5_1", number="2"), port("mlx5_10")]
    assert [p.name for p in net.rails(ports, net.hca_spec(spec))] == selected


# ---------------------------------------------------------------- rails on one node


def test_hole_a_rail_that_is_not_active_fails_naming_device_port_and_state():
    node = hgx()
    node.ports[3] = port("mlx5_3", "INIT", "LinkUp")
    found, notes = fabric.rail_problems(node)
    assert found == [
        "rail mlx5_3 port 1 is INIT (physical LinkUp): the link is up but no subnet manager has"
        " configured the port (start opensm or the switch's SM)"
    ]
    assert notes and "mlx5_8 port 1 is ACTIVE" in notes[0] and "not a rail" in notes[0]


def test_a_port_that_is_not_a_rail_is_reported_not_judged():
    node = hgx()
    node.ports[8] = port("mlx5_8", "DOWN", "Disabled", layer="Ethernet")
    found, notes = fabric.rail_problems(node)
    assert found == [] and "not a rail (NCCL_IB_HCA==mlx5_0" in notes[0]
    assert "mlx5_8 port 1 is DOWN (physical Disabled)" in notes[0]


def test_without_nccl_ib_hca_every_ib_and_roce_port_is_a_rail():
    node = hgx()
    node.settings = {}
    node.ports[8] = port("mlx5_8", "DOWN", "Polling", layer="Ethernet")
    found, _ = fabric.rail_problems(node)
    assert found and "rail mlx5_8 port 1 is DOWN (physical Polling)" in found[0]


def test_settings_in_force_against_what_nccl_loaded():
    node = hgx(loaded=log("nccl-8-rails-gdr.log"))
    assert fabric.settings_problems(node) == ([], [])
    node.settings["NCCL_IB_GID_INDEX"] = "3"
    node.settings["NCCL_SOCKET_IFNAME"] = "eth0"
    found, _ = fabric.settings_problems(node)
    assert "NCCL_IB_GID_INDEX=3 is set but NCCL did not report loading it" in found
    assert "NCCL_SOCKET_IFNAME: set to 'eth0', NCCL loaded 'ibp12s0'" in found


def test_nccl_opening_a_port_that_is_not_an_active_rail_fails():
    node = hgx(loaded=log("nccl-8-rails-gdr.log"))
    node.ports[7] = port("mlx5_7", "DOWN", "Polling")
    found, _ = fabric.settings_problems(node)
    assert found == ["NCCL opened mlx5_7:1, which are not active rails"]


def test_roce_settings_loaded_as_set():
    ports = [port("mlx5_10", layer="Ethernet"), port("mlx5_11", layer="Ethernet")]
    node = fabric.NodeFabric(ports=ports, settings={"NCCL_IB_GID_INDEX": "3", "NCCL_IB_TC": "106"},
                             loaded=log("nccl-roce-2-rails-gid3.log"))  # fmt: skip
    assert fabric.settings_problems(node) == ([], [])
    node.settings["NCCL_IB_TC"] = "41"
    assert fabric.settings_problems(node)[0] == ["NCCL_IB_TC: set to '41', NCCL loaded '106'"]


def test_error_counters_that_grew_name_the_port():
    before = {"mlx5_0/1": {"symbol_error": 0, "link_downed": 1}, "mlx5_1/1": {"symbol_error": 4}}
    after = {"mlx5_0/1": {"symbol_error": 12, "link_downed": 2}, "mlx5_1/1": {"symbol_error": 4}}
    assert fabric.counter_problems(before, after) == [
        "mlx5_0/1: error counters grew during the run: link_downed 1 -> 2, symbol_error 0 -> 12"
    ]
    assert fabric.counter_problems(before, before) == []


def _sysfs(root: Path, device: str, state: str, counters: dict[str, int]) -> None:
    base = root / "sys/class/infiniband" / device / "ports/1"
    (base / "counters").mkdir(parents=True)
    (base / "state").write_text(f"{ {'ACTIVE': 4, 'INIT': 2}[state] }: {state}\n")
    (base / "phys_state").write_text("5: LinkUp\n")
    (base / "rate").write_text(f"{NDR}\n")
    (base / "link_layer").write_text("InfiniBand\n")
    for name, value in counters.items():
        (base / "counters" / name).write_text(f"{value}\n")


def test_the_floor_reads_ports_counters_settings_and_peermem(tmp_path):
    _sysfs(tmp_path, "mlx5_0", "ACTIVE", {"symbol_error": 3, "link_downed": 0})
    _sysfs(tmp_path, "mlx5_1", "INIT", {"port_rcv_errors": 7})
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nccl.conf").write_text("NCCL_IB_HCA=mlx5_1\nNCCL_IB_TC=106\n# x=1\n")
    (tmp_path / "sys/module/nvidia_peermem").mkdir(parents=True)
    node = fabric.read_node(str(tmp_path), {"NCCL_IB_HCA": "=mlx5_0", "PATH": "/bin"})
    assert node.settings == {"NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_TC": "106"}  # env wins
    assert [p.name for p in node.rails] == ["mlx5_0/1"]
    assert node.before == {"mlx5_0/1": {"symbol_error": 3, "link_downed": 0},
                           "mlx5_1/1": {"port_rcv_errors": 7}}  # fmt: skip
    assert node.gdr.peermem is True and node.verbs is None


# ---------------------------------------------------------------- the node check


def _ctx() -> Context:
    return Context(node="n1", thresholds=load_thresholds(), specs=load_specs())


def test_fabric_is_not_needed_and_skips_where_there_is_no_ib():
    bare = NodeInfo(gpus=[{"index": 0}])
    assert not fabric.needed(bare)
    assert "no InfiniBand/RoCE port" in fabric.unavailable(_ctx(), bare)
    with_ib = NodeInfo(gpus=[{"index": 0}], rdma_ports=["mlx5_0/1"])
    assert fabric.needed(with_ib) and fabric.unavailable(_ctx(), with_ib) is None


def test_the_fabric_check_judges_rails_settings_and_counters():
    node = hgx(loaded=log("nccl-8-rails-gdr.log"))
    node.after = {"mlx5_0/1": {"symbol_error": 0}}
    node.before = {"mlx5_0/1": {"symbol_error": 0}}
    good = fabric.judge(_ctx(), NodeInfo(), {0: node.to_dict()}, 1)
    assert good.status is Status.PASS and "mlx5_7:1 ACTIVE" in good.reason
    node.ports[2] = port("mlx5_2", "INIT")
    node.after = {"mlx5_0/1": {"symbol_error": 9}}
    bad = fabric.judge(_ctx(), NodeInfo(), {0: node.to_dict()}, 1)
    assert bad.status is Status.FAIL
    assert "rail mlx5_2 port 1 is INIT" in bad.reason
    assert "mlx5_0/1: error counters grew during the run: symbol_error 0 -> 9" in bad.reason


# ---------------------------------------------------------------- across nodes


def test_hole_ib_present_but_not_active_fails_the_socket_fallback_naming_the_cause():
    t = log("nccl-socket-fallback-ib-init.log")
    nodes = {"n1": hgx("INIT"), "n2": hgx("INIT")}
    result, _ = bandwidth({"n1": t, "n2": t}, nodes, 0.05, min_busbw=0.03)
    assert result.status is Status.FAIL
    assert "NCCL fell back to TCP sockets across nodes" in result.reason
    assert "n1: rail mlx5_0 port 1 is INIT (physical LinkUp)" in result.reason
    assert "no subnet manager" in result.reason


def test_socket_fallback_with_active_rails_names_missing_verbs():
    t = log("nccl-socket-fallback-ib-init.log")
    n2 = hgx()
    n2.verbs = None
    result, _ = bandwidth({"n1": t, "n2": t}, {"n1": hgx(), "n2": n2}, 0.05, min_busbw=0.03)
    assert "n2: libibverbs.so.1 not found (install rdma-core / libibverbs1)" in result.reason


def test_hole_one_node_with_rails_is_enough_to_fail_a_socket_fallback():
    # Today's rule wanted an active port on every node: one node without IB let it pass.
    t = nccl_log.parse(["Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"])
    assert nccl_log.inter_node_problems(t, {"n1": ["mlx5_0/1"], "n2": []})
    bare = fabric.NodeFabric(ports=[])
    result, _ = bandwidth({"n1": t, "n2": t}, {"n1": hgx(), "n2": bare}, 1.0, min_busbw=0.5)
    assert result.status is Status.FAIL and "n1 has InfiniBand/RoCE rails" in result.reason


def test_hole_eight_rails_are_judged_as_eight_not_half_of_one():
    t = log("nccl-8-rails-gdr.log")
    nodes = {"n1": hgx(), "n2": hgx()}
    assert t.used_devices() == [f"mlx5_{i}:1" for i in range(8)]
    result, floor = bandwidth({"n1": t, "n2": t}, nodes, 30.0)
    assert floor == pytest.approx(0.5 * 8 * 50.0)  # 200 GB/s, not 25
    assert result.status is Status.FAIL
    assert "busbw 30.00 GB/s at 1024 MiB < 200.00 GB/s" in result.reason
    assert "0.5 x 8 rail(s) NCCL used on n1 x their rate = 0.5 x 400 GB/s" in result.reason
    assert "one rail's worth (50 GB/s) with 8 active rails" in result.reason
    healthy, _ = bandwidth({"n1": t, "n2": t}, nodes, 360.0)
    assert healthy.status is Status.PASS, healthy.reason


def test_hole_a_node_that_uses_one_of_eight_rails_fails_naming_the_idle_ones():
    one = log("nccl-1-of-8-rails.log")
    all8 = log("nccl-8-rails-gdr.log")
    result, floor = bandwidth({"n1": all8, "n2": one}, {"n1": hgx(), "n2": hgx()}, 45.0)
    assert result.status is Status.FAIL
    idle = ", ".join(f"mlx5_{i}:1" for i in range(1, 8))
    assert f"n2: NCCL used 1 of 8 rails; idle: {idle}" in result.reason
    assert floor == pytest.approx(0.5 * 50.0)  # the floor follows what NCCL used


def test_hole_gdr_off_fails_naming_why():
    t = log("nccl-8-rails-gdr-off.log")
    n1 = hgx()
    n1.gdr = fabric.GdrFacts(peermem=False, acs_bridges=("0000:15:01.0",))
    result, _ = bandwidth({"n1": t, "n2": t}, {"n1": n1, "n2": hgx()}, 360.0)
    assert result.status is Status.FAIL
    assert "n1: NCCL's channels over IB/RoCE show no /GDRDMA" in result.reason
    assert "GPU Direct RDMA Disabled for HCA 0 'mlx5_0'" in result.reason
    assert (
        "nvidia_peermem is not loaded" in result.reason
        and "ACS redirect on 0000:15:01.0" in result.reason
    )
    assert "n2: NCCL's channels over IB/RoCE show no /GDRDMA" in result.reason


def test_gdr_not_required_lets_a_site_without_gdr_pass():
    t = log("nccl-8-rails-gdr-off.log")
    result, _ = bandwidth({"n1": t, "n2": t}, {"n1": hgx(), "n2": hgx()}, 360.0, gdr_required=False)
    assert result.status is Status.PASS, result.reason


def test_gdr_on_is_read_from_the_channel_lines():
    t = log("nccl-8-rails-gdr.log")
    assert t.gdrdma and "GPU Direct RDMA Enabled for HCA 0 'mlx5_0'" in t.gdr_lines
    assert t.settings["NCCL_SOCKET_IFNAME"] == "ibp12s0"


def test_roce_rails_set_the_floor_from_their_rate():
    t = log("nccl-roce-2-rails-gid3.log")
    ports = [port(f"mlx5_1{i}", rate="400 Gb/sec (4X NDR)", layer="Ethernet") for i in (0, 1)]
    nodes = {n: fabric.NodeFabric(ports=list(ports), gdr=fabric.GdrFacts(peermem=True))
             for n in ("n1", "n2")}  # fmt: skip
    assert fabric.rails_floor(nodes, {"n1": t, "n2": t})[0] == pytest.approx(0.5 * 100.0)


def test_gdr_required_is_a_documented_threshold_and_a_cluster_option():
    assert load_thresholds()["fabric"]["gdr_required"] is True
    assert load_thresholds(text="fabric: {gdr_required: false}")["fabric"]["gdr_required"] is False


# ---------------------------------------------------------------- perftest


def test_ib_write_bw_output_is_parsed_in_either_unit():
    fast = fabric.parse_ib_write_bw((FIXTURES / "ib_write_bw-ndr-cuda-gbits.txt").read_text())
    assert fast == {"bytes": 65536, "iterations": 50000, "peak_gbps": 392.84 / 8,
                    "average_gbps": 391.27 / 8}  # fmt: skip
    roce = fabric.parse_ib_write_bw((FIXTURES / "ib_write_bw-roce-mbytes.txt").read_text())
    assert roce is not None and roce["average_gbps"] == pytest.approx(11.54112)
    assert fabric.parse_ib_write_bw((FIXTURES / "ib_write_bw-no-peer.txt").read_text()) is None


def test_the_pair_test_holds_each_rail_to_nine_tenths_of_its_port_rate():
    text = {n: (FIXTURES / f"ib_write_bw-{n}.txt").read_text()
            for n in ("ndr-cuda-gbits", "ndr-slow-gbits", "no-peer")}  # fmt: skip
    good = judge.RailRun("n1", "n2", "mlx5_0:1", 50.0, text["ndr-cuda-gbits"], True)
    slow = judge.RailRun("n1", "n2", "mlx5_3:1", 50.0, text["ndr-slow-gbits"], False)
    gone = judge.RailRun("n2", "n1", "mlx5_0:1", 50.0, text["no-peer"], False)
    assert judge.fabric_pairs([good], 0.9, 1.0).status is Status.PASS
    bad = judge.fabric_pairs([good, slow, gone], 0.9, 1.0)
    assert bad.status is Status.FAIL
    assert "n1 -> n2 over mlx5_3:1: 24.6 GB/s < 0.9 x 50 GB/s port rate" in bad.reason
    assert "n2 -> n1 over mlx5_0:1: ib_write_bw gave no result (" in bad.reason
    assert "mlx5_0:1: 48.9" not in bad.reason


def test_counters_across_the_cluster_name_node_and_port():
    before = {"n1": {"mlx5_0/1": {"link_downed": 0}}, "n2": {"mlx5_0/1": {"link_downed": 0}}}
    after = {"n1": {"mlx5_0/1": {"link_downed": 3}}, "n2": "timed out"}
    r = judge.fabric_counters(before, after, 0.1)
    assert r.status is Status.FAIL
    assert "n1 mlx5_0/1: error counters grew during the run: link_downed 0 -> 3" in r.reason
    assert "n2: counters not read after the runs: timed out" in r.reason
    assert judge.fabric_counters(before, before, 0.1).status is Status.PASS


# ---------------------------------------------------------------- the CLI


def test_gpu_subset_without_cuda_visible_devices_is_bad_input(monkeypatch, capsys):
    import gpuenv.checks.session

    def boom(*args, **kwargs):
        raise AssertionError("checks ran despite bad input")

    monkeypatch.setattr(gpuenv.checks.session, "run_checks", boom)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert main(["check", "--gpu-subset"]) == 2
    assert "--gpu-subset: CUDA_VISIBLE_DEVICES is not set" in capsys.readouterr().err


# ---------------------------------------------------------------- rails paired by GPU affinity


def test_perftest_pairs_rails_by_the_gpu_next_to_them_and_uses_that_gpu():
    from gpuenv.cluster import pipeline
    from gpuenv.cluster.inventory import Host

    a, b = (Host(n, n, "127.0.0.1", local=True) for n in ("a", "b"))
    state = pipeline.State([a, b], pipeline.Options(), None)  # type: ignore[arg-type]
    state.alive = [a, b]
    # a: mlx5_0 next to GPU 1, mlx5_1 next to GPU 0; b: the other way round (name order would
    # pair a's GPU-1 rail with b's GPU-0 rail, across the rail-optimized leaf switches).
    nodes = {
        "a": hgx(
            rail_gpu={"mlx5_0:1": 1, "mlx5_1:1": 0}, settings={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}
        ),
        "b": hgx(
            rail_gpu={"mlx5_0:1": 0, "mlx5_1:1": 1}, settings={"NCCL_IB_HCA": "=mlx5_0,mlx5_1"}
        ),
    }
    ((client, server, rails),) = pipeline._rail_pairs(state, nodes)
    assert (client.name, server.name) == ("a", "b")
    assert [(m.device, t.device) for m, t in rails] == [("mlx5_1", "mlx5_0"), ("mlx5_0", "mlx5_1")]
    argv = pipeline._perftest(
        rails[1][0], 18515, None, pipeline._cuda_gpu(nodes["a"], rails[1][0], True)
    )
    assert "--use_cuda=1" in argv
    assert pipeline._cuda_gpu(nodes["a"], rails[1][0], False) is None
    assert "--use_cuda_dmabuf" not in argv
    dmabuf = hgx()
    dmabuf.gdr = fabric.GdrFacts(peermem=False, dmabuf=True)
    assert pipeline._dmabuf_only(dmabuf) and not pipeline._dmabuf_only(nodes["a"])
    assert pipeline._perftest(rails[0][0], 18515, None, 0, True)[-2:] == [
        "--use_cuda=0",
        "--use_cuda_dmabuf",
    ]
