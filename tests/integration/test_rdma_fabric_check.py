"""The rdma_fabric role in check mode against localhost, reading a fabric fixture tree
(tests/fixtures/fabric, rdma_fabric_root): it derives the fixture's expected NCCL settings, plans
nvidia_peermem where GDR is off, acts on nothing without RDMA ports, changes nothing on this
machine, and stops a bad override before anything runs, naming the variable.

Each case is one ansible-playbook --check run with a local connection; the cases start at once.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/fabric"

PLAY = """---
- name: The rdma_fabric role on a fixture
  hosts: all
  become: false
  gather_facts: true
  roles:
    - role: gpuenv.cluster.rdma_fabric
  post_tasks:
    - name: Show what the role derived
      ansible.builtin.debug:
        msg: "{{ {'nccl_conf': __rdma_fabric_found.nccl_conf, 'rdma': __rdma_fabric_found.rdma,
                  'peermem': __rdma_fabric_peermem | bool} | to_json }}"
"""

CASES = {
    "hgx-h100-8ib": {},
    "hgx-h200-8ib": {},
    "roce-v2-gid3": {"rdma_fabric_nccl_ib_tc": "96"},
    "peermem-missing": {},
    "ethernet-single": {},
    "bad-tc": {"rdma_fabric_nccl_ib_tc": "300"},
}
FIXTURE = {"bad-tc": "hgx-h100-8ib"}


def run_case(name: str, tmp: Path) -> tuple[int, str]:
    fixture = FIXTURE.get(name, name)
    play = tmp / f"{name}.yml"
    play.write_text(PLAY)
    extra = {
        "rdma_fabric_root": str(FIXTURES / fixture / "root"),
        # nothing installed on this machine: the probe's dpkg answer decides, apt is not asked
        "rdma_fabric_packages": [],
        **CASES[name],
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_LOCAL_TEMP": str(tmp / "tmp"),
    }
    done = subprocess.run(
        [
            "ansible-playbook",
            "--check",
            "-i",
            "localhost,",
            "-c",
            "local",
            str(play),
            "-e",
            json.dumps(extra),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done.returncode, done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[int, dict]]:
    tmp = tmp_path_factory.mktemp("rdma_fabric")
    with ThreadPoolExecutor(len(CASES)) as pool:
        futures = {n: pool.submit(run_case, n, tmp) for n in CASES}
    found = {}
    for name, future in futures.items():
        rc, out = future.result()
        found[name] = (rc, json.JSONDecoder().raw_decode(out[out.index("{") :])[0])
    return found


def tasks(report: dict) -> dict[str, dict]:
    return {
        t["task"]["name"].rpartition(" : ")[2]: t["hosts"]["localhost"]
        for play in report["plays"]
        for t in play["tasks"]
    }


def derived(report: dict) -> dict:
    return json.loads(tasks(report)["Show what the role derived"]["msg"])


@pytest.mark.parametrize(
    "name", ["hgx-h100-8ib", "hgx-h200-8ib", "roce-v2-gid3", "peermem-missing"]
)
def test_check_mode_derives_the_fixture_settings_and_changes_nothing(runs, name):
    rc, report = runs[name]
    assert rc == 0, report
    expected = yaml.safe_load((FIXTURES / name / "expected.yml").read_text())["settings"]
    if "rdma_fabric_nccl_ib_tc" in CASES[name]:
        expected["NCCL_IB_TC"] = CASES[name]["rdma_fabric_nccl_ib_tc"]  # the override wins
    assert derived(report)["nccl_conf"] == expected
    assert report["stats"]["localhost"]["failures"] == 0
    assert report["stats"]["localhost"]["changed"] <= 1  # at most the planned modprobe


def test_peermem_is_planned_only_where_gdr_is_off(runs):
    assert derived(runs["peermem-missing"][1])["peermem"] is True
    assert derived(runs["hgx-h200-8ib"][1])["peermem"] is False  # dma-buf: no peermem
    # loaded already on the proprietary module: kept at boot, not loaded again
    assert derived(runs["hgx-h100-8ib"][1])["peermem"] is True
    name = "Load nvidia_peermem for GPUDirect RDMA"
    assert tasks(runs["hgx-h100-8ib"][1])[name].get("skipped")
    assert tasks(runs["hgx-h200-8ib"][1])[name].get("skipped")
    # check mode: planned, and command does not run in check mode
    assert not tasks(runs["peermem-missing"][1])[name].get("failed")


def test_a_node_without_rdma_ports_installs_and_writes_nothing(runs):
    rc, report = runs["ethernet-single"]
    assert rc == 0
    assert derived(report)["rdma"] is False
    found = tasks(report)
    assert found["Write the fabric's local fact and nvidia_peermem's boot entry"].get("skipped")


@pytest.mark.parametrize(
    ("name", "variable"),
    [("bad-tc", "rdma_fabric_nccl_ib_tc=300")],
)
def test_a_bad_override_fails_before_the_fabric_is_read_naming_the_variable(runs, name, variable):
    rc, report = runs[name]
    assert rc != 0
    failed = [h for h in tasks(report).values() if h.get("failed")]
    assert variable in failed[0]["msg"]
    assert "Read the fabric and derive the NCCL settings" not in tasks(report)
