"""A node that stops answering mid-batch (playbooks/upgrade.yml; roles/rolling_upgrade/tasks/
layout.yml, watch.yml, watch_node.yml). Ansible takes an unreachable host out of the play at once
and block/rescue never sees it: a batch whose nodes all stopped answering used to end the playbook
with nothing said, and one lost node of a larger batch let the next batches run.

The playbook's own plays run here on local connections, with only the node's step (the role's main
entry point, which needs apt and a real node) replaced by a small fake that notes where it is, as
the role does, touches a file on the node and sets the node's outcome. A node is made unreachable
mid-step by its connection, which becomes ssh to a closed port once a marker file exists; a fake
`scontrol` keeps the Slurm state. The layout, the watchers, the drain, the record and the UPGRADE
STOPPED summary are the real ones. The lab test (tests/lab/test_upgrade_lab.py) pauses a real
node's container during its batch."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "upgrade.yml"
NODES = ["n1", "n2", "n3", "n4"]

SCONTROL = """#!/bin/sh
echo "scontrol $*" >> "{d}/log"
case "$1" in
  show)
    node=$4
    state=$(cat "{d}/$node.state" 2>/dev/null || echo IDLE)
    reason=$(cat "{d}/$node.reason" 2>/dev/null)
    echo "NodeName=$node State=$state${{reason:+ Reason=$reason [root@2026-12-07T23:00:00]}}" ;;
  update)
    node=""
    for arg in "$@"; do
      case "$arg" in
        nodename=*) node="${{arg#nodename=}}" ;;
        state=drain) echo "IDLE+DRAIN" > "{d}/$node.state" ;;
        reason=*) echo "${{arg#reason=}}" > "{d}/$node.reason" ;;
      esac
    done ;;
esac
"""

# The node's step, in place of the role's main entry point: a read of the node, what the role notes
# before it drains and changes the node, one change on the node (unreachable once the node's marker
# exists), the outcome.
FAKE_STEP = """
- name: Read the node, as validate.yml does
  ansible.builtin.stat:
    path: "{d}"
- name: Note where the node is, as install.yml does
  ansible.builtin.set_fact:
    __rolling_upgrade_step: the drain and change
    __rolling_upgrade_started_at: "2026-12-07T23:00:00Z"
    __rolling_upgrade_before: {{gpuenv-standin: "1.0"}}
- name: Lose the node here
  ansible.builtin.file:
    path: "{d}/gone-{{{{ inventory_hostname }}}}"
    state: touch
    mode: "0644"
  when: inventory_hostname in lose
- name: Change the node
  ansible.builtin.file:
    path: "{d}/changed-{{{{ inventory_hostname }}}}"
    state: touch
    mode: "0644"
- name: Set the node's outcome
  ansible.builtin.set_fact:
    rolling_upgrade_result: {{batch: 0, outcome: upgraded, pins: {{gpuenv-standin: "2.0"}}}}
- name: Fail the node's validation, with an outcome
  ansible.builtin.fail:
    msg: "UPGRADE STOPPED at batch 2 ({{{{ inventory_hostname }}}}): validation failed (the fake's)"
  when: inventory_hostname in fail
"""


def build_playbook(d: Path) -> Path:
    """upgrade.yml with the preflight's checks of the variables and the nodes (the variable check
    and the role's preflight entry point, which read a real node) left out, and the node's step
    faked."""
    plays = yaml.safe_load(PLAYBOOK.read_text())
    preflight, rollout = plays[0], plays[1]
    kept = [t for t in preflight["tasks"] if "preflight" not in str(t)]
    assert len(kept) < len(preflight["tasks"]), preflight["tasks"]
    assert any("layout" in str(t) for t in kept), "the preflight lays out the rollout"
    preflight["tasks"] = kept
    step = [
        t for t in rollout["tasks"] if t["ansible.builtin.include_role"].get("tasks_from") is None
    ]
    assert len(step) == 1, rollout["tasks"]
    step[0].pop("ansible.builtin.include_role")
    step[0]["block"] = yaml.safe_load(FAKE_STEP.format(d=d))
    for play in plays:
        play["gather_facts"] = False
        play.pop("become", None)
    path = d / "upgrade.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return path


def run(
    d: Path, *, batch_size: int = 1, lose: tuple[str, ...] = (), fail: tuple[str, ...] = ()
) -> tuple[int, str]:
    (d / "bin").mkdir(exist_ok=True)
    scontrol = d / "bin" / "scontrol"
    scontrol.write_text(SCONTROL.format(d=d))
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    pins = d / "pins.yml"
    pins.write_text(yaml.safe_dump({"pinned_packages_list": [{"name": "gpuenv-standin"}]}))

    def connection(node: str) -> str:
        """Local until the node's marker exists, then ssh to a closed port: unreachable."""
        test = f"test -e {d}/gone-{node} && echo y || true"
        return "{{ 'ssh' if lookup('ansible.builtin.pipe', '" + test + "') else 'local' }}"

    inventory = d / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_python_interpreter": sys.executable, "ansible_host": "127.0.0.1",
                 "ansible_port": 9},
        "children": {
            "gpu_nodes": {"hosts": {n: {"ansible_connection": connection(n)} for n in NODES}},
            "slurm_controller": {"hosts": {"ctl": {"ansible_connection": "local"}}},
            "slurm_compute": {"hosts": {n: {} for n in NODES}},
        },
    }}))  # fmt: skip
    variables = {
        "rolling_upgrade_pins": str(pins),
        "rolling_upgrade_batch_size": batch_size,
        "rolling_upgrade_report_dir": str(d / "reports"),
        "lose": list(lose),
        "fail": list(fail),
    }
    env = {
        **os.environ,
        "PATH": f"{d / 'bin'}:{os.environ['PATH']}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(d / "tmp"),
        "ANSIBLE_SSH_ARGS": "-o ControlMaster=no",
    }
    argv = [shutil.which("ansible-playbook") or "ansible-playbook", "-i", str(inventory)]
    argv += ["-e", json.dumps(variables), str(build_playbook(d))]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


