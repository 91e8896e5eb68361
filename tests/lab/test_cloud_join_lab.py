"""End to end in the lab: an instance that bootstrapped itself joins a cluster a controller runs.

The lab's last node plays a new cloud instance: it is left out of the cluster's inventory, gets
the group's `gpuenv cloud-init` user data through cloud-init (cloudlab.py), converges itself
from the lab's sources and writes the ready marker, while the controller converges the other
nodes. Then the node is added to the inventory and the controller runs site.yml, validate stage
included:

- the node's host keys are read over the controller's verified connection and recorded; every
  node's known_hosts then holds exactly the keys the node has, and the cluster user reaches it
  from the others (and them from it) with strict host-key checking, as mpirun does in the
  validate stage, which passes across all nodes;
- on the other nodes that run changes only what names the cluster's members: their known_hosts,
  the mesh's client settings and the MPI hostfile (a node that never learnt the new one's host
  key could not reach it); the controller records the new host keys. Nothing else changes on
  them, and on the new node nothing changes but the mesh and the hostfile, so a pull converge
  and a push converge leave the same node;
- the run after that changes nothing anywhere.

Opt-in, because it needs docker, a running bookworm lab of 3 nodes and about 40 minutes:

    gpuenv lab up --nodes 3 --distro bookworm --name join
    GPUENV_JOIN_LAB=join python -m pytest -q tests/lab/test_cloud_join_lab.py
"""

import os
import shutil
import threading

import pytest
import yaml
from cloudlab import (
    ROOT,
    TORCH,
    LabNode,
    head_commit,
    playbook,
    render,
    serve_https,
    serve_project,
    serve_torch,
)

from gpuenv.lab.settings import LabPaths

LAB = os.environ.get("GPUENV_JOIN_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_JOIN_LAB to a running bookworm lab's name (3 nodes)"
)
GROUP = "gpu_nodes"  # the lab inventory's group
CONVERGE_DEADLINE_S = 2400  # the whole stack, on a shared 2-core machine
KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
MESH_CONFIG = "/etc/ssh/ssh_config.d/50-gpuenv-mesh.conf"
HOSTFILE = "/etc/gpuenv/mpi-hostfile"
# What names the cluster's members, on every node: the tasks and the files they write.
MEMBERSHIP = {
    "Write the known hosts, the mesh's client settings and the cluster user's public key": {
        KNOWN_HOSTS,
        MESH_CONFIG,
    },
    "Write the MCA settings, the hostfile and Open MPI's local facts": {HOSTFILE},
}
# Done on the controller (delegated), reported under the play's first host.
CONTROLLER = {"Record the mesh's host keys on the controller"}


