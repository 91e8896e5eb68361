"""The driver version as a Slurm node feature: roles/slurm writes it on the node's slurm.conf line
from its facts (absent where no driver runs), and the rolling upgrade's edit of that line
(roles/rolling_upgrade/tasks/feature_publish.yml, Python's re as ansible.builtin.replace uses it)
changes, adds and removes it on exactly that node's line."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[2]
SLURM_TEMPLATES = ROOT / "roles" / "slurm" / "templates"
PUBLISH = ROOT / "roles" / "rolling_upgrade" / "tasks" / "feature_publish.yml"


def _facts(name: str, address: str) -> dict[str, object]:
    return {"hostname": name, "default_ipv4": {"address": address}}


def render_conf(drivers: dict[str, str]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(SLURM_TEMPLATES), trim_blocks=True)
    env.filters["comment"] = lambda text: f"#\n# {text}\n#"
    env.filters["bool"] = bool
    hosts = sorted(drivers)
    hostvars = {
        host: {
            "ansible_facts": _facts(host, f"10.0.0.{i + 1}"),
            "__slurm_node": {
                "cpus": 8,
                "sockets": 1,
                "cores": 8,
                "threads": 1,
                "memory_mb": 1000,
                "gpus": 8 if drivers[host] else 0,
                "gpu_type": "hopper",
                "driver": drivers[host],
            },
        }
        for i, host in enumerate(hosts)
    }
    return env.get_template("slurm.conf.j2").render(
        ansible_managed="managed", slurm_cluster_name="gpuenv", hostvars=hostvars,
        __slurm_controller=hosts[0], slurm_ctld_port=6817, slurm_d_port=6818,
        __slurm_state_dir="/var/lib/slurm", __slurm_spool_dir="/var/spool/slurmd",
        __slurm_log_dir="/var/log/slurm", slurm_cgroup=False, slurm_health_check=False,
        slurm_prolog=False, groups={"compute": hosts}, slurm_compute_group="compute",
        slurm_partition_name="gpu",
    )  # fmt: skip


def node_line(conf: str, node: str) -> str:
    return next(line for line in conf.splitlines() if line.startswith(f"NodeName={node} "))


def publish(conf: str, node: str, features: list[str]) -> str:
    """The replace task of feature_publish.yml with its Jinja filled in for ``node``."""
    task = next(t for t in yaml.safe_load(PUBLISH.read_text()) if "ansible.builtin.replace" in t)
    args = task["ansible.builtin.replace"]
    regexp = args["regexp"].replace(
        "{{ __rolling_upgrade_slurm_node | regex_escape }}", re.escape(node)
    )
    assert "{{" not in regexp, regexp
    replace = r"\1" + (f" Features={','.join(features)}" if features else "") + r"\2"
    assert args["replace"].startswith("\\1") and args["replace"].endswith("\\2")
    return re.sub(regexp, replace, conf, flags=re.MULTILINE)


def test_the_driver_is_a_feature_only_where_a_driver_runs():
    conf = render_conf({"gpu1": "550.54.15", "cpu1": ""})
    assert node_line(conf, "gpu1").endswith(" Features=nvidia-driver-550.54.15 State=UNKNOWN")
    assert "Features=" not in node_line(conf, "cpu1")


def test_the_upgrade_changes_adds_and_removes_the_feature_on_its_node_only():
    conf = render_conf({"gpu1": "550.54.15", "gpu2": "550.54.15", "cpu1": ""})
    changed = publish(conf, "gpu1", ["nvidia-driver-570.86.10"])
    assert node_line(changed, "gpu1").endswith(" Features=nvidia-driver-570.86.10 State=UNKNOWN")
    assert node_line(changed, "gpu2") == node_line(conf, "gpu2")
    added = publish(conf, "cpu1", ["nvidia-driver-570.86.10"])
    assert node_line(added, "cpu1").endswith(" Features=nvidia-driver-570.86.10 State=UNKNOWN")
    removed = publish(conf, "gpu2", [])
    assert "Features=" not in node_line(removed, "gpu2")
    # The rendered conf, edited to what it already says, stays byte for byte the same.
    assert publish(conf, "gpu1", ["nvidia-driver-550.54.15"]) == conf
