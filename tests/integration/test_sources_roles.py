"""Push and pull read the sources alike: the roles' defaults (expressions over the gpuenv_*
variables, the preset read through plugins/filter/sources.py) give the same mirrors, repository,
index, proxy and wheel folders as gpuenv.cloud.sources.resolve(), which `gpuenv cloud-init`
uses, for every preset and for a site that overrides everything.

One ansible-playbook run on localhost (local connection, no facts, nothing changed): each case is
an inventory host with its own gpuenv_* variables; the roles' defaults files are the inventory's
group_vars of "all" (below host variables, as role defaults are), so they are templated exactly as
when the roles run, and the play writes them as JSON into a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv.cloud import sources

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("nvidia_driver", "cuda_toolkit", "nccl", "gpu_env")
SHOWN = (
    "nvidia_driver_debian_mirror",
    "nvidia_driver_repo_url",
    "nvidia_driver_repo_key_url",
    "cuda_toolkit_debian_mirror",
    "cuda_toolkit_repo_url",
    "nccl_repo_url",
    "nccl_repo_key_url",
    "cuda_toolkit_pip_extra_args",
    "nccl_pip_extra_args",
    "gpu_env_pip_index_url",
    "gpu_env_pip_extra_index_urls",
    "gpu_env_pip_find_links",
    "gpu_env_pip_trusted_hosts",
    "gpu_env_pip_proxy",
)
SITE = {
    "gpuenv_sources_preset": "ustc",
    "gpuenv_apt_mirror": "http://apt.site.example/debian",
    "gpuenv_cuda_repo_url": "http://repo.site.example/cuda",
    "gpuenv_cuda_repo_key_url": "http://repo.site.example/cuda.pub",
    "gpuenv_pip_index_url": "https://pypi.site.example/simple",
    "gpuenv_pip_extra_index_url": ["https://wheels.site.example/simple"],
    "gpuenv_pip_find_links": "http://cache.site.example:8080/",
    "gpuenv_http_proxy": "http://proxy.site.example:3128",
    "gpuenv_apt_proxy": "http://cache.site.example:3142",
}
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    **{f"preset-{name}": {"gpuenv_sources_preset": name} for name in sources.presets()},
    "site": SITE,
    # An explicit role variable wins over the preset, and the roles that default to it follow.
    "explicit": {
        "gpuenv_sources_preset": "aliyun",
        "nvidia_driver_repo_url": "http://own.example/cuda",
    },
}

PLAY = """---
- name: Show the roles' source defaults
  hosts: all
  gather_facts: false
  tasks:
    - name: Write them
      ansible.builtin.copy:
        content: "{{{{ {{{shown}}} | to_json }}}}"
        dest: "{out}/{{{{ inventory_hostname }}}}.json"
        mode: "0644"
"""


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("sources")
    # The defaults as group_vars of "all": below host variables, as role defaults are.
    (work / "group_vars" / "all").mkdir(parents=True)
    for role in ROLES:
        shutil.copy(
            ROOT / "roles" / role / "defaults" / "main.yml",
            work / "group_vars" / "all" / f"{role}.yml",
        )
    pairs = ", ".join(f"'{n}': {n}" for n in SHOWN)
    (work / "play.yml").write_text(PLAY.format(shown=pairs, out=work))
    hosts = {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **v}
        for name, v in CASES.items()
    }
    (work / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
    }
    proc = subprocess.run(
        [
            shutil.which("ansible-playbook") or "ansible-playbook",
            "-i",
            str(work / "hosts.yml"),
            str(work / "play.yml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return {host: json.loads((work / f"{host}.json").read_text()) for host in CASES}


def _expected(variables: dict[str, Any]) -> dict[str, Any]:
    """What the roles must read, from the CLI's resolver."""
    s = sources.resolve(variables)
    proxy = s.https_proxy or s.http_proxy
    trusted = list(sources.plain_http_hosts(s))
    pip = ["--index-url", s.pip_index_url]
    for url in s.pip_extra_index_urls:
        pip += ["--extra-index-url", url]
    for url in s.pip_find_links:
        pip += ["--find-links", url]
    for host in trusted:
        pip += ["--trusted-host", host]
    pip += ["--proxy", proxy] if proxy else []
    pip += ["--cert", sources.SYSTEM_CA_BUNDLE]
    return {
        "nvidia_driver_debian_mirror": s.apt["debian"].mirror,
        "nvidia_driver_repo_url": s.cuda_repo_url,
        "nvidia_driver_repo_key_url": s.cuda_repo_key_url,
        "cuda_toolkit_debian_mirror": s.apt["debian"].mirror,
        "cuda_toolkit_repo_url": s.cuda_repo_url,
        "nccl_repo_url": s.cuda_repo_url,
        "nccl_repo_key_url": s.cuda_repo_key_url,
        "cuda_toolkit_pip_extra_args": " ".join(pip),
        "nccl_pip_extra_args": " ".join(pip),
        "gpu_env_pip_index_url": s.pip_index_url,
        "gpu_env_pip_extra_index_urls": list(s.pip_extra_index_urls),
        "gpu_env_pip_find_links": list(s.pip_find_links),
        "gpu_env_pip_trusted_hosts": trusted,
        "gpu_env_pip_proxy": proxy,
    }


@pytest.mark.parametrize("case", [c for c in CASES if c != "explicit"])
def test_roles_resolve_the_sources_as_the_cli_does(shown: dict, case: str) -> None:
    assert shown[case] == _expected(CASES[case])


def test_the_site_case_reaches_every_role() -> None:
    # The comparison above must be able to fail: the site case differs from the default everywhere.
    site, default = _expected(SITE), _expected({})
    assert all(site[k] != default[k] for k in ("nvidia_driver_repo_key_url", "gpu_env_pip_proxy"))
    assert site["gpu_env_pip_trusted_hosts"] == ["cache.site.example"]


def test_an_explicit_role_variable_wins_and_the_others_follow_it(shown: dict) -> None:
    got = shown["explicit"]
    assert got["nvidia_driver_repo_url"] == "http://own.example/cuda"
    assert got["cuda_toolkit_repo_url"] == got["nccl_repo_url"] == "http://own.example/cuda"
    assert got["gpu_env_pip_index_url"] == "https://mirrors.aliyun.com/pypi/simple/"
