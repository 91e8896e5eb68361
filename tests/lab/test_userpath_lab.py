"""The user's own path, on a lab: the collection alone from a folder outside the repository, the
nodes reached through a bastion with ProxyJump, and validation in the SSH login environment.

Opt-in: it needs docker and a fresh lab (not provisioned yet), and converges it (about 15-20 min
on the 2-core machine, more under load; figures in docs/collection.md and docs/cluster.md):

    gpuenv lab up --nodes 3 --distro bookworm --name up
    GPUENV_USERPATH_LAB=up python -m pytest -q tests/lab/test_userpath_lab.py
    gpuenv lab down --name up

The tests run in file order and build on each other: converge, check mode, bastion, login
environment. Every change a test makes to a node is put back at its end.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

LAB = os.environ.get("GPUENV_USERPATH_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_USERPATH_LAB to a running, fresh lab's name"
)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INVENTORY = ROOT / f"inventory/lab-{LAB}/hosts.yml"
PINS = ROOT / "inventory/pins/debian-12.yml"
# The CPU build of torch the lab wheelhouse serves to Debian 12 nodes (scripts/demo.sh).
TORCH = ["-e", "gpu_env_install_torch=true", "-e", "gpu_env_torch_package=torch==2.13.0"]
# The shared cache container serves this machine's wheel folder (~/.cache/gpuenv/lab-wheels, or
# $GPUENV_LAB_WHEELHOUSE; each checkout's .cache/lab/wheels links to it). To try other wheels,
# serve them yourself and name the address here, e.g.
# `python -m http.server 8099 --bind <lab gateway> --directory /path/to/wheels`.
WHEELHOUSE = os.environ.get("GPUENV_USERPATH_WHEELHOUSE", "")
if WHEELHOUSE:
    TORCH += ["-e", f"gpuenv_lab_wheelhouse_url={WHEELHOUSE}"]
RECAP = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
)


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 3600):
    start = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s, check=False
    )
    return done, time.monotonic() - start


def _recap(stdout: str) -> dict[str, tuple[int, int, int, int]]:
    return {m[0]: tuple(int(x) for x in m[1:]) for m in RECAP.findall(stdout)}


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A folder outside the repository with an empty ansible.cfg and the collection installed
    there from the tarball scripts/build-collection.sh makes (the wheel inside it)."""
    base = tmp_path_factory.mktemp("userpath")
    work = base / "site"
    work.mkdir()
    (work / "ansible.cfg").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(work / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(base / "collections"),
        ANSIBLE_NOCOLOR="1",
        PYTHON=sys.executable,
    )
    build, _ = _run(["bash", str(ROOT / "scripts/build-collection.sh"), str(base)], env, work)
    assert build.returncode == 0, build.stderr[-2000:]
    (tarball,) = base.glob("gpuenv-cluster-*.tar.gz")
    galaxy = [str(BIN / "ansible-galaxy"), "collection", "install", "--offline"]
    install, _ = _run([*galaxy, "-p", str(base / "collections"), str(tarball)], env, work)
    assert install.returncode == 0, install.stderr[-2000:]
    yield work, env


def _site(work: Path, env: dict[str, str], *more: str):
    argv = [str(BIN / "ansible-playbook"), "gpuenv.cluster.site", "-i", str(INVENTORY)]
    argv += ["-e", f"@{PINS}", *TORCH, "-e", f"ssh_mesh_key_dir={work}/.gpuenv/ssh"]
    argv += ["-e", f"validate_report_dir={work}/reports", *more]
    return _run(argv, env, work)


def test_site_from_the_installed_collection_converges_and_validates(outside) -> None:
    work, env = outside
    done, took_s = _site(work, env)
    print(f"converge from the collection: {took_s:.0f} s")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    recap = _recap(done.stdout)
    assert len(recap) == 3 and all(r[2:] == (0, 0) for r in recap.values()), recap
    # gpuenv came from the wheel the collection carries: each node's venv records its digest.
    wheels = Path(env["ANSIBLE_COLLECTIONS_PATH"]) / "ansible_collections/gpuenv/cluster"
    (wheel,) = (wheels / "roles/gpu_env/files/wheel").glob("gpuenv-*.whl")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    for node in _nodes():
        assert _docker("exec", node, "cat", "/opt/gpuenv/gpuenv-wheel.installed") == digest
        _docker("exec", node, "test", "-f", f"/var/lib/gpuenv/wheels/{wheel.name}")
    report = json.loads((work / "reports/cluster.json").read_text())
    assert report["verdict"]["ok"] is True, report["verdict"]


def test_check_mode_on_the_converged_lab_changes_nothing(outside) -> None:
    work, env = outside
    done, took_s = _site(work, env, "--check")
    print(f"check mode from the collection: {took_s:.0f} s")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    recap = _recap(done.stdout)
    assert len(recap) == 3 and all(r[1] == 0 for r in recap.values()), recap


def _nodes() -> dict[str, str]:
    data = yaml.safe_load(INVENTORY.read_text())
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    return {name: hv["ansible_host"] for name, hv in hosts.items()}


def _docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _as_root(node: str, script: str) -> None:
    """On a node through the docker API, not SSH (the bastion test blocks SSH from here)."""
    _docker("exec", node, "sh", "-c", script)


