"""Offline install: lab nodes on a docker network with no route outside converge from a bundle.

Opt-in: it needs docker, the lab images and a Debian 12 bundle (about 15 min on 2 cores):

    GPUENV_LAB_PREFIX=gpuenv-hb gpuenv lab build --distro bookworm
    python -m pip download -c constraints.txt -d .cache/lab/wheels torch   # as scripts/demo.sh
    GPUENV_LAB_PREFIX=gpuenv-hb gpuenv bundle --pins debian-12 -o /tmp/b12 \\
        --driver-mode userspace --cpu-only --torch torch==2.13.0 --find-links .cache/lab/wheels
    GPUENV_LAB_PREFIX=gpuenv-hb GPUENV_OFFLINE_BUNDLE=/tmp/b12 \\
        python -m pytest -q -s tests/lab/test_offline_lab.py

What it does: `gpuenv lab up` (3 Debian 12 nodes), then moves the nodes from the lab's network
(which reaches the internet and the lab's cache) to a new `docker network create --internal`
network whose only other member is a container serving the bundle (python3 -m http.server,
its access log on stdout). The controller still reaches the nodes (the host's side of the
bridge); nothing on that network routes anywhere else. site.yml then runs with the site_cache
role pointed at the bundle (apt's only source, trusted through the bundle's key) and pip at its
wheels with no index.

What proves that no other host was contacted:
- before the run: the network is internal (docker forwards nothing from it to any other
  interface) and holds only the nodes and the server; each node has one address, on that network,
  routes through nothing but that network's gateway (the host's side of the bridge, which does
  not forward), cannot resolve deb.debian.org and cannot connect to the addresses of
  deb.debian.org and pypi.org (resolved on the controller) on port 80 or 443;
- after the run: apt on each node lists only the bundle's index files, the venv's pip has
  no-index, and the server's access log shows every node fetched the signed index, .deb files
  and wheels, each request answered 200 or 304 (a 404 would mean a node wanted something the bundle
  lacks, and with no route out it could not have fetched it elsewhere).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from labnet import ROOT, gpuenv, parse_access_log, readdress, wait_port

BUNDLE = os.environ.get("GPUENV_OFFLINE_BUNDLE", "")
pytestmark = pytest.mark.skipif(
    not BUNDLE, reason="opt-in: set GPUENV_OFFLINE_BUNDLE to a Debian 12 `gpuenv bundle` folder"
)
LAB = "hbair"
PORT = 8080
# Run on a node: can it resolve a public name, and connect to each address given (port 80/443)?
_PROBE = """
import socket, sys
try:
    socket.getaddrinfo("deb.debian.org", 80)
    print("resolved")
except OSError:
    print("closed")
for address in sys.argv[1:]:
    for port in (80, 443):
        try:
            socket.create_connection((address, port), timeout=3).close()
            print("open", address, port)
            break
        except OSError:
            pass
    else:
        print("closed")
