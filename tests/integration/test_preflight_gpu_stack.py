"""Preflight stops bad GPU-stack input before anything changes, naming the variable.

Each case runs the real playbooks/preflight.yml with ansible-playbook against localhost with a
local connection. Facts come from a small fact module written into a temporary folder
(ANSIBLE_FACTS_MODULES), so the "node" can be any OS and the run needs no docker, no GPU and
changes nothing on this machine. A marker play placed after preflight proves that nothing runs
once preflight fails. All cases are started at once so the file takes a few seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
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


@dataclass(frozen=True)
class Case:
    facts: dict
    extra: dict
    # Strings the failure message must contain: the variable and the allowed values.
    expect: tuple[str, ...]


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
        ("gpu_env_nccl_home", "absolute path"),
    ),
    "build-tools-wrong-type": Case(
        TRIXIE,
        {**GOOD_TRIXIE, "gpu_env_build_tools": "sometimes"},
        ("gpu_env_build_tools", "bool"),
    ),
    "unsupported-os": Case(ROCKY, GOOD_TRIXIE, ("Rocky 9.4 is not supported", "Debian", "Ubuntu")),
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
    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
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
    flat = " ".join(run.output.split())
    for needle in CASES[name].expect:
        assert needle in flat, f"{name}: {needle!r} not in the failure\n{run.output[-3000:]}"
