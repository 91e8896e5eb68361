"""The `examples` check: what it runs where, how it reads an example's output and judges it,
and real runs: the examples that run on CPU with this venv, and stand-in examples that fail,
crash, hang or print nothing, through the driver's own process engine."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from gpuenv import proc
from gpuenv.checks import REGISTRY, examples
from gpuenv.checks.base import Context, NodeInfo, Placement, has_module
from gpuenv.checks.profiles import default_names, requirements
from gpuenv.checks.thresholds import load_specs, load_thresholds
from gpuenv.results import Status

ROOT = Path(__file__).resolve().parents[2]
CPU = NodeInfo(no_gpu="no NVIDIA GPU visible")
GPU1 = NodeInfo(gpus=[{"index": 0, "name": "NVIDIA H100"}])
ALL = {"run": [e.name for e in examples.EXAMPLES]}


def _ctx(**kw):
    return Context(node="n1", profile="examples", thresholds=load_thresholds(),
                   specs=load_specs(), **kw)  # fmt: skip


def _line(**fields):
    return "EXAMPLE-RESULT " + json.dumps({"example": "x", **fields})


def _ran(name, text, returncode=0, timed_out=False):
    out = examples.read_output(text)
    return {
        "name": name, "argv": ["python3", f"{name}.py"], "returncode": returncode,
        "timed_out": timed_out, "deadline_s": 30.0, "elapsed_s": 1.0, "result": out.result,
        "unreadable": out.unreadable, "errors": out.errors, "tail": out.tail, "signal": out.signal,
    }  # fmt: skip


# ---------------------------------------------------------------- registry, profile, files


def test_registered_optional_launched_with_a_deadline_and_required_by_its_profile_only():
    assert REGISTRY["examples"] is examples and examples.OPTIONAL is True
    assert examples.PLACEMENT is Placement.LAUNCHER
    thresholds = load_thresholds()
    assert thresholds["deadlines_s"]["examples"] > 0
    assert requirements(thresholds, "examples", gpu_node=True) == ["system", "examples"]
    assert requirements(thresholds, "examples", gpu_node=False) == ["examples"]
    assert "examples" in default_names(REGISTRY, thresholds, "examples")
    for profile in ("quick", "full", "cpu", "frameworks"):
        assert "examples" not in default_names(REGISTRY, thresholds, profile), profile


def test_the_profile_runs_every_example_by_default():
    params = load_thresholds()["profiles"]["examples"]["examples"]
    assert params["run"] == [e.name for e in examples.EXAMPLES]


def test_every_example_is_a_file_that_lists_the_documents_bugs_and_prints_its_line():
    folder = examples.examples_dir()
    assert folder is not None
    for example in examples.EXAMPLES:
        text = (folder / f"{example.name}.py").read_text(encoding="utf-8")
        doc = text.split('"""')[1]
        assert "The document's bugs, and the fixes here:" in doc, example.name
        assert "1. " in doc and "EXAMPLE-RESULT" in doc, example.name
        assert f'EXAMPLE = "{example.name}"' in text, example.name
    assert sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__") == sorted(
        e.name for e in examples.EXAMPLES
    )


def test_an_unknown_name_in_the_profile_skips_naming_it():
    ctx = _ctx()
    ctx.thresholds["profiles"]["examples"]["examples"]["run"] = ["mpi_cupy", "mpi_cuda"]
    assert examples.unavailable(ctx, CPU) == (
        "examples.run names no example: mpi_cuda; known: " + ", ".join(examples.BY_NAME)
    )
    assert examples.unavailable(_ctx(), CPU) is None


def test_no_examples_folder_skips(monkeypatch):
    monkeypatch.setattr(examples, "examples_dir", lambda: None)
    assert "examples are not installed" in examples.unavailable(_ctx(), CPU)


# ---------------------------------------------------------------- what runs where


def _plan(gpus, missing=(), tools=("mpirun", "horovodrun", "nvcc"), params=ALL):
    return {
        p.name: p
        for p in examples.plan(
            gpus, params, Path("/ex"), found=lambda m: m not in missing,
            tool=lambda t: f"/usr/bin/{t}" if t in tools else None, open_mpi=True,
        )
    }  # fmt: skip


