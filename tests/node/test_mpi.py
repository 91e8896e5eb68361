"""roles/mpi: Open MPI installed, its facts, the hostfile, the MCA interface, a local run."""

from __future__ import annotations

import re

from nodehelpers import hostvars, local_fact, login_run, require, venv

ALLREDUCE = """
import json
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
n = 1 << 20
mine = np.arange(n, dtype=np.float64) * (comm.rank + 1)
total = np.empty_like(mine)
comm.Allreduce(mine, total, op=MPI.SUM)
expected = np.arange(n, dtype=np.float64) * (comm.size * (comm.size + 1) / 2)
names = comm.gather(MPI.Get_processor_name(), root=0)
oks = comm.gather(bool(np.array_equal(total, expected)), root=0)
if comm.rank == 0:
    print(json.dumps({"size": comm.size, "ok": all(oks), "hosts": sorted(set(names))}))
"""


def _fact(host) -> dict:
    fact = local_fact(host, "gpuenv_mpi")
    assert fact is not None, "/etc/ansible/facts.d/gpuenv_mpi.fact is missing"
    return fact


def test_mpirun_version_matches_recorded_fact(host):
    require(host, "mpi")
    out = host.check_output("mpirun --version")
    m = re.search(r"Open MPI\)? ([0-9][0-9.]*)", out) or re.search(r"([0-9]+\.[0-9]+\.[0-9]+)", out)
    assert m, f"mpirun --version printed no version: {out!r}"
    assert m.group(1) == _fact(host)["version"]
    for pkg in ("openmpi-bin", "libopenmpi-dev"):
        if not hostvars(host).get("mpi_packages"):
            assert host.package(pkg).is_installed, f"{pkg} is not installed"


def test_cuda_awareness_fact_matches_ompi_info(host):
    require(host, "mpi")
    out = host.check_output("ompi_info --parsable --all")
    built = "mpi_built_with_cuda_support:value:true" in out
    assert _fact(host)["cuda_aware"] is built


def test_hostfile_lists_every_mpi_node(host):
    require(host, "mpi")
    hv = hostvars(host)
    group = hv.get("mpi_group", "all")
    path = hv.get("mpi_hostfile", "/etc/gpuenv/mpi-hostfile")
    lines = [
        line.split()
        for line in host.file(path).content_string.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(lines) == len(hv["groups"][group]), f"{path}: {lines}"
    for fields in lines:
        slots = dict(f.split("=", 1) for f in fields[1:]).get("slots", "0")
        assert int(slots) >= 1, f"{path}: {fields}"


def test_mca_interface_is_in_effect(host):
    require(host, "mpi")
    iface = _fact(host)["interface"]
    want = hostvars(host).get("mpi_network_interface") or iface
    assert iface == want
    # /sys/class/net rather than `ip`, which minimal images lack.
    assert host.file(f"/sys/class/net/{iface}").exists, f"interface {iface} does not exist"
    out = host.check_output("ompi_info --parsable --param btl tcp --level 9")
    assert f"btl_tcp_if_include:value:{iface}" in out, "btl_tcp_if_include is not set"


def test_local_mpi4py_allreduce(host):
    require(host, "mpi", "env")
    py = f"{venv(host)}/bin/python"
    script = ALLREDUCE.replace("'", "'\"'\"'")
    cmd = f"cd /tmp && timeout 120 mpirun --oversubscribe -np 2 {py} -c '{script}'"
    res = login_run(host, cmd)
    assert res.rc == 0, res.stderr
    assert '"ok": true' in res.stdout and '"size": 2' in res.stdout, res.stdout
