"""The repository builds into the collection tarball gpuenv.cluster, the tarball installs with
ansible-galaxy (from the file: no Galaxy server is reachable from CI), and a playbook outside the
repository uses its roles and modules by their full names.

The playbook runs against localhost (local connection) from a temporary folder, with an empty
ansible.cfg and ANSIBLE_COLLECTIONS_PATH naming only the temporary install, so nothing can come
from the checkout. It runs the roles' validate entry (what preflight runs) and the modules in
check mode: it changes nothing on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VERSION = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
TARBALL = f"gpuenv-cluster-{VERSION}.tar.gz"

PLAY = """---
- name: Use gpuenv.cluster from an installed tarball
  hosts: localhost
  connection: local
  gather_facts: true
  vars:
    # NVIDIA's repository offers any branch and version on every supported OS (this machine's).
    nvidia_driver_install_method: nvidia_repo
    nvidia_driver_branch: "550"
    cuda_toolkit_install_method: nvidia_repo
    cuda_toolkit_version: "12.4"
    nccl_install_method: pip
    nccl_version: "2.22"
    # gpu_env_gpuenv_install left at auto: outside a checkout, the wheel the collection carries.
  tasks:
    - name: Check the GPU stack variables as preflight does
      ansible.builtin.include_role:
        name: "gpuenv.cluster.{{ item }}"
        tasks_from: validate
      loop: [sources, nvidia_driver, cuda_toolkit, nccl, gpu_env]

    - name: Write a file in check mode
      gpuenv.cluster.gpuenv_files:
        files:
          - path: "{{ gs_dir }}/written.conf"
            content: "x=1\\n"
            owner: "{{ ansible_facts['user_id'] }}"
            group: "{{ lookup('ansible.builtin.pipe', 'id -gn') }}"
      check_mode: true
      register: gs_files

    - name: Find PyYAML in the Python running the modules
      gpuenv.cluster.python_packages_info:
        names: [PyYAML]
        interpreter: true
      register: gs_found

    - name: Report what the modules said
      ansible.builtin.copy:
        content: >-
          {{ {'files': gs_files, 'found': gs_found,
              'tuna_pypi': ('tuna' | gpuenv.cluster.sources_preset).pypi.index_url} | to_json }}
        dest: "{{ gs_dir }}/result.json"
        mode: "0644"
