"""The site_cache stage: nothing to do costs one skipped task; bad input stops it, named.

Runs the real playbooks/site_cache.yml with ansible-playbook against localhost (local
connection, check mode, become off): no docker, nothing on this machine changes. The cases run
at once, so the file takes a few seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_stage(extra: dict[str, object], tmp: Path) -> subprocess.CompletedProcess[str]:
    (tmp / "vars.json").write_text(json.dumps({"ansible_become": False, **extra}))
    return subprocess.run(
        ["ansible-playbook", "playbooks/site_cache.yml", "-i", "localhost,", "-c", "local",
         "--check", "-e", f"@{tmp / 'vars.json'}"],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip


CASES = {
    "unset": ({}, 0, "skipped=1"),
    "bad_url": (
        {"site_cache_apt_proxy_url": "ftp://cache.site"},
        2,
        "must be http(s)://host[:port][/path] URLs (got ftp://cache.site)",
    ),
    "bundle_without_key": (
        {"site_cache_bundle_url": "http://bundle.site:8080/"},
        2,
        'site_cache_bundle_key "" must be the controller path',
    ),
    "no_index_without_wheels": (
        {"site_cache_apt_proxy_url": "http://cache.site:3142", "site_cache_pip_no_index": True},
        2,
        "site_cache_pip_no_index is true but there is no wheel folder",
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    dirs = {name: tmp_path_factory.mktemp(name) for name in CASES}
    with ThreadPoolExecutor(len(CASES)) as pool:
        futures = {n: pool.submit(run_stage, CASES[n][0], dirs[n]) for n in CASES}
        return {n: f.result() for n, f in futures.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_site_cache_stage(case: str, results: dict[str, subprocess.CompletedProcess]) -> None:
    _, rc, text = CASES[case]
    done = results[case]
    out = done.stdout + done.stderr
    assert done.returncode == rc, out[-3000:]
    assert text in out, out[-3000:]
    if rc == 0:
        # Nothing configured: no facts gathered, no task run.
        assert "Gathering Facts" not in out and "ok=0" in out, out
