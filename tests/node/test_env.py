"""roles/gpu_env: the environment in login shells and services, the cluster venv."""

from __future__ import annotations

import shlex

import pytest
from nodehelpers import (
    address,
    as_root,
    as_user,
    cluster_user,
    gpu_count,
    hostvars,
    local_fact,
    login_run,
    require,
    require_gpu,
    require_plain_python3,
    venv,
)

CUDA_CANDIDATES = ("/usr/local/cuda", "/usr/lib/nvidia-cuda-toolkit", "/usr/lib/cuda")


def _cuda_home(host) -> str | None:
    configured = hostvars(host).get("gpu_env_cuda_home")
    for path in [configured] if configured else CUDA_CANDIDATES:
        if host.file(f"{path}/bin/nvcc").exists:
            return path
    return None


def _login_env(host) -> dict[str, str]:
    """A login shell's environment (the cluster user's, or the connection user's: login_run)."""
    res = login_run(host, "env")
    assert res.rc == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


def test_login_shell_sees_the_environment(host):
    require(host, "env")
    env = _login_env(host)
    assert env.get("GPUENV_VENV") == venv(host)
    path = env.get("PATH", "").split(":")
    if hostvars(host).get("gpu_env_venv_on_path", True):
        assert f"{venv(host)}/bin" in path, f"PATH={env.get('PATH')}"
    cuda = _cuda_home(host)
    if cuda:
        assert env.get("CUDA_HOME") == cuda
        assert f"{cuda}/bin" in path
        if host.file(f"{cuda}/lib64").exists:
            assert f"{cuda}/lib64" in env.get("LD_LIBRARY_PATH", "").split(":")
    else:
        assert "CUDA_HOME" not in env, "CUDA_HOME is set but no CUDA toolkit was found"
    nccl = local_fact(host, "gpuenv_nccl") or {}
    want_nccl = hostvars(host).get("gpu_env_nccl_home") or nccl.get("home")
    assert env.get("NCCL_HOME") == want_nccl, f"NCCL_HOME={env.get('NCCL_HOME')!r}, fact {nccl}"
    if nccl.get("ld_library_path") and not hostvars(host).get("gpu_env_nccl_home"):
        assert nccl["ld_library_path"] in env.get("LD_LIBRARY_PATH", "").split(":"), env
    for name, value in {
        **hostvars(host).get("gpu_env_nccl_env", {}),
        **hostvars(host).get("gpu_env_extra_env", {}),
    }.items():
        assert env.get(name) == str(value), f"{name}={env.get(name)!r}, want {value!r}"


def test_services_see_the_environment(host):
    require(host, "env")
    if not hostvars(host).get("gpu_env_systemd", True):
        pytest.skip("gpu_env_systemd is false: services get no gpuenv environment")
    if not host.file("/run/systemd/system").is_directory:
        pytest.skip("systemd is not this node's init: there are no services to look at")
    # A real (transient) service, not just the manager's settings.
    with as_root(host):
        out = host.check_output("systemd-run --wait --pipe --quiet env")
    assert f"GPUENV_VENV={venv(host)}" in out.splitlines(), out


def test_venv_imports_the_cluster_stack(host):
    require(host, "env")
    py = f"{venv(host)}/bin/python"
    res = host.run(
        "%s -c %s",
        py,
        "import gpuenv, mpi4py, numpy; from mpi4py import MPI; print(MPI.Get_library_version())",
    )
    assert res.rc == 0, res.stderr
    assert "Open MPI" in res.stdout or "MPICH" in res.stdout, res.stdout
    assert host.run("%s/bin/gpuenv --help", venv(host)).rc == 0


def test_torch_present_when_requested(host):
    require(host, "env")
    want = hostvars(host).get("gpu_env_install_torch")
    if want is None:
        pytest.skip("gpu_env_install_torch is not in the inventory (role default: GPU nodes only)")
    res = host.run("%s/bin/python -c 'import torch; print(torch.__version__)'", venv(host))
    assert (res.rc == 0) is bool(want), res.stderr or res.stdout


# The module each of gpu_env_frameworks is imported by, and whether CPU-only nodes get it too.
FRAMEWORK_MODULES = {
    "dask": ("distributed", True),
    "tensorflow": ("tensorflow", True),
    "pycuda": ("pycuda.driver", False),
    "horovod": ("horovod.torch", True),
}


