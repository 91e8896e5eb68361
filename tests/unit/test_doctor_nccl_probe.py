"""gpuenv.doctor.nccl_probe: which NCCL torch and CuPy load, each framework in its own process."""

import json
import subprocess
import sys
import time

import pytest

from gpuenv.doctor import nccl, nccl_probe
from gpuenv.doctor.system import CmdOut, System

# Stands in for the probe's per-framework process: what it does is named by the framework.
FAKE = """
import json, sys, time
what = sys.argv[1]
if what == "hang":
    time.sleep(600)
elif what == "silent":
    print("warning: nothing to say", file=sys.stderr)
    sys.exit(3)
else:
    print("loading " + what)
    print(json.dumps({"version": "2.27.7", "paths": ["/x/" + what + "/libnccl.so.2"]}))
"""


@pytest.fixture
def fake_probe(tmp_path, monkeypatch):
    (tmp_path / "fake_nccl_probe.py").write_text(FAKE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(nccl_probe, "MODULE", "fake_nccl_probe")


def test_each_framework_answers_from_a_process_of_its_own(fake_probe):
    out = nccl_probe.each_alone(("torch", "cupy"))
    assert out == {
        "torch": {"version": "2.27.7", "paths": ["/x/torch/libnccl.so.2"]},
        "cupy": {"version": "2.27.7", "paths": ["/x/cupy/libnccl.so.2"]},
    }


def test_a_framework_that_hangs_or_says_nothing_is_an_error_in_time(fake_probe):
    began_at = time.monotonic()
    out = nccl_probe.each_alone(("hang", "silent"), deadline_s=1.0)
    assert time.monotonic() - began_at < 10
    assert out["hang"] == {"error": "TimeoutExpired: no answer within 1 s"}
    assert out["silent"] == {
        "error": "NoAnswer: exit code 3, no JSON printed: warning: nothing to say"
    }


def test_the_module_runs_with_python_m_and_prints_one_json_object():
    """On this machine (no GPU): each framework answers with its version or why not."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuenv.doctor.nccl_probe"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    answer = json.loads(done.stdout)
    assert set(answer) == {"torch", "cupy"}
    for info in answer.values():
        assert set(info) in ({"version", "paths"}, {"error"}), info


def test_doctor_runs_the_probe_module_in_the_nodes_python():
    seen = []

    def runner(name, argv):
        seen.append((name, list(argv)))
        return CmdOut(0, '{"torch": {"version": "2.28.9", "paths": []}}\n')

    assert nccl.probe_frameworks(System(runner=runner)) == {
        "torch": {"version": "2.28.9", "paths": []}
    }
    assert seen == [("python-nccl", [sys.executable, "-m", "gpuenv.doctor.nccl_probe"])]
