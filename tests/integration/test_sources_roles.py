"""Push and pull read the sources alike: the roles' defaults (expressions over the gpuenv_*
variables, the preset read through plugins/filter/sources.py) give the same mirrors, repository,
index, proxy and wheel folders as gpuenv.floor.sources.resolve(), which `gpuenv cloud-init`
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

from gpuenv.floor import sources

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
    **{f"preset-{name}": {"gpuenv_sources_preset": name} for name in sources.PRESETS},
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


def _show(
    work: Path, files: list[Path], names: tuple[str, ...], cases: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The values of ``names`` for each case (an inventory host), with ``files`` (role defaults
    or vars) as group_vars of "all": below host variables, as role defaults are."""
    (work / "group_vars" / "all").mkdir(parents=True)
    for i, file in enumerate(files):
        shutil.copy(file, work / "group_vars" / "all" / f"{i:02d}-{file.parent.parent.name}.yml")
    pairs = ", ".join(f"'{n}': {n}" for n in names)
    (work / "play.yml").write_text(PLAY.format(shown=pairs, out=work))
    hosts = {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **v}
        for name, v in cases.items()
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
    return {host: json.loads((work / f"{host}.json").read_text()) for host in cases}


@pytest.fixture(scope="module")
def shown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    files = [ROOT / "roles" / role / "defaults" / "main.yml" for role in ROLES]
    return _show(tmp_path_factory.mktemp("sources"), files, SHOWN, CASES)


def _expected(variables: dict[str, Any]) -> dict[str, Any]:
    """What the roles must read, from the CLI's resolver."""
    s = sources.resolve(variables)
    proxy = s.https_proxy or s.http_proxy
    trusted = sources.plain_http_hosts(
        [s.pip_index_url, *s.pip_extra_index_urls, *s.pip_find_links]
    )
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


# --- the sources role's own files: one apt settings file, one pip configuration ----------------

OWN = ("__sources_apt_conf_body", "__sources_pip_conf_body", "__sources_unwanted")
OWN_CASES: dict[str, dict[str, Any]] = {
    "nothing": {},
    # A site cache and a general proxy both set: apt's plain HTTP goes to the cache.
    "cache-and-proxy": {
        "gpuenv_http_proxy": "http://proxy.site.example:3128",
        "gpuenv_https_proxy": "http://proxy.site.example:3128",
        "gpuenv_apt_proxy": "http://cache.site.example:3142",
        "gpuenv_pip_find_links": "http://cache.site.example:8080/wheels/",
        "gpuenv_no_proxy": "cache.site.example,.site.example",
    },
    # An offline bundle beside a proxy and a cache: DIRECT holds, the bundle's wheels and no-index.
    "bundle-and-proxy": {
        "gpuenv_http_proxy": "http://proxy.site.example:3128",
        "gpuenv_apt_proxy": "http://cache.site.example:3142",
        "gpuenv_apt_bundle_url": "http://bundle.site.example:8080/",
        "gpuenv_apt_bundle_key": "/dev/null",
    },
    # The deprecated names alone give the same as their replacements.
    "deprecated": {
        "site_cache_apt_proxy_url": "http://cache.site.example:3142",
        "site_cache_wheels_url": "http://cache.site.example:8080/wheels/",
        "site_cache_bundle_url": "http://bundle.site.example:8080/",
        "site_cache_bundle_key": "/dev/null",
        "site_cache_pip_no_index": False,
    },
}


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    # The role's defaults and its vars/main.yml, templated as when the role runs.
    files = [ROOT / "roles" / "sources" / part / "main.yml" for part in ("defaults", "vars")]
    return _show(tmp_path_factory.mktemp("sources-own"), files, OWN, OWN_CASES)


@pytest.mark.parametrize("case", list(OWN_CASES))
def test_the_roles_apt_and_pip_files_are_the_floors(own: dict, case: str) -> None:
    s = sources.resolve(OWN_CASES[case])
    assert own[case]["__sources_apt_conf_body"] == s.apt_conf()
    pip = sources.pip_conf("", [], s.find_links(), s.pip_no_index, s.https_proxy or s.http_proxy)
    assert own[case]["__sources_pip_conf_body"] == pip
    # Older releases' files go, whatever is set.
    assert {
        "/etc/apt/apt.conf.d/90gpuenv-proxy",
        "/etc/apt/apt.conf.d/80gpuenv-site-cache",
    } <= set(own[case]["__sources_unwanted"])


def test_the_cache_wins_over_the_proxy_and_a_bundles_direct_holds(own: dict) -> None:
    apt = own["cache-and-proxy"]["__sources_apt_conf_body"].splitlines()
    assert 'Acquire::http::Proxy "http://cache.site.example:3142";' in apt
    assert 'Acquire::https::Proxy "http://proxy.site.example:3128";' in apt
    assert not any("3128" in line and "http::Proxy " in line for line in apt)
    bundle = own["bundle-and-proxy"]["__sources_apt_conf_body"]
    assert 'Acquire::http::Proxy "DIRECT";' in bundle
    assert "cache.site.example" not in bundle and "proxy.site.example" not in bundle
    assert (
        "find-links = http://bundle.site.example:8080/wheels/\nno-index = true\n"
        in (own["bundle-and-proxy"]["__sources_pip_conf_body"])
    )
    # The deprecated names reach the same files as their replacements.
    assert own["deprecated"]["__sources_apt_conf_body"] == bundle
    assert "/etc/apt/gpuenv-bundle.list" not in own["deprecated"]["__sources_unwanted"]
    assert "/etc/apt/gpuenv-bundle.list" in own["nothing"]["__sources_unwanted"]


def test_the_roles_file_names_are_the_floors() -> None:
    role = yaml.safe_load((ROOT / "roles" / "sources" / "vars" / "main.yml").read_text())
    assert role["__sources_apt_conf"] == sources.APT_CONF
    assert role["__sources_pip_conf"] == sources.PIP_CONF
    assert tuple(role["__sources_stale_apt_confs"]) == sources.STALE_APT_CONFS
    assert role["__sources_bundle_list"] == sources.BUNDLE_LIST
    assert role["__sources_bundle_parts"] == sources.BUNDLE_PARTS
    assert role["__sources_bundle_keyring"] == sources.BUNDLE_KEYRING
    assert role["__sources_stale_pip_conf"] == sources.STALE_PIP_CONF
    assert tuple(role["__sources_stale_pip_keys"]) == sources.STALE_PIP_KEYS
