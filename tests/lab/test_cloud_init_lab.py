"""End to end in the lab: a node runs `gpuenv cloud-init` user data through cloud-init itself.

The node gets Debian's cloud-init and a NoCloud seed (/var/lib/cloud/seed/nocloud) holding the
rendered user data; cloud-init's stages are then started by hand, as a booting instance would
run them. The project reaches the node as a `git archive` tarball served by the lab's cache
container (http://apt-cache:8080/bootstrap/), apt goes through the lab's apt cache, PyPI through
the controller's proxy (the node image trusts its CA). Nothing leaves the lab's network:
cloud-init looks at the NoCloud seed only, and its network, hostname, apt-sources and host-key
modules are told to leave the container alone.

Opt-in, because it needs docker, a running one-node bookworm lab and about half an hour:

    export GPUENV_LAB_PREFIX=gpuenv-h3
    gpuenv lab up --nodes 1 --distro bookworm --name h3cloud
    GPUENV_CLOUD_LAB=h3cloud python -m pytest -q tests/lab/test_cloud_init_lab.py
"""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuenv.lab.cluster import ssh_argv
from gpuenv.lab.settings import WHEELHOUSE_URL, wheelhouse_dir

LAB = os.environ.get("GPUENV_CLOUD_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_CLOUD_LAB to a running one-node bookworm lab's name"
)
ROOT = Path(__file__).resolve().parents[2]
NODE = "node1"
BAD_REF_DEADLINE_S = 900  # apt install + the ansible venv, then the fetch fails
CONVERGE_DEADLINE_S = 2400  # the whole stack on one node, on a shared 2-core machine
TORCH = "torch==2.13.0"  # the CPU build constraints.txt pins, which lies on the controller
# Test-harness settings for cloud-init (not user data): the NoCloud seed only, and hands off
# what a container must keep (its network, hostname, apt sources and the host keys the lab's
# known_hosts holds).
CLOUD_CFG = """\
datasource_list: [NoCloud, None]
network: {config: disabled}
preserve_hostname: true
manage_etc_hosts: false
ssh_deletekeys: false
apt:
  preserve_sources_list: true
"""
# Each stage whatever the one before returned, as systemd starts them at boot (a module that
# fails, e.g. locale on a minbase image, makes its stage exit non-zero).
CLOUD_INIT_STAGES = (
    "cloud-init init --local; cloud-init init; cloud-init modules --mode=config;"
    " cloud-init modules --mode=final"
)


def on_node(command, stdin=None, timeout=600):
    argv = ssh_argv(ROOT, LAB, NODE, ["sudo", "sh", "-c", shlex.quote(command)])
    return subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def marker():
    done = on_node("cat /var/lib/gpuenv/ready.json 2>/dev/null || true")
    return json.loads(done.stdout) if done.stdout.strip() else None


def boot(user_data, instance_id, deadline_s):
    """Seed cloud-init as a new instance, run its stages, wait for the bootstrap's end."""
    seed = "/var/lib/cloud/seed/nocloud"
    meta = f"instance-id: {instance_id}\n"
    cleaned = on_node(f"cloud-init clean --logs; rm -f /var/lib/gpuenv/ready.json; mkdir -p {seed}")
    assert cleaned.returncode == 0, cleaned.stderr
    assert on_node(f"cat > {seed}/user-data", stdin=user_data).returncode == 0
    assert on_node(f"cat > {seed}/meta-data", stdin=meta).returncode == 0
    started = on_node(
        f"systemd-run --unit gpuenv-e2e-{instance_id} --collect sh -c '{CLOUD_INIT_STAGES}'"
    )
    assert started.returncode == 0, started.stderr
    stop_at = time.monotonic() + deadline_s
    while time.monotonic() < stop_at:
        state = marker()
        if state and state["ref"] in instance_id and state["status"] != "running":
            return state
        time.sleep(20)
    log = on_node("tail -n 40 /var/log/gpuenv-bootstrap.log /var/log/cloud-init-output.log")
    pytest.fail(f"no final marker within {deadline_s} s:\n{log.stdout}")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The committed project as a tarball the lab serves, and an inventory for the new node."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = wheelhouse_dir(ROOT) / "bootstrap"
    out.mkdir(parents=True, exist_ok=True)
    tarball = out / f"gpuenv-{commit}.tar.gz"
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar.gz", "--prefix=gpuenv/", "-o",
         str(tarball), commit],
        check=True,
    )  # fmt: skip
    inv = tmp_path_factory.mktemp("cloudinv")
    pins = yaml.safe_load((ROOT / "inventory" / "pins" / "debian-12.yml").read_text())
    # CPU-only lab nodes are judged by the cpu profile, as the lab's own inventory says; it
    # requires ddp, so the node gets the CPU build of torch from the lab's wheelhouse (cp311: a
    # Debian 12 node), as `make demo` does.
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "-c", str(ROOT / "constraints.txt"),
         "-d", str(wheelhouse_dir(ROOT)), TORCH],
        check=True, capture_output=True,
    )  # fmt: skip
    group_vars = {
        **pins,
        "gpuenv_lab_wheelhouse_url": WHEELHOUSE_URL,
        "validate_profile": "cpu",
        "gpu_env_install_torch": True,
        "gpu_env_torch_package": TORCH,
    }
    (inv / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"cloud_nodes": {"vars": group_vars}}}})
    )
    install = on_node(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq"
        " --no-install-recommends cloud-init >/dev/null && mkdir -p /etc/cloud/cloud.cfg.d"
        " && cat > /etc/cloud/cloud.cfg.d/99-gpuenv-lab.cfg",
        stdin=CLOUD_CFG,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr
    yield inv / "hosts.yml", commit
    tarball.unlink(missing_ok=True)


def render(inventory, ref):
    done = subprocess.run(
        [sys.executable, "-m", "gpuenv", "cloud-init", "-i", str(inventory), "--group",
         "cloud_nodes", "--source", f"{WHEELHOUSE_URL}bootstrap/gpuenv-{{ref}}.tar.gz",
         "--ref", ref],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "PRIVATE KEY" not in done.stdout
    return done.stdout


def test_a_ref_that_does_not_exist_fails_the_bootstrap_and_the_marker_says_so(project):
    inventory, _ = project
    state = boot(render(inventory, "no-such-ref"), "badref-no-such-ref", BAD_REF_DEADLINE_S)
    assert (state["status"], state["stage"]) == ("failed", "fetch"), state
    assert "404" in state["reason"], state


def test_the_node_converges_from_the_labs_sources_checks_itself_and_is_ready(project):
    inventory, commit = project
    state = boot(render(inventory, commit), f"good-{commit}", CONVERGE_DEADLINE_S)
    assert state["status"] == "done", state
    assert state["verdict"] == "pass", state
    report = json.loads(on_node("cat /var/lib/gpuenv/check.json").stdout)
    assert report["results"], report
    # Converged from the lab's sources: the pinned driver user space and the cluster venv.
    dpkg = on_node("dpkg-query -W -f='${Version}' nvidia-smi")
    assert dpkg.stdout.startswith("535."), dpkg.stdout
    assert on_node("/opt/gpuenv/bin/python -c 'import mpi4py, numpy'").returncode == 0
