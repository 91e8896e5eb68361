"""roles/ssh_mesh: the cluster key, complete known_hosts, node-to-node ssh with strict checking."""

from __future__ import annotations

import shlex

import pytest
from nodehelpers import address, as_root, as_user, cluster_user, hostvars, peer, require

KEY_FILES = "/etc/ssh/ssh_host_*_key.pub"


def _mesh(host) -> list[str]:
    hv = hostvars(host)
    group = hv.get("ssh_mesh_group", "all")
    members = hv["groups"].get(group, [])
    if hv["inventory_hostname"] not in members:
        pytest.skip(f"this node is not in the mesh group {group!r}")
    return members


def _host_keys(node) -> set[str]:
    out = node.check_output(f"cat {KEY_FILES}")
    return {" ".join(line.split()[:2]) for line in out.splitlines() if line.strip()}


def test_cluster_key_installed_and_authorized(host):
    require(host, "ssh")
    _mesh(host)
    user = cluster_user(host)
    name = hostvars(host).get("ssh_mesh_key_name", "id_gpuenv")
    with as_root(host):
        home = host.user(user).home
        key = host.file(f"{home}/.ssh/{name}")
        assert key.exists, f"{key.path} missing"
        assert key.user == user and key.mode == 0o600, f"{key.path}: {key.user} {oct(key.mode)}"
        pub = " ".join(host.file(f"{home}/.ssh/{name}.pub").content_string.split()[:2])
        authorized = host.file(f"{home}/.ssh/authorized_keys").content_string
    assert pub in authorized, f"the cluster key is not in {user}'s authorized_keys"


def test_known_hosts_holds_every_node_real_keys(host, request):
    require(host, "ssh")
    members = _mesh(host)
    problems = []
    for name in members:
        other = peer(request.config, name)
        real = _host_keys(other)
        for alias in {name, address(hostvars(other), name)}:
            out = host.run("ssh-keygen -F %s -f /etc/ssh/ssh_known_hosts", alias)
            listed = {
                " ".join(line.split()[1:3])
                for line in out.stdout.splitlines()
                if line and not line.startswith("#")
            }
            if listed != real:
                problems.append(
                    f"{alias}: known_hosts has {sorted(k.split()[0] for k in listed)}, "
                    f"node has {sorted(k.split()[0] for k in real)}"
                    + (" (keys differ)" if listed and listed != real else "")
                )
    assert not problems, "; ".join(problems)


def test_ssh_to_every_node_with_strict_host_key_checking(host, request):
    require(host, "ssh")
    members = _mesh(host)
    user = cluster_user(host)
    failures = []
    for name in members:
        other = peer(request.config, name)
        target = address(hostvars(other), name)
        expected = other.check_output("hostname")
        cmd = (
            "ssh -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 "
            f"{shlex.quote(target)} hostname"
        )
        res = as_user(host, user, cmd, login=False)
        if res.rc != 0 or res.stdout.strip() != expected:
            failures.append(f"{target}: rc={res.rc} {res.stdout.strip()!r} {res.stderr.strip()}")
    assert not failures, "; ".join(failures)


def test_unknown_host_key_is_refused(host, request):
    """Strict checking is really on: with no known_hosts the same connection must fail."""
    require(host, "ssh")
    members = [m for m in _mesh(host) if m != hostvars(host)["inventory_hostname"]] or _mesh(host)
    other = peer(request.config, members[0])
    target = address(hostvars(other), members[0])
    cmd = (
        "ssh -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 "
        "-o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null "
        f"{shlex.quote(target)} true; echo ssh-exit=$?"
    )
    # ssh exits 255 on a refused host key; testinfra's own ssh backend would take a 255 for a lost
    # connection to the node, so the exit status travels in the output instead.
    res = as_user(host, cluster_user(host), cmd, login=False)
    assert "ssh-exit=0" not in res.stdout, f"ssh to {target} succeeded without a known host key"
    assert "ssh-exit=255" in res.stdout, res.stdout
    assert "Host key verification failed" in res.stderr, res.stderr
