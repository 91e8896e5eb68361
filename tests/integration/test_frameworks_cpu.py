"""The optional framework checks' CPU paths, end to end: Dask with numpy blocks on a local
scheduler and two worker processes, TensorFlow's MirroredStrategy on two logical CPU devices.

dask, distributed and tensorflow-cpu are in the dev extras (pyproject.toml), so these tests do
not skip when they are missing: they fail, naming what to install. Horovod does not build for
the pinned torch (docs/checks.md): its check SKIPs here, and the test says so.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from gpuenv.checks.system import probe
from gpuenv.proc import processes_with_env

pytestmark = pytest.mark.skipif(probe().get("available", False), reason="this machine has a GPU")


def _require(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    assert not missing, (
        f"{', '.join(missing)} missing from this venv: they are dev extras (pyproject.toml);"
        " rebuild the venv with scripts/venv.sh"
    )


def _check(tmp_path, only, *extra, env_extra=None, timeout=240):
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpuenv", "check", "--profile", "cpu", "--only", only,
         "--json", str(out), *extra],
        capture_output=True, text=True, env={**os.environ, **(env_extra or {})}, timeout=timeout,
    )  # fmt: skip
    report = json.loads(out.read_text())
    return done, {r["check"]: r for r in report["results"]}


def test_dask_and_tensorflow_pass_on_cpu_and_say_so(tmp_path):
    _require("dask", "distributed", "tensorflow")
    tag = str(uuid.uuid4())
    done, results = _check(tmp_path, "dask,tensorflow,horovod", env_extra={"GPUENV_TEST_TAG": tag})
    assert done.returncode == 0, done.stdout + done.stderr
    d = results["dask"]
    assert d["status"] == "PASS", d
    assert "numpy blocks (no GPU: CPU only)" in d["reason"]
    assert len(d["details"]["workers"]) == 2 and d["details"]["left_running"] == []
    t = results["tensorflow"]
    assert t["status"] == "PASS", t
    assert "2 replicas on CPU only" in t["reason"] and t["details"]["device_kind"] == "cpu"
    # Horovod cannot be built for the pinned torch here: a SKIP naming it, never a PASS.
    h = results["horovod"]
    if importlib.util.find_spec("horovod") is None:
        assert h["status"] == "SKIP" and h["reason"] == "horovod not installed"
    else:
        assert h["status"] == "PASS", h
    # The scheduler, the workers and TensorFlow's process are all gone.
    assert processes_with_env("GPUENV_TEST_TAG", tag) == []


def test_a_hung_dask_client_fails_in_time_and_leaves_no_worker(tmp_path):
    """The client stops with its scheduler and workers up; the deadline takes them all down."""
    _require("dask", "distributed")
    tag = str(uuid.uuid4())
    fault = "hang:rank=0:check=dask:stage=compute"
    t0 = time.monotonic()
    done, results = _check(
        tmp_path, "dask", "--deadline", "20",
        env_extra={"GPUENV_FAULT": fault, "GPUENV_TEST_TAG": tag},
    )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert done.returncode == 1
    d = results["dask"]
    assert d["status"] == "FAIL" and "deadline 20 s expired" in d["reason"], d
    assert d["details"]["last_stage"]["0"] == "compute"
    assert elapsed < 20 + 30
    assert processes_with_env("GPUENV_TEST_TAG", tag) == []


def test_the_dask_stage_spans_two_emulated_nodes_and_leaves_nothing(monkeypatch):
    """`gpuenv cluster`'s optional dask stage: the scheduler and client on the first node, a worker
    on each, numpy blocks (no GPU), every worker computing; then nothing of it is left."""
    _require("dask", "distributed")
    import socket

    from gpuenv.cluster import pipeline
    from gpuenv.cluster.inventory import Host

    tag = str(uuid.uuid4())
    monkeypatch.setenv("GPUENV_TEST_TAG", tag)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hosts = [Host(n, n, "127.0.0.1", local=True, python=sys.executable) for n in ("a", "b")]
    opts = pipeline.Options(stages=("rendezvous", "dask"), port=port, deadline_s=90,
                            dask_size=(512, 128))  # fmt: skip
    run = pipeline.validate(hosts, opts)
    r = next(r for r in run.results if r.check == "dask")
    assert r.status.value == "PASS", r.reason
    assert "2 workers on 2 nodes (scheduler on a), numpy blocks (CPU-only nodes)" in r.reason
    assert len(r.details["workers"]) == 2 and r.details["left_running"] == {}
    assert processes_with_env("GPUENV_TEST_TAG", tag) == []