def test_requested_frameworks_import_in_the_venv(host):
    require(host, "env")
    wanted = hostvars(host).get("gpu_env_frameworks") or []
    if not wanted:
        pytest.skip("gpu_env_frameworks is empty here: no framework was asked for")
    gpu = gpu_count(host) > 0
    for name in wanted:
        module, on_cpu_nodes = FRAMEWORK_MODULES[name]
        if not (gpu or on_cpu_nodes):
            continue  # pycuda is for GPU nodes only
        res = host.run("%s/bin/python -c %s", venv(host), f"import {module}")
        assert res.rc == 0, f"{name}: {res.stderr}"


def test_gpu_python_stack_sees_the_gpus(host):
    require(host, "env")
    require_gpu(host)
    py = f"{venv(host)}/bin/python"
    cupy = host.run("%s -c %s", py, "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
    assert cupy.rc == 0 and int(cupy.stdout.strip()) > 0, cupy.stderr


def test_plain_ssh_command_sees_the_environment(host):
    """`ssh node cmd` runs a non-login shell (no /etc/profile.d): its python3 must be the venv's."""
    require(host, "ssh", "env")
    require_plain_python3(host)
    target = address(hostvars(host), hostvars(host)["inventory_hostname"])
    probe = "import sys, mpi4py; print(sys.executable)"
    cmd = (
        "ssh -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 "
        f"{shlex.quote(target)} python3 -c {shlex.quote(shlex.quote(probe))}"
    )
    res = as_user(host, cluster_user(host), cmd, login=False)
    assert res.rc == 0, f"{cmd}: rc={res.rc} {res.stderr.strip()}"
    assert res.stdout.strip() == f"{venv(host)}/bin/python3", res.stdout


NCCL_PROGRAM = r"""#include <stdio.h>
#include <nccl.h>

int main(void) {
  int version = 0;
  ncclResult_t result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    fprintf(stderr, "ncclGetVersion: %s\n", ncclGetErrorString(result));
    return 1;
  }
  printf("header %d library %d\n", NCCL_VERSION_CODE, version);
  return 0;
}
"""

# Only the login environment: NCCL_HOME names the NCCL to build against; nvcc when CUDA is on
# PATH, else the C++ compiler (nccl.h includes cuda_runtime.h, found through CUDA_HOME).
NCCL_MAKEFILE = """NVCC := $(shell command -v nvcc)
BUILD := $(if $(NVCC),$(NVCC),$(CXX) $(if $(CUDA_HOME),-I$(CUDA_HOME)/include))

ncclversion: ncclversion.cpp
\t$(BUILD) -I$(NCCL_HOME)/include -o $@ $< -L$(NCCL_HOME)/lib -lnccl
"""


def _nccl_code(version: str) -> int:
    """NCCL's version code (2.21.5 -> 22105) from a major.minor.patch version."""
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    return major * 10000 + minor * 100 + patch


def test_nccl_program_builds_with_make_from_the_login_environment(host):
    """A user's first NCCL program: `make` against $NCCL_HOME, then run it: the installed NCCL
    answers (the version the nccl role recorded)."""
    require(host, "nccl", "env")
    if not hostvars(host).get("gpu_env_build_tools", True):
        pytest.skip("gpu_env_build_tools is false: make and the compiler are the site's business")
    fact = local_fact(host, "gpuenv_nccl")
    assert fact is not None, "/etc/ansible/facts.d/gpuenv_nccl.fact is missing (roles/nccl)"
    env = _login_env(host)
    assert env.get("NCCL_HOME") == fact["home"], f"NCCL_HOME={env.get('NCCL_HOME')!r}, fact {fact}"
    compiler = "nvcc" if login_run(host, "command -v nvcc").rc == 0 else "c++"
    cuda_include = f"{env.get('CUDA_HOME', '/usr')}/include"
    if compiler == "c++" and not host.file(f"{cuda_include}/cuda_runtime.h").exists:
        pytest.skip("no CUDA toolkit on this node: nccl.h includes cuda_runtime.h, which it lacks")
    script = (
        'set -e; d=$(mktemp -d); trap \'rm -rf "$d"\' EXIT; cd "$d"; '
        f"printf %s {shlex.quote(NCCL_MAKEFILE)} > Makefile; "
        f"printf %s {shlex.quote(NCCL_PROGRAM)} > ncclversion.cpp; "
        "make -s && ./ncclversion"
    )
    res = login_run(host, script)
    assert res.rc == 0, f"make ({compiler}) or the run failed (rc {res.rc}): {res.stderr[-2000:]}"
    words = res.stdout.split()
    header, library = int(words[words.index("header") + 1]), int(words[words.index("library") + 1])
    want = _nccl_code(fact["version"])
    built = f"built with {compiler}, installed {fact['version']}"
    assert library == want, f"{built}: libnccl answers {library}"
    assert header == want, f"{built}: nccl.h says {header}"
