"""`ansible-playbook playbooks/validate.yml --limit node1` on a two-node inventory ends OK when
node1 is healthy: the one-node cluster is judged by the checks that make sense for one node.

The nodes are emulated on this machine (ansible_connection local), so the play runs the real
`gpuenv cluster` with the play's --limit, and node1 runs the real `gpuenv check --profile cpu`
(mpirun and torch on this machine). What is not exercised here: SSH to a real node (the lab).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("mpirun") is None or shutil.which("ansible-playbook") is None,
    reason="needs mpirun and ansible-playbook on this machine",
)


def test_validate_play_on_one_node_of_two_ends_ok(tmp_path):
    python = sys.executable
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        textwrap.dedent(
            f"""
            all:
              hosts:
                node1: {{ansible_connection: local, gpuenv_cluster_python: {python}}}
                node2: {{ansible_connection: local, gpuenv_cluster_python: {python}}}
            """
        )
    )
    reports = tmp_path / "reports"
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    # The play runs `ansible_playbook_python -m gpuenv`: this interpreter, this checkout.
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["ansible-playbook", str(ROOT / "playbooks/validate.yml"), "-i", str(inv),
         "--limit", "node1", "-e", "validate_profile=cpu", "-e", f"validate_report_dir={reports}",
         "-e", "validate_deadline=240"],
        capture_output=True, text=True, timeout=400, env=env, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    data = json.loads((reports / "cluster.json").read_text())
    assert data["hosts"] == ["node1"] and data["verdict"]["ok"] is True
    consistency = next(r for r in data["results"] if r["check"] == "consistency")
    assert consistency["status"] == "SKIP"
    assert "excused: not required on a one-node cluster" in consistency["reason"]
    assert "verdict: OK" in done.stdout