def test_a_cpu_node_runs_numpy_and_gloo_and_leaves_the_gpu_only_examples_out():
    planned = _plan(0)
    assert planned["nccl_cupy_mpi"].not_applicable == "needs a GPU"
    assert planned["pycuda_kernel"].not_applicable == "needs a GPU"
    mpi = planned["mpi_cupy"].argv
    assert mpi[:3] == ["mpirun", "-n", "2"] and mpi[-2:] == ["--array", "numpy"]
    assert "--oversubscribe" in mpi and mpi[-4:-2] == [sys.executable, "/ex/mpi_cupy.py"]
    ddp = planned["ddp_torchrun"].argv
    assert ddp[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert ddp[ddp.index("--nproc-per-node") + 1] == "2" and ddp[-2:] == ["--device", "cpu"]
    assert planned["horovod_cupy"].argv[:5] == ["horovodrun", "-np", "2", "-H", "localhost:2"]
    assert all(p.skip is None for p in planned.values())


def test_a_gpu_node_gives_nccl_one_rank_per_gpu_and_the_others_cupy():
    planned = _plan(4)
    assert planned["nccl_cupy_mpi"].argv[:3] == ["mpirun", "-n", "4"]
    assert planned["mpi_cupy"].argv[-2:] == ["--array", "cupy"]
    assert planned["dask_cupy"].argv[2:4] == ["--array", "cupy"]
    assert planned["pycuda_kernel"].argv == [sys.executable, "/ex/pycuda_kernel.py"]
    one = _plan(1)
    assert one["nccl_cupy_mpi"].argv[:3] == ["mpirun", "-n", "1"]
    assert one["mpi_cupy"].argv[:3] == ["mpirun", "-n", "2"]  # two ranks share the GPU


def test_a_missing_framework_or_launcher_is_named():
    planned = _plan(1, missing=("tensorflow", "cupy"), tools=("mpirun",))
    assert planned["tf_mirrored"].skip == "tensorflow not installed"
    assert planned["horovod_cupy"].skip == (
        "tensorflow not installed; cupy not installed; horovodrun not found on PATH"
    )
    assert planned["pycuda_kernel"].skip == "nvcc not found on PATH"
    assert planned["mpi_cupy"].skip == "cupy not installed"
    # cupy is not needed for the CPU runs
    assert _plan(0, missing=("cupy",))["mpi_cupy"].skip is None


def test_the_profile_narrows_the_set():
    planned = _plan(0, params={"run": ["dask_cupy"], "dask_n": 64, "dask_chunk": 32})
    assert list(planned) == ["dask_cupy"]
    assert planned["dask_cupy"].argv[-4:] == ["--n", "64", "--chunk", "32"]


# ---------------------------------------------------------------- reading and judging


def test_pass_only_on_its_own_ok_line_and_exit_0():
    text = "noise\n" + _line(ok=True, device="cpu", checked="Bcast verified") + "\nteardown\n"
    status, why = examples.judge_one(_ran("mpi_cupy", text), gpu_node=False)
    assert (status, why) == (Status.PASS, "Bcast verified")
    # a launcher's prefix before the line
    prefixed = "[1,0]<stdout>:" + _line(ok=True, device="cuda", checked="on GPU")
    assert examples.judge_one(_ran("mpi_cupy", prefixed), gpu_node=True)[0] is Status.PASS


def test_its_own_failure_is_a_fail_with_its_words():
    text = _line(ok=False, error="Gatherv: [0, 1] != [0, 1, 4]") + "\nmpi_cupy: FAILED: ...\n"
    status, why = examples.judge_one(_ran("mpi_cupy", text, returncode=1), gpu_node=False)
    assert status is Status.FAIL and "its own check failed: Gatherv: [0, 1] != [0, 1, 4]" in why


def test_ok_line_with_a_bad_exit_or_on_the_cpu_of_a_gpu_node_fails():
    ok = _line(ok=True, device="cpu", checked="fine")
    status, why = examples.judge_one(_ran("ddp_torchrun", ok, returncode=1), gpu_node=False)
    assert status is Status.FAIL and why == "reported ok but exited with exit code 1"
    status, why = examples.judge_one(_ran("tf_mirrored", ok), gpu_node=True)
    assert status is Status.FAIL and "ran on cpu on a GPU node" in why


def test_no_line_or_an_unreadable_one_fails_with_the_error_lines():
    text = (
        "Traceback (most recent call last):\n  File x\nModuleNotFoundError: No module named 'x'\n"
    )
    status, why = examples.judge_one(_ran("dask_cupy", text, returncode=1), gpu_node=False)
    assert status is Status.FAIL
    assert why.startswith("exit code 1, without its EXAMPLE-RESULT line: ")
    assert "ModuleNotFoundError: No module named 'x'" in why
    status, why = examples.judge_one(_ran("dask_cupy", "EXAMPLE-RESULT {ok"), gpu_node=False)
    assert status is Status.FAIL and "unreadable EXAMPLE-RESULT line" in why
    status, why = examples.judge_one(_ran("dask_cupy", "EXAMPLE-RESULT [1]"), gpu_node=False)
    assert status is Status.FAIL and "not a JSON object" in why


def test_a_crash_names_the_signal_and_on_gpus_what_it_means_for_mpi():
    # What Open MPI 4's mpirun says when a rank dies in libmpi on a device buffer.
    said = (
        "[n1:123] *** Process received signal ***\n"
        "[n1:123] Signal: Segmentation fault (11)\n"
        "mpirun noticed that process rank 0 with PID 123 on node n1 exited on signal 11"
        " (Segmentation fault).\n"
    )
    status, why = examples.judge_one(_ran("mpi_cupy", said, returncode=139), gpu_node=True)
    assert status is Status.FAIL
    assert why.startswith("exit code 139; a rank exited on signal SIGSEGV")
    assert "not CUDA-aware" in why and "exited on signal 11" in why
    # Started directly: the exit status is the signal; no MPI hint for other examples.
    status, why = examples.judge_one(_ran("pycuda_kernel", "", returncode=-11), gpu_node=True)
    assert (
        status is Status.FAIL and why.startswith("signal SIGSEGV, without its") and "MPI" not in why
    )
    # The MPI hint is for device buffers: not on a CPU node.
    assert "CUDA-aware" not in examples.judge_one(_ran("mpi_cupy", said, 139), gpu_node=False)[1]


def test_a_deadline_fails_and_says_the_session_was_killed():
    status, why = examples.judge_one(
        _ran("dask_cupy", "waiting for workers\n", returncode=-15, timed_out=True), False
    )
    assert status is Status.FAIL
    assert why == "deadline 30 s expired; its process session was killed: waiting for workers"


def _payload(*entries):
    return {0: {"examples": list(entries), "folder": "/ex"}}


def test_the_check_fails_if_one_fails_skips_if_one_skips_passes_only_when_all_pass():
    good = _ran("mpi_cupy", _line(ok=True, device="cpu", checked="verified"))
    bad = _ran("dask_cupy", _line(ok=False, error="differs by 0.5"), returncode=1)
    skipped = {"name": "tf_mirrored", "argv": [], "skip": "tensorflow not installed"}
    na = {"name": "pycuda_kernel", "argv": [], "not_applicable": "needs a GPU"}
    ctx = _ctx()
    r = examples.judge(ctx, CPU, _payload(good, bad, skipped, na), 1)
    assert (
        r.status is Status.FAIL
        and "FAIL dask_cupy: its own check failed: differs by 0.5" in r.reason
    )
    r = examples.judge(ctx, CPU, _payload(good, skipped, na), 1)
    assert r.status is Status.SKIP
    assert r.reason.startswith("1 of 2 passed (CPU-only node: no GPU verified)")
    assert "SKIP tf_mirrored: tensorflow not installed" in r.reason
    assert "not for a CPU-only node: pycuda_kernel" in r.reason
    r = examples.judge(ctx, CPU, _payload(good, na), 1)
    assert r.status is Status.PASS and r.reason.startswith("1 of 1 passed")
    assert r.details["examples"]["mpi_cupy"]["command"] == "python3 mpi_cupy.py"
    assert r.measurements[0].name == "passed" and r.measurements[0].ok() is True
    only_na = examples.judge(ctx, CPU, _payload(na), 1)
    assert only_na.status is Status.SKIP and "no example applies here" in only_na.reason


# ---------------------------------------------------------------- the driver, for real


def _fake(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(f"import json, os, signal, sys, time\n{body}\n", encoding="utf-8")
    return examples.Planned(name, [sys.executable, str(path)])


def test_the_driver_judges_what_really_happened(tmp_path):
    ok = 'print("EXAMPLE-RESULT " + json.dumps({"ok": True, "device": "cpu", "checked": "fine"}))'
    runs = {
        "passes": _fake(tmp_path, "passes", ok),
        "crashes": _fake(tmp_path, "crashes", "os.kill(os.getpid(), signal.SIGSEGV)"),
        "silent": _fake(tmp_path, "silent", "print('done')"),
        "raises": _fake(tmp_path, "raises", "raise RuntimeError('no GPU for rank 3')"),
    }
    seen = {p.name: examples.run_one(p, 30.0, tmp_path) for p in runs.values()}
    judged = {n: examples.judge_one(s, gpu_node=False) for n, s in seen.items()}
    assert judged["passes"] == (Status.PASS, "fine")
    assert judged["crashes"][0] is Status.FAIL
    assert judged["crashes"][1].startswith("signal SIGSEGV, without its EXAMPLE-RESULT line")
    assert judged["silent"] == (Status.FAIL, "exit code 0, without its EXAMPLE-RESULT line: done")
    assert judged["raises"][0] is Status.FAIL
    assert "RuntimeError: no GPU for rank 3" in judged["raises"][1]


def test_a_hung_example_is_killed_with_its_children_at_its_deadline(tmp_path):
    marker = tmp_path / "child.pid"
    body = (
        "import subprocess\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)"
    )
    began_at = time.monotonic()
    seen = examples.run_one(_fake(tmp_path, "hangs", body), 3.0, tmp_path)
    assert time.monotonic() - began_at < 3.0 + proc.KILL_GRACE_S + 5
    assert seen["timed_out"] is True
    assert examples.judge_one(seen, False)[1].startswith("deadline 3 s expired")
    child = int(marker.read_text())
    assert not proc.alive({child}), "the example's child outlived its deadline"


def test_a_spent_deadline_starts_nothing_more(tmp_path):
    planned = [_fake(tmp_path, "never", "raise SystemExit('must not run')")]
    seen = examples.run_all(planned, 30.0, lambda: 1.0, lambda stage: None)
    assert seen[0]["timed_out"] is True and "deadline was spent" in seen[0]["errors"][0]


# ---------------------------------------------------------------- the CPU examples, as run by users


def _run_example(tmp_path, planned):
    seen = examples.run_one(planned, 240.0, tmp_path)
    status, why = examples.judge_one(seen, gpu_node=False)
    assert status is Status.PASS, f"{planned.name}: {why}\n" + "\n".join(seen.get("tail", []))
    return seen["result"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not on PATH (openmpi-bin)")
@pytest.mark.skipif(not has_module("mpi4py"), reason="mpi4py not installed")
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_mpi_cupy_on_cpu_with_numpy_buffers(tmp_path, ranks):
    # 3 ranks: parts of 4, 3 and 3 elements (the document's Gather could not take them).
    planned = _plan(0, params={"run": ["mpi_cupy"]})["mpi_cupy"]
    argv = list(planned.argv)
    argv[argv.index("-n") + 1] = str(ranks)
    argv[argv.index("/ex/mpi_cupy.py")] = str(ROOT / "examples/mpi_cupy.py")
    result = _run_example(tmp_path, examples.Planned("mpi_cupy", argv))
    assert result["ranks"] == ranks and result["array"] == "numpy"


def _real(name):
    planned = examples.plan(0, {"run": [name], "dask_n": 512, "dask_chunk": 128},
                            examples.examples_dir())  # fmt: skip
    (one,) = planned
    if one.skip:
        pytest.skip(f"{name}: {one.skip}")
    return one


def test_dask_cupy_on_cpu_with_numpy_blocks(tmp_path):
    result = _run_example(tmp_path, _real("dask_cupy"))
    assert result["array"] == "numpy" and result["workers"] == 2 and result["max_abs_err"] == 0.0


def test_ddp_torchrun_on_cpu_with_gloo(tmp_path):
    result = _run_example(tmp_path, _real("ddp_torchrun"))
    assert result["backend"] == "gloo" and result["ranks"] == 2 and result["param_max_diff"] == 0


def test_tf_mirrored_on_two_logical_cpus(tmp_path):
    result = _run_example(tmp_path, _real("tf_mirrored"))
    assert result["replicas"] == 2 and result["device"] == "cpu"


def test_the_whole_check_through_the_engine_on_this_cpu_node():
    from gpuenv.checks.session import run_checks

    ctx = _ctx()
    ctx.thresholds["profiles"]["examples"]["examples"]["run"] = ["dask_cupy", "pycuda_kernel"]
    ctx.thresholds["profiles"]["examples"]["examples"]["dask_n"] = 256
    run = run_checks(REGISTRY, ctx, ["system", "examples"])
    result = next(r for r in run.results if r.check == "examples")
    if run.node.has_gpu:
        pytest.skip("this machine has a GPU: the CPU-node verdict is not what runs here")
    assert result.status is Status.PASS, result.reason
    assert (
        "1 of 1 passed" in result.reason
        and "not for a CPU-only node: pycuda_kernel" in result.reason
    )
