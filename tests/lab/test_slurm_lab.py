"""Against a running lab: the slurm stage makes the lab's first node the controller (the submit
host) and the others compute nodes. The stage is idempotent and check mode reports no change;
`srun -N<n> hostname` reaches every compute node; `srun -N<n> python3 -m mpi4py.bench helloworld`,
run by the cluster user in an SSH login on the controller as users run it, starts one MPI rank per
compute node (MpiDefault=pmix); `gpuenv cluster --launcher srun --profile cpu` over the compute
nodes is OK; a reset-level health fault on the last node (Xid 154, the driver asking for a GPU
reset, read by the real scanner through --nvml-fixture/--kernel-log) drains it with a `gpuenv:`
reason naming the finding, clearing it resumes it, and an administrator's drain on another node
stays through a healthy scan. A crash: gpuenv made unable to start on a middle node (a module of
its package moved away) leaves the rolling upgrade's drain as it is, drains the node with `gpuenv:
health scan failed: ...` naming the missing module once nobody else holds it, and the first healthy
scan after the repair resumes that drain.

Opt-in, because it needs docker and a lab with the cluster user, Open MPI and the cluster venv
(mpi4py, gpuenv, the CPU torch from the lab's wheelhouse; the health check drains a node without
gpuenv, by design):

    gpuenv lab up --nodes 4 --name srun --distro bookworm
    python -m pip download -c constraints.txt -d .cache/lab/wheels torch   # the nodes' CPU torch
    ansible-playbook site.yml -i inventory/lab-srun/hosts.yml -e @inventory/pins/debian-12.yml \
        -e gpu_env_install_torch=true -e gpu_env_torch_package=torch==2.13.0 \
        --skip-tags driver,cuda,nccl,validate
    GPUENV_LAB=srun python -m pytest -q -s tests/lab/test_slurm_lab.py
    gpuenv lab down --name srun

Lab containers share the host's cgroup tree (--cgroupns=host): the test sets slurm_cgroup=false
(proctrack/linuxproc, task/none), so device confinement is not tested here, and the nodes have no
GPU: the cluster's slurm-gpus check SKIPs with that reason (docs/slurm.md).
"""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from labnet import converge_idempotent, run_playbook

LAB = os.environ.get("GPUENV_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_LAB to a running lab whose env stage ran"
)
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / f"inventory/lab-{LAB}/hosts.yml"
GPUENV = [sys.executable, "-m", "gpuenv"]
FIXTURES = ROOT / "tests" / "fixtures" / "health"
FAULT_DIR = "/etc/gpuenv/lab-fault"
HEALTH = "/usr/local/sbin/gpuenv-slurm-health"
ADMIN_REASON = "admin: lab maintenance"
UPGRADE_REASON = "gpuenv: upgrade batch 1 to lab"  # as roles/rolling_upgrade writes it
CLUSTER_USER = "gpuenv"  # roles/ssh_mesh's ssh_mesh_user


def names():
    data = yaml.safe_load(INVENTORY.read_text())
    return sorted(data["all"]["children"]["gpu_nodes"]["hosts"])


