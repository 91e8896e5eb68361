"""roles/gpu_env: the environment in login shells and services, the cluster venv."""

from __future__ import annotations

import pytest
from nodehelpers import as_root, hostvars, login_run, require, require_gpu, venv

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


def test_gpu_python_stack_sees_the_gpus(host):
    require(host, "env")
    require_gpu(host)
    py = f"{venv(host)}/bin/python"
    cupy = host.run("%s -c %s", py, "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
    assert cupy.rc == 0 and int(cupy.stdout.strip()) > 0, cupy.stderr
