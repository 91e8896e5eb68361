"""Against a running lab: the rolling upgrade (playbooks/upgrade.yml) changes the pin of a stand-in
package from 1.0 to 2.0 on three Slurm compute nodes, batch size 1 (the canary, batch 2, batch 3).

The stand-in: `gpuenv-standin`, built here with dpkg-deb in versions 1.0 and 2.0, served from an
apt repository built and signed as `gpuenv bundle` builds its own (gpuenv.bundle.build's
write_signed_index, in a container of the lab's image) and trusted by the nodes as a bundle is:
the sources role installs its key for that repository only (signed-by) and makes it apt's only
source. The package is pinned through `pinned_packages_list` (roles/pinned_packages, apt_pin): the
path a real cluster's site packages take, and the one the upgrade changes.

The injected failure: `/etc/gpuenv-standin/fault-2.0` on batch 2's node. The stand-in's
`gpuenv-standin --selftest` fails while a fault file for its own version exists, and the test
gives it to the upgrade as the site's acceptance command (rolling_upgrade_acceptance_commands): so
version 2.0 fails validation on that node only, and 1.0 passes there. That stands for a new
version that does not work on one node's hardware.

What is checked: bad input stops in preflight before any node is drained or changed; the first
run fails at batch 2, the canary stays on 2.0 (validated, resumed), batch 2 is rolled back to 1.0
(validated, resumed), batch 3 is not touched (no record, 1.0, its pin file unchanged, never
drained), and the output says so; with the fault removed the re-run completes with the canary
skipped (changed=0 there) and every node on 2.0; a check-mode run of the finished rollout changes
nothing.

Then a node that stops answering mid-batch: an upgrade to 3.0 during which batch 2's node has its
container paused (`docker pause`) right after the upgrade drained it, and unpaused once the run
ended. Ansible reports it UNREACHABLE; its batch's watcher names it in an UPGRADE STOPPED summary,
keeps it drained with a `gpuenv: upgrade batch 2: unreachable ...` reason and records it on the
controller; batch 3 is not touched. The re-run, with the node back, skips the canary and upgrades
node2 (from the versions before in its `started` record) and node3; every node ends IDLE.

Opt-in (about 30 minutes on 2 shared cores): a lab whose stack converged without the GPU roles,

    gpuenv lab up --nodes 3 --name upg --distro bookworm
    ansible-playbook -i inventory/lab-upg/hosts.yml site.yml \\
        --skip-tags driver,cuda,nccl,validate,slurm,monitoring,qos,fabric \\
        -e @inventory/pins/debian-12.yml
    GPUENV_UPGRADE_LAB=upg python -m pytest -q -s tests/lab/test_upgrade_lab.py
    gpuenv lab down --name upg

The lab's first node is the Slurm controller and also a compute node (3 compute nodes on 3
containers); the module's fixture runs the slurm, sources and packages stages (health check and
prolog off, no cgroup) once for both tests.
Containers have no NVIDIA kernel module, so no reboot happens and no driver feature is published:
the run says so. docs/upgrade.md has the figures.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from labnet import run_playbook

from gpuenv.bundle.build import MOUNT, write_signed_index
from gpuenv.bundle.container import DockerExecutor, build_container, docker_client

LAB = os.environ.get("GPUENV_UPGRADE_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_UPGRADE_LAB to a running lab whose stack converged"
)
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / f"inventory/lab-{LAB}/hosts.yml"
GPUENV = [sys.executable, "-m", "gpuenv"]
IMAGE = "gpuenv/node:bookworm"
PACKAGE = "gpuenv-standin"
PIN = f"/etc/apt/preferences.d/gpuenv-{PACKAGE}.pref"
STATE = "/etc/gpuenv/upgrade-state.json"
FAULT = "/etc/gpuenv-standin/fault-2.0"
PORT = 8080
VERSIONS = ("1.0", "2.0", "3.0")
CHECK_ONLY = ["--only", "system,mpi"]
PAIR_ARGS = ["--skip", "health,torch,pairs", "--check-args", " ".join(CHECK_ONLY)]
STANDIN = """#!/bin/sh
# gpuenv-standin: stands in for a GPU stack package in the rolling-upgrade lab test.
VERSION={version}
case "$1" in
  --version) echo "$VERSION" ;;
  --selftest)
    if [ -e /etc/gpuenv-standin/fault-$VERSION ]; then
      echo "gpuenv-standin $VERSION self-test FAILED on $(hostname):" \\
           "$(cat /etc/gpuenv-standin/fault-$VERSION)" >&2
      exit 1
    fi
    echo "gpuenv-standin $VERSION self-test passed on $(hostname)" ;;
  *) echo "usage: gpuenv-standin --version | --selftest" >&2; exit 2 ;;
