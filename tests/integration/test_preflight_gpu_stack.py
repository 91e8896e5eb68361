"""Preflight stops bad GPU-stack input before anything changes, naming the variable.

Each case runs the real playbooks/preflight.yml with ansible-playbook against localhost with a
local connection. Facts come from a small fact module written into a temporary folder
(ANSIBLE_FACTS_MODULES), so the "node" can be any OS and the run needs no docker, no GPU and
changes nothing on this machine. A marker play placed after preflight proves that nothing runs
once preflight fails, and the recap that no task changed. The node's PCI bus and EFI variables
come from a fixture tree (nvidia_driver_system_root) where a case needs GPUs, NVSwitches or Secure
Boot. All cases are started at once so the file takes a few seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FACT_MODULE = """#!/usr/bin/python
import json, os
from ansible.module_utils.basic import AnsibleModule
def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    with open(os.environ["GS_FAKE_FACTS"]) as f:
        facts = json.load(f)
    module.exit_json(changed=False, ansible_facts=facts)
main()
"""

MARKER_PLAY = """---
- name: Preflight
  ansible.builtin.import_playbook: {preflight}
- name: A later stage
  hosts: all
  gather_facts: false
  tasks:
    - name: Leave a marker
      ansible.builtin.copy:
        content: ran
        dest: "{{{{ gs_marker }}}}"
        mode: "0644"
