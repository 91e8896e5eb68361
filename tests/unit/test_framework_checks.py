"""The optional framework checks (pycuda, horovod, tensorflow, dask): their judges with payloads
that must pass and payloads that must not, when they run, and why they skip."""

import pytest

from gpuenv.checks import REGISTRY, dask, horovod, pycuda, tensorflow
from gpuenv.checks.base import Context, NodeInfo, Placement
from gpuenv.checks.profiles import default_names, requirements
from gpuenv.checks.thresholds import load_specs, load_thresholds
from gpuenv.cli.check import resolve_names
from gpuenv.results import Status

H200 = {
    "index": 0,
    "name": "NVIDIA H200",
    "pci_device_id": "0x2335",
    "pcie_max_gen": 5,
    "pcie_max_width": 16,
    "nvlink_links": 18,
    "nvlink_active": 18,
}
UNKNOWN_GPU = {"index": 0, "name": "NVIDIA Mystery", "nvlink_active": 12}  # no NVLink spec row
FRAMEWORKS = ("pycuda", "horovod", "tensorflow", "dask")


def _ctx(**kw):
    return Context(node="n1", thresholds=load_thresholds(), specs=load_specs(), **kw)


def _gpus(n, gpu=H200):
    return NodeInfo(gpus=[{**gpu, "index": i} for i in range(n)])


CPU = NodeInfo(no_gpu="no NVIDIA GPU visible")


# ---------------------------------------------------------------- when they run


def test_framework_checks_are_registered_optional_with_a_deadline():
    thresholds = load_thresholds()
    for name in FRAMEWORKS:
        assert REGISTRY[name].OPTIONAL is True
        assert thresholds["deadlines_s"][name] > 0


def test_optional_checks_run_only_when_asked():
    thresholds = load_thresholds()
    for profile in ("quick", "full", "cpu"):
        names = default_names(REGISTRY, thresholds, profile)
        assert not set(FRAMEWORKS) & set(names), profile
        assert "mpi" in names and "system" in names
    assert set(FRAMEWORKS) <= set(default_names(REGISTRY, thresholds, "frameworks"))
    known = list(REGISTRY)
    assert resolve_names(["dask"], known, default_names(REGISTRY, thresholds, "quick")) == ["dask"]


def test_the_frameworks_profile_requires_them_and_no_other_profile_does():
    thresholds = load_thresholds()
    gpu = requirements(thresholds, "frameworks", gpu_node=True)
    cpu = requirements(thresholds, "frameworks", gpu_node=False)
    assert set(FRAMEWORKS) <= set(gpu)
    assert set(cpu) >= {"horovod", "tensorflow", "dask"} and "pycuda" not in cpu
    assert "dask" in requirements(thresholds, "frameworks", True, "cluster")
    for profile in ("quick", "full", "cpu"):
        for gpu_node in (True, False):
            for scope in ("node", "cluster"):
                wanted = requirements(thresholds, profile, gpu_node, scope) or []
                assert not {*FRAMEWORKS} & set(wanted), (profile, gpu_node, scope)


@pytest.mark.parametrize(
    ("check", "missing", "reason"),
    [
        (pycuda, "pycuda", "pycuda not installed"),
        (horovod, "horovod", "horovod not installed"),
        (tensorflow, "tensorflow", "tensorflow not installed"),
        (dask, "distributed", "distributed not installed"),
    ],
)
def test_each_skips_naming_its_missing_framework(monkeypatch, check, missing, reason):
    monkeypatch.setattr(check, "has_module", lambda m: m != missing)
    assert check.unavailable(_ctx(), CPU) == reason


def test_pycuda_needs_nvcc(monkeypatch):
    monkeypatch.setattr(pycuda, "has_module", lambda m: True)
    monkeypatch.setattr(pycuda, "nvcc", lambda: None)
    assert "nvcc not found" in pycuda.unavailable(_ctx(), _gpus(1))


