"""`gpuenv check` on a machine without a GPU, end to end with real torchrun and mpirun."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from gpuenv.checks.system import probe
from gpuenv.proc import processes_with_env

pytestmark = [
    pytest.mark.skipif(probe().get("available", False), reason="this machine has a GPU"),
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed"),
]


def _gpuenv(args, env_extra=None, timeout=120):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, "-m", "gpuenv", "check", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_cpu_node_skips_gpu_checks_and_passes_ddp_and_mpi(tmp_path):
    out = tmp_path / "r.json"
    done = _gpuenv(["--profile", "cpu", "--json", str(out), "--junit", str(tmp_path / "r.xml")])
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("no GPU verified)")
    report = json.loads(out.read_text())
    assert report["verdict"]["required"] == ["mpi", "ddp"] and report["verdict"]["ok"]
    results = {r["check"]: r for r in report["results"]}
    assert list(results) == ["system", "cupy", "streams", "nccl", "fabric", "mpi", "ddp"]
    # Without a driver NVML says so; without nvidia-ml-py the reason names that instead.
    assert results["system"]["status"] == "SKIP"
    assert "NVML" in results["system"]["reason"] or "nvidia-ml-py" in results["system"]["reason"]
    for name in ("cupy", "streams", "nccl"):
        assert results[name]["status"] == "SKIP"
        assert results[name]["reason"].startswith("no NVIDIA GPU visible")
    # No InfiniBand/RoCE here: the fabric check says so, and nothing requires it.
    assert results["fabric"]["status"] == "SKIP"
    assert "no InfiniBand/RoCE port" in results["fabric"]["reason"]
    assert results["ddp"]["status"] == "PASS", results["ddp"]
    assert results["ddp"]["details"]["backend"] == "gloo"
    assert "2 ranks" in results["ddp"]["reason"]
    assert results["mpi"]["status"] == "PASS", results["mpi"]
    assert results["mpi"]["details"]["path"] == "numpy"
    assert "2 ranks" in results["mpi"]["reason"]


def test_hung_ddp_rank_fails_in_time_is_named_and_leaves_nothing(tmp_path):
    tag = str(uuid.uuid4())
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    done = _gpuenv(
        ["--only", "ddp", "--profile", "cpu", "--deadline", "20", "--json", str(out)],
        {"GPUENV_FAULT": "hang:rank=1:check=ddp", "GPUENV_TEST_TAG": tag},
    )
    elapsed = time.monotonic() - t0
    assert done.returncode == 1, done.stdout + done.stderr
    # The probe (system) reports in every run; --only ddp adds the one check.
    system, result = json.loads(out.read_text())["results"]
    assert (system["check"], result["check"]) == ("system", "ddp")
    assert result["status"] == "FAIL"
    assert "rank 1" in result["reason"] and "did not keep up" in result["reason"]
    assert result["details"]["ranks_behind"] == [1]
    assert elapsed < 20 + 10
    time.sleep(0.3)
    assert processes_with_env("GPUENV_TEST_TAG", tag) == []


def test_a_gpu_profile_on_a_cpu_node_is_not_ok(tmp_path):
    out = tmp_path / "r.json"
    done = _gpuenv(["--only", "mpi", "--json", str(out)])
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = json.loads(out.read_text())["verdict"]
    assert "profile 'quick' is for GPU nodes" in verdict["problems"][0]


def test_gpus_on_the_pci_bus_without_a_driver_fail_the_run(tmp_path):
    """A PCI fixture (through GPUENV_ROOT) shows an NVIDIA GPU that no driver answers for."""
    dev = tmp_path / "root/sys/bus/pci/devices/0000:17:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "device").write_text("0x2330\n")
    (dev / "class").write_text("0x030200\n")
    out = tmp_path / "r.json"
    done = _gpuenv(["--json", str(out)], {"GPUENV_ROOT": str(tmp_path / "root")})
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(out.read_text())
    system = report["results"][0]
    assert system["status"] == "FAIL" and "0000:17:00.0" in system["reason"]
    assert report["verdict"]["node_kind"] == "gpu"


def test_a_frozen_mpi_rank_is_named_though_both_entered_bcast(tmp_path):
    """Rank 1 stops (SIGSTOP) inside 'bcast' while rank 0 waits in the same stage."""
    out = tmp_path / "r.json"
    done = _gpuenv(
        ["--only", "mpi", "--profile", "cpu", "--deadline", "15", "--json", str(out)],
        {"GPUENV_FAULT": "freeze:rank=1:check=mpi:stage=bcast"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    system, result = json.loads(out.read_text())["results"]
    assert (system["check"], result["check"]) == ("system", "mpi")
    assert result["details"]["ranks_behind"] == [1], result
    assert "frozen in 'bcast'" in result["reason"]
