"""roles/mpi: Open MPI installed, its facts, the hostfile, the MCA interface, a local run."""

from __future__ import annotations

import re

import pytest
from nodehelpers import gpu_count, hostvars, local_fact, login_run, require, require_gpu, venv

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


# The seed documents' first method, as users write it: CuPy arrays straight into Bcast and Gather.
SEED = """
import json
import cupy as cp
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
n = 10 * size
data = cp.arange(n, dtype=cp.float32) if rank == 0 else cp.empty(n, dtype=cp.float32)
comm.Bcast(data, root=0)
part = cp.square(data[rank * 10 : (rank + 1) * 10])
cp.cuda.get_current_stream().synchronize()
got = cp.empty([size, 10], dtype=cp.float32) if rank == 0 else None
comm.Gather(part, got, root=0)
if rank == 0:
    want = cp.square(cp.arange(10 * size, dtype=cp.float32))
    print(json.dumps({"size": size, "ok": bool(cp.all(got.reshape(-1) == want))}))
"""


def _require_cuda_build(host) -> None:
    if hostvars(host).get("mpi_cuda_build", "auto") == "never":
        pytest.skip("mpi_cuda_build: never: this node keeps the OS's Open MPI (no device buffers)")


def test_cuda_awareness_fact_is_the_transfers_answer(host):
    require(host, "mpi")
    fact = _fact(host)
    if gpu_count(host) == 0:
        # No GPU: no transfer runs, and the build's claim is not taken for an answer.
        assert fact["cuda_aware"] is False and fact["cuda_tested"] is False, fact
        assert "no device transfer" in fact["cuda_evidence"], fact
        return
    assert fact["cuda_tested"] is True, fact
    if hostvars(host).get("mpi_cuda_build", "auto") != "never":
        assert fact["cuda_aware"] is True, fact["cuda_evidence"]
        assert fact["prefix"] == hostvars(host).get("mpi_cuda_prefix", "/opt/gpuenv/openmpi")


def test_the_login_shell_runs_the_cuda_aware_mpirun_and_mpi4py(host):
    require(host, "mpi", "env")
    require_gpu(host)
    _require_cuda_build(host)
    prefix = _fact(host)["prefix"]
    assert prefix, "the mpi role recorded no CUDA-aware Open MPI prefix on a GPU node"
    assert login_run(host, "command -v mpirun").stdout.strip() == f"{prefix}/bin/mpirun"
    # mpi4py built from its source against the build: its extension links the build's libmpi (a
    # binary wheel would be MPI.openmpi.*.so, loading whichever libmpi.so.40 comes first).
    py = f"{venv(host)}/bin/python"
    res = login_run(host, f"ldd $({py} -c 'import mpi4py.MPI as m; print(m.__file__)')")
    assert f"libmpi.so.40 => {prefix}/lib/libmpi.so.40" in res.stdout, res.stdout + res.stderr


def test_the_seed_documents_cupy_mpi_method_runs(host):
    require(host, "mpi", "env")
    require_gpu(host)
    _require_cuda_build(host)
    assert _fact(host)["cuda_aware"], _fact(host)["cuda_evidence"]
    script = SEED.replace("'", "'\"'\"'")
    for ranks in (1, 2):
        cmd = f"cd /tmp && timeout 120 mpirun --oversubscribe -np {ranks} python3 -c '{script}'"
        res = login_run(host, cmd)
        assert res.rc == 0, res.stderr[-2000:]
        assert '"ok": true' in res.stdout and f'"size": {ranks}' in res.stdout, res.stdout


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
