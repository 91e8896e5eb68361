"""GPU stack (roles nvidia_driver, cuda_toolkit, nccl) as the node shows it."""

from __future__ import annotations

import re

import pytest
from nodehelpers import driver_left_alone, hostvars, require, require_gpu

NCCL_VERSION = (
    "import ctypes; lib = ctypes.CDLL('libnccl.so.2'); v = ctypes.c_int(); "
    "lib.ncclGetVersion(ctypes.byref(v)); print(v.value)"
)


def test_nouveau_blacklisted(host):
    require(host, "driver")
    alone = driver_left_alone(host)
    if alone:
        # Not blacklisted by gpuenv then, but nouveau must still not be the driver in use.
        assert not host.file("/sys/module/nouveau").exists, f"nouveau is loaded ({alone})"
        return
    out = host.run(
        "grep -rhsE '^[[:space:]]*blacklist[[:space:]]+nouveau' "
        "/etc/modprobe.d /lib/modprobe.d /usr/lib/modprobe.d"
    )
    assert out.stdout.strip(), "no 'blacklist nouveau' in any modprobe.d folder"


def test_driver_packages_held(host):
    require(host, "driver")
    if hostvars(host).get("nvidia_driver_hold") is False:
        pytest.skip("nvidia_driver_hold is false in the inventory")
    alone = driver_left_alone(host)
    if alone:
        pytest.skip(alone)
    held = host.check_output("apt-mark showhold").split()
    nvidia = [p for p in held if re.match(r"^(nvidia|libnvidia|libcuda|cuda-drivers)", p)]
    assert nvidia, f"no NVIDIA driver package is held (held: {held})"


def _held_nvidia(host) -> list[str]:
    held = host.check_output("apt-mark showhold").split()
    return [p for p in held if re.match(r"^(nvidia|libnvidia|libcuda|cuda-drivers)", p)]


def test_driver_packages_pinned_against_drift(host):
    require(host, "driver")
    if hostvars(host).get("nvidia_driver_apt_pin") is False:
        pytest.skip("nvidia_driver_apt_pin is false in the inventory")
    alone = driver_left_alone(host)
    if alone:
        pytest.skip(alone)
    nvidia = _held_nvidia(host)
    assert nvidia, "no NVIDIA driver package is held"
    for pkg in nvidia:
        policy = host.check_output(f"apt-cache policy {pkg}")
        installed = re.search(r"Installed: (\S+)", policy)
        candidate = re.search(r"Candidate: (\S+)", policy)
        # The pin keeps the installed version the candidate whatever the repositories offer.
        assert installed and candidate and installed.group(1) == candidate.group(1), policy


def test_driver_packages_blacklisted_for_unattended_upgrades(host):
    require(host, "driver")
    if hostvars(host).get("nvidia_driver_unattended_upgrades_blacklist") is False:
        pytest.skip("nvidia_driver_unattended_upgrades_blacklist is false in the inventory")
    alone = driver_left_alone(host)
    if alone:
        pytest.skip(alone)
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    listed = {
        entry.replace("[.]", ".").replace("[+]", "+").rstrip("$")
        for entry in re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.+)";$', dump, re.M)
    }
    missing = [p for p in _held_nvidia(host) if p not in listed]
    assert not missing, f"held but not in Unattended-Upgrade::Package-Blacklist: {missing}"


def test_nvidia_smi_installed_and_lists_gpus(host):
    require(host, "driver")
    assert host.exists("nvidia-smi"), "nvidia-smi is not installed"
    require_gpu(host)
    out = host.check_output("nvidia-smi --list-gpus")
    assert re.search(r"^GPU 0:", out, re.M), out


def test_nvcc_version(host):
    require(host, "cuda")
    res = host.run("bash -lc 'nvcc --version'")
    assert res.rc == 0, f"nvcc not found in a login shell: {res.stderr}"
    m = re.search(r"release ([0-9]+\.[0-9]+)", res.stdout)
    assert m, res.stdout
    want = hostvars(host).get("cuda_toolkit_version")
    if want:
        assert m.group(1) == str(want), f"nvcc {m.group(1)}, inventory wants {want}"


def test_nccl_version(host):
    require(host, "nccl")
    res = host.run("bash -lc %s", f'python3 -c "{NCCL_VERSION}"')
    assert res.rc == 0, f"libnccl.so.2 cannot be loaded: {res.stderr}"
    code = int(res.stdout.strip())
    # NCCL encodes 2.22.3 as 22203 (major*10000 + minor*100 + patch) since 2.9.
    version = f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    want = hostvars(host).get("nccl_version")
    if want:
        assert version.startswith(str(want)), f"NCCL {version}, inventory wants {want}"
    assert code >= 20000, f"NCCL version code {code}"