def test_dask_on_a_gpu_node_needs_cupy(monkeypatch):
    monkeypatch.setattr(dask, "has_module", lambda m: m != "cupy")
    assert dask.unavailable(_ctx(), _gpus(2)) == (
        "cupy not installed (needed for CuPy blocks on GPU workers)"
    )
    assert dask.unavailable(_ctx(), CPU) is None


def test_placements_and_worlds():
    assert pycuda.PLACEMENT is Placement.GPU and pycuda.world(_ctx(), _gpus(4)) == 4
    assert horovod.world(_ctx(), CPU) == 2 and horovod.world(_ctx(), _gpus(1)) == 2
    assert horovod.world(_ctx(), _gpus(8)) == 8
    assert tensorflow.world(_ctx(), _gpus(8)) == 1 and dask.world(_ctx(), _gpus(8)) == 1
    assert dask.workers_for(0) == 2 and dask.workers_for(1) == 2 and dask.workers_for(4) == 4


# ---------------------------------------------------------------- pycuda


def _overlap(overlap, errors=()):
    return {
        "t_copy_ms": 10.0,
        "t_compute_ms": 10.0,
        "t_both_ms": 20.0 - overlap * 10.0,
        "overlap": overlap,
        "errors": list(errors),
        "versions": {"pycuda": "2025.1.2"},
    }


def test_pycuda_passes_when_verified_and_overlapping():
    r = pycuda.judge(_ctx(), _gpus(2), {0: _overlap(0.95), 1: _overlap(0.9)}, 2)
    assert r.status is Status.PASS, r.reason
    assert r.check == "pycuda" and "`add` verified" in r.reason
    assert r.versions["pycuda"] == "2025.1.2"


def test_pycuda_fails_on_wrong_values_or_serialised_streams():
    wrong = pycuda.judge(
        _ctx(), _gpus(1), {0: _overlap(0.95, ["`add` kernel on a stream gave wrong values"])}, 1
    )
    assert wrong.status is Status.FAIL and "GPU0: `add` kernel" in wrong.reason
    serial = pycuda.judge(_ctx(), _gpus(2), {0: _overlap(0.9), 1: _overlap(0.05)}, 2)
    assert serial.status is Status.FAIL
    assert "GPU1: overlap 0.05 < 0.5" in serial.reason
    # The threshold is the streams check's.
    ctx = _ctx()
    ctx.thresholds["streams"]["min_overlap"] = 0.99
    assert pycuda.judge(ctx, _gpus(1), {0: _overlap(0.95)}, 1).status is Status.FAIL


# ---------------------------------------------------------------- tensorflow


def _tf(**kw):
    payload = {
        "losses": [1.0, 0.6, 0.4, 0.3, 0.2],
        "replica_max_diff": 0.0,
        "replicas": 2,
        "devices": ["/job:localhost/replica:0/task:0/device:CPU:0", "…CPU:1"],
        "step_time_s": 0.01,
        "device_kind": "cpu",
        "physical_devices": 0,
        "tensorflow": "2.21.0",
    }
    payload.update(kw)
    return payload


def test_tensorflow_on_cpu_passes_and_says_it_ran_on_cpu():
    r = tensorflow.judge(_ctx(), CPU, {0: _tf()}, 1)
    assert r.status is Status.PASS, r.reason
    assert "CPU only" in r.reason and "no GPU verified" in r.reason
    assert r.details["device_kind"] == "cpu"


def test_tensorflow_on_gpus_passes_and_names_a_split_gpu():
    r = tensorflow.judge(_ctx(), _gpus(1), {0: _tf(device_kind="gpu", physical_devices=1)}, 1)
    assert r.status is Status.PASS and "2 logical GPUs on one" in r.reason


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"replica_max_diff": 1e-3}, "replicas' variables differ"),
        ({"losses": [1.0, 0.99, 0.98]}, "loss did not decrease enough"),
        ({"losses": [1.0, 2.0]}, "loss did not decrease enough"),
        ({"replicas": 1}, "a mirror of itself"),
    ],
)
def test_tensorflow_fails_on_bad_training(bad, words):
    r = tensorflow.judge(_ctx(), CPU, {0: _tf(**bad)}, 1)
    assert r.status is Status.FAIL and words in r.reason


