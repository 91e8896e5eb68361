"""Shared helpers of the node suite: what the inventory installs, what the node has.

Run it against any inventory:
    pytest tests/node --hosts=ansible://all --ansible-inventory=INVENTORY

A check for a component the inventory does not install (host variable ``gpuenv_components``,
default: all of them) skips saying so; a check that needs a GPU skips on a node without one.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
import testinfra
from testinfra.utils.ansible_runner import AnsibleRunner

ALL_COMPONENTS = ("driver", "cuda", "nccl", "ssh", "mpi", "env")

# Counts NVIDIA display/3D controllers on the PCI bus, the way roles/gpu_env decides "GPU node".
PCI_GPU_COUNT = (
    "import glob; print(sum(open(d + '/vendor').read().strip() == '0x10de'"
    " and open(d + '/class').read().startswith('0x03')"
    " for d in glob.glob('/sys/bus/pci/devices/*')))"
)


def hostvars(host) -> dict[str, Any]:
    return host.ansible.get_variables()


def components(host) -> list[str]:
    return list(hostvars(host).get("gpuenv_components", ALL_COMPONENTS))


def require(host, *wanted: str) -> None:
    """Skip unless the inventory installs every wanted component on this host."""
    have = components(host)
    missing = [c for c in wanted if c not in have]
    if missing:
        pytest.skip(
            f"the inventory does not install {', '.join(missing)} on this node "
            f"(gpuenv_components = {have})"
        )


def require_plain_python3(host) -> None:
    """Skip unless the roles make a plain `python3` in a non-login SSH session the venv's
    (roles/gpu_env: the venv on PATH, written for pam_env)."""
    hv = hostvars(host)
    if not hv.get("gpu_env_pam_env", True):
        pytest.skip("gpu_env_pam_env is false: non-login SSH sessions get no gpuenv environment")
    if not hv.get("gpu_env_venv_on_path", True):
        pytest.skip("gpu_env_venv_on_path is false: python3 on PATH is not the venv's")


def gpu_count(host) -> int:
    out = host.check_output("python3 -c %s", PCI_GPU_COUNT)
    return int(out.strip() or 0)


def require_gpu(host) -> None:
    if gpu_count(host) == 0:
        pytest.skip("no NVIDIA GPU on this node (no PCI device of vendor 0x10de, class 03)")


def cluster_user(host) -> str:
    return str(hostvars(host).get("ssh_mesh_user", "gpuenv"))


def venv(host) -> str:
    return str(hostvars(host).get("gpu_env_venv", "/opt/gpuenv"))


def is_root(host) -> bool:
    """Whether the connection runs as root already (then sudo, which a node may lack, is unused)."""
    return host.user().uid == 0


@contextlib.contextmanager
def as_root(host) -> Iterator[None]:
    """Run the block's commands as root: directly when connected as root, else through sudo."""
    if is_root(host):
        yield
    else:
        with host.sudo():
            yield


def as_user(host, user: str, command: str, login: bool = True):
    """Run a command as another user (sudo, or runuser when connected as root), in a login shell
    by default, with that user's HOME."""
    shell = "bash -lc" if login else "bash -c"
    if is_root(host):
        home = host.user(user).home
        return host.run(
            f"runuser -u {shlex.quote(user)} -- env HOME={shlex.quote(home)} "
            f"{shell} {shlex.quote(command)}"
        )
    with host.sudo():
        return host.run(f"sudo -u {shlex.quote(user)} -H {shell} {shlex.quote(command)}")


def login_run(host, command: str):
    """Run a command in a login shell as the cluster user where the inventory creates one
    (ssh_mesh), else as the connection user (Open MPI is then told that root is intended)."""
    if "ssh" in components(host):
        return as_user(host, cluster_user(host), command)
    if is_root(host):
        command = f"export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; {command}"
    return host.run(f"bash -lc {shlex.quote(command)}")


def driver_left_alone(host) -> str:
    """Why the driver role left this node's driver alone, or "" when gpuenv's packages manage it.

    The role leaves a loaded driver of the requested branch unchanged (a runfile or an image put
    it there); then no package of it is held and nothing blacklists nouveau.
    """
    version = host.file("/sys/module/nvidia/version")
    if not version.exists:
        return ""
    packaged = host.run(
        "dpkg-query -W -f='${Package} ${Status}\\n' 'nvidia-driver*' 'cuda-drivers*' nvidia-smi "
        "libcuda1 'libnvidia-compute-*' 2>/dev/null | grep -c ' ok installed$'"
    )
    if packaged.stdout.strip() not in ("", "0"):
        return ""
    return (
        f"driver {version.content_string.strip()} was loaded before gpuenv and no package of "
        "it is installed: the nvidia_driver role left it unchanged"
    )


def local_fact(host, name: str) -> dict[str, Any] | None:
    path = f"/etc/ansible/facts.d/{name}.fact"
    f = host.file(path)
    if not f.exists:
        return None
    return json.loads(f.content_string)


def inventory_path(config: pytest.Config) -> str | None:
    return config.getoption("ansible_inventory", default=None)


def group_hosts(config: pytest.Config, group: str) -> list[str]:
    return AnsibleRunner.get_runner(inventory_path(config)).get_hosts(group)


def peer(config: pytest.Config, name: str):
    """A testinfra host for another inventory host, reached the way Ansible reaches it."""
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=inventory_path(config))


def address(host_vars: dict[str, Any], name: str) -> str:
    """The address other nodes reach this node at (as roles/ssh_mesh and roles/mpi use it)."""
    return str(
        host_vars.get("ssh_mesh_address")
        or host_vars.get("mpi_host_address")
        or host_vars.get("ansible_host")
        or name
    )