def node_names():
    hosts = yaml.safe_load(LabPaths(ROOT, LAB).hosts_file.read_text())
    return sorted(hosts["all"]["children"][GROUP]["hosts"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The controller's inventory without the new node, and with it; the new node bootstrapped
    through cloud-init while the controller converges the others."""
    paths = LabPaths(ROOT, LAB)
    names = node_names()
    assert len(names) >= 2, f"lab {LAB} needs 2 nodes or more, has {names}"
    lab = yaml.safe_load(paths.hosts_file.read_text())
    pins = yaml.safe_load(paths.pins_file.read_text())
    mesh = f"cloudjoin-{LAB}"
    record_dir = ROOT / ".gpuenv" / "ssh" / mesh
    shutil.rmtree(record_dir, ignore_errors=True)
    lab["all"]["vars"].update(
        pins,
        gpu_env_install_torch=True,
        gpu_env_torch_package=TORCH,
        ssh_mesh_cluster_name=mesh,
    )
    hosts = lab["all"]["children"][GROUP]["hosts"]
    new = names[-1]
    inv = tmp_path_factory.mktemp("joininv")
    (inv / "before.yml").write_text(
        yaml.safe_dump(
            {"all": {**lab["all"], "children": {GROUP: {"hosts": {
                n: hosts[n] for n in names[:-1]}}}}},
        )
    )  # fmt: skip
    (inv / "after.yml").write_text(yaml.safe_dump(lab))
    commit = head_commit()
    tarball = serve_project(commit)
    source = serve_https(LAB, tarball, tmp_path_factory.mktemp("tls"))
    first: dict = {}

    def converge_the_others():
        try:
            first["run"] = playbook(inv / "before.yml", "--skip-tags", "validate")
        except BaseException as err:  # reported by the fixture below, in the test's thread
            first["error"] = err

    # The https server is for the new node's fetch: stopped once the node is ready (or not).
    try:
        serve_torch()
        node = LabNode(LAB, new)
        node.install_cloud_init()
        instance = f"join-{commit}"
        # The user data of the group, as a cloud would pass it to a new instance.
        node.seed_and_start(render(inv / "before.yml", GROUP, commit, source), instance)
        converge = threading.Thread(target=converge_the_others)
        converge.start()
        ready = node.wait_ready(instance, CONVERGE_DEADLINE_S)
    finally:
        source.stop()
    converge.join(CONVERGE_DEADLINE_S)
    assert "error" not in first, f"the controller's converge of the others: {first.get('error')!r}"
    assert "run" in first, "the controller's converge of the other nodes did not end"
    assert first["run"].rc == 0, first["run"].output[-4000:]
    yield {"names": names, "new": node, "ready": ready, "inv": inv, "record": record_dir}
    tarball.unlink(missing_ok=True)
    shutil.rmtree(record_dir, ignore_errors=True)


def host_keys(node):
    out = node.run("cat /etc/ssh/ssh_host_*_key.pub").stdout
    return sorted(" ".join(line.split()[:2]) for line in out.splitlines() if line.strip())


def reaches(source, target):
    """The cluster user on source runs `hostname` on target, host key verified."""
    return source.run(
        f"su - gpuenv -c 'ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {target} hostname'",
        timeout=60,
    )


def test_the_new_instance_bootstrapped_itself_and_is_not_in_the_mesh_yet(cluster):
    ready = cluster["ready"]
    assert (ready["status"], ready["verdict"]) == ("done", "pass"), ready
    first = LabNode(LAB, cluster["names"][0])
    new = cluster["new"].name
    known = first.run(f"cat {KNOWN_HOSTS}").stdout
    assert new not in known, known
    refused = reaches(first, new)
    assert refused.returncode != 0, refused.stdout
    assert "Host key verification failed" in refused.stderr, refused.stderr


def test_the_next_controller_run_adds_it_to_the_mesh_with_its_host_key_verified(cluster):
    names, new = cluster["names"], cluster["new"]
    run = playbook(cluster["inv"] / "after.yml")
    assert run.rc == 0, run.output[-4000:]
    assert all(r[1:] == (0, 0) for r in run.recap.values()), run.recap
    # The others: only what names the members changed, and that did change (the new node's key).
    for name in names[:-1]:
        changes = [c for c in run.changed_tasks.get(name, []) if c.task not in CONTROLLER]
        assert changes, f"{name}: nothing changed, yet it must learn {new.name}'s host key"
        for change in changes:
            assert change.task in MEMBERSHIP, f"{name}: not a membership file: {change}"
            assert set(change.files or ()) <= MEMBERSHIP[change.task], (name, change)
    # The new node: the mesh (skipped by its own converge) and the hostfile naming every member;
    # nothing of the GPU stack the pull converge installed.
    for change in run.changed_tasks.get(new.name, []):
        assert change.task in MEMBERSHIP or "/roles/ssh_mesh/" in change.path, (
            f"{new.name} changed after its own converge: {change}"
        )
    # Host keys: recorded from the node itself, and every member trusts exactly those.
    keys = host_keys(new)
    record = yaml.safe_load((cluster["record"] / "host_keys.yml").read_text())
    assert sorted(record["hosts"][new.name]["keys"]) == keys
    for name in names:
        node = LabNode(LAB, name)
        listed = node.run(f"ssh-keygen -F {new.name} -f {KNOWN_HOSTS}").stdout
        assert sorted({" ".join(line.split()[1:3]) for line in listed.splitlines()
                       if line and not line.startswith("#")}) == keys, (name, listed)  # fmt: skip
        for other in names:
            if other != name:
                done = reaches(node, other)
                assert (done.returncode, done.stdout.strip()) == (0, other), (name, done.stderr)


def test_the_run_after_that_changes_nothing_anywhere(cluster):
    run = playbook(cluster["inv"] / "after.yml", "--skip-tags", "validate")
    assert run.rc == 0, run.output[-4000:]
    assert {h: r[0] for h, r in run.recap.items()} == dict.fromkeys(cluster["names"], 0), (
        run.changed_tasks
    )