def test_tensorflow_that_sees_no_gpu_on_a_gpu_node_fails():
    r = tensorflow.judge(_ctx(), _gpus(2), {0: _tf()}, 1)
    assert r.status is Status.FAIL and "TensorFlow sees none" in r.reason
    fewer = tensorflow.judge(_ctx(), _gpus(4), {0: _tf(device_kind="gpu", physical_devices=2)}, 1)
    assert fewer.status is Status.FAIL and "TensorFlow sees 2 of the node's 4 GPUs" in fewer.reason


# ---------------------------------------------------------------- horovod


def _hvd(rank, kind="cpu", device=None, seconds=0.01, nbytes=64 << 20, errors=()):
    return {
        "errors": list(errors),
        "bytes": nbytes,
        "allreduce_s": seconds,
        "device_kind": kind,
        "device": device,
        "horovod": "0.28.1",
        "torch": "2.13.0",
    }


def test_horovod_on_cpu_passes_on_values_and_reports_bandwidth_only():
    r = horovod.judge(_ctx(), CPU, {0: _hvd(0), 1: _hvd(1)}, 2)
    assert r.status is Status.PASS, r.reason
    assert "reported only (gloo between CPU ranks" in r.reason
    busbw = next(m for m in r.measurements if m.name == "busbw")
    assert busbw.threshold is None and busbw.bound is None


def test_horovod_fails_on_wrong_sums_and_on_one_rank():
    wrong = horovod.judge(
        _ctx(), CPU, {0: _hvd(0), 1: _hvd(1, errors=["hvd.allreduce: wrong sum"])}, 2
    )
    assert wrong.status is Status.FAIL and "rank 1: hvd.allreduce: wrong sum" in wrong.reason
    alone = horovod.judge(_ctx(), CPU, {0: _hvd(0)}, 1)
    assert alone.status is Status.FAIL and "proves nothing" in alone.reason


def test_horovod_on_gpus_is_held_to_the_nccl_floor():
    # 2 x H200 over NVLink: floor 450 x 0.6 = 270 GB/s; busbw = algbw for 2 ranks.
    fast = {r: _hvd(r, "cuda", r, seconds=(1 << 30) / 330e9, nbytes=1 << 30) for r in (0, 1)}
    r = horovod.judge(_ctx(), _gpus(2), fast, 2)
    assert r.status is Status.PASS and ">= 270.0 GB/s (NVLink" in r.reason
    slow = {r: _hvd(r, "cuda", r, seconds=(1 << 30) / 100e9, nbytes=1 << 30) for r in (0, 1)}
    r = horovod.judge(_ctx(), _gpus(2), slow, 2)
    assert r.status is Status.FAIL and "< 270.0 GB/s" in r.reason


def test_horovod_on_a_gpu_without_spec_is_not_judged():
    payloads = {r: _hvd(r, "cuda", r) for r in (0, 1)}
    r = horovod.judge(_ctx(), _gpus(2, UNKNOWN_GPU), payloads, 2)
    assert r.status is Status.SKIP and "NOT JUDGED" in r.reason
    strict = horovod.judge(_ctx(strict=True), _gpus(2, UNKNOWN_GPU), payloads, 2)
    assert strict.status is Status.FAIL


# ---------------------------------------------------------------- dask


def _dask(**kw):
    payload = {
        "blocks": "numpy",
        "result_type": "numpy",
        "n": 1024,
        "chunk": 256,
        "max_abs_err": 0.0,
        "workers": ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"],
        "workers_used": ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"],
        "worker_gpus": {},
        "worker_hosts": ["127.0.0.1"],
        "compute_s": 1.2,
        "cluster": "local scheduler",
        "left_running": [],
        "dask": "2026.8.0",
        "distributed": "2026.8.0",
    }
    payload.update(kw)
    return payload


def _cupy(**kw):
    return _dask(
        blocks="cupy",
        result_type="cupy",
        worker_gpus={"tcp://127.0.0.1:1": "0000:17:00.0", "tcp://127.0.0.1:2": "0000:18:00.0"},
        **kw,
    )


