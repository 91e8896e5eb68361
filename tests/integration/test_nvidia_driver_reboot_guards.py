"""The nvidia_driver role's reboot guards, run for real against localhost with a fixture tree
(nvidia_driver_system_root) and no GPU: before a reboot the next boot's kernel must have an NVIDIA
module (tasks/before_reboot.yml); after it the installed module must be loaded and answer
(tasks/after_reboot.yml). Both only read the node. Each case is one ansible-playbook run; they
start at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLAY = """---
- name: A reboot guard of nvidia_driver
  hosts: all
  gather_facts: true
  tasks:
    - name: Stand in for what the role decided before (tasks/platform.yml, install.yml)
      ansible.builtin.set_fact:
        __nvidia_driver_effective_mode: full
        __nvidia_driver_flavour: proprietary
        __nvidia_driver_platform: {{secure_boot: false}}
        __nvidia_driver_gpu_count: 1
        __nvidia_driver_result: {{version: "550.163.01-2", changed: true}}

    - name: Run the guard
      ansible.builtin.include_role:
        name: gpuenv.cluster.nvidia_driver
        tasks_from: {guard}
"""


def kernel(root: Path, release: str, module: str = "") -> None:
    (root / "boot").mkdir(parents=True, exist_ok=True)
    (root / "boot" / f"vmlinuz-{release}").write_text("")
    (root / "lib/modules" / release / "kernel").mkdir(parents=True)
    if module:
        path = root / "lib/modules" / release / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def upgraded_kernel_without_module(root: Path) -> None:
    kernel(root, "6.1.0-9-amd64", "updates/dkms/nvidia-current.ko")
    kernel(root, "6.1.0-10-amd64")


def upgraded_kernel_with_module(root: Path) -> None:
    kernel(root, "6.1.0-9-amd64", "updates/dkms/nvidia-current.ko")
    kernel(root, "6.1.0-10-amd64", "updates/dkms/nvidia-current.ko")


CASES = {
    "next-boot-kernel-without-module": ("before_reboot", upgraded_kernel_without_module),
    "next-boot-kernel-with-module": ("before_reboot", upgraded_kernel_with_module),
    # This machine has no NVIDIA module loaded: the check after a reboot must fail.
    "module-not-loaded-after-reboot": ("after_reboot", upgraded_kernel_with_module),
}


def _run(name: str, base: Path) -> subprocess.CompletedProcess:
    guard, build = CASES[name]
    work = base / name
    build(work / "system")
    playbook = work / "play.yml"
    playbook.write_text(PLAY.format(guard=guard))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
    }
    extra = {
        "ansible_python_interpreter": sys.executable,
        "nvidia_driver_system_root": str(work / "system"),
    }
    return subprocess.run(
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
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    base = tmp_path_factory.mktemp("reboot-guards")
    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        futures = {name: pool.submit(_run, name, base) for name in CASES}
        return {name: f.result() for name, f in futures.items()}


def _flat(run: subprocess.CompletedProcess) -> str:
    return " ".join((run.stdout + run.stderr).split())


def test_no_reboot_into_a_kernel_without_an_nvidia_module(runs):
    run = runs["next-boot-kernel-without-module"]
    assert run.returncode != 0, run.stdout[-3000:]
    flat = _flat(run)
    assert "not rebooting: the next boot starts kernel 6.1.0-10-amd64" in flat, flat[-3000:]
    assert "the newest of /boot/vmlinuz-* (2 kernel(s))" in flat
    assert "dkms autoinstall -k 6.1.0-10-amd64" in flat


def test_reboot_allowed_when_the_next_kernel_has_a_module(runs):
    run = runs["next-boot-kernel-with-module"]
    assert run.returncode == 0, run.stdout[-3000:]


def test_after_a_reboot_a_missing_module_fails_the_play(runs):
    run = runs["module-not-loaded-after-reboot"]
    assert run.returncode != 0, run.stdout[-3000:]
    flat = _flat(run)
    assert "after the reboot the NVIDIA module is not loaded, not 550.163.01" in flat, flat[-3000:]