"""


@dataclass(frozen=True)
class Installed:
    tarball: Path
    collections: Path
    env: dict[str, str]
    work: Path


def _bin(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or name


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("collection")
    work = base / "elsewhere"
    work.mkdir()
    (work / "ansible.cfg").write_text("[defaults]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(work / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(base / "collections"),
        ANSIBLE_LOCAL_TEMP=str(base / "tmp"),
        ANSIBLE_NOCOLOR="1",
    )
    # The project's build: the gpuenv wheel first, into the collection, then the tarball.
    build = _run(
        ["bash", str(ROOT / "scripts" / "build-collection.sh"), str(base)],
        {**env, "PYTHON": sys.executable},
        work,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    tarball = base / TARBALL
    galaxy = [_bin("ansible-galaxy"), "collection", "install", "--offline"]
    install = _run([*galaxy, "-p", str(base / "collections"), str(tarball)], env, work)
    assert install.returncode == 0, install.stdout + install.stderr
    return Installed(tarball, base / "collections", env, work)


def test_tarball_holds_the_collection_and_nothing_else(installed: Installed) -> None:
    with tarfile.open(installed.tarball) as tar:
        names = set(tar.getnames())
    for wanted in (
        "MANIFEST.json",
        "FILES.json",
        "meta/runtime.yml",
        "roles/apt_pin/meta/argument_specs.yml",
        "roles/nvidia_driver/tasks/main.yml",
        "plugins/modules/gpuenv_files.py",
        "plugins/module_utils/node.py",
        "plugins/filter/ssh_mesh.py",
        "playbooks/preflight.yml",
        "docs/collection.md",
        "playbooks/site.yml",
        f"roles/gpu_env/files/wheel/gpuenv-{VERSION}-py3-none-any.whl",
    ):
        assert wanted in names, wanted
    tops = {name.split("/")[0] for name in names}
    assert not tops & {"tests", "molecule", "scripts", "benchmarks", ".venv", ".ansible"}
    # Nothing of the Python package: the shared tables live in plugins/module_utils.
    assert "gpuenv" not in tops
    assert "plugins/module_utils/sources.py" in names
    # About 270 KB of roles, plugins and docs plus the gpuenv wheel (about 370 KB, compressed
    # already; 641 KB in all on 2026-12-02): the bound catches a stray venv, cache or a second
    # wheel (each would pass it), not the next role's few kilobytes.
    assert installed.tarball.stat().st_size < 900_000


def test_declared_collections_install_offline_from_the_ansible_package(installed: Installed):
    # galaxy.yml declares what the roles use; --offline resolved them from the collections the
    # ansible package carries, so no Galaxy server was contacted (none is reachable from CI).
    manifest = json.loads(
        (installed.collections / "ansible_collections/gpuenv/cluster/MANIFEST.json").read_text()
    )
    assert set(manifest["collection_info"]["dependencies"]) == {
        "ansible.posix",
        "community.crypto",
    }
    # Every collection a role or a shipped playbook names is declared.
    used = set()
    for path in [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "playbooks").glob("*.yml")]:
        for fqcn in (
            "ansible.posix.",
            "community.crypto.",
            "community.general.",
            "community.docker.",
        ):
            if fqcn in path.read_text():
                used.add(fqcn.rstrip("."))
    assert used <= set(manifest["collection_info"]["dependencies"])


def test_outside_playbook_uses_roles_and_modules_by_full_name(installed: Installed) -> None:
    play = installed.work / "play.yml"
    play.write_text(PLAY)
    extra = {"gs_dir": str(installed.work), "ansible_python_interpreter": sys.executable}
    proc = _run(
        [_bin("ansible-playbook"), "-i", "localhost,", "-e", json.dumps(extra), str(play)],
        installed.env,
        installed.work,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    result = json.loads((installed.work / "result.json").read_text())
    # Check mode: the module reports the file it would write and writes nothing.
    assert result["files"]["changed_paths"] == [str(installed.work / "written.conf")]
    assert not (installed.work / "written.conf").exists()
    assert "pyyaml" in result["found"]["interpreter"]
    # The presets table travelled with the collection (module_utils): the roles' filter reads it.
    assert result["tuna_pypi"] == "https://pypi.tuna.tsinghua.edu.cn/simple"
    # The roles came from the installed copy, not from the checkout.
    doc = _run(
        [_bin("ansible-doc"), "-t", "role", "gpuenv.cluster.apt_pin"], installed.env, installed.work
    )
    assert doc.returncode == 0, doc.stderr
    assert str(installed.collections / "ansible_collections" / "gpuenv" / "cluster") in doc.stdout
    assert str(ROOT) not in doc.stdout


def test_bad_variable_fails_naming_it(installed: Installed) -> None:
    play = installed.work / "bad.yml"
    play.write_text(
        "- name: Bad input\n  hosts: localhost\n  connection: local\n  gather_facts: true\n"
        "  roles:\n    - role: gpuenv.cluster.nccl\n      nccl_install_method: tarball\n"
    )
    extra = {"ansible_python_interpreter": sys.executable}
    argv = [_bin("ansible-playbook"), "--check", "-i", "localhost,", "-e", json.dumps(extra)]
    proc = _run([*argv, str(play)], installed.env, installed.work)
    assert proc.returncode != 0
    flat = " ".join(proc.stdout.split())
    assert "nccl_install_method" in flat and "tarball" in flat, proc.stdout[-3000:]
    assert "changed=0" in flat


def test_site_playbook_runs_by_its_full_name(installed: Installed) -> None:
    # `ansible-playbook gpuenv.cluster.site` resolves from the installed collection alone: every
    # stage it imports parses (the converge itself: the opt-in tests/lab/test_userpath_lab.py).
    argv = [_bin("ansible-playbook"), "--syntax-check", "-i", "localhost,", "gpuenv.cluster.site"]
    proc = _run(argv, installed.env, installed.work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    listed = _run([argv[0], "--list-tasks", *argv[2:]], installed.env, installed.work)
    assert listed.returncode == 0, listed.stderr[-3000:]
    for stage in ("Preflight checks", "Stage validate"):
        assert stage in listed.stdout, stage