"""


def _outside_addresses() -> list[str]:
    """The archive's and PyPI's addresses, resolved on the controller (which reaches them)."""
    import socket

    found = []
    for name in ("deb.debian.org", "pypi.org"):
        try:
            found.append(socket.getaddrinfo(name, 80, socket.AF_INET)[0][4][0])
        except OSError:
            continue
    return found


def test_lab_converges_from_the_bundle_alone() -> None:
    import docker

    from gpuenv.lab.cluster import network_name
    from gpuenv.lab.settings import LABEL_LAB, LABEL_OWNER, LabPaths, Names

    bundle = Path(BUNDLE).resolve()
    manifest = yaml.safe_load((bundle / "bundle.json").read_text())
    assert manifest["codename"] == "bookworm", "this test runs Debian 12 nodes"
    # The lab's validate profile (cpu) requires DDP across the nodes, as in scripts/demo.sh.
    torch = next((w for w in manifest["wheels_requested"] if w.startswith("torch")), "")
    assert torch, "build the bundle with --torch (see the docstring)"
    names = Names.from_env()
    client = docker.from_env()
    offline_name = f"{names.prefix}-{LAB}-offline"
    server_name = f"{names.prefix}-{LAB}-bundle"
    up = gpuenv("lab", "up", "--nodes", "3", "--distro", "bookworm", "--name", LAB)
    assert up.returncode == 0, up.stderr
    network = server = None
    try:
        network = client.networks.create(
            offline_name, driver="bridge", internal=True, labels={LABEL_OWNER: names.prefix}
        )
        server = client.containers.run(
            names.cache_image,
            name=server_name,
            command=["python3", "-u", "-m", "http.server", str(PORT), "--directory", "/srv"],
            detach=True,
            network=offline_name,
            volumes={str(bundle): {"bind": "/srv", "mode": "ro"}},
            labels={LABEL_OWNER: names.prefix},
        )
        nodes = sorted(
            client.containers.list(filters={"label": f"{LABEL_LAB}={LAB}"}), key=lambda c: c.name
        )
        addresses = {}
        for node in nodes:
            network.connect(node)
            client.networks.get(network_name(LAB)).disconnect(node)
            node.reload()
            addresses[node.name] = node.attrs["NetworkSettings"]["Networks"][offline_name][
                "IPAddress"
            ]
        server.reload()
        server_ip = server.attrs["NetworkSettings"]["Networks"][offline_name]["IPAddress"]
        for ip in addresses.values():
            wait_port(ip, 22)
        paths = readdress(LAB, addresses)
        url = f"http://{server_name}:{PORT}/"
        offline_vars = {
            "site_cache_bundle_url": url,
            "site_cache_bundle_key": str(bundle / "gpuenv-bundle.asc"),
            "gpu_env_pip_find_links": [f"{url}wheels/"],
            "gpu_env_pip_no_index": True,
            "gpu_env_install_torch": True,
            "gpu_env_torch_package": torch,
            "gpu_env_pip_trusted_hosts": [server_name],
            "nccl_pip_extra_args": (
                f"--no-index --find-links {url}wheels/ --trusted-host {server_name}"
            ),
        }
        offline_file = paths.inventory_dir / "group_vars" / "all" / "offline.yml"
        offline_file.write_text("---\n" + yaml.safe_dump(offline_vars, sort_keys=False))

        # No way out before the run: an internal network holding only the nodes and the server.
        network.reload()
        assert network.attrs["Internal"] is True
        members = {c["Name"] for c in network.attrs["Containers"].values()}
        assert members == {*addresses, server_name}, members
        outside = _outside_addresses()
        gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
        for node in nodes:
            routes = node.exec_run(["ip", "-4", "route"]).output.decode()
            vias = set(re.findall(r"via (\S+)", routes))
            assert vias <= {gateway}, f"{node.name} routes through {vias}:\n{routes}"
            addrs = node.exec_run(["ip", "-o", "-4", "addr", "show", "scope", "global"])
            assert addrs.output.decode().count("inet ") == 1, addrs.output.decode()
            probe = node.exec_run(["python3", "-c", _PROBE, *outside]).output.decode()
            assert probe.split() == ["closed"] * (len(outside) + 1), probe

        started = time.monotonic()
        run = subprocess.run(
            ["ansible-playbook", "site.yml", "-i", str(paths.hosts_file)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        )
        elapsed = time.monotonic() - started
        (ROOT / ".cache" / "offline-lab.log").write_text(run.stdout + run.stderr)
        recap = run.stdout[run.stdout.rfind("PLAY RECAP") :]
        print(f"\nsite.yml from the bundle: rc {run.returncode} in {elapsed:.0f}s\n{recap}")
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]

        for node in nodes:
            targets = node.exec_run(["apt-get", "indextargets", "--format", "$(URI)"]).output
            uris = {u for u in targets.decode().split() if u}
            assert uris and all(u.startswith(f"{url}apt/") for u in uris), uris
            pip = node.exec_run(["/opt/gpuenv/bin/pip", "config", "list"]).output.decode()
            assert "global.no-index='true'" in pip, pip

        log = parse_access_log(server.logs(stdout=True, stderr=True).decode(errors="replace"))
        assert log, "the bundle server logged no request"
        # 304: apt asking again for an index it holds (If-Modified-Since), answered "unchanged".
        bad = [a for a in log if a.status not in (200, 304) or a.client not in addresses.values()]
        assert not bad, bad
        for ip in addresses.values():
            mine = [a.path for a in log if a.client == ip]
            assert "/apt/InRelease" in mine, f"{ip} never read the signed index"
            assert any(p.endswith(".deb") for p in mine), f"{ip} fetched no .deb"
            assert any(p.endswith(".whl") for p in mine), f"{ip} fetched no wheel"
        debs = sum(a.path.endswith(".deb") for a in log)
        wheels = sum(a.path.endswith(".whl") for a in log)
        print(f"bundle server ({server_ip}): {len(log)} requests, {debs} .deb, {wheels} wheels")
    finally:
        (LabPaths(ROOT, LAB).inventory_dir / "group_vars" / "all" / "offline.yml").unlink(
            missing_ok=True
        )
        down = gpuenv("lab", "down", "--name", LAB)
        if server is not None:
            server.remove(force=True)
        if network is not None:
            network.remove()
        assert down.returncode == 0, down.stderr
