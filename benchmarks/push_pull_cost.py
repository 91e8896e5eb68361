"""CPU-seconds of a converged re-run, push (from the controller) versus pull (each node alone).

    python benchmarks/push_pull_cost.py --name hs --vars inventory/pins/debian-12.yml [--runs 2]

Needs a running, converged lab (`gpuenv lab up --name NAME`, then site.yml once) and the git HEAD
of this checkout (the pull runs use `git archive HEAD`).

Push: `ansible-playbook site.yml -i inventory/lab-NAME/hosts.yml -e @VARS --skip-tags validate`
from the controller, once untimed (a pull run before leaves each node's hostfile naming itself
alone, which the controller's run puts back), then --runs times. Its cost is the user + sys CPU
of ansible-playbook and every process it waited for (its forks, the ssh clients:
getrusage(RUSAGE_CHILDREN)), plus the CPU the run added to the SSH control masters
(ControlPersist), which detach and are never waited for: they are found by their connections to
the nodes' addresses (`ss -tnp`). What the run cost the
nodes (sshd, the modules) is read from the containers' cgroups.

Pull: what `gpuenv cloud-init`'s bootstrap runs on a node (its converge stage), set up as the
bootstrap sets it up: the project at HEAD in /opt/gpuenv-bootstrap/project, ansible (the version
gpuenv cloud-init installs) in /opt/gpuenv-bootstrap/venv, and /etc/gpuenv/inventory with this
node alone (local connection) and the group's variables as `gpuenv cloud-init` renders them
(plus VARS). Each node then runs `ansible-playbook site.yml -i /etc/gpuenv/inventory/hosts.yml
--skip-tags ssh,validate` once to settle (the mesh and the hostfile differ from the controller's
view) and --runs more times, timed on the node with bash's `time` (user + sys of the run and its
children). The controller does nothing in pull mode beyond reading the ready marker.

Every timed run must end with changed=0 and failed=0. Prints one JSON record; exit 0 when every
run converged, 1 when one did not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.rerun_site import recap  # noqa: E402
from gpuenv.cloud import userdata  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
WORK = "/opt/gpuenv-bootstrap"
NODE_INVENTORY = "/etc/gpuenv/inventory"
WHEELHOUSE = "http://apt-cache:8080/"


def mux_cpu_s(addresses: set[str]) -> dict[int, float]:
    """CPU seconds so far of each ssh process connected to one of ``addresses`` on port 22."""
    out = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=True).stdout
    cpu = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[4].rsplit(":", 1)[0] not in addresses:
            continue
        for pid in map(int, re.findall(r'"ssh",pid=(\d+)', line)):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            cpu[pid] = (int(stat[11]) + int(stat[12])) / CLK_TCK
    return cpu


def container_cpu_s(node: str) -> float | None:
    """CPU seconds the node's container has used so far (its cgroup: every process in it), or
    None where this host's cgroup layout is not one of the two known ones."""
    cid = subprocess.run(
        ["docker", "inspect", "-f", "{{.Id}}", node], capture_output=True, text=True, check=True
    ).stdout.strip()
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
    if v1.is_file():
        return int(v1.read_text()) / 1e9
    v2 = Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat")
    if v2.is_file():
        usage = dict(line.split() for line in v2.read_text().splitlines())
        return int(usage["usage_usec"]) / 1e6
    return None


def nodes_cpu_s(nodes: list[str]) -> float | None:
    values = [container_cpu_s(n) for n in nodes]
    return None if None in values else sum(v for v in values if v is not None)


def push_run(
    inventory: Path, extra: list[str], addresses: set[str], nodes: list[str]
) -> dict[str, Any]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "site.yml", "-i", str(inventory)]
    argv += [*extra, "--skip-tags", "validate"]
    mux_before = mux_cpu_s(addresses)
    nodes_before = nodes_cpu_s(nodes)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    mux_after = mux_cpu_s(addresses)
    nodes_after = nodes_cpu_s(nodes)
    mux = sum(v - mux_before.get(pid, 0.0) for pid, v in mux_after.items())
    rows = recap(proc.stdout)
    return {
        "command": " ".join(argv[1:]),
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "user_s": round(after.ru_utime - before.ru_utime, 2),
        "sys_s": round(after.ru_stime - before.ru_stime, 2),
        "ssh_masters_s": round(mux, 2),
        # What the run cost the nodes (sshd, the modules), all containers together.
        "nodes_s": None
        if nodes_before is None or nodes_after is None
        else round(nodes_after - nodes_before, 2),
        "changed": sum(r["changed"] for r in rows.values()),
        "failed": sum(r["failed"] + r["unreachable"] for r in rows.values())
        + (proc.returncode != 0),
        "hosts": len(rows),
    }