esac
"""


def names() -> list[str]:
    data = yaml.safe_load(INVENTORY.read_text())
    return sorted(data["all"]["children"]["gpu_nodes"]["hosts"])


def on_node(name: str, command: str, check: bool = True) -> tuple[int, str]:
    done = subprocess.run(
        [*GPUENV, "lab", "ssh", "--name", LAB, name, f"sudo bash -c {shlex.quote(command)}"],
        capture_output=True, text=True, check=False, timeout=180,
    )  # fmt: skip
    if check:
        assert done.returncode == 0, (name, command, done.stdout, done.stderr)
    return done.returncode, done.stdout


def build_debs(folder: Path) -> None:
    for version in VERSIONS:
        tree = folder / f"tree-{version}"
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "usr" / "bin").mkdir(parents=True)
        (tree / "DEBIAN" / "control").write_text(
            f"Package: {PACKAGE}\nVersion: {version}\nArchitecture: all\n"
            "Maintainer: gpuenv lab <lab@gpuenv.invalid>\nPriority: optional\n"
            "Description: stand-in for a GPU stack package (rolling-upgrade lab test)\n"
        )
        script = tree / "usr" / "bin" / PACKAGE
        script.write_text(STANDIN.format(version=version))
        script.chmod(0o755)
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "--build", str(tree),
             str(folder / "apt" / "pool" / f"{PACKAGE}_{version}_all.deb")],
            check=True, capture_output=True,
        )  # fmt: skip


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The signed repository, served on the lab's network: (its URL, its public key)."""
    out = tmp_path_factory.mktemp("standin-repo")
    (out / "apt" / "pool").mkdir(parents=True)
    (out / "wheels").mkdir()  # the sources role gives pip a bundle's wheels/: none here
    build_debs(out)
    client = docker_client()
    network = f"{LAB}-net"
    started_at = time.monotonic()
    with build_container(client, IMAGE, out, network) as executor:
        _repo_tools(executor)
        fingerprint = write_signed_index(executor, out, "bookworm", datetime.now(UTC))
        # Files made in the container belong to root there; the controller reads them as itself.
        executor.run(["chmod", "-R", "a+rX", MOUNT])
    print(f"\nrepository signed by {fingerprint} in {time.monotonic() - started_at:.1f} s")
    server = client.containers.run(
        IMAGE, command=["python3", "-m", "http.server", str(PORT), "--directory", MOUNT],
        detach=True, init=True, network=network, labels={"gpuenv.owner": f"lab-{LAB}-upgrade"},
        volumes={str(out): {"bind": MOUNT, "mode": "ro"}},
    )  # fmt: skip
    try:
        server.reload()
        address = server.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
        yield f"http://{address}:{PORT}/", out / "gpuenv-bundle.asc"
    finally:
        server.remove(force=True)


def _repo_tools(executor: DockerExecutor) -> None:
    """apt-ftparchive and gpg in the build container, through the lab's apt cache."""
    executor.run(
        ["sh", "-c", 'echo "Acquire::http::Proxy \\"http://apt-cache:3142\\";" '
         "> /etc/apt/apt.conf.d/01gpuenv-lab-proxy"]
    )  # fmt: skip
    executor.run(["apt-get", "update", "--quiet"])
    executor.run(["apt-get", "install", "--quiet", "--yes", "--no-install-recommends",
                  "apt-utils", "gnupg"])  # fmt: skip


