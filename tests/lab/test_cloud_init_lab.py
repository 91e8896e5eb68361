"""End to end in the lab: a node runs `gpuenv cloud-init` user data through cloud-init itself.

How the node boots (NoCloud seed, the project served by the lab's cache container, nothing
leaving the lab's network) is in cloudlab.py. The node converges from the lab's sources, checks
itself and writes the ready marker; a ref that does not exist fails the bootstrap with the
marker saying so. test_cloud_join_lab.py goes on from there: the node joins a cluster.

Opt-in, because it needs docker, a running one-node bookworm lab and about half an hour:

    export GPUENV_LAB_PREFIX=gpuenv-h3
    gpuenv lab up --nodes 1 --distro bookworm --name h3cloud
    GPUENV_CLOUD_LAB=h3cloud python -m pytest -q tests/lab/test_cloud_init_lab.py
"""

import json
import os

import pytest
import yaml
from cloudlab import (
    ROOT,
    TORCH,
    LabNode,
    head_commit,
    render,
    serve_https,
    serve_project,
    serve_torch,
)

from gpuenv.lab.settings import WHEELHOUSE_URL

LAB = os.environ.get("GPUENV_CLOUD_LAB", "")
pytestmark = pytest.mark.skipif(
    not LAB, reason="opt-in: set GPUENV_CLOUD_LAB to a running one-node bookworm lab's name"
)
NODE = LabNode(LAB, "node1")
BAD_REF_DEADLINE_S = 900  # apt install + the ansible venv, then the fetch fails
CONVERGE_DEADLINE_S = 2400  # the whole stack on one node, on a shared 2-core machine
GROUP = "cloud_nodes"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The committed project as a tarball the lab serves over https, and an inventory for the
    new node."""
    commit = head_commit()
    tarball = serve_project(commit)
    source = serve_https(LAB, tarball, tmp_path_factory.mktemp("tls"))
    serve_torch()
    inv = tmp_path_factory.mktemp("cloudinv")
    pins = yaml.safe_load((ROOT / "inventory" / "pins" / "debian-12.yml").read_text())
    group_vars = {
        **pins,
        "gpuenv_lab_wheelhouse_url": WHEELHOUSE_URL,
        "validate_profile": "cpu",
        "gpu_env_install_torch": True,
        "gpu_env_torch_package": TORCH,
    }
    (inv / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {GROUP: {"vars": group_vars}}}})
    )
    try:
        NODE.install_cloud_init()
        yield inv / "hosts.yml", commit, source
    finally:
        source.stop()
        tarball.unlink(missing_ok=True)


def test_a_ref_that_does_not_exist_fails_the_bootstrap_and_the_marker_says_so(project):
    inventory, _, source = project
    user_data = render(inventory, GROUP, "no-such-ref", source)
    state = NODE.boot(user_data, "badref-no-such-ref", BAD_REF_DEADLINE_S)
    assert (state["status"], state["stage"]) == ("failed", "fetch"), state
    # Over https, the certificate verified by --ca-bundle's CA: the server answered, 404.
    assert "404" in state["reason"], state


def test_the_node_converges_from_the_labs_sources_checks_itself_and_is_ready(project):
    inventory, commit, source = project
    user_data = render(inventory, GROUP, commit, source)
    state = NODE.boot(user_data, f"good-{commit}", CONVERGE_DEADLINE_S)
    assert state["status"] == "done", state
    assert state["verdict"] == "pass", state
    report = json.loads(NODE.run("cat /var/lib/gpuenv/check.json").stdout)
    assert report["results"], report
    # Converged from the lab's sources: the pinned driver user space and the cluster venv.
    dpkg = NODE.run("dpkg-query -W -f='${Version}' nvidia-smi")
    assert dpkg.stdout.startswith("535."), dpkg.stdout
    assert NODE.run("/opt/gpuenv/bin/python -c 'import mpi4py, numpy'").returncode == 0