def test_dask_with_numpy_blocks_passes_and_says_cpu_only():
    r = dask.judge(_ctx(), CPU, {0: _dask()}, 1)
    assert r.status is Status.PASS, r.reason
    assert "numpy blocks (no GPU: CPU only)" in r.reason


def test_dask_with_cupy_blocks_on_two_gpus_passes():
    r = dask.judge(_ctx(), _gpus(2), {0: _cupy()}, 1)
    assert r.status is Status.PASS and "CuPy blocks on 2 GPU(s)" in r.reason


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"max_abs_err": 0.5}, "differs from numpy's by 0.5"),
        ({"max_abs_err": float("nan")}, "differs from numpy's"),
        ({"result_type": "cupy"}, "came back as a cupy array, not numpy"),
        ({"workers_used": ["tcp://127.0.0.1:1"]}, "worker(s) tcp://127.0.0.1:2 ran no task"),
        (
            {"workers": ["tcp://127.0.0.1:1"], "workers_used": ["tcp://127.0.0.1:1"]},
            "1 of 2 workers",
        ),
        ({"left_running": ["4242"]}, "still running after shutdown: 4242"),
    ],
)
def test_dask_fails_on_bad_runs(bad, words):
    r = dask.judge(_ctx(), CPU, {0: _dask(**bad)}, 1)
    assert r.status is Status.FAIL and words in r.reason, r.reason


def test_dask_on_gpus_fails_with_numpy_blocks_or_one_shared_gpu():
    numpy_on_gpus = dask.judge(_ctx(), _gpus(2), {0: _dask()}, 1)
    assert numpy_on_gpus.status is Status.FAIL and "blocks were numpy" in numpy_on_gpus.reason
    same = {"tcp://127.0.0.1:1": "0000:17:00.0", "tcp://127.0.0.1:2": "0000:17:00.0"}
    one_gpu = dask.judge(_ctx(), _gpus(2), {0: _cupy() | {"worker_gpus": same}}, 1)
    assert one_gpu.status is Status.FAIL and "1 distinct GPU(s), expected 2" in one_gpu.reason
    # On a one-GPU node the two workers share it, and that is right.
    shared = dask.judge(_ctx(), _gpus(1), {0: _cupy() | {"worker_gpus": same}}, 1)
    assert shared.status is Status.PASS, shared.reason


def test_dask_workers_see_the_parents_visible_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert dask.visible_gpu_ids(2) == ["2", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert dask.visible_gpu_ids(2) == ["0", "1"]


# ---------------------------------------------------------------- the cluster's dask stage


def test_the_dask_stage_runs_only_when_asked():
    from gpuenv.cli.cluster import _stages
    from gpuenv.cluster import pipeline
    from gpuenv.errors import BadInput

    assert "dask" in pipeline.OPTIONAL_STAGES
    assert "dask" not in _stages([])
    assert _stages([], ["dask"])[-1] == "dask"
    thresholds = load_thresholds()
    required = requirements(thresholds, "frameworks", False, "cluster")
    assert "dask" in _stages([], [], required)
    assert "dask" not in _stages(["dask"], [], required)  # --skip wins
    with pytest.raises(BadInput, match="--with: unknown stage"):
        _stages([], ["torch"])  # not an optional stage: it runs anyway


def test_an_empty_stage_list_leaves_optional_stages_out(monkeypatch):
    from gpuenv.cluster import pipeline

    ran = []
    stages = tuple(
        pipeline.Stage(s.name, lambda state, n=s.name: ran.append(n), optional=s.optional)
        for s in pipeline.STAGES
    )
    monkeypatch.setattr(pipeline, "STAGES", stages)
    monkeypatch.setattr(pipeline, "probe_stage", lambda state: None)
    monkeypatch.setattr(pipeline, "_why_not", lambda stage, state: None)
    pipeline.validate([], pipeline.Options())
    assert "dask" not in ran and "torch" in ran
    ran.clear()
    pipeline.validate([], pipeline.Options(stages=("dask",)))
    assert ran == ["dask"]