def write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def upgrade(inventories: list[Path], *args: str) -> tuple[int, str, float]:
    """The upgrade playbook, which may fail: (exit status, output, seconds)."""
    started_at = time.monotonic()
    argv = ["ansible-playbook", *(a for i in inventories for a in ("-i", str(i)))]
    done = subprocess.run(
        [*argv, str(ROOT / "playbooks" / "upgrade.yml"), *args],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=2400,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started_at


def recap(output: str) -> dict[str, int]:
    text = output[output.rindex("PLAY RECAP") :]
    return {
        line.split()[0]: int(line.split("changed=")[1].split()[0])
        for line in text.splitlines()
        if "changed=" in line
    }


def installed(node: str) -> str:
    return on_node(node, f"dpkg-query -W -f='${{Version}}' {PACKAGE}")[1].strip()


def record(node: str) -> dict[str, object] | None:
    rc, out = on_node(node, f"cat {STATE}", check=False)
    return json.loads(out) if rc == 0 else None


def slurm_node(controller: str, node: str) -> tuple[str, str]:
    _, out = on_node(controller, f"scontrol show node -o {node}")
    state = out.split(" State=")[1].split()[0]
    reason = out.split(" Reason=")[1].rsplit(" [", 1)[0].strip() if " Reason=" in out else ""
    return state, reason


def seconds(rec: dict[str, object]) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    began = datetime.strptime(str(rec["started_at"]), fmt)
    return (datetime.strptime(str(rec["finished_at"]), fmt) - began).total_seconds()


def flat(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Stack:
    """The lab after the slurm, sources and packages stages: every node on 1.0, IDLE in Slurm."""

    inventories: list[Path]
    nodes: list[str]
    controller: str
    entry: dict[str, object]
    reports: Path


@pytest.fixture(scope="module")
def stack(repository: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Stack:
    url, key = repository
    folder = tmp_path_factory.mktemp("stack")
    nodes = names()
    controller = nodes[0]
    slurm = write_yaml(folder / "slurm.yml", {"all": {
        "vars": {"slurm_cgroup": False, "slurm_health_check": False, "slurm_prolog": False},
        "children": {"slurm_controller": {"hosts": {controller: {}}},
                     "slurm_compute": {"hosts": {n: {} for n in nodes}}},
    }})  # fmt: skip
    _, slurm_s = run_playbook([INVENTORY, slurm], ROOT / "playbooks" / "slurm.yml", timeout_s=1800)
    print(f"slurm stage: {slurm_s:.1f} s")
    on_node(controller, f"scontrol update nodename={','.join(nodes)} state=resume", check=False)

    entry = {"name": PACKAGE, "packages": [PACKAGE]}
    site = write_yaml(folder / "site.yml", {"all": {"vars": {
        "gpuenv_apt_bundle_url": url, "gpuenv_apt_bundle_key": str(key),
        "pinned_packages_list": [{**entry, "version": "1.0"}],
        "rolling_upgrade_acceptance_commands": [[PACKAGE, "--selftest"]],
        # No torch on the lab's nodes (its CPU wheel is not served here and the CUDA one fills the
        # disk): the node check runs system and mpi, the pair test MPI across the pair.
        "rolling_upgrade_check_args": CHECK_ONLY,
        "rolling_upgrade_pair_args": PAIR_ARGS,
        "rolling_upgrade_report_dir": str(folder / "reports"),
    }}})  # fmt: skip
    inventories = [INVENTORY, slurm, site]
    _, sources_s = run_playbook(inventories, ROOT / "playbooks" / "sources.yml")
    _, packages_s = run_playbook(inventories, ROOT / "playbooks" / "packages.yml")
    print(f"sources stage (the repository apt's only source): {sources_s:.1f} s; "
          f"packages stage ({PACKAGE} 1.0): {packages_s:.1f} s")  # fmt: skip
    assert [installed(n) for n in nodes] == ["1.0"] * 3
    for node in nodes:
        on_node(node, f"rm -f {STATE} {FAULT}")
    return Stack(inventories, nodes, controller, entry, folder / "reports")


def test_a_failed_batch_is_rolled_back_and_the_rerun_completes(stack, tmp_path):
    inventories, nodes, controller, entry = (
        stack.inventories, stack.nodes, stack.controller, stack.entry
    )  # fmt: skip
    canary, second, third = nodes

    target = write_yaml(
        tmp_path / "target.yml", {"pinned_packages_list": [{**entry, "version": "2.0"}]}
    )
    missing = write_yaml(
        tmp_path / "missing.yml", {"pinned_packages_list": [{**entry, "version": "9.9"}]}
    )

    # Bad input: stopped in preflight, nothing drained, no record.
    for args, words in (
        ([], "no target versions: set rolling_upgrade_pins"),
        ([f"rolling_upgrade_pins={target}", "-e", "rolling_upgrade_batch_size=0"],
         "rolling_upgrade_batch_size: must be 1 or more (got 0)"),
        ([f"rolling_upgrade_pins={missing}"],
         f"entry {PACKAGE} version 9.9 is not in the node's repositories; "
         f"{PACKAGE} is offered at: {', '.join(reversed(VERSIONS))}"),
    ):  # fmt: skip
        rc, out, took = upgrade(inventories, *(["-e", *args] if args else []))
        print(f"bad input ({words[:40]}...): exit {rc} in {took:.1f} s")
        assert rc != 0 and words in flat(out), out[-3000:]
        assert "PLAY [Rolling upgrade]" not in out
    assert all(record(n) is None for n in nodes)
    assert all("DRAIN" not in slurm_node(controller, n)[0] for n in nodes)

    # Batch 2's node cannot run 2.0.
    on_node(
        second, f"mkdir -p {FAULT.rsplit('/', 1)[0]} && echo 'injected by the lab test' > {FAULT}"
    )
    _, third_pin_before = on_node(third, f"stat -c %Y {PIN}")
    rc, out, first_s = upgrade(inventories, "-e", f"rolling_upgrade_pins={target}")
    said = flat(out)
    print(f"first run: exit {rc} in {first_s:.1f} s")
    print("\n".join(line for line in out.splitlines() if "UPGRADE" in line or "validation" in line))
    assert rc != 0
    assert f"UPGRADE STOPPED at batch 2 ({second}): validation failed" in said, out[-4000:]
    assert f"ROLLBACK: {PACKAGE} 2.0 -> 1.0; validated on the versions before" in said
    assert "and resumed in Slurm" in said
    assert f"NOT TOUCHED (later batches): {third}." in said
    assert f"gpuenv-standin 2.0 self-test FAILED on {second}" in said
    assert "no NVIDIA kernel module loaded or installed" in said  # the reboot step's stated skip
    assert [installed(n) for n in nodes] == ["2.0", "1.0", "1.0"]
    first, rolled = record(canary), record(second)
    assert first and (first["batch"], first["outcome"]) == (1, "upgraded")
    assert first["validation"]["ok"] and "the canary" in first["validation"]["pair"]
    assert rolled and (rolled["batch"], rolled["outcome"]) == (2, "rolled back")
    assert rolled["failure"]["step"] == "validation" and rolled["validation"]["ok"]
    assert (rolled["before"][PACKAGE], rolled["after"][PACKAGE]) == ("1.0", "1.0")
    assert record(third) is None
    assert on_node(third, f"stat -c %Y {PIN}")[1] == third_pin_before
    for node in nodes:
        assert slurm_node(controller, node) == ("IDLE", ""), node
    print(f"canary {seconds(first):.0f} s, batch 2 with its rollback {seconds(rolled):.0f} s")

    # The fault fixed: the run continues from batch 2; the canary is skipped.
    on_node(second, f"rm -f {FAULT}")
    rc, out, second_s = upgrade(inventories, "-e", f"rolling_upgrade_pins={target}")
    print(f"re-run: exit {rc} in {second_s:.1f} s, changed {recap(out)}")
    print("\n".join(line for line in out.splitlines() if "UPGRADE" in line))
    assert rc == 0, out[-4000:]
    assert "UPGRADE COMPLETE" in out
    assert f"{canary} batch 1 skipped, already upgraded in an earlier run" in flat(out)
    assert recap(out)[canary] == 0
    assert [installed(n) for n in nodes] == ["2.0"] * 3
    records = [record(n) for n in nodes]
    assert [(r["batch"], r["outcome"]) for r in records] == [
        (1, "upgraded"),
        (2, "upgraded"),
        (3, "upgraded"),
    ]
    for rec in records[1:]:
        assert rec["validation"]["ok"], rec
        assert rec["validation"]["pair"].startswith(f"gpuenv cluster with {canary}: exit 0"), rec
    print(f"batch 2 {seconds(records[1]):.0f} s, batch 3 {seconds(records[2]):.0f} s")
    for node in nodes:
        assert slurm_node(controller, node) == ("IDLE", ""), node

    rc, out, check_s = upgrade(inventories, "-e", f"rolling_upgrade_pins={target}", "--check")
    print(f"check mode on the finished rollout: exit {rc} in {check_s:.1f} s, changed {recap(out)}")
    assert rc == 0 and set(recap(out).values()) == {0}, out[-3000:]


def upgrade_pausing(
    inventories: list[Path], node: str, *args: str
) -> tuple[int, str, float, float]:
    """The upgrade playbook, with ``node``'s container paused (docker pause) right after the
    upgrade drained it, that is while its batch runs, and unpaused after the run ended: (exit
    status, output, seconds, seconds from the pause to the end of the run)."""
    argv = ["ansible-playbook", *(a for i in inventories for a in ("-i", str(i)))]
    container = docker_client().containers.get(node)  # the lab names a node's container as the node
    started_at = time.monotonic()
    proc = subprocess.Popen(
        [*argv, str(ROOT / "playbooks" / "upgrade.yml"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    watchdog = threading.Timer(2400, proc.kill)
    watchdog.start()
    lines: list[str] = []
    task, paused_at = "", 0.0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("TASK ["):
                task = line
            if (
                not paused_at
                and ": Drain the node]" in task
                and line.startswith(f"changed: [{node} ")
            ):
                container.pause()
                paused_at = time.monotonic()
                print(f"paused {node} at {paused_at - started_at:.1f} s, just after its drain")
        rc = proc.wait()
    finally:
        watchdog.cancel()
        container.reload()
        if container.status == "paused":
            container.unpause()
    assert paused_at, "the node's drain was never seen: " + "".join(lines)[-3000:]
    ended_at = time.monotonic()
    return rc, "".join(lines), ended_at - started_at, ended_at - paused_at


def test_a_node_paused_during_its_batch_stops_the_rollout_and_the_rerun_continues(stack, tmp_path):
    """node2 stops answering (its container paused) right after the upgrade drained it: Ansible
    takes it out of the play, and its batch's watcher names it, keeps it drained with a reason of
    the upgrade's, records it on the controller and stops the rollout; node3 is not touched. Once
    the node is back, the re-run skips the canary and upgrades node2 (from its record's versions
    before) and node3."""
    inventories, nodes, controller, entry = (
        stack.inventories, stack.nodes, stack.controller, stack.entry
    )  # fmt: skip
    canary, second, third = nodes
    for node in nodes:
        on_node(node, f"rm -f {FAULT}")
    before = {n: installed(n) for n in nodes}
    target = write_yaml(
        tmp_path / "target-3.yml", {"pinned_packages_list": [{**entry, "version": "3.0"}]}
    )
    rc, out, first_s, lost_s = upgrade_pausing(
        inventories, second, "-e", f"rolling_upgrade_pins={target}"
    )
    said = flat(out)
    print(
        f"run with {second} paused: exit {rc} in {first_s:.1f} s ({lost_s:.1f} s after the pause)"
    )
    print(
        "\n".join(line for line in out.splitlines() if "UPGRADE" in line or "UNREACHABLE" in line)
    )
    assert rc != 0
    assert f"fatal: [{second}]: UNREACHABLE!" in out
    stopped = f"UPGRADE STOPPED at batch 2 ({second}): unreachable during the drain and change ("
    assert stopped in said, out[-4000:]
    assert f"ROLLBACK: none while the node cannot be worked on; its record ({STATE}" in said
    assert f"keeps the versions before ({PACKAGE}={before[second]}" in said
    assert f"NOT TOUCHED (later batches): {third}." in said
    assert "UPGRADE COMPLETE" not in said
    state, reason = slurm_node(controller, second)
    assert "DRAIN" in state.split("+"), state
    assert reason.startswith("gpuenv: upgrade batch 2: unreachable during the drain and change"), (
        reason
    )
    lost = json.loads((stack.reports / f"upgrade-{second}.json").read_text())
    assert (lost["node"], lost["batch"], lost["outcome"]) == (second, 2, "unreachable")
    assert lost["before"][PACKAGE] == before[second]
    upgraded, half = record(canary), record(second)
    assert upgraded and upgraded["outcome"] == "upgraded" and installed(canary) == "3.0"
    assert half and half["outcome"] == "started" and half["before"][PACKAGE] == before[second]
    assert half["target_id"] == upgraded["target_id"] == lost["target_id"]
    assert installed(third) == before[third]
    assert (record(third) or {}).get("target_id") != upgraded["target_id"]
    for node in (canary, third):
        assert slurm_node(controller, node) == ("IDLE", ""), node

    # The node is back (unpaused): the re-run skips the canary and continues at batch 2.
    rc, out, rerun_s = upgrade(inventories, "-e", f"rolling_upgrade_pins={target}")
    print(f"re-run: exit {rc} in {rerun_s:.1f} s, changed {recap(out)}")
    print("\n".join(line for line in out.splitlines() if "UPGRADE" in line))
    assert rc == 0, out[-4000:]
    assert f"{canary} batch 1 skipped, already upgraded in an earlier run" in flat(out)
    assert recap(out)[canary] == 0
    assert [installed(n) for n in nodes] == ["3.0"] * 3
    done = record(second)
    assert done and done["outcome"] == "upgraded" and done["before"][PACKAGE] == before[second]
    assert (record(third) or {}).get("outcome") == "upgraded"
    for node in nodes:
        assert slurm_node(controller, node) == ("IDLE", ""), node
