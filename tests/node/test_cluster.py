"""Across nodes: one mpirun over the SSH mesh, as the cluster user, on every node of mpi_group.

Runs once per session (no `host` fixture): from the first node of the group, with the generated
hostfile, an mpi4py all-reduce of numpy arrays whose result every rank checks.
"""

from __future__ import annotations

import json

import pytest
from nodehelpers import (
    as_user,
    cluster_user,
    components,
    group_hosts,
    hostvars,
    local_fact,
    peer,
    venv,
)
from test_mpi import ALLREDUCE


def test_mpirun_allreduce_across_all_nodes(request):
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
