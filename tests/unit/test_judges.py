"""Every judge, with payloads that must pass and payloads that must not."""

import sys

import pytest

from gpuenv.checks import cupy, ddp, mpi, nccl_log, streams, system
from gpuenv.checks.base import Context, NodeInfo
from gpuenv.checks.thresholds import load_specs, load_thresholds
from gpuenv.results import Status

H200 = {
    "index": 0,
    "name": "NVIDIA H200",
    "pci_device_id": "0x2335",
    "pci_bus_id": "0000:17:00.0",
    "memory_mib": 143771,
    "ecc": True,
    "persistence": True,
    "pcie_max_gen": 5,
    "pcie_max_width": 16,
    "nvlink_links": 18,
    "nvlink_active": 18,
}


def _ctx(**kw):
    return Context(node="n1", thresholds=load_thresholds(), specs=load_specs(), **kw)


# ---------------------------------------------------------------- system


def _system(gpus, pci, available=True, **ctx):
    probe = (
        {"available": True, "driver": "580.159.04", "cuda_driver": "13.0", "gpus": gpus}
        if available
        else {"available": False, "reason": "no NVIDIA GPU visible (NVML: Driver Not Loaded)"}
    )
    payload = {"probe": probe, "pci_gpus": pci, "versions": {}}
    node = system.node_info(payload, None)
    return system.judge(_ctx(**ctx), node, {0: payload}, 1), node


def test_system_passes_when_nvml_sees_every_gpu_on_the_bus():
    result, node = _system([H200], ["0000:17:00.0"])
    assert result.status is Status.PASS and len(node.gpus) == 1


def test_gpus_on_the_bus_without_a_driver_fail_naming_their_addresses():
    result, node = _system([], ["0000:17:00.0", "0000:18:00.0"], available=False)
    assert result.status is Status.FAIL
    assert "0000:17:00.0, 0000:18:00.0" in result.reason and "Driver Not Loaded" in result.reason
    assert node.pci_gpus and not node.gpus


def test_gpus_on_the_bus_without_nvidia_ml_py_say_nvml_was_not_asked(monkeypatch):
    # The probe as it answers without pynvml: nothing was asked of the driver.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe = system.probe()
    assert probe["available"] is False and probe.get("unread") is True
    payload = {"probe": probe, "pci_gpus": ["0000:17:00.0"], "versions": {}}
    result = system.judge(_ctx(), system.node_info(payload, None), {0: payload}, 1)
    assert result.status is Status.FAIL
    assert "NVML could not be asked: nvidia-ml-py (pynvml) not installed" in result.reason
    assert "driver sees none" not in result.reason


def test_a_gpu_the_driver_does_not_see_is_named():
    result, _ = _system([H200], ["0000:17:00.0", "0000:3a:00.0"])
    assert result.status is Status.FAIL
    assert "not seen by the driver: 0000:3a:00.0" in result.reason


def test_expect_gpus_overrides_the_bus():
    assert _system([H200], ["0000:17:00.0"], expect_gpus=2)[0].status is Status.FAIL
    assert _system([H200], ["0000:17:00.0"], expect_gpus=1)[0].status is Status.PASS


def test_a_cpu_only_node_skips_system_with_its_reason():
    result, _ = _system([], [], available=False)
    assert result.status is Status.SKIP and "CPU-only node" in result.reason


def test_pci_bus_is_read_through_the_root_override(tmp_path):
    for addr, vendor, klass in (
        ("0000:17:00.0", "0x10de", "0x030200"),  # NVIDIA 3D controller: a GPU
        ("0000:18:00.0", "0x10de", "0x068000"),  # NVIDIA bridge (NVSwitch): not a GPU
        ("0000:00:02.0", "0x8086", "0x030000"),  # Intel VGA: not NVIDIA
    ):
        dev = tmp_path / "sys/bus/pci/devices" / addr
        dev.mkdir(parents=True)
        (dev / "vendor").write_text(vendor + "\n")
        (dev / "device").write_text("0x2330\n")
        (dev / "class").write_text(klass + "\n")
    assert system.pci_gpus(tmp_path) == ["0000:17:00.0"]
    assert system.pci_gpus(tmp_path / "nothing") is None
    assert system.normal_bus_id("00000000:17:00.0") == "0000:17:00.0"


