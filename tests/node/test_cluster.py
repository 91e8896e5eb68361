"""Across nodes: one mpirun over the SSH mesh, as the cluster user, on every node of mpi_group.

Runs once per session (no `host` fixture): from the first node of the group, with the generated
hostfile, an mpi4py all-reduce of numpy arrays whose result every rank checks; and the line a user
types, plain `mpirun ... python3 -m mpi4py.bench helloworld` over every node.
"""

from __future__ import annotations

import json
import re

import pytest
from nodehelpers import (
    address,
    as_user,
    cluster_user,
    components,
    group_hosts,
    hostvars,
    local_fact,
    peer,
    require_plain_python3,
    venv,
)
from test_mpi import ALLREDUCE


def _mpi_members(request) -> list[str]:
    """The nodes of mpi_group (first one launches), or a skip saying why the check cannot run."""
    hosts_opt = request.config.getoption("hosts", default=None)
    if not hosts_opt or "ansible://" not in str(hosts_opt):
        pytest.skip("needs --hosts=ansible://... --ansible-inventory=INVENTORY")
    first = peer(request.config, group_hosts(request.config, "all")[0])
    hv = hostvars(first)
    missing = [c for c in ("ssh", "mpi", "env") if c not in components(first)]
    if missing:
        pytest.skip(f"the inventory does not install {', '.join(missing)}")
    members = hv["groups"].get(hv.get("mpi_group", "all"), [])
    if len(members) < 2:
        pytest.skip(f"mpi_group has {len(members)} node(s); this check needs 2 or more")
    return members


def test_mpirun_allreduce_across_all_nodes(request):
    members = _mpi_members(request)
    launcher = peer(request.config, members[0])
    facts = {name: local_fact(peer(request.config, name), "gpuenv_mpi") for name in members}
    versions = {name: (f or {}).get("version") for name, f in facts.items()}
    assert len(set(versions.values())) == 1, f"Open MPI versions differ: {versions}"
    slots = sum(int((f or {}).get("slots", 1)) for f in facts.values())
    hostfile = hostvars(launcher).get("mpi_hostfile", "/etc/gpuenv/mpi-hostfile")
    script = ALLREDUCE.replace("'", "'\"'\"'")
    cmd = (
        f"cd /tmp && timeout 180 mpirun --hostfile {hostfile} -np {slots} "
        f"{venv(launcher)}/bin/python -c '{script}'"
    )
    res = as_user(launcher, cluster_user(launcher), cmd)
    assert res.rc == 0, f"mpirun failed (rc {res.rc}): {res.stderr[-2000:]}"
    line = next(x for x in res.stdout.splitlines() if x.startswith("{"))
    result = json.loads(line)
    want_hosts = sorted(peer(request.config, n).check_output("hostname") for n in members)
    assert result["size"] == slots
    assert result["ok"] is True, "the all-reduce result was wrong on some rank"
    assert result["hosts"] == want_hosts, f"ranks ran on {result['hosts']}, want {want_hosts}"


HELLO = re.compile(r"^Hello, World! I am process +([0-9]+) of ([0-9]+) on (\S+?)\.?$")


def test_user_mpirun_of_plain_python3_across_all_nodes(request):
    """What a user types in a login shell on the first node: plain `mpirun` and `python3`.

    The remote ranks start through ssh in a non-login shell, so this holds only when sshd gives
    such sessions the cluster environment (roles/gpu_env, pam_env): their `python3` must be the
    venv's, which has mpi4py. `mpi_yield_when_idle`: ranks that wait yield the CPU (lab nodes
    share cores; busy-polling ranks crawl there).
    """
    members = _mpi_members(request)
    launcher = peer(request.config, members[0])
    require_plain_python3(launcher)
    targets = [address(hostvars(peer(request.config, n)), n) for n in members]
    cmd = (
        "cd /tmp && timeout 180 mpirun --mca mpi_yield_when_idle 1 "
        f"-np {len(members)} --host {','.join(targets)} python3 -m mpi4py.bench helloworld"
    )
    res = as_user(launcher, cluster_user(launcher), cmd)
    assert res.rc == 0, f"{cmd} failed (rc {res.rc}): {res.stderr[-2000:]}"
    lines = [m.groups() for m in map(HELLO.match, res.stdout.splitlines()) if m]
    assert sorted(int(rank) for rank, _, _ in lines) == list(range(len(members))), res.stdout
    assert {int(size) for _, size, _ in lines} == {len(members)}, res.stdout
    want_hosts = sorted(peer(request.config, n).check_output("hostname") for n in members)
    assert sorted(host for _, _, host in lines) == want_hosts, res.stdout
