"""Against a running lab: one node made bad is named, within the deadline, nothing left behind.

Opt-in, because it needs docker and a provisioned lab (site.yml with the cluster venv):

    gpuenv lab up --nodes 3 --name h5lab --distro bookworm
    ansible-playbook -i inventory/lab-h5lab/hosts.yml site.yml ...
    GPUENV_LAB=h5lab python -m pytest -q tests/unit/test_cluster_lab.py
"""

import json
import os
import subprocess
import sys
import time

import pytest

LAB = os.environ.get("GPUENV_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_LAB to a running, provisioned lab's name"
)
INVENTORY = f"inventory/lab-{LAB}/hosts.yml"
GPUENV = [sys.executable, "-m", "gpuenv"]
DEADLINE = 30


def lab(*args, check=True):
    return subprocess.run(
        [*GPUENV, "lab", *args, "--name", LAB], capture_output=True, text=True, check=check
    )


def on_node(node, command):
    return subprocess.run(
        [*GPUENV, "lab", "ssh", "--name", LAB, node, command],
        capture_output=True,
        text=True,
        check=False,
    )


def cluster(*args, deadline=DEADLINE):
    start = time.monotonic()
    done = subprocess.run(
        [*GPUENV, "cluster", "-i", INVENTORY, "--json", "-", "--no-progress",
         "--deadline", str(deadline), *args],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done, json.loads(done.stdout), time.monotonic() - start


def result(data, check, node="cluster"):
    return next(r for r in data["results"] if r["check"] == check and r["node"] == node)


def leftovers(marker):
    """Processes of ours on the controller whose command line holds the marker."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


def test_stopped_node_is_named_within_the_deadline_and_nothing_is_left():
    node = f"{LAB}-node3"
    lab("stop", "node3")
    try:
        done, data, elapsed = cluster("--skip", "check,pairs,torch")
    finally:
        lab("start", "node3")
    assert done.returncode == 1, done.stderr
    reach = result(data, "reach", node)
    assert reach["status"] == "FAIL" and "unreachable" in reach["reason"], reach
    # Probe deadline 30 s + 10 s grace, plus the stages the others still ran.
    assert elapsed < 90
    assert f"without {node}" in result(data, "rendezvous")["reason"]
    assert result(data, "mpi")["status"] == "PASS"
    assert leftovers(INVENTORY) == []
    for other in ("node1", "node2"):
        ps = on_node(other, "pgrep -af 'gpuenv[.]cluster|torch[.]distributed|[m]pirun' || true")
        assert ps.stdout.strip() == "", ps.stdout


def test_node_with_another_package_version_is_named():
    node = f"{LAB}-node2"
    pip = "sudo /opt/gpuenv/bin/python -m pip install -q --disable-pip-version-check"
    base = on_node("node1", "/opt/gpuenv/bin/python -c 'import numpy; print(numpy.__version__)'")
    assert base.returncode == 0, base.stderr
    original = base.stdout.strip()
    other = "2.4.5" if original != "2.4.5" else "2.4.4"
    changed = on_node("node2", f"{pip} numpy=={other}")
    assert changed.returncode == 0, changed.stderr
    try:
        done, data, _ = cluster("--skip", "check,rendezvous,torch,mpi,pairs")
    finally:
        on_node("node2", f"{pip} numpy=={original}")
    assert done.returncode == 1
    cons = result(data, "consistency")
    assert cons["status"] == "FAIL"
    assert f"pkg.numpy: {original} on {LAB}-node1, {LAB}-node3; {other} on {node}" in cons["reason"]
    assert cons["details"]["odd_nodes"] == [node]


def test_node_that_breaks_the_launch_is_isolated_by_pairs():
    node = f"{LAB}-node2"
    pip = "sudo /opt/gpuenv/bin/python -m pip"
    version = on_node("node2", "/opt/gpuenv/bin/python -c 'import torch; print(torch.__version__)'")
    assert version.returncode == 0, version.stderr
    wanted = version.stdout.strip().split("+")[0]
    assert on_node("node2", f"{pip} uninstall -y -q torch").returncode == 0
    try:
        # A generous deadline: on a loaded machine a healthy pair's launch alone can take 30 s.
        done, data, _ = cluster("--skip", "check,mpi", deadline=180)
    finally:
        restored = on_node("node2", f"{pip} install -q --disable-pip-version-check torch=={wanted}")
    assert restored.returncode == 0, restored.stderr
    assert done.returncode == 1
    allreduce = result(data, "allreduce")
    assert (
        allreduce["status"] == "FAIL"
        and f"stopped because {node} failed first" in allreduce["reason"]
    )
    assert data["isolation"]["bad_nodes"] == [node]
    assert result(data, "isolation")["reason"] == f"bad node(s): {node}"
    # The waiting ranks are stopped when the broken one fails, not at the 180 s deadline.
    assert allreduce["duration_s"] < 60
    for other in ("node1", "node2", "node3"):
        ps = on_node(other, "pgrep -af 'gpuenv[.]cluster|torch[.]distributed|[m]pirun' || true")
        assert ps.stdout.strip() == "", ps.stdout
