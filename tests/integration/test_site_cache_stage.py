"""The site_cache and sources stages: nothing to do costs one skipped task; bad input stops them,
named; a site cache host's URLs reach the sources role, and apt's one settings file sends plain
HTTP to the cache while the general proxy stays for HTTPS.

Runs the real playbooks/site_cache.yml and playbooks/sources.yml with ansible-playbook against
localhost (local connection, check mode, become off): no docker, nothing on this machine changes.
The cache host of the inventory (cache.invalid) is never contacted: the runs are limited to
localhost and probe nothing. The cases run at once, so the file takes a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = {
    "all": {
        "hosts": {"localhost": {"ansible_connection": "local"}},
        "children": {"site_cache": {"hosts": {"cache": {"ansible_host": "cache.invalid"}}}},
    }
}


def run_stage(
    playbook: str, extra: dict[str, object], tmp: Path, with_cache: bool
) -> subprocess.CompletedProcess[str]:
    # A bundle key is a controller file: a stand-in in the case's folder (check mode installs it
    # nowhere).
    key = tmp / "gpuenv-bundle.asc"
    key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n(a stand-in)\n")
    extra = {k: str(key) if v == KEY else v for k, v in extra.items()}
    (tmp / "vars.json").write_text(json.dumps({"ansible_become": False, **extra}))
    inventory = ["-i", "localhost,", "-c", "local"]
    if with_cache:
        (tmp / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
        inventory = ["-i", str(tmp / "hosts.yml"), "--limit", "localhost"]
    return subprocess.run(
        ["ansible-playbook", f"playbooks/{playbook}", *inventory, "--check", "--diff",
         "-e", f"@{tmp / 'vars.json'}"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip


KEY = "<the case's key file>"
QUIET = {"sources_probe_urls": []}  # nothing is fetched from this machine
PROXY = {
    "gpuenv_http_proxy": "http://proxy.invalid:3128",
    "gpuenv_https_proxy": "http://proxy.invalid:3128",
}
# name: (playbook, variables, with a cache host, exit status, text in the output)
CASES = {
    "unset": ("site_cache.yml", {}, False, 0, "skipped=1"),
    "bad_upstream_proxy": (
        "site_cache.yml",
        {"site_cache_host": "localhost", "site_cache_upstream_proxy": "ftp://cache.site"},
        False,
        2,
        "site_cache_upstream_proxy must be an http(s)://host[:port][/path] URL (got ftp://cache.site)",
    ),
    "no_wheels_src": (
        "site_cache.yml",
        {"site_cache_host": "localhost", "site_cache_wheels_src": "/nonexistent/wheels"},
        False,
        2,
        'site_cache_wheels_src "/nonexistent/wheels" is not a folder on the controller',
    ),
    "cache_and_proxy": (
        "sources.yml",
        {**QUIET, **PROXY},
        True,
        0,
        'Acquire::http::Proxy "http://cache.invalid:3142";',
    ),
    "another_apt_proxy": (
        "sources.yml",
        {**QUIET, "gpuenv_apt_proxy": "http://other.invalid:3142"},
        True,
        2,
        'gpuenv_apt_proxy="http://other.invalid:3142" but the site cache host cache serves '
        "http://cache.invalid:3142",
    ),
    "deprecated_alone": (
        "sources.yml",
        {**QUIET, "site_cache_apt_proxy_url": "http://old.invalid:3142"},
        False,
        0,
        "DEPRECATED: site_cache_apt_proxy_url is deprecated: set gpuenv_apt_proxy instead",
    ),
    "deprecated_disagrees": (
        "sources.yml",
        {
            **QUIET,
            "site_cache_apt_proxy_url": "http://old.invalid:3142",
            "gpuenv_apt_proxy": "http://new.invalid:3142",
        },
        False,
        2,
        "remove site_cache_apt_proxy_url",
    ),
    "bundle_without_key": (
        "sources.yml",
        {**QUIET, "gpuenv_apt_bundle_url": "http://bundle.invalid:8080/"},
        False,
        2,
        'sources_apt_bundle_key (gpuenv_apt_bundle_key) "" must be the controller path',
    ),
    "bundle_and_proxy": (
        "sources.yml",
        {
            **QUIET,
            **PROXY,
            "gpuenv_apt_bundle_url": "http://bundle.invalid:8080/",
            "gpuenv_apt_bundle_key": KEY,
        },
        True,
        0,
        'Acquire::http::Proxy "DIRECT";',
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    dirs = {name: tmp_path_factory.mktemp(name) for name in CASES}
    with ThreadPoolExecutor(4) as pool:
        futures = {
            n: pool.submit(run_stage, CASES[n][0], CASES[n][1], dirs[n], CASES[n][2]) for n in CASES
        }
        return {n: f.result() for n, f in futures.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_stage(case: str, results: dict[str, subprocess.CompletedProcess]) -> None:
    _, _, _, rc, text = CASES[case]
    done = results[case]
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == rc, out[-3000:]
    assert " ".join(text.split()) in out, out[-3000:]


def test_nothing_set_costs_one_skipped_task(results: dict[str, subprocess.CompletedProcess]):
    out = results["unset"].stdout
    assert "Gathering Facts" not in out and "ok=0" in out, out


def test_the_cache_wins_for_plain_http_and_the_proxy_keeps_https(
    results: dict[str, subprocess.CompletedProcess],
) -> None:
    out = results["cache_and_proxy"].stdout
    assert 'Acquire::https::Proxy "http://proxy.invalid:3128";' in out
    assert 'Acquire::http::Proxy "http://proxy.invalid:3128";' not in out
    # The cache's wheel folder reached pip's one configuration.
    assert "find-links = http://cache.invalid:8080/wheels/" in out


def test_a_bundles_direct_holds_beside_a_proxy_and_a_cache(
    results: dict[str, subprocess.CompletedProcess],
) -> None:
    out = results["bundle_and_proxy"].stdout
    assert 'Acquire::https::Proxy "DIRECT";' in out
    assert 'Acquire::http::Proxy "http://' not in out
    keyring = "/etc/apt/keyrings/gpuenv-bundle.asc"
    assert f"deb [signed-by={keyring}] http://bundle.invalid:8080/apt ./" in out
