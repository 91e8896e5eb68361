"""What a user of the GPU stack relies on, checked on the converged lab node.

The same file verifies both scenarios: Debian 13 (NCCL from Debian's packages) and Debian 12
(NCCL from the nvidia-nccl-cu11 wheel in /opt/nccl). The node is a container without a GPU, so
the driver is user space only: nothing here needs a GPU.
"""

import pytest

NCCL_PROGRAM = r"""
#include <cstdio>
#include <nccl.h>
#include <cuda_runtime.h>
int main() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 1;
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::printf("nccl %d cudart %d\n", version, runtime);
  return 0;
}
"""

# What each Debian release gets in the scenarios.
EXPECTED = {
    "13": {
        "nvcc_release": "12.4",
        "driver_branch": "550",
        "nccl_code": "22203",
        "held": [
            "nvidia-smi",
            "libcuda1",
            "libnvidia-ml1",
            "nvidia-cuda-toolkit",
            "libnccl2",
            "libnccl-dev",
        ],
        "build_flags": "",
    },
    "12": {
        "nvcc_release": "11.8",
        "driver_branch": "535",
        "nccl_code": "22105",
        "held": ["nvidia-smi", "libcuda1", "libnvidia-ml1", "nvidia-cuda-toolkit"],
        "build_flags": "-I/opt/nccl/include -L/opt/nccl/lib",
    },
}


@pytest.fixture(scope="module")
def expected(host):
    major = host.system_info.release.split(".")[0]
    assert major in EXPECTED, f"unexpected Debian release {host.system_info.release}"
    return EXPECTED[major]


def test_nvcc_compiles_and_links_against_nccl(host, expected):
    host.run_test("install -d -m 0755 /tmp/gs-nccl-build")
    host.run_test(f"cat > /tmp/gs-nccl-build/t.cu <<'EOF'\n{NCCL_PROGRAM}\nEOF")
    nvcc_version = host.check_output("nvcc --version")
    assert f"release {expected['nvcc_release']}" in nvcc_version
    build = host.run(
        f"nvcc -o /tmp/gs-nccl-build/t /tmp/gs-nccl-build/t.cu {expected['build_flags']} -lnccl"
    )
    assert build.rc == 0, build.stderr
    # The program runs without a GPU: ncclGetVersion needs none, and it must find libnccl.so.2
    # through the dynamic linker (ld.so.conf.d for the wheel).
    out = host.check_output("/tmp/gs-nccl-build/t")
    assert f"nccl {expected['nccl_code']}" in out
    linked = host.check_output("ldd /tmp/gs-nccl-build/t")
    assert "libnccl.so.2" in linked and "not found" not in linked


def test_nvidia_smi_installed_from_the_branch(host, expected):
    smi = host.package("nvidia-smi")
    assert smi.is_installed
    assert smi.version.startswith(expected["driver_branch"] + ".")
    assert host.exists("nvidia-smi")


def test_packages_are_held(host, expected):
    held = host.check_output("apt-mark showhold").split()
    missing = [p for p in expected["held"] if p not in held]
    assert not missing, f"not held: {missing}"


def test_nouveau_blacklisted(host):
    conf = host.file("/etc/modprobe.d/gpuenv-blacklist-nouveau.conf")
    assert conf.exists and conf.mode == 0o644
    assert "blacklist nouveau" in conf.content_string.splitlines()


def test_userspace_only_in_a_container(host):
    # No kernel module package and no dkms on a node that cannot load modules.
    for pkg in ("nvidia-kernel-dkms", "dkms", "nvidia-driver"):
        assert not host.package(pkg).is_installed, pkg


def test_nccl_conf_names_the_inventory_interface(host):
    conf = host.file("/etc/nccl.conf")
    assert conf.exists and conf.mode == 0o644
    lines = conf.content_string.splitlines()
    assert "NCCL_SOCKET_IFNAME=eth0" in lines
    assert "NCCL_DEBUG=WARN" in lines


def test_nonfree_sources_are_deb822(host):
    src = host.file("/etc/apt/sources.list.d/gpuenv-debian-nonfree.sources")
    assert src.exists
    assert "Components: contrib non-free non-free-firmware" in src.content_string