"""


def fake_facts(distribution: str, major: str, version: str, release: str) -> dict:
    return {
        "distribution": distribution,
        "distribution_major_version": major,
        "distribution_version": version,
        "distribution_release": release,
        "os_family": "Debian",
        "architecture": "x86_64",
        "kernel": "6.1.0-test",
        "virtualization_role": "guest",
        "virtualization_type": "docker",
        "service_mgr": "systemd",
        "python": {"executable": sys.executable},
        "interfaces": ["lo", "eth0"],
        "mounts": [{"mount": "/", "size_available": 200 * 1024**3}],
        "default_ipv4": {"interface": "eth0", "address": "192.0.2.10"},
    }


TRIXIE = fake_facts("Debian", "13", "13.2", "trixie")
BOOKWORM = fake_facts("Debian", "12", "12.11", "bookworm")
ROCKY = fake_facts("Rocky", "9", "9.4", "blue onyx")

GOOD_TRIXIE = {
    "nvidia_driver_branch": "550",
    "cuda_toolkit_version": "12.4",
    "nccl_version": "2.22",
}
GOOD_BOOKWORM = {
    "nvidia_driver_branch": "535",
    "cuda_toolkit_version": "11.8",
    "nccl_install_method": "pip",
    "nccl_version": "2.21",
}


def pci(root: Path, bdf: str, device: int, klass: int) -> None:
    folder = root / "sys/bus/pci/devices" / bdf
    folder.mkdir(parents=True)
    (folder / "vendor").write_text("0x10de\n")
    (folder / "device").write_text(f"0x{device:04x}\n")
    (folder / "class").write_text(f"0x{klass:06x}\n")


def gpus(device: int, count: int = 2) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        for n in range(count):
            pci(root, f"0000:{0x1B + n:02x}:00.0", device, 0x030200)

    return build


def secure_boot_on(root: Path) -> None:
    gpus(0x2330)(root)  # GH100 [H100 SXM5 80GB]
    folder = root / "sys/firmware/efi/efivars"
    folder.mkdir(parents=True)
    (folder / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\0\0\0\x01")


def hgx(root: Path) -> None:
    gpus(0x2330, 8)(root)
    for bus in (7, 8, 9, 10):
        pci(root, f"0000:{bus:02x}:00.0", 0x22A3, 0x068000)  # GH100 [H100 NVSwitch]


FULL = {"nvidia_driver_mode": "full"}


@dataclass(frozen=True)
class Case:
    facts: dict
    extra: dict
    # Strings the failure message must contain: the variable and the allowed values.
    expect: tuple[str, ...]
    # Builds the node's system tree (nvidia_driver_system_root); None: this machine's own.
    system: Callable[[Path], None] | None = None


CASES: dict[str, Case] = {
    "good-trixie": Case(TRIXIE, GOOD_TRIXIE, ()),
    "good-bookworm": Case(BOOKWORM, GOOD_BOOKWORM, ()),
    "unknown-driver-method": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "nvidia_driver_install_method": "runfile"},
        ("nvidia_driver_install_method", "distro", "nvidia_repo"),
    ),
    "no-index-without-find-links": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpu_env_pip_no_index": True, "gpu_env_pip_find_links": []},
        ("gpu_env_pip_no_index is true but gpu_env_pip_find_links is empty",),
    ),
    "malformed-driver-branch": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "nvidia_driver_branch": "latest"},
        ("nvidia_driver_branch='latest'", "three digits"),
    ),
    "malformed-cuda-version": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "cuda_toolkit_version": "12"},
        ("cuda_toolkit_version='12'", "major.minor", "12.4"),
    ),
    "driver-too-old-for-cuda": Case(
        TRIXIE,
        {
            **GOOD_TRIXIE,
            "nvidia_driver_install_method": "nvidia_repo",
            "nvidia_driver_branch": "470",
        },
        ("nvidia_driver_branch=470", "cuda_toolkit_version=12.4", "550.54.14", ">= 550"),
    ),
    "nccl-distro-missing-on-bookworm": Case(
        BOOKWORM,
        {**GOOD_BOOKWORM, "nccl_install_method": "distro"},
        ("nccl_install_method=distro", "Debian 12", "nvidia_repo, pip"),
    ),
    "nccl-cuda-major-mismatch": Case(
        BOOKWORM,
        {**GOOD_BOOKWORM, "nccl_cuda_major": "12"},
        ("nccl_cuda_major=12", "cuda_toolkit_version=11.8", "nvidia-nccl-cu11"),
    ),
    "wrong-type": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "nvidia_driver_reboot": "sometimes"},
        ("nvidia_driver_reboot", "bool"),
    ),
    "value-pam-env-cannot-carry": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpu_env_extra_env": {"OMPI_MCA_FLAGS": "--bind-to none"}},
        ("pam_env cannot carry the values of", "OMPI_MCA_FLAGS", "gpu_env_pam_env: false"),
    ),
    "relative-nccl-home": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpu_env_nccl_home": "opt/nccl"},
        # Refused by preflight's first check, by the format gpu_env's own check states.
        ("gpu_env_nccl_home: 'opt/nccl' does not match ^/",),
    ),
    "build-tools-wrong-type": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpu_env_build_tools": "sometimes"},
        ("gpu_env_build_tools", "bool"),
    ),
    # A list variable given a mapping is named by the argument spec, not left to a template error.
    "find-links-mapping": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpu_env_pip_find_links": {"url": "https://wheels.example/"}},
        ("gpu_env_pip_find_links", "list"),
    ),
    # The site cache stage does not run (no cache host), its variables are checked all the same.
    "cache-port-without-cache-host": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "site_cache_http_port": 99999},
        ("site_cache_http_port", "99999", "TCP port"),
    ),
    "cache-port-not-a-number": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "site_cache_apt_port": "apt"},
        ("site_cache_apt_port", "int"),
    ),
    "unsupported-os": Case(ROCKY, GOOD_TRIXIE, ("Rocky 9.4 is not supported", "Debian", "Ubuntu")),
    "good-full-hopper": Case(TRIXIE, {**GOOD_TRIXIE, **FULL}, (), gpus(0x2330)),
    "blackwell-with-proprietary-modules": Case(
        TRIXIE,
        {**GOOD_TRIXIE, **FULL, "nvidia_driver_module_flavour": "proprietary"},
        (
            "nvidia_driver_module_flavour=proprietary cannot drive GPU 0000:1b:00.0 (10de:2901, "
            "Blackwell): it needs the open kernel module; set nvidia_driver_module_flavour=open",
        ),
        gpus(0x2901),  # GB100 [B200]
    ),
    "volta-with-open-modules": Case(
        BOOKWORM,
        {**GOOD_BOOKWORM, **FULL, "nvidia_driver_module_flavour": "open"},
        (
            "nvidia_driver_module_flavour=open cannot drive GPU 0000:1b:00.0 (10de:1db1, "
            "pre-Turing",
            "set nvidia_driver_module_flavour=proprietary",
        ),
        gpus(0x1DB1),  # GV100GL [Tesla V100 SXM2 16GB]
    ),
    "secure-boot-without-a-key": Case(
        TRIXIE,
        {**GOOD_TRIXIE, **FULL},
        (
            "Secure Boot is on",
            "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c: 1",
            "Set nvidia_driver_signing_key and nvidia_driver_signing_cert",
        ),
        secure_boot_on,
    ),
    "secure-boot-key-missing-on-the-node": Case(
        TRIXIE,
        {
            **GOOD_TRIXIE,
            **FULL,
            "nvidia_driver_signing_key": "/nonexistent/mok.key",
            "nvidia_driver_signing_cert": "/nonexistent/mok.der",
        },
        ("not found on the node: /nonexistent/mok.key, /nonexistent/mok.der",),
        secure_boot_on,
    ),
    "secure-boot-check-off": Case(
        TRIXIE,
        {**GOOD_TRIXIE, **FULL, "nvidia_driver_secure_boot_check": False},
        (),
        secure_boot_on,
    ),
    "nvswitches-without-fabric-manager-package": Case(
        TRIXIE,
        {**GOOD_TRIXIE, **FULL},
        (
            "NVSwitches on the PCI bus (0000:07:00.0, 0000:08:00.0, 0000:09:00.0, "
            "0000:0a:00.0) need Fabric Manager",
            "set nvidia_driver_install_method=nvidia_repo",
        ),
        hgx,
    ),
    "good-sources": Case(
        TRIXIE,
        {
            **GOOD_TRIXIE,
            "gpuenv_sources_preset": "tuna",
            "gpuenv_apt_proxy": "http://cache.site.example:3142",
            "gpuenv_pip_find_links": "http://cache.site.example:8080/",
        },
        (),
    ),
    "unknown-sources-preset": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpuenv_sources_preset": "tsinghua"},
        (
            "gpuenv_sources_preset='tsinghua' is not a known preset",
            "valid: aliyun, official, tuna, ustc",
        ),
    ),
    "sources-mirror-not-a-url": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpuenv_apt_mirror": "mirrors.example.cn/debian"},
        ("not a URL", "gpuenv_apt_mirror"),
    ),
    "sources-ca-bundle-missing": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpuenv_ca_bundle": "/nonexistent/site-ca.pem"},
        ("gpuenv_ca_bundle", "/nonexistent/site-ca.pem does not exist on the controller"),
    ),
    "sources-base-repoint-not-a-bool": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpuenv_apt_base_repoint": "maybe"},
        # Refused by preflight's first check, through the default it feeds.
        (
            "gpuenv_apt_base_repoint: through sources_apt_base_repoint",
            "'maybe' is not a valid boolean",
        ),
    ),
}


@dataclass(frozen=True)
class Run:
    rc: int
    output: str
    marker_written: bool


def _run_case(name: str, case: Case, base: Path) -> Run:
    work = base / name
    work.mkdir()
    (work / "facts.json").write_text(json.dumps(case.facts))
    marker = work / "marker"
    playbook = work / "play.yml"
    playbook.write_text(MARKER_PLAY.format(preflight=ROOT / "playbooks" / "preflight.yml"))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LIBRARY": str(base / "library"),
        "ANSIBLE_FACTS_MODULES": "gs_fake_facts",
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "GS_FAKE_FACTS": str(work / "facts.json"),
    }
    extra = {**case.extra, "gs_marker": str(marker), "ansible_python_interpreter": sys.executable}
    if case.system:
        case.system(work / "system")
        extra["nvidia_driver_system_root"] = str(work / "system")
    proc = subprocess.run(
        [
            shutil.which("ansible-playbook") or "ansible-playbook",
            "-i",
            "gs-node,",
            "-c",
            "local",
            "-e",
            json.dumps(extra),
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return Run(proc.returncode, proc.stdout + proc.stderr, marker.exists())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    base = tmp_path_factory.mktemp("preflight")
    (base / "library").mkdir()
    (base / "library" / "gs_fake_facts.py").write_text(FACT_MODULE)
    # All at once on a machine of a few cores would push single runs past their deadline.
    with ThreadPoolExecutor(max_workers=min(len(CASES), 4 * (os.cpu_count() or 1))) as pool:
        futures = {name: pool.submit(_run_case, name, case, base) for name, case in CASES.items()}
        yield {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.expect])
def test_good_input_passes_preflight(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.rc == 0, run.output[-3000:]
    assert run.marker_written


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.expect])
def test_bad_input_stops_in_preflight(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.rc != 0, f"{name}: preflight passed\n{run.output[-3000:]}"
    assert not run.marker_written, f"{name}: a later stage ran after preflight failed"
    recap = re.search(r"^gs-node\s+:.*$", run.output, re.M)
    assert recap and " changed=0 " in recap.group(0), f"{name}: preflight changed something"
    flat = " ".join(run.output.split())
    for needle in CASES[name].expect:
        assert needle in flat, f"{name}: {needle!r} not in the failure\n{run.output[-3000:]}"
