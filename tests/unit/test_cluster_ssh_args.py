"""The validation reaches nodes as Ansible does: the OpenSSH client with the inventory's own
arguments (ProxyJump, ProxyCommand, -o options), and the cluster user's SSH login on the node;
what gpuenv cannot honour is an error naming the host and the variable."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from gpuenv import tools
from gpuenv.cluster import inventory
from gpuenv.cluster.fanout import remote_command, ssh_argv
from gpuenv.cluster.inventory import Host, ssh_words
from gpuenv.errors import BadInput


def _host(tmp_path: Path, **hv) -> Host:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    base = {"ansible_host": "10.0.0.2", "ansible_ssh_common_args": f"-o UserKnownHostsFile={kh}"}
    return inventory._host("n2", {**base, **hv}, tmp_path)


def test_proxyjump_and_proxycommand_reach_ssh_word_for_word(tmp_path):
    jump = "-o ProxyJump=admin@bastion:2222"
    proxy = "-o 'ProxyCommand=ssh -W %h:%p -q admin@bastion'"
    h = _host(
        tmp_path,
        ansible_ssh_common_args=f"{jump} -o UserKnownHostsFile={tmp_path}/known_hosts",
        ansible_ssh_extra_args=f"-J other {proxy} -C -4",
        ansible_port=2200,
        ansible_user="admin",
    )
    argv = ssh_argv(h, "true", 20)
    assert argv[0] == "ssh"
    # gpuenv's fixed options first: ssh takes an option's first value.
    assert argv[1:5] == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert "Port=2200" in argv and 'User="admin"' in argv
    tail = argv[argv.index("ConnectTimeout=20") + 1 : -2]
    common = f"{jump} -o UserKnownHostsFile={tmp_path}/known_hosts"
    assert tail == shlex.split(common) + shlex.split(f"-J other {proxy} -C -4")
    assert argv[-2:] == ["10.0.0.2", "true"]


def test_no_port_means_sshs_own_choice_and_the_key_is_named(tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("k")
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    h = _host(tmp_path, ansible_ssh_private_key_file=str(key), ansible_ssh_executable="/opt/ssh")
    argv = ssh_argv(h, "true", 5)
    assert not any(a.startswith("Port=") for a in argv)  # ~/.ssh/config may set it
    assert f'IdentityFile="{key}"' in argv and argv[0] == "/opt/ssh"


def test_a_proxied_address_is_not_resolved_on_the_controller(tmp_path):
    h = _host(
        tmp_path,
        ansible_host="only-the-bastion-knows.invalid",
        ansible_ssh_extra_args="-J admin@bastion",
    )
    assert h.problem is None
    direct = _host(tmp_path, ansible_host="nowhere.invalid")
    assert direct.problem and "does not resolve" in direct.problem


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ("-o StrictHostKeyChecking=no", "-o StrictHostKeyChecking=no"),
        ("-oStrictHostKeyChecking=accept-new", "accept-new"),
        ("-o BatchMode=no", "BatchMode=no"),
        ("-tt", "-t"),
        ("-N", "-N"),
        ("-f", "-f"),
        ("-W host:22", "-W"),
        ("-o RemoteCommand=bash", "RemoteCommand=bash"),
        ("-o RequestTTY=force", "RequestTTY=force"),
        ("node2", "'node2'"),
        ("-Z", "-Z"),
        ("-J", "-J"),
        ("-o 'ProxyCommand=ssh", "does not parse"),
    ],
)
def test_unsupported_ssh_args_are_refused_naming_host_and_variable(tmp_path, args, named):
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        with pytest.raises(BadInput) as caught:
            ssh_words("n7", {var: args})
        msg = str(caught.value)
        assert msg.startswith("host n7: ") and var in msg and named in msg, msg


def test_supported_args_keep_their_order_and_first_option_value():
    words, opts = ssh_words(
        "n1",
        {
            "ansible_ssh_common_args": "-F cfg -o ProxyJump=b1 -o ProxyJump=b2",
            "ansible_ssh_extra_args": "-vC -i key -p 2022 -l me -o ControlMaster=auto",
        },
    )
    assert words == shlex.split("-F cfg -o ProxyJump=b1 -o ProxyJump=b2") + shlex.split(
        "-vC -i key -p 2022 -l me -o ControlMaster=auto"
    )
    assert opts["proxyjump"] == "b1" and opts["controlmaster"] == "auto"


def test_password_and_other_connections_are_refused(tmp_path):
    with pytest.raises(BadInput, match="host n2: ansible_password is set"):
        _host(tmp_path, ansible_password="secret")
    with pytest.raises(BadInput, match=r"host n2: ansible_connection 'community\.docker\.docker'"):
        _host(tmp_path, ansible_connection="community.docker.docker")


def test_commands_run_in_the_cluster_users_ssh_login_on_the_node():
    h = Host("n1", "10.0.0.1", "192.168.1.1", user="admin", become_user="gpuenv",
             env={"NCCL_DEBUG": "INFO"})  # fmt: skip
    remote = remote_command(h, "python3 -m gpuenv check", 30)
    words = shlex.split(remote)
    # Outer deadline, then sudo to the cluster user, whose ssh logs in to the node's own address.
    assert words[:4] == ["timeout", "-k", "5", "35"]
    assert words[4:10] == ["sudo", "-n", "-u", "gpuenv", "-H", "ssh"]
    assert "BatchMode=yes" in words and "StrictHostKeyChecking=yes" in words
    assert words[-2] == "192.168.1.1"
    inner = shlex.split(words[-1])
    # The login's own deadline and a login shell: the remote command dies on time there too.
    assert inner[:5] == ["timeout", "-k", "5", "30", "bash"] and inner[5] == "-lc"
    assert inner[6] == "cd && env NCCL_DEBUG=INFO python3 -m gpuenv check"
    assert "sudo" not in remote.split("ssh", 1)[1]  # never sudo inside the user's login


def test_the_connection_user_who_is_the_cluster_user_needs_no_loop():
    h = Host("n1", "10.0.0.1", "10.0.0.1", user="gpuenv")
    assert shlex.split(remote_command(h, "true", 10)) == [
        "timeout", "-k", "5", "10", "bash", "-lc", "true",
    ]  # fmt: skip


def test_tools_are_found_beside_the_interpreter_before_path(tmp_path, monkeypatch):
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    # A venv's python is a link to the system interpreter: its folder is the venv's, unresolved.
    (venv_bin / "python").symlink_to(sys.executable)
    tool = venv_bin / "ansible-inventory"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    elsewhere = tmp_path / "path"
    elsewhere.mkdir()
    other = elsewhere / "ansible-inventory"
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(elsewhere))
    assert tools.find("ansible-inventory") == str(tool)
    tool.unlink()
    assert tools.find("ansible-inventory") == str(other)
    monkeypatch.setenv("PATH", os.devnull)
    assert tools.find("ansible-inventory") is None


def test_inventory_is_read_without_the_venv_on_path(tmp_path, monkeypatch):
    # gpuenv run by its path, the venv not activated: ansible-inventory is still found.
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    a:\n      ansible_connection: local\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if tools.find("ansible-inventory") is None:
        pytest.skip("ansible-inventory is not installed beside this interpreter")
    hosts = inventory.load(str(tmp_path / "hosts.yml"))
    assert [h.name for h in hosts] == ["a"]