def flat(text: str) -> str:
    return " ".join(text.split())


def changed(d: Path) -> list[str]:
    return [n for n in NODES if (d / f"changed-{n}").exists()]


def slurm(d: Path, node: str) -> tuple[str, str]:
    def read(name: str) -> str:
        path = d / f"{node}.{name}"
        return path.read_text().strip() if path.exists() else ""

    return read("state") or "IDLE", read("reason")


def test_a_batch_whose_only_node_stops_answering_stops_the_rollout_and_says_so(tmp_path):
    rc, out = run(tmp_path, lose=("n2",))
    said = flat(out)
    assert rc != 0, out[-3000:]
    assert "UNREACHABLE" in out
    assert changed(tmp_path) == ["n1"]  # batch 3 and 4 never started
    stopped = "UPGRADE STOPPED at batch 2 (n2): unreachable during the drain and change"
    assert stopped in said, out[-3000:]
    assert "ROLLBACK: none while the node cannot be worked on" in said
    assert "keeps the versions before (gpuenv-standin=1.0)" in said
    assert "NOT TOUCHED (later batches): n3, n4." in said
    assert "UPGRADE COMPLETE" not in said
    state, reason = slurm(tmp_path, "n2")
    assert "DRAIN" in state
    assert reason.startswith(
        "gpuenv: upgrade batch 2: unreachable during the drain and change, see "
    )
    assert f'Left drained in Slurm (reason "{reason}")' in said
    assert [slurm(tmp_path, n) for n in ("n1", "n3", "n4")] == [("IDLE", "")] * 3
    record = json.loads((tmp_path / "reports" / "upgrade-n2.json").read_text())
    assert (record["node"], record["batch"], record["outcome"]) == ("n2", 2, "unreachable")
    assert record["step"] == "the drain and change"
    assert record["before"] == {"gpuenv-standin": "1.0"}
    assert str(tmp_path / "reports" / "upgrade-n2.json") in reason


def test_the_rest_of_the_batch_finishes_its_step_and_an_administrators_drain_stays(tmp_path):
    (tmp_path / "n3.state").write_text("IDLE+DRAIN\n")
    (tmp_path / "n3.reason").write_text("ops: fan replaced, burn-in pending\n")
    (tmp_path / "gone-n4").touch()  # n4 does not answer from its first task on
    rc, out = run(tmp_path, batch_size=3, lose=("n3",))
    said = flat(out)
    assert rc != 0, out[-3000:]
    assert changed(tmp_path) == ["n1", "n2"]
    stopped = "UPGRADE STOPPED at batch 2 (n3): unreachable during the drain and change"
    assert stopped in said, out[-3000:]
    assert slurm(tmp_path, "n3") == ("IDLE+DRAIN", "ops: fan replaced, burn-in pending")
    assert "Left drained in Slurm with the reason someone else gave (ops: fan replaced" in said
    stopped = "UPGRADE STOPPED at batch 2 (n4): unreachable during the read of the node, before any"
    assert stopped in said
    assert "ROLLBACK: none needed: the node left before this run changed it." in said
    state, reason = slurm(tmp_path, "n4")
    assert "DRAIN" in state
    assert reason.startswith("gpuenv: upgrade batch 2: unreachable during the read of the node")
    assert "NOT TOUCHED (later batches): none." in said
    assert "scontrol update nodename=n3" not in (tmp_path / "log").read_text()
    assert slurm(tmp_path, "n2") == ("IDLE", "")


def test_a_node_that_failed_with_an_outcome_stops_the_rollout_after_its_batch(tmp_path):
    rc, out = run(tmp_path, batch_size=2, fail=("n2",))
    said = flat(out)
    assert rc != 0
    assert "UPGRADE STOPPED at batch 2 (n2): validation failed (the fake's)" in said
    assert "Batch 2 did not pass: n2 (UPGRADE STOPPED above); the rollout stops after it." in said
    assert changed(tmp_path) == ["n1", "n2", "n3"]  # n3, in the same batch, finished its step
    assert not (tmp_path / "reports" / "upgrade-n2.json").exists()
    assert "UPGRADE COMPLETE" not in said


def test_a_rollout_where_every_node_answers_completes(tmp_path):
    rc, out = run(tmp_path, batch_size=2)
    said = flat(out)
    assert rc == 0, out[-3000:]
    assert changed(tmp_path) == NODES
    summary = said.split("UPGRADE COMPLETE: ")[1].split('"')[0]
    assert summary.startswith("4 node(s): n1 batch")
    assert "watcher" not in summary
    assert not (tmp_path / "log").exists() or "update" not in (tmp_path / "log").read_text()
