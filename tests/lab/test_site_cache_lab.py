"""Download once per site: 3 lab nodes converge through the site_cache role's apt-cacher-ng.

Opt-in: it needs docker, the lab images and a wheel folder built once for Debian 12 (about
15 min on 2 cores):

    GPUENV_LAB_PREFIX=gpuenv-hb gpuenv bundle --pins debian-12 -o /tmp/b12 \\
        --driver-mode userspace --cpu-only
    GPUENV_LAB_PREFIX=gpuenv-hb GPUENV_SITE_CACHE_WHEELS=/tmp/b12/wheels \\
        python -m pytest -q -s tests/lab/test_site_cache_lab.py

The lab's own cache container sits between every lab node and the internet, so it cannot tell
what a site fetched. Here node1 of a fresh 3-node lab is the site's cache host (inventory group
site_cache): the role installs apt-cacher-ng there, with the lab's cache as its upstream proxy,
so everything the site fetches from outside passes node1's apt-cacher-ng as a miss. All three
nodes (node1 too) send apt through node1; pip uses node1's wheel folder with no index, so no
node fetches a wheel from outside (the wheels were downloaded once, by `gpuenv bundle`).

The figures come from node1's apt-cacher-ng itself: its report page (acng-report.html, "Data
fetched" and "Data served" since startup) and its transfer log (apt-cacher.log: one line per
file sent to a client, ``time|O|bytes|client|path``, and per file fetched upstream,
``time|I|bytes|client|path``). One node's package set is what node2 was sent.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from labnet import ROOT, gpuenv

WHEELS = os.environ.get("GPUENV_SITE_CACHE_WHEELS", "")
pytestmark = pytest.mark.skipif(
    not WHEELS, reason="opt-in: set GPUENV_SITE_CACHE_WHEELS to a Debian 12 bundle's wheels/"
)
LAB = "hbsc"
MAX_RATIO = 1.2
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def report_bytes(html: str, label: str) -> int:
    """'Data fetched' / 'Data served' since startup from acng-report.html, in bytes."""
    text = re.sub(r"<[^>]+>", " ", html)
    m = re.search(rf"{label}:?\s+([\d.]+)\s*(B|KiB|MiB|GiB|TiB)", text)
    assert m, f"no {label!r} in the report page"
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def log_bytes(log: str) -> tuple[int, dict[str, int]]:
    """(bytes fetched upstream, bytes sent per client) from apt-cacher.log lines."""
    fetched = 0
    sent: dict[str, int] = defaultdict(int)
    for line in log.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[2].isdigit():
            continue
        if parts[1] == "I":
            fetched += int(parts[2])
        elif parts[1] == "O":
            sent[parts[3]] += int(parts[2])
    return fetched, dict(sent)


def test_first_converge_fetches_each_package_once() -> None:
    import docker

    from gpuenv.lab.settings import LABEL_LAB, LabPaths

    wheels = Path(WHEELS).resolve()
    assert any(wheels.glob("*.whl")), f"no wheel in {wheels}"
    paths = LabPaths(ROOT, LAB)
    extra_inventory = paths.inventory_dir / "site_cache.yml"
    extra_vars = paths.inventory_dir / "group_vars" / "all" / "site_cache.yml"
    up = gpuenv("lab", "up", "--nodes", "3", "--distro", "bookworm", "--name", LAB)
    assert up.returncode == 0, up.stderr
    try:
        client = docker.from_env()
        nodes = sorted(
            client.containers.list(filters={"label": f"{LABEL_LAB}={LAB}"}), key=lambda c: c.name
        )
        hosts = yaml.safe_load(paths.hosts_file.read_text())["all"]["children"]["gpu_nodes"]
        address = {name: hv["ansible_host"] for name, hv in hosts["hosts"].items()}
        cache_host = nodes[0].name
        cache_url = f"http://{address[cache_host]}:8080/wheels/"
        extra_inventory.write_text(
            "---\n" + yaml.safe_dump({"site_cache": {"hosts": {cache_host: None}}})
        )
        site_vars = {
            # The lab's cache stands for the outside world: node1's misses go there.
            "site_cache_upstream_proxy": "http://apt-cache:3142",
            "site_cache_wheels_src": str(wheels),
            "gpu_env_pip_find_links": [cache_url],
            "gpu_env_pip_no_index": True,
            "gpu_env_pip_trusted_hosts": [address[cache_host]],
            "nccl_pip_extra_args": (
                f"--no-index --find-links {cache_url} --trusted-host {address[cache_host]}"
            ),
        }
        extra_vars.write_text("---\n" + yaml.safe_dump(site_vars, sort_keys=False))
        playbook = ["ansible-playbook", "site.yml", "-i", str(paths.hosts_file), "-i",
                    str(extra_inventory)]  # fmt: skip
        env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
        started = time.monotonic()
        run = subprocess.run(
            [*playbook, "--skip-tags", "validate"],
            cwd=ROOT, capture_output=True, text=True, check=False, env=env,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        (ROOT / ".cache" / "site-cache-lab.log").write_text(run.stdout + run.stderr)
        recap = run.stdout[run.stdout.rfind("PLAY RECAP") :]
        print(f"\nsite.yml through the site cache: rc {run.returncode} in {elapsed:.0f}s\n{recap}")
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]

        url = f"http://{address[cache_host]}:3142/acng-report.html"
        with urllib.request.urlopen(url, timeout=30) as page:
            html = page.read().decode(errors="replace")
        fetched = report_bytes(html, "Data fetched")
        served = report_bytes(html, "Data served")
        log = nodes[0].exec_run(["cat", "/var/log/apt-cacher-ng/apt-cacher.log"]).output.decode()
        log_fetched, sent = log_bytes(log)
        one_node = sent.get(address[nodes[1].name], 0)
        print(
            f"node1 apt-cacher-ng: fetched {fetched / 2**20:.1f} MiB, served "
            f"{served / 2**20:.1f} MiB (report page); log: fetched {log_fetched / 2**20:.1f} MiB,"
            " sent "
            + ", ".join(f"{ip} {b / 2**20:.1f} MiB" for ip, b in sorted(sent.items()))
            + f"; ratio fetched / node2's set = {fetched / max(one_node, 1):.3f}"
        )
        # The stage again, then in check mode: nothing to change on a converged site.
        for extra in ([], ["--check"]):
            again = subprocess.run(
                [*playbook, "--tags", "site_cache", *extra],
                cwd=ROOT, capture_output=True, text=True, check=False, env=env,
            )  # fmt: skip
            recap = again.stdout[again.stdout.rfind("PLAY RECAP") :]
            assert again.returncode == 0 and recap.count("changed=0") == 3, recap
        assert set(sent) == set(address.values()), sent
        assert one_node > 100 * 2**20, "node2 got less than 100 MiB: the stack was not installed"
        assert served >= 2.5 * one_node
        assert fetched <= MAX_RATIO * one_node
    finally:
        extra_inventory.unlink(missing_ok=True)
        extra_vars.unlink(missing_ok=True)
        down = gpuenv("lab", "down", "--name", LAB)
        assert down.returncode == 0, down.stderr