def _cluster(inventory: Path, env: dict[str, str] | None = None):
    """``gpuenv`` run by its path, the venv's bin/ off PATH (the tools are found beside it)."""
    argv = [str(BIN / "gpuenv"), "cluster", "-i", str(inventory), "--profile", "cpu"]
    argv += ["--json", "-", "--no-progress", "--deadline", "240"]
    run_env = {**os.environ, **(env or {}), "PATH": "/usr/bin:/bin"}
    done, took_s = _run(argv, run_env, ROOT)
    return done, json.loads(done.stdout), took_s


def _results(report: dict, node: str) -> list[dict]:
    return [r for r in report["results"] if r["node"] == node]


BLOCK = "/etc/ssh/sshd_config.d/00-gpuenv-test-bastion.conf"


@pytest.fixture
def bastion(tmp_path: Path) -> Iterator[Path]:
    """node2 and node3 refuse SSH from the controller (sshd DenyUsers *@<the controller's
    address on the lab network>); node1, on the same network, is the bastion. Yields an
    inventory whose node2 and node3 go through node1 with ProxyJump; an ssh config (-F) tells
    the jump how to log in to node1, as a user's ~/.ssh/config would."""
    nodes = _nodes()
    names = list(nodes)
    gateway = _docker(
        "network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", f"{LAB}-net"
    )
    data = yaml.safe_load(INVENTORY.read_text())
    common = data["all"]["vars"]["ansible_ssh_common_args"]
    key = data["all"]["vars"]["ansible_ssh_private_key_file"]
    known = INVENTORY.parent / "known_hosts"
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {nodes[names[0]]}\n  User admin\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n"
    )
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    for name in names[1:]:
        hosts[name]["ansible_ssh_common_args"] = (
            f"-F {config} {common} -o ProxyJump=admin@{nodes[names[0]]}"
        )
    (tmp_path / "group_vars").symlink_to(INVENTORY.parent / "group_vars")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump(data))
    for name in names[1:]:
        _as_root(name, f"echo 'DenyUsers *@{gateway}' >{BLOCK} && systemctl reload ssh")
    try:
        yield inventory
    finally:
        for name in names[1:]:
            _as_root(name, f"rm -f {BLOCK} && systemctl reload ssh")


def test_validation_reaches_nodes_through_a_bastion_with_proxyjump(bastion, outside) -> None:
    names = list(_nodes())
    # Direct SSH from the controller is refused now: the plain inventory cannot reach node2.
    direct, report, took_s = _cluster(INVENTORY)
    print(f"direct (blocked): {took_s:.0f} s")
    reach = {r["node"]: r for r in report["results"] if r["check"] == "reach"}
    assert direct.returncode != 0 and reach[names[1]]["status"] == "FAIL", reach
    assert "authentication as admin failed" in reach[names[1]]["reason"], reach[names[1]]
    # Through the bastion, gpuenv (run by its path, the venv off PATH) validates all three.
    done, report, took_s = _cluster(bastion)
    print(f"gpuenv cluster over ProxyJump: {took_s:.0f} s")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert report["verdict"]["ok"] is True, report["verdict"]
    assert {r["node"] for r in report["results"] if r["check"] == "reach"} == set(names)
    # Ansible itself reaches every node through the same inventory ...
    work, env = outside
    ping, _ = _run([str(BIN / "ansible"), "all", "-i", str(bastion), "-m", "ping"], env, work)
    assert ping.returncode == 0, ping.stdout[-3000:]
    # ... and its validate stage, from the installed collection, validates over it.
    argv = [str(BIN / "ansible-playbook"), "gpuenv.cluster.validate", "-i", str(bastion)]
    argv += ["-e", f"validate_report_dir={work}/reports-bastion"]
    played, took_s = _run(argv, env, work)
    print(f"ansible-playbook gpuenv.cluster.validate over ProxyJump: {took_s:.0f} s")
    assert played.returncode == 0, played.stdout[-6000:] + played.stderr[-2000:]


# Open MPI reads OMPI_MCA_* from the environment: a transport that does not exist stops MPI_Init,
# as it would stop the user's mpirun. (A folder on LD_LIBRARY_PATH holding a libmpi.so.40 that is
# not a library breaks nothing: the loader passes over a file that is not ELF and goes on.)
BROKEN = "OMPI_MCA_btl=nosuchbtl"


@pytest.mark.parametrize(
    ("where", "setting"),
    [
        # pam_env: what a user's SSH login reads and `sudo -u USER bash -lc` does not.
        ("/etc/environment", BROKEN),
        ("/etc/profile.d/zz-broken.sh", f"export {BROKEN}"),
    ],
)
def test_a_login_setting_that_breaks_jobs_breaks_the_check_and_is_named(where, setting) -> None:
    node = list(_nodes())[1]
    backup = f"/root/gpuenv-test-{Path(where).name}.orig"
    _as_root(
        node,
        f"{{ [ ! -e {where} ] || cp -p {where} {backup}; }} && echo '{setting}' >>{where}",
    )
    try:
        done, report, took_s = _cluster(INVENTORY)
        print(f"gpuenv cluster with {where} broken: {took_s:.0f} s")
    finally:
        _as_root(node, f"if [ -e {backup} ]; then mv {backup} {where}; else rm -f {where}; fi")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    named = f"OMPI_MCA_btl='nosuchbtl' (set in {where})"
    failed = [r for r in _results(report, node) if r["status"] in ("FAIL", "ERROR")]
    assert failed and all(named in r["reason"] for r in failed), failed
    # The other nodes, whose logins are clean, pass their checks.
    for other in list(_nodes())[::2]:
        assert not [r for r in _results(report, other) if r["status"] in ("FAIL", "ERROR")]
