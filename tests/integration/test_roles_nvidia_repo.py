"""NVIDIA's repository entry: rendered with the overridable URL and signed-by, and a download
failure names the URL. NVIDIA's repository is not reachable from CI, so the tests serve a
stand-in key on 127.0.0.1 and run the repository tasks of the shared apt role
(gpuenv.cluster.apt_pin, asked with its one dictionary as the GPU stack roles ask it) in check
mode: nothing changes on this machine; check mode still makes get_url probe the URL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLAY = """---
- name: Render NVIDIA's repository entry
  hosts: all
  gather_facts: true
  tasks:
    - name: Add the repository
      ansible.builtin.include_role:
        name: gpuenv.cluster.apt_pin
        tasks_from: nvidia_repo
      vars:
        apt_pin_request:
          packages: [nvidia-smi]
          version_regex: '^550\\.'
          request: nvidia_driver_install_method=nvidia_repo
          nvidia_repo:
            url: "{{ gs_base }}"
            dist: debian13
            hint: nvidia_driver_repo_url / nvidia_driver_repo_key_url
          retries: 1
          delay: 0
"""


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mirror")
    key = root / "cuda" / "repos" / "debian13" / "x86_64" / "3bf863cc.pub"
    key.parent.mkdir(parents=True)
    key.write_text(
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\nstand-in\n-----END PGP PUBLIC KEY BLOCK-----\n"
    )
    server = HTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/cuda/repos/"
    server.shutdown()


def _run(base: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_GATHER_SUBSET": "!all,!min,architecture",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    extra = {"gs_base": base, "ansible_python_interpreter": sys.executable}
    cmd = [shutil.which("ansible-playbook") or "ansible-playbook", "--check", "--diff"]
    cmd += ["-i", "gs-node,", "-c", "local", "-e", json.dumps(extra), str(play)]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(not Path("/etc/apt/sources.list.d").is_dir(), reason="needs a Debian-like host")
def test_entry_uses_the_mirror_and_the_keyring(mirror: str, tmp_path: Path) -> None:
    proc = _run(mirror, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert f"+URIs: {mirror}debian13/x86_64/" in out
    assert "+Suites: /" in out
    assert "+Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in out


def test_unreachable_repository_is_named(tmp_path: Path) -> None:
    # Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    base = "http://127.0.0.1:9/cuda/repos"
    proc = _run(base, tmp_path)
    assert proc.returncode != 0
    flat = " ".join(proc.stdout.split())
    assert "could not download the NVIDIA repository key from" in flat
    assert f"{base}/debian13/x86_64/3bf863cc.pub" in flat
    assert "nvidia_driver_repo_url" in flat
