"""The rolling upgrade's Slurm steps against a fake slurmctld: a fake `scontrol` and `squeue` on
PATH (state files in a temporary folder), the role's own task files run on localhost as the
controller and the node. Drain with the upgrade's reason, wait for the node's jobs up to the
deadline (and fail naming them after it), resume only the upgrade's own drain (an
administrator's stays), and publish the driver version as the node's feature in slurmctld and in
slurm.conf. The lab test (tests/lab/test_upgrade_lab.py) runs them against a real Slurm; this one
needs neither docker nor Slurm and covers what the lab cannot: running jobs and a driver version."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
NODE = socket.gethostname().split(".")[0]

SCONTROL = """#!/bin/sh
echo "scontrol $*" >> "{d}/log"
case "$1" in
  show)
    reason=$(cat "{d}/reason")
    features=$(cat "{d}/features")
    echo "NodeName=$4 Arch=x86_64 AvailableFeatures=$features ActiveFeatures=$features" \\
         "State=$(cat "{d}/state")${{reason:+ Reason=$reason [root@2026-12-02T03:00:00]}}" ;;
  update)
    for arg in "$@"; do
      case "$arg" in
        state=drain) state=DRAIN ;;
        state=resume) echo IDLE > "{d}/state"; : > "{d}/reason" ;;
        reason=*) echo "${{arg#reason=}}" > "{d}/reason" ;;
        AvailableFeatures=*) f="${{arg#AvailableFeatures=}}"
                             echo "${{f:-(null)}}" > "{d}/features" ;;
      esac
    done
    if [ "$state" = DRAIN ]; then echo "IDLE+DRAIN" > "{d}/state"; fi ;;
esac
"""
SQUEUE = """#!/bin/sh
echo "squeue $*" >> "{d}/log"
cat "{d}/jobs"
"""

PLAY = """---
- name: The upgrade's Slurm steps
  hosts: all
  gather_facts: true
  environment:
    PATH: "{bin}:{{{{ ansible_env.PATH }}}}"
  tasks:
    - name: Run the steps
      ansible.builtin.include_role:
        name: gpuenv.cluster.rolling_upgrade
        tasks_from: "{{{{ item }}}}"
      loop: {steps}
"""


@pytest.fixture
def ctld(tmp_path: Path) -> Path:
    d = tmp_path / "ctld"
    d.mkdir()
    (d / "bin").mkdir()
    for name, text in (("scontrol", SCONTROL), ("squeue", SQUEUE)):
        path = d / "bin" / name
        path.write_text(text.format(d=d))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    for name, text in (
        ("state", "IDLE"),
        ("reason", ""),
        ("features", "(null)"),
        ("jobs", ""),
        ("log", ""),
    ):
        (d / name).write_text(text + ("\n" if text else ""))
    return d


def run_step(ctld: Path, *steps: str, **extra: object) -> subprocess.CompletedProcess[str]:
    """The role's task files ``steps``, one after the other in one play (facts carry over)."""
    play = ctld / f"{'-'.join(steps)}.yml"
    play.write_text(PLAY.format(bin=ctld / "bin", steps=json.dumps(list(steps))))
    pins = ctld / "pins.yml"
    pins.write_text(
        yaml.safe_dump(
            {"pinned_packages_list": [{"name": "x", "packages": ["x"], "version": "2.0"}]}
        )
    )
    inventory = ctld / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "slurm_controller": {"hosts": {"localhost": {}}},
        "slurm_compute": {"hosts": {"localhost": {}}},
    }}}))  # fmt: skip
    variables = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "rolling_upgrade_pins": str(pins),
        **extra,
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_GATHER_SUBSET": "!all,min",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(ctld / "tmp"),
    }
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(inventory)]
    cmd += ["-e", json.dumps(variables), str(play)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180, check=False)


def read(ctld: Path, name: str) -> str:
    return (ctld / name).read_text().strip()


def test_drain_waits_for_jobs_then_resume_lifts_only_its_own_drain(ctld: Path) -> None:
    done = run_step(ctld, "slurm_drain")
    assert done.returncode == 0, done.stdout[-3000:]
    assert read(ctld, "state") == "IDLE+DRAIN"
    assert read(ctld, "reason").startswith("gpuenv: upgrade batch 1 to ")
    assert f"squeue --noheader --nodelist {NODE} --states RUNNING,COMPLETING,CONFIGURING" in read(
        ctld, "log"
    )
    done = run_step(ctld, "slurm_resume")
    assert done.returncode == 0, done.stdout[-3000:]
    assert (read(ctld, "state"), read(ctld, "reason")) == ("IDLE", "")


def test_jobs_past_the_deadline_fail_the_drain_by_name(ctld: Path) -> None:
    (ctld / "jobs").write_text("4242 alice train-llm\n")
    done = run_step(
        ctld, "slurm_drain", rolling_upgrade_drain_timeout_s=2, rolling_upgrade_drain_poll_s=1
    )
    assert done.returncode != 0
    flat = " ".join(done.stdout.split())
    assert (
        "drain deadline passed: jobs still running after 2 s (rolling_upgrade_drain_timeout_s): "
        "4242 alice train-llm" in flat
    )


def test_an_administrators_drain_is_kept_and_not_resumed(ctld: Path) -> None:
    (ctld / "state").write_text("IDLE+DRAIN\n")
    (ctld / "reason").write_text("admin: PSU swap\n")
    for step in ("slurm_drain", "slurm_resume"):
        done = run_step(ctld, step)
        assert done.returncode == 0, done.stdout[-3000:]
        assert (read(ctld, "state"), read(ctld, "reason")) == ("IDLE+DRAIN", "admin: PSU swap")
    assert "state=drain" not in read(ctld, "log") and "state=resume" not in read(ctld, "log")
    assert "its reason (admin: PSU swap) is not the upgrade's" in " ".join(done.stdout.split())


def test_the_driver_feature_is_published_in_slurmctld_and_slurm_conf(ctld: Path) -> None:
    conf = ctld / "slurm.conf"
    other = (
        "NodeName=other NodeAddr=10.0.0.9 CPUs=8 Features=nvidia-driver-550.54.15 State=UNKNOWN\n"
    )
    mine = (
        f"NodeName={NODE} NodeAddr=10.0.0.1 CPUs=8 Features=nvidia-driver-550.54.15 State=UNKNOWN"
    )
    conf.write_text(f"{mine}\n{other}")
    (ctld / "features").write_text("ib,nvidia-driver-550.54.15\n")
    done = run_step(
        ctld, "feature_publish", "slurm_resume", rolling_upgrade_slurm_conf=str(conf),
        __rolling_upgrade_driver_version="570.86.10",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert read(ctld, "features") == "ib,nvidia-driver-570.86.10"
    lines = conf.read_text().splitlines()
    assert lines[0].endswith(" Features=ib,nvidia-driver-570.86.10 State=UNKNOWN")
    assert lines[1] == other.strip()
    # Again: nothing to change, no scontrol update.
    updates = read(ctld, "log").count("scontrol update")
    done = run_step(
        ctld, "feature_publish", "slurm_resume", rolling_upgrade_slurm_conf=str(conf),
        __rolling_upgrade_driver_version="570.86.10",
    )  # fmt: skip
    assert done.returncode == 0 and "changed=0" in done.stdout, done.stdout[-2000:]
    assert read(ctld, "log").count("scontrol update") == updates
