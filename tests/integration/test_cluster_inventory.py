import os
import textwrap

import pytest

from gpuenv.cli import main
from gpuenv.cluster import inventory
from gpuenv.errors import BadInput


def write(tmp_path, text, name="hosts.yml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


@pytest.fixture
def known_hosts(tmp_path):
    path = tmp_path / "known_hosts"
    path.write_text("")
    return path


def test_local_and_ssh_hosts_with_their_connection_settings(tmp_path, known_hosts):
    key = tmp_path / "id_lab"
    key.write_text("not really a key")
    key.chmod(0o600)
    inv = write(
        tmp_path,
        f"""
        all:
          children:
            nodes:
              hosts:
                n1:
                  ansible_host: 127.0.0.1
                  ansible_port: 2222
                  ansible_user: root
                  ansible_ssh_private_key_file: {key}
                  ansible_ssh_common_args: >-
                    -o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes
                emu:
                  ansible_connection: local
                  gpuenv_cluster_python: /usr/bin/python3
                  gpuenv_cluster_env: {{CUDA_VISIBLE_DEVICES: "1"}}
        """,
    )
    hosts = inventory.load(inv)
    assert [h.name for h in hosts] == ["n1", "emu"]
    n1, emu = hosts
    assert (n1.address, n1.port, n1.user, n1.key_file) == ("127.0.0.1", 2222, "root", str(key))
    assert n1.known_hosts == (str(known_hosts),)
    assert n1.become_user == "gpuenv" and not n1.local
    assert n1.python == "python3"  # the login environment's, as users run it
    assert emu.local and emu.rendezvous_address == "127.0.0.1"
    assert emu.python == "/usr/bin/python3" and emu.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert [h.name for h in inventory.load(inv, "emu")] == ["emu"]


def test_inventory_that_does_not_parse(tmp_path):
    inv = write(tmp_path, "all: [unclosed\n")
    with pytest.raises(BadInput, match="does not parse"):
        inventory.load(inv)


def test_missing_inventory(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        inventory.load(str(tmp_path / "nope.yml"))


def test_empty_group_and_limit_matching_nothing(tmp_path):
    inv = write(
        tmp_path,
        """
        all:
          children:
            gpu: {hosts: {}}
            cpu: {hosts: {c1: {ansible_connection: local}}}
        """,
    )
    with pytest.raises(BadInput, match=r"group 'gpu' .* is empty"):
        inventory.load(inv, "gpu")
    with pytest.raises(BadInput, match=r"limit 'nomatch' matches no host.*groups: all, cpu, gpu"):
        inventory.load(inv, "nomatch")


def test_inventory_without_hosts(tmp_path):
    inv = write(tmp_path, "all:\n  children:\n    gpu: {hosts: {}}\n")
    with pytest.raises(BadInput, match="has no hosts"):
        inventory.load(inv)


def test_host_that_does_not_resolve_is_kept_with_its_problem(tmp_path, known_hosts):
    """One unresolvable name no longer refuses the whole run: that node fails `reach` by name."""
    args = f"-o UserKnownHostsFile={known_hosts}"
    inv = write(
        tmp_path,
        f"all:\n  hosts:\n    ghost:\n      ansible_host: no-such-node.invalid\n"
        f"      ansible_ssh_common_args: '{args}'\n",
    )
    (ghost,) = inventory.load(inv)
    assert ghost.problem == "address 'no-such-node.invalid' does not resolve"


def test_host_key_checking_cannot_be_turned_off(tmp_path):
    inv = write(
        tmp_path,
        """
        all:
          hosts:
            n1:
              ansible_host: 127.0.0.1
              ansible_ssh_common_args: -o StrictHostKeyChecking=no
        """,
    )
    with pytest.raises(BadInput, match="StrictHostKeyChecking=no"):
        inventory.load(inv)


def test_missing_known_hosts_file_and_open_key(tmp_path):
    inv = write(
        tmp_path,
        f"""
        all:
          hosts:
            n1:
              ansible_host: 127.0.0.1
              ansible_ssh_common_args: -o UserKnownHostsFile={tmp_path}/absent
        """,
    )
    with pytest.raises(BadInput, match=r"UserKnownHostsFile .*absent does not exist"):
        inventory.load(inv)
    key = tmp_path / "id_open"
    key.write_text("x")
    os.chmod(key, 0o644)
    inv = write(
        tmp_path,
        f"all:\n  hosts:\n    n1:\n      ansible_host: 127.0.0.1\n"
        f"      ansible_ssh_private_key_file: {key}\n",
        "open.yml",
    )
    with pytest.raises(BadInput, match="readable by others"):
        inventory.load(inv)


def test_cli_bad_inventory_exits_2_and_launches_nothing(tmp_path, monkeypatch, capsys):
    from gpuenv.cluster import pipeline

    def boom(*_a, **_k):
        raise AssertionError("nothing may be launched on bad input")

    monkeypatch.setattr(pipeline, "validate", boom)
    inv = write(tmp_path, "all: [unclosed\n")
    assert main(["cluster", "-i", inv]) == 2
    assert "does not parse" in capsys.readouterr().err
    good = write(tmp_path, "all:\n  hosts:\n    a: {ansible_connection: local}\n", "good.yml")
    assert main(["cluster", "-i", good, "--limit", "zzz"]) == 2
    assert main(["cluster", "-i", good, "--skip", "bogus"]) == 2
    assert main(["cluster", "-i", good, "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert main(["cluster", "-i", good, "--json", str(tmp_path)]) == 2
    assert main(["cluster", "-i", good, "--profile", "turbo"]) == 2
    assert main(["cluster", "-i", good, "--check-args", "--profile full"]) == 2
    assert list(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == []
    with pytest.raises(SystemExit) as exc:
        main(["cluster", "-i", good, "--deadline", "-1"])
    assert exc.value.code == 2


def test_several_sources_and_the_expected_gpu_count(tmp_path):
    """`gpuenv cluster -i A -i B` reads both, as ansible-playbook does; gpuenv_expect_gpus is
    checked and carried to the node's check."""
    first = write(tmp_path, "all:\n  hosts:\n    a: {ansible_connection: local}\n", "a.yml")
    second = write(
        tmp_path,
        "all:\n  hosts:\n    b: {ansible_connection: local, gpuenv_expect_gpus: 0}\n",
        "b.yml",
    )
    a, b = inventory.load([first, second])
    assert (a.name, a.expect_gpus, b.name, b.expect_gpus) == ("a", None, "b", 0)
    bad = write(
        tmp_path,
        "all:\n  hosts:\n    c: {ansible_connection: local, gpuenv_expect_gpus: x}\n".replace(
            "local, ", "local,\n        "
        ),
    )
    with pytest.raises(BadInput, match="gpuenv_expect_gpus must be a number >= 0"):
        inventory.load(bad)
