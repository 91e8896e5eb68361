"""Against a running lab: the gpu_monitoring stage puts Prometheus on the lab's first node,
scraping every node's node-exporter; the HTTP API returns gpuenv's health metrics for every node;
a fault fixture on the last node (an Xid 79 and NVML without that GPU, read by the real scanner
through its test hooks) makes GpuXid79FallenOffTheBus fire, seen through /api/v1/alerts. The
stage is idempotent and check mode reports no change on the converged lab.

Opt-in, because it needs docker and a lab whose env stage ran (the venv with gpuenv in it; the
lightest path, docs/monitoring.md "Lab test"):

    gpuenv lab up --nodes 3 --name mon --distro bookworm
    ansible-playbook -i inventory/lab-mon/hosts.yml playbooks/sources.yml playbooks/env.yml \
        -e '{"gpu_env_packages": [], "gpu_env_build_tools": false}'
    GPUENV_LAB=mon python -m pytest -q -s tests/lab/test_monitoring_lab.py

Lab nodes have no GPU: without the fixture their scan reports 0 GPUs (docs/monitoring.md).
"""

import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from labnet import converge_idempotent, run_playbook

from gpuenv.health.nvml import patch_gpus

LAB = os.environ.get("GPUENV_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_LAB to a running lab whose env stage ran"
)
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / f"inventory/lab-{LAB}/hosts.yml"
GPUENV = [sys.executable, "-m", "gpuenv"]
FIXTURES = ROOT / "tests" / "fixtures" / "health"
FAULT_DIR = "/etc/gpuenv/lab-fault"
INTERVAL_S = 10  # the timer's period in the lab (the role's floor)
WAIT_S = 180.0  # for Prometheus to scrape, evaluate and fire


def hosts():
    data = yaml.safe_load(INVENTORY.read_text())
    return data["all"]["children"]["gpu_nodes"]["hosts"]


def on_node(name, command, data=None):
    done = subprocess.run(
        [*GPUENV, "lab", "ssh", "--name", LAB, name, f"sudo bash -c {shlex.quote(command)}"],
        input=data,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, (name, command, done.stdout, done.stderr)
    return done


def copy_to(name, folder, remote):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(folder, arcname=".")
    on_node(name, f"mkdir -p {remote} && tar -C {remote} -xf -", data=buf.getvalue())


def playbook(extra_inventory, *args):
    return run_playbook(
        [INVENTORY, extra_inventory], ROOT / "playbooks" / "monitoring.yml", *args, timeout_s=900
    )


def api(address, path, **params):
    url = f"http://{address}:9090{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        data = json.load(answer)
    assert data["status"] == "success", data
    return data["data"]


def wait_for(what, probe, timeout_s=WAIT_S):
    started_at = time.monotonic()
    while True:
        got = probe()
        if got:
            return got, time.monotonic() - started_at
        assert time.monotonic() - started_at < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(2)


def write_inventory(path, names, fault_node=None):
    extra = {"--nvml-fixture": f"{FAULT_DIR}/nvml.json", "--kernel-log": f"{FAULT_DIR}/kernel.log"}
    data = {
        "all": {
            "vars": {
                "gpu_monitoring_enabled": True,
                "gpu_monitoring_health_interval_s": INTERVAL_S,
            },
            "children": {"monitoring": {"hosts": {names[0]: {}}}},
        }
    }
    if fault_node:
        args = [word for pair in extra.items() for word in pair]
        data["all"]["hosts"] = {fault_node: {"gpu_monitoring_health_extra_args": args}}
    path.write_text(yaml.safe_dump(data))


def fault_fixture(folder):
    """Xid 79 on GPU 3 of the recorded 8-GPU node, which NVML no longer lists."""
    folder.mkdir()
    base = json.loads((FIXTURES / "_base" / "hgx8" / "nvml.json").read_text())
    (folder / "nvml.json").write_text(json.dumps(patch_gpus(base, {"3": {"remove": True}})))
    log = (FIXTURES / "xid79-fallen-off-bus" / "kernel.log").read_text()
    (folder / "kernel.log").write_text(log)


def test_prometheus_scrapes_every_node_and_a_fault_fires_its_alert(tmp_path):
    nodes = hosts()
    names = sorted(nodes)
    prom = nodes[names[0]]["ansible_host"]
    faulty = names[-1]
    extra = tmp_path / "monitoring.yml"
    write_inventory(extra, names)

    converge_idempotent([INVENTORY, extra], ROOT / "playbooks" / "monitoring.yml")

    def every_node_scanned():
        result = api(prom, "/api/v1/query", query="gpuenv_health_worst_action")["result"]
        seen = {r["metric"]["node"]: r for r in result}
        return seen if set(seen) == set(names) else None

    _, seen_s = wait_for("gpuenv_health_worst_action from every node", every_node_scanned)
    print(f"every node's gpuenv metrics in the API after {seen_s:.1f} s")
    up = api(prom, "/api/v1/query", query='up{job="node"}')["result"]
    assert {r["metric"]["node"]: r["value"][1] for r in up} == {n: "1" for n in names}
    gpus = api(prom, "/api/v1/query", query="gpuenv_health_gpus")["result"]
    assert {r["metric"]["node"]: r["value"][1] for r in gpus} == {n: "0" for n in names}
    rules = api(prom, "/api/v1/rules")["groups"]
    assert "GpuXid79FallenOffTheBus" in {r["name"] for g in rules for r in g["rules"]}
    assert not [a for a in api(prom, "/api/v1/alerts")["alerts"] if a["state"] == "firing"
                and a["labels"]["alertname"].startswith("Gpu")]  # fmt: skip

    fault_fixture(tmp_path / "fault")
    copy_to(faulty, tmp_path / "fault", FAULT_DIR)
    write_inventory(extra, names, fault_node=faulty)
    changed, fault_s = playbook(extra)
    print(f"fault run: {fault_s:.1f} s, changed {changed}")
    assert changed[faulty] > 0 and all(changed[n] == 0 for n in names if n != faulty), changed

    def xid79_firing():
        alerts = api(prom, "/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "GpuXid79FallenOffTheBus"
                and a["state"] == "firing"]  # fmt: skip

    firing, firing_s = wait_for("GpuXid79FallenOffTheBus firing", xid79_firing)
    print(f"GpuXid79FallenOffTheBus firing {firing_s:.1f} s after the fault run: {firing}")
    assert [a["labels"]["node"] for a in firing] == [faulty]
    assert firing[0]["labels"]["subject"] == "79"
    gpus = api(prom, "/api/v1/query", query="gpuenv_health_gpus")["result"]
    assert {r["metric"]["node"]: r["value"][1] for r in gpus}[faulty] == "7"

    write_inventory(extra, names)  # the fault undone: the timer reads the node again
    playbook(extra)
    on_node(faulty, f"rm -rf {FAULT_DIR}")
