"""What a user of the GPU stack relies on, checked on the converged lab node.

The same file verifies both scenarios: Debian 13 (NCCL from Debian's packages) and Debian 12
(NCCL from the nvidia-nccl-cu11 wheel in /opt/nccl). The node is a container without a GPU, so
the driver is user space only: nothing here needs a GPU.
"""

import re

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


# Driver drift: a newer version of every held GPU package is offered by a local repository (fake
# packages of the same names, built on the node with dpkg-deb and apt-ftparchive, served from a
# file: URI), together with a canary package that nothing protects. unattended-upgrade's dry run
# must select the canary (so the run could select anything) and none of the GPU packages.
UU_REPO = "/tmp/gs-uu-repo"
UU_ORIGIN = "gs-uu-test"
CANARY = "gs-uu-canary"
UU_SOURCE = "/etc/apt/sources.list.d/gs-uu-test.list"
# Last of apt.conf.d: only the test repository's origin is allowed, so the dry run downloads
# nothing from the archive.
UU_CONF = "/etc/apt/apt.conf.d/99zz-gs-uu-test"
# An apt configuration with every pin file out of the way: the blacklist alone must hold.
NO_PINS = "/tmp/gs-uu-no-pins.conf"
FAKE_CONTROL = "Package: {0}\nVersion: {1}\nArchitecture: {2}\nMaintainer: gs <gs@localhost>\n"
FAKE_CONTROL += "Description: newer-looking fake of {0} (molecule test)\n"


def _sh(host, command):
    done = host.run(command)
    assert done.rc == 0, f"{command}: exit status {done.rc}: {done.stderr}"
    return done.stdout


def _fake_deb(host, name, version, arch):
    folder = f"{UU_REPO}/build/{name}-{version}"
    _sh(host, f"install -d -m 0755 {folder}/DEBIAN")
    control = FAKE_CONTROL.format(name, version, arch)
    _sh(host, f"cat > {folder}/DEBIAN/control <<'EOF'\n{control}EOF")
    _sh(host, f"dpkg-deb -b -Zgzip {folder} {UU_REPO}/{name}_{version}_{arch}.deb")


def _upgraded(output):
    """The packages of unattended-upgrade's "Packages that will be upgraded: a b" line."""
    for line in output.splitlines():
        if "Packages that will be upgraded:" in line:
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module")
def newer_offered(host, expected):
    _sh(
        host,
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        "unattended-upgrades apt-utils",
    )
    _sh(host, f"rm -rf {UU_REPO} && install -d -m 0755 {UU_REPO}")
    versions = {}
    for name in expected["held"]:
        fields = _sh(host, f"dpkg-query -W -f='${{Version}} ${{Architecture}}' {name}")
        version, arch = fields.split()
        versions[name] = version
        _fake_deb(host, name, f"{version}+gs1", arch)
    # The canary: installed at 1.0, offered at 2.0, neither held, pinned nor blacklisted.
    _fake_deb(host, CANARY, "1.0", "all")
    _sh(host, f"dpkg -i {UU_REPO}/{CANARY}_1.0_all.deb")
    _sh(host, f"rm {UU_REPO}/{CANARY}_1.0_all.deb")
    _fake_deb(host, CANARY, "2.0", "all")
    _sh(
        host,
        f"cd {UU_REPO} && apt-ftparchive packages . > Packages && apt-ftparchive "
        f"-o APT::FTPArchive::Release::Origin={UU_ORIGIN} release . > Release",
    )
    _sh(host, f"echo 'deb [trusted=yes] file:{UU_REPO} ./' > {UU_SOURCE}")
    _sh(
        host,
        f"printf '%s\\n' '#clear Unattended-Upgrade::Origins-Pattern;' "
        f"'#clear Unattended-Upgrade::Allowed-Origins;' "
        f"'Unattended-Upgrade::Origins-Pattern {{ \"origin={UU_ORIGIN}\"; }};' > {UU_CONF}",
    )
    _sh(
        host,
        "install -d -m 0755 /tmp/gs-uu-no-pins && printf '%s\\n' "
        "'Dir::Etc::PreferencesParts \"/tmp/gs-uu-no-pins\";' "
        f"'Dir::Etc::Preferences \"/dev/null\";' > {NO_PINS}",
    )
    _sh(host, "apt-get update -q")
    yield versions
    host.run(f"rm -rf {UU_REPO} {UU_SOURCE} {UU_CONF} {NO_PINS} /tmp/gs-uu-no-pins")
    host.run(f"dpkg --purge {CANARY}")
    host.run("apt-get update -q")


def test_unattended_upgrade_selects_no_gpu_package(host, newer_offered):
    run = host.run("unattended-upgrade --dry-run -d")
    selected = _upgraded(run.stdout + run.stderr)
    assert CANARY in selected, f"the dry run selected nothing it could: {run.stdout[-2000:]}"
    assert not selected & set(newer_offered), f"GPU packages selected: {selected}"


def test_pin_keeps_the_installed_version_the_candidate(host, newer_offered):
    for name, version in newer_offered.items():
        policy = host.check_output(f"apt-cache policy {name}")
        assert f"Installed: {version}" in policy and f"Candidate: {version}" in policy, policy
        # The newer version is offered, and pinned away.
        assert re.search(rf"^\s+{re.escape(version)}\+gs1 -1$", policy, re.M), policy
    canary = host.check_output(f"apt-cache policy {CANARY}")
    assert "Candidate: 2.0" in canary, canary


def test_blacklist_alone_keeps_them_out(host, newer_offered):
    # Pins out of the way (APT_CONFIG) and the holds lifted for the one dry run: only the
    # blacklist is left, and unattended-upgrades must still select none of the GPU packages.
    packages = " ".join(newer_offered)
    name = next(iter(newer_offered))
    unpinned = host.check_output(f"APT_CONFIG={NO_PINS} apt-cache policy {name}")
    assert f"Candidate: {newer_offered[name]}+gs1" in unpinned, unpinned
    _sh(host, f"apt-mark unhold {packages}")
    try:
        run = host.run(f"APT_CONFIG={NO_PINS} unattended-upgrade --dry-run -d")
    finally:
        _sh(host, f"apt-mark hold {packages}")
    output = run.stdout + run.stderr
    selected = _upgraded(output)
    assert CANARY in selected, output[-2000:]
    assert not selected & set(newer_offered), f"GPU packages selected: {selected}"
    for pkg in newer_offered:
        # unattended-upgrades turns each blacklist entry into a pin it never lets through.
        assert f"PkgPin(pkg='/^{pkg}$/', priority=-32768)" in output, f"{pkg} not blacklisted"


def test_pin_and_blacklist_files(host, expected):
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    listed = {
        entry.replace("[.]", ".").replace("[+]", "+").rstrip("$")
        for entry in re.findall(r'^Unattended-Upgrade::Package-Blacklist:: "(.+)";$', dump, re.M)
    }
    missing = set(expected["held"]) - listed
    assert not missing, f"not in Unattended-Upgrade::Package-Blacklist: {missing}"
    pinned = set()
    for pin in host.run("ls /etc/apt/preferences.d/").stdout.split():
        conf = host.file(f"/etc/apt/preferences.d/{pin}")
        if pin.startswith("gpuenv-"):
            assert conf.mode == 0o644 and "Pin-Priority: -1" in conf.content_string, pin
            pinned |= set(re.findall(r"^Package: (.+)$", conf.content_string, re.M)[0].split())
    missing = set(expected["held"]) - pinned
    assert not missing, f"not pinned in /etc/apt/preferences.d/gpuenv-*.pref: {missing}"