@pytest.mark.parametrize(
    ("visible", "guess"),
    [
        (None, ["0000:17:00.0", "0000:65:00.0"]),
        ("1", ["0000:65:00.0"]),
        ("1,7,0", ["0000:65:00.0"]),  # CUDA stops at the first invalid entry
        ("", []),
        ("GPU-5f6b5afc", None),  # a UUID: only NVML can tell, no guess
    ],
)
def test_the_probe_s_early_guess_reads_the_driver_s_gpu_list(tmp_path, monkeypatch, visible, guess):
    for bus in ("0000:65:00.0", "0000:17:00.0"):
        (tmp_path / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
    monkeypatch.setenv(system.ROOT_ENV, str(tmp_path))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    node = system.early_node(Context(node="n1"))
    if guess is None:
        assert node is None
    else:
        assert [g["pci_bus_id"] for g in node.gpus] == guess
        assert node.has_gpu is bool(guess)


def test_without_the_driver_the_early_guess_is_a_node_without_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv(system.ROOT_ENV, str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    node = system.early_node(Context(node="n1"))
    assert node is not None and not node.has_gpu


# ---------------------------------------------------------------- cupy, streams


def _cupy(h2d=55.0, gemm=800.0, errors=(), gpu=H200):
    payload = {
        "errors": list(errors),
        "h2d_gbps": h2d,
        "d2h_gbps": h2d,
        "gemm_tflops": gemm,
        "gemm_n": 8192,
        "versions": {},
    }
    return cupy.judge(_ctx(), NodeInfo(gpus=[gpu]), {0: payload}, 1)


def test_cupy_passes_a_healthy_h200_and_fails_a_slow_or_wrong_one():
    assert _cupy().status is Status.PASS
    slow = _cupy(gemm=300.0)
    assert slow.status is Status.FAIL and "gemm_fp16 300.0 TFLOPS < 494.8" in slow.reason
    assert _cupy(h2d=10.0).status is Status.FAIL
    wrong = _cupy(errors=["add kernel: wrong values"])
    assert wrong.status is Status.FAIL and "add kernel" in wrong.reason


def test_cupy_on_a_gpu_without_spec_skips_naming_it():
    result = _cupy(gpu={**H200, "name": "NVIDIA H20", "pci_device_id": "0x2329"})
    assert result.status is Status.SKIP
    assert "no fp16 spec for 'NVIDIA H20' (PCI id 0x2329)" in result.reason


def test_a_gpu_missing_from_the_spec_table_ran_and_the_verdict_says_so():
    from gpuenv.checks import REGISTRY
    from gpuenv.checks.profiles import assess

    gpu = {**H200, "name": "NVIDIA Unlisted", "pci_device_id": "0x9999"}
    result = _cupy(gpu=gpu)
    assert result.status is Status.SKIP and result.measurements  # it measured
    run = assess(load_thresholds(), "quick", NodeInfo(gpus=[gpu]), [result], REGISTRY)
    said = [p for p in run.problems if "required check cupy" in p]
    assert said and said[0].startswith("required check cupy ran but was not judged: ")
    assert not any("cupy did not run" in p for p in run.problems)


def test_streams_fails_when_copy_and_compute_serialise():
    def payload(overlap):
        return {"overlap": overlap, "t_copy_ms": 5, "t_compute_ms": 5, "t_both_ms": 10}

    assert streams.judge(_ctx(), NodeInfo([H200]), {0: payload(0.9)}, 1).status is Status.PASS
    bad = streams.judge(_ctx(), NodeInfo([H200]), {0: payload(0.1)}, 1)
    assert bad.status is Status.FAIL and "serialised" in bad.reason


# ---------------------------------------------------------------- ddp, mpi


def _ddp(world=2, diff=0.0, first=1.0, last=0.3):
    p = {
        "backend": "gloo",
        "steps": 20,
        "losses": [first, last],
        "loss_first": first,
        "loss_last": last,
        "param_max_diff": diff,
        "step_time_s": 0.002,
        "torch": "2.13.0",
    }
    return ddp.judge(_ctx(), NodeInfo(), {r: p for r in range(world)}, world)


def test_ddp_pass_and_its_failures():
    assert _ddp().status is Status.PASS
    assert "parameters differ" in _ddp(diff=1e-3).reason
    assert "loss did not decrease enough" in _ddp(last=0.95).reason
    one = _ddp(world=1)
    assert one.status is Status.FAIL and "prove nothing" in one.reason


def test_ddp_rule_is_shared():
    ok = {"param_max_diff": 0.0, "loss_first": 1.0, "loss_last": 0.5}
    assert ddp.problems(ok, 0.9) == []
    assert ddp.problems({**ok, "loss_first": 0.0}, 0.9)  # no loss to fall from


def _mpi(world=2, errors=()):
    p = {
        "path": "numpy",
        "why": "no GPU",
        "errors": list(errors),
        "bytes": 16,
        "allreduce_s": 0.001,
        "mpi4py": "4.1.2",
        "mpi": "Open MPI v4.1.4",
    }
    return mpi.judge(_ctx(), NodeInfo(), {r: p for r in range(world)}, world)


def test_mpi_pass_and_its_failures():
    assert _mpi().status is Status.PASS
    bad = _mpi(errors=["Bcast: values differ from the root's"])
    assert bad.status is Status.FAIL and "rank 0: Bcast" in bad.reason
    assert _mpi(world=1).status is Status.FAIL


def test_ddp_and_mpi_always_ask_for_two_ranks():
    one_gpu = NodeInfo(gpus=[H200])
    assert ddp.world(_ctx(), one_gpu) == 2 and ddp.backend(one_gpu) == "gloo"
    assert mpi.world(_ctx(), one_gpu) == 2
    assert ddp.world(_ctx(), NodeInfo()) == 2
    two = NodeInfo(gpus=[H200, H200])
    assert ddp.backend(two) == "nccl" and ddp.world(_ctx(), two) == 2


# ---------------------------------------------------------------- NCCL's log


LOG = """\
n1:100:100 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
n1:100:120 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUDA IPC
n1:100:120 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUDA IPC
n1:100:120 [0] NCCL INFO Channel 00/0 : 1[0] -> 2[0] [send] via NET/IB/0/GDRDMA
n1:100:120 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/Socket/1
"""


def test_nccl_log_is_read_by_family():
    t = nccl_log.parse(LOG.splitlines())
    assert t.version == "2.28.9"
    assert t.families == {"P2P": 2, "NET/IB": 1, "NET/Socket": 1}
    assert t.gdrdma
    assert len(t.samples) == 3


def test_socket_fallback_with_active_ib_ports_is_named():
    t = nccl_log.parse(["NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"])
    ports = {"n1": ["mlx5_0/1"], "n2": ["mlx5_0/1"]}
    problems = nccl_log.inter_node_problems(t, ports)
    assert problems and "fell back to TCP sockets" in problems[0]
    assert nccl_log.inter_node_problems(t, {"n1": [], "n2": []}) == []  # no IB: Socket is right


def test_network_floor_follows_the_transport():
    sock = nccl_log.parse(["Channel 00/0 : 0[0] -> 1[0] via NET/Socket/0"])
    ib = nccl_log.parse(["Channel 00/0 : 0[0] -> 1[0] via NET/IB/0"])
    assert nccl_log.floor_gbps(sock, 12.5) == pytest.approx(12.5 * 0.25)
    assert nccl_log.floor_gbps(ib, 25.0) == pytest.approx(12.5)
    assert nccl_log.floor_gbps(ib, None) is None
    assert nccl_log.ib_rate_gbps("200 Gb/sec (4X HDR)") == 25.0
    assert nccl_log.nic_speed_gbps("100000\n") == 12.5
    assert nccl_log.nic_speed_gbps("-1") is None


def test_nccl_logs_are_read_per_process_and_added_up(tmp_path):
    path = tmp_path / "nccl.log"
    path.write_text(LOG)
    one = nccl_log.read(path)
    assert one["families"] == {"P2P": 2, "NET/IB": 1, "NET/Socket": 1}
    assert "cannot be read" in nccl_log.read(tmp_path / "missing.log")["error"]
    both = nccl_log.merge([one, one, {}])
    assert both.families == {"P2P": 4, "NET/IB": 2, "NET/Socket": 2} and both.version == "2.28.9"
    assert len(both.samples) == 3  # the same evidence line is kept once