def on_node(name, command, data=None, check=True):
    done = subprocess.run(
        [*GPUENV, "lab", "ssh", "--name", LAB, name, f"sudo bash -c {shlex.quote(command)}"],
        input=data, capture_output=True, check=False, timeout=180,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, (name, command, done.stdout, done.stderr)
    return done.returncode, done.stdout.decode()


def playbook(extra_inventory, *args):
    return run_playbook(
        [INVENTORY, extra_inventory], ROOT / "playbooks" / "slurm.yml", *args, timeout_s=1500
    )


def write_inventory(path, nodes, fault_node=None):
    data = {
        "all": {
            "vars": {"slurm_cgroup": False, "slurm_health_interval_s": 3600},
            "children": {
                "slurm_controller": {"hosts": {nodes[0]: {}}},
                "slurm_compute": {"hosts": {n: {} for n in nodes[1:]}},
            },
        }
    }
    if fault_node:
        args = [
            "--nvml-fixture",
            f"{FAULT_DIR}/nvml.json",
            "--kernel-log",
            f"{FAULT_DIR}/kernel.log",
        ]
        # Xid 154 asks for a reset: the default fail-on (reset) drains it, as a node that needs
        # a reset must not take the next job.
        data["all"]["hosts"] = {fault_node: {"slurm_health_extra_args": args}}
    path.write_text(yaml.safe_dump(data))


def as_cluster_user(node, command):
    """``command`` in the cluster user's own SSH login to ``node`` (the SSH mesh's key), where
    sshd's PAM session and the login profile give it what a user's shell has."""
    inner = f"bash -lc {shlex.quote(command)}"
    return shlex.join(["sudo", "-n", "-u", CLUSTER_USER, "-H", "ssh", "-o", "BatchMode=yes",
                       address(node), inner])  # fmt: skip


def address(name):
    data = yaml.safe_load(INVENTORY.read_text())
    return data["all"]["children"]["gpu_nodes"]["hosts"][name]["ansible_host"]


def node_state(controller, node):
    _, out = on_node(controller, f"scontrol show node -o {node}")
    state = out.split(" State=")[1].split()[0]
    reason = out.split(" Reason=")[1].rsplit(" [", 1)[0].strip() if " Reason=" in out else ""
    return state, reason


def wait_for(what, probe, timeout_s=120.0):
    started_at = time.monotonic()
    while True:
        got = probe()
        if got:
            return got, time.monotonic() - started_at
        assert time.monotonic() - started_at < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(2)


def test_slurm_runs_jobs_and_gpuenv_owns_its_drains(tmp_path):
    nodes = names()
    controller, computes = nodes[0], nodes[1:]
    faulty, administered = computes[-1], computes[0]
    extra = tmp_path / "slurm.yml"
    write_inventory(extra, nodes)

    converge_idempotent([INVENTORY, extra], ROOT / "playbooks" / "slurm.yml", timeout_s=1500)

    for name in nodes:
        _, out = on_node(name, "systemctl is-active munge slurmd slurmctld || true")
        print(f"{name}: munge/slurmd/slurmctld {out.split()}")
    on_node(controller, f"scontrol update nodename={','.join(computes)} state=resume", check=False)
    started_at = time.monotonic()
    _, out = on_node(controller, f"sudo -u admin timeout 150 srun -N{len(computes)} hostname")
    print(f"srun -N{len(computes)} hostname: {time.monotonic() - started_at:.1f} s: {out.split()}")
    assert sorted(out.split()) == sorted(computes)

    # MPI through Slurm as users run it: the cluster user's SSH login on the submit host.
    started_at = time.monotonic()
    hello = f"srun -N{len(computes)} python3 -m mpi4py.bench helloworld"
    _, out = on_node(controller, as_cluster_user(controller, hello))
    print(f"{hello}: {time.monotonic() - started_at:.1f} s:\n{out.strip()}")
    lines = sorted(line for line in out.splitlines() if line.startswith("Hello, World!"))
    assert [line.split(" on ")[0] for line in lines] == [
        f"Hello, World! I am process {i} of {len(computes)}" for i in range(len(computes))
    ], out
    assert sorted(line.split(" on ")[1].rstrip(".") for line in lines) == sorted(computes), out

    # gpuenv cluster through Slurm: every multi-node run is one srun from the controller.
    started_at = time.monotonic()
    done = subprocess.run(
        [*GPUENV, "cluster", "--launcher", "srun", "-i", str(INVENTORY), "-i", str(extra),
         "--limit", "slurm_compute", "--profile", "cpu", "--json", "-", "--no-progress"],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=900,
    )  # fmt: skip
    wall_s = time.monotonic() - started_at
    report = json.loads(done.stdout)
    cluster = {r["check"]: r for r in report["results"] if r["node"] == "cluster"}
    for name, r in cluster.items():
        print(f"  {name}: {r['status']}: {r['reason'][:160]}")
    print(f"gpuenv cluster --launcher srun --profile cpu: exit {done.returncode}, {wall_s:.1f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("slurm-reach", "allreduce", "ddp", "mpi"):
        assert cluster[name]["status"] == "PASS", cluster[name]
    assert cluster["slurm-gpus"]["status"] == "SKIP", cluster["slurm-gpus"]

    # The fault: the recorded 8-GPU node whose driver asks for a reset of GPU 3 (Xid 154, a
    # reset-level finding; the real scanner reads it).
    nvml = (FIXTURES / "_base" / "hgx8" / "nvml.json").read_text()
    log = (FIXTURES / "xid154-recovery-reset" / "kernel.log").read_text()
    on_node(faulty, f"mkdir -p {FAULT_DIR} && cat > {FAULT_DIR}/nvml.json", data=nvml.encode())
    on_node(faulty, f"cat > {FAULT_DIR}/kernel.log", data=log.encode())
    write_inventory(extra, nodes, fault_node=faulty)
    playbook(extra)
    rc, out = on_node(faulty, HEALTH, check=False)
    print(f"health check on {faulty}: exit {rc}: {out.strip()}")
    state, reason = node_state(controller, faulty)
    print(f"{faulty}: {state} {reason!r}")
    assert rc == 1 and out.strip().splitlines()[-1].startswith("gpuenv-slurm-verdict: unhealthy")
    # Xid 119 (a GSP timeout) and Xid 154 both ask for a reset; the first in scan order names it.
    assert "DRAIN" in state and reason.startswith("gpuenv: xid gpu3 1"), (state, reason)

    # An administrator's drain on another node stays through its healthy scan.
    on_node(
        controller, f"scontrol update nodename={administered} state=drain reason='{ADMIN_REASON}'"
    )
    rc, out = on_node(administered, HEALTH, check=False)
    assert rc == 0, out
    state, reason = node_state(controller, administered)
    print(f"{administered} after a healthy scan: {state} {reason!r}")
    assert "DRAIN" in state and reason == ADMIN_REASON, (state, reason)

    crash_keeps_others_drains_and_drains_its_own(controller, computes[len(computes) // 2])

    # The fault cleared: the next scan resumes the node gpuenv drained.
    write_inventory(extra, nodes)
    playbook(extra)
    on_node(faulty, f"rm -rf {FAULT_DIR}")
    rc, out = on_node(faulty, HEALTH, check=False)
    assert rc == 0, out
    (state, reason), resumed_s = wait_for(
        "the resume", lambda: (s := node_state(controller, faulty)) and "DRAIN" not in s[0] and s
    )
    print(f"{faulty} resumed: {state} {reason!r} after {resumed_s:.1f} s")
    on_node(controller, f"scontrol update nodename={administered} state=resume")


def crash_keeps_others_drains_and_drains_its_own(controller, node):
    """gpuenv cannot start on ``node`` (its gpuenv.health.slurm moved away: every gpuenv command
    dies on the import): the health-check script drains by itself, by the same rule."""
    _, line = on_node(node, f"sed -n 's/^gpuenv=//p' {HEALTH}")
    python = Path(shlex.split(line)[0]).parent / "python"
    _, module = on_node(node, f"{python} -c 'import gpuenv.health.slurm as m; print(m.__file__)'")
    module = module.strip()
    on_node(controller, f"scontrol update nodename={node} state=drain reason='{UPGRADE_REASON}'")
    on_node(node, f"mv {module} {module}.away")
    try:
        rc, out = on_node(node, HEALTH, check=False)
        state, reason = node_state(controller, node)
        print(f"{node}, gpuenv broken, the upgrade's drain: exit {rc}: {out.strip()!r}; {state}")
        assert rc == 1 and "DRAIN" in state and reason == UPGRADE_REASON, (out, state, reason)

        on_node(controller, f"scontrol update nodename={node} state=resume")  # the upgrade's end
        rc, out = on_node(node, HEALTH, check=False)
        state, reason = node_state(controller, node)
        print(f"{node}, gpuenv broken: exit {rc}: {out.strip()!r}; {state} {reason!r}")
        assert rc == 1 and "DRAIN" in state, (out, state, reason)
        assert reason.startswith(
            "gpuenv: health scan failed: gpuenv health exited 1 without a"
            " verdict: ModuleNotFoundError: No module named"
        ), reason
    finally:
        on_node(node, f"mv {module}.away {module}")
    rc, out = on_node(node, HEALTH, check=False)
    state, reason = node_state(controller, node)
    print(f"{node}, gpuenv repaired: exit {rc}: {out.strip()!r}; {state} {reason!r}")
    assert rc == 0 and "DRAIN" not in state, (out, state, reason)