def on_node(node: str, script: str, stdin: bytes | None = None, timeout: int = 1800) -> str:
    proc = subprocess.run(
        ["docker", "exec", "-i", node, "bash", "-c", script],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{node}: {script[:80]}... exit {proc.returncode}: "
            f"{proc.stderr.decode(errors='replace')[-2000:]}"
        )
    return proc.stdout.decode()


def pull_setup(node: str, inventory: Path, group: str, pins: dict[str, Any]) -> None:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True
    ).stdout
    on_node(
        node,
        f"rm -rf {WORK}/project && mkdir -p {WORK}/project && tar -x -C {WORK}/project",
        stdin=archive,
    )
    rendered = userdata.render(
        userdata.Request(str(inventory), group, "https://example.invalid/g.git", "main")
    )
    node_vars = {**rendered.node_vars, **pins}
    hosts = {
        "all": {
            "children": {
                group: {
                    "hosts": {
                        node: {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": "/usr/bin/python3",
                        }
                    }
                }
            }
        }
    }
    files = {"hosts.yml": hosts, f"group_vars/{group}.yml": node_vars}
    for name, data in files.items():
        on_node(
            node,
            f"mkdir -p {NODE_INVENTORY}/group_vars && cat > {NODE_INVENTORY}/{name}",
            stdin=yaml.safe_dump(data).encode(),
        )
    on_node(
        node,
        f"[ -x {WORK}/venv/bin/ansible-playbook ] || {{ python3 -m venv {WORK}/venv && "
        f"{WORK}/venv/bin/pip install -q --find-links {WHEELHOUSE} --trusted-host apt-cache "
        f"'{userdata.ANSIBLE_REQUIREMENT}' '{userdata.SETUPTOOLS_REQUIREMENT}' wheel; }}",
    )


def pull_run(node: str) -> dict[str, Any]:
    log = f"{WORK}/pull-run.log"
    container_before = container_cpu_s(node)
    out = on_node(
        node,
        f"cd {WORK}/project && TIMEFORMAT='%U %S %R' && "
        f"{{ time {WORK}/venv/bin/ansible-playbook site.yml -i {NODE_INVENTORY}/hosts.yml "
        f"--skip-tags ssh,validate >{log} 2>&1; }} 2>&1; echo rc=$?; cat {log}",
    )
    container_after = container_cpu_s(node)
    first, rest = out.split("\n", 1)
    user, sys_, wall = map(float, first.split())
    rows = recap(rest)
    return {
        "node": node,
        "wall_s": wall,
        "user_s": user,
        "sys_s": sys_,
        # The container's whole cgroup over the same span (background services included).
        "container_s": None
        if container_before is None or container_after is None
        else round(container_after - container_before, 2),
        "changed": sum(r["changed"] for r in rows.values()),
        "failed": sum(r["failed"] + r["unreachable"] for r in rows.values())
        + ("rc=0" not in rest.split("\n", 1)[0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="lab name (inventory/lab-NAME)")
    parser.add_argument("--vars", type=Path, action="append", default=[], help="-e @FILE")
    parser.add_argument("--group", default="gpu_nodes")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--no-pull", action="store_true")
    parser.add_argument("--no-push", action="store_true")
    args = parser.parse_args()
    inventory = ROOT / "inventory" / f"lab-{args.name}" / "hosts.yml"
    if not inventory.is_file() or args.runs < 1:
        print(f"no lab inventory {inventory} (gpuenv lab up --name {args.name})", file=sys.stderr)
        return 2
    hosts = yaml.safe_load(inventory.read_text())["all"]["children"][args.group]["hosts"]
    addresses = {h["ansible_host"] for h in hosts.values()}
    extra = [a for v in args.vars for a in ("-e", f"@{v}")]
    pins: dict[str, Any] = {}
    for v in args.vars:
        pins.update(yaml.safe_load(v.read_text()) or {})
    record: dict[str, Any] = {"nodes": len(hosts), "push": [], "pull": []}
    if not args.no_push:
        push_run(inventory, extra, addresses, list(hosts))  # settles
        record["push"] = [
            push_run(inventory, extra, addresses, list(hosts)) for _ in range(args.runs)
        ]
    if not args.no_pull:
        for node in hosts:
            pull_setup(node, inventory, args.group, pins)
            pull_run(node)  # settles: the mesh and the hostfile see one node
            record["pull"] += [pull_run(node) for _ in range(args.runs)]
    print(json.dumps(record, indent=2))
    runs = record["push"] + record["pull"]
    return 0 if all(r["changed"] == 0 and r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
