"""The lab's orchestration against a fake docker client (no docker needed)."""

from types import SimpleNamespace
from unittest import mock

import pytest
from docker.errors import NotFound

from gpuenv.errors import BadInput, EnvironmentProblem
from gpuenv.lab import cluster, inventory
from gpuenv.lab.settings import LabPaths, Names
from gpuenv.progress import Silent


class FakeContainer:
    def __init__(self, name, labels, net, ip, fail_keys=False):
        self.name = name
        self.labels = labels
        self.status = "created"
        self._net, self._ip, self._fail = net, ip, fail_keys
        self.attrs = {"NetworkSettings": {"Networks": {}}}
        self.archives = []
        self.removed = False

    def put_archive(self, path, data):
        self.archives.append((path, data))

    def start(self):
        self.status = "running"

    def reload(self):
        nets = {self._net: {"IPAddress": self._ip}} if self.status == "running" else {}
        self.attrs = {"NetworkSettings": {"Networks": nets}}

    def exec_run(self, cmd):
        if self._fail:
            return SimpleNamespace(exit_code=1, output=b"")
        return SimpleNamespace(exit_code=0, output=f"ssh-ed25519 KEY-{self.name} root@x\n".encode())

    def remove(self, force=False):
        self.removed = True

    def stop(self, timeout=10):
        self.status = "exited"


def _client(existing=(), fail_node=None):
    client = mock.MagicMock()
    created = []

    def create(image, name, labels, network, **kwargs):
        index = int(labels["gpuenv.node"])
        c = FakeContainer(name, labels, network, f"172.31.0.{index + 1}", name == fail_node)
        c.create_kwargs = dict(kwargs, image=image)
        created.append(c)
        return c

    def listing(all=False, filters=None):
        return list(existing)

    client.containers.create.side_effect = create
    client.containers.list.side_effect = listing
    client.networks.get.side_effect = NotFound("no network")
    return client, created


@pytest.fixture
def patched(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ensure_images = mock.Mock()
    monkeypatch.setattr(cluster.images, "ensure_images", ensure_images)
    monkeypatch.setattr(cluster.cache, "ensure_cache", mock.Mock())
    monkeypatch.setattr(cluster.cache, "ensure_network", mock.Mock())
    remove_network = mock.Mock()
    monkeypatch.setattr(cluster.cache, "remove_network", remove_network)
    monkeypatch.setattr(cluster, "_ssh_banner", lambda ip: True)
    return SimpleNamespace(
        root=tmp_path, remove_network=remove_network, ensure_images=ensure_images
    )


def _up(client, root, nodes=3, lab="gpuenv"):
    return cluster.up(client, Names(), root, lab, nodes, "trixie", root / "ca.pem", Silent())


def test_up_starts_systemd_nodes_and_writes_inventory(patched):
    client, created = _client()
    inv = _up(client, patched.root)
    assert [n.name for n in inv.nodes] == ["gpuenv-node1", "gpuenv-node2", "gpuenv-node3"]
    assert all(c.status == "running" for c in created)
    first = created[0].create_kwargs
    assert first["image"] == "gpuenv/node:trixie"
    assert first["hostname"] == "gpuenv-node1"
    assert first["cap_add"] == ["SYS_ADMIN"]
    assert first["cgroupns"] == "host"
    assert "privileged" not in first
    assert set(first["tmpfs"]) == {"/run", "/run/lock"}
    # The lab's public key reaches admin's authorized_keys before the node boots.
    assert created[0].archives[0][0] == "/home/admin/.ssh"
    paths = LabPaths(patched.root, "gpuenv")
    known = paths.known_hosts.read_text()
    assert "gpuenv-node2,172.31.0.3 ssh-ed25519 KEY-gpuenv-node2" in known
    assert inventory.load(paths).nodes[2].ip == "172.31.0.4"


def test_failed_boot_removes_everything_it_created(patched):
    client, created = _client(fail_node="gpuenv-node2")
    with pytest.raises(EnvironmentProblem, match="host keys of gpuenv-node2"):
        _up(client, patched.root)
    assert len(created) == 3
    assert all(c.removed for c in created)
    patched.remove_network.assert_called_once()
    assert not LabPaths(patched.root, "gpuenv").hosts_file.exists()


def test_name_of_an_existing_lab_is_refused_before_anything_is_created(patched):
    running = FakeContainer("gpuenv-node1", {"gpuenv.lab": "gpuenv"}, "gpuenv-net", "x")
    running.status = "running"
    client, _ = _client(existing=[running])
    with pytest.raises(BadInput, match="already exists"):
        _up(client, patched.root)
    client.containers.create.assert_not_called()
    client.networks.create.assert_not_called()
    patched.ensure_images.assert_not_called()


def test_foreign_network_with_the_lab_name_is_a_clash(patched):
    client, _ = _client()
    client.networks.get.side_effect = None
    with pytest.raises(BadInput, match="network gpuenv-net"):
        _up(client, patched.root)
    client.containers.create.assert_not_called()


def test_leftover_network_of_the_same_lab_points_at_lab_down(patched):
    client, _ = _client()
    client.networks.get.side_effect = None
    client.networks.get.return_value = SimpleNamespace(attrs={"Labels": {"gpuenv.lab": "gpuenv"}})
    with pytest.raises(BadInput, match="gpuenv lab down --name gpuenv"):
        _up(client, patched.root)
    client.containers.create.assert_not_called()


def test_start_keeps_keys_and_rewrites_the_address(patched):
    client, created = _client()
    _up(client, patched.root, nodes=2)
    node2 = created[1]
    node2.stop()
    node2._ip = "172.31.0.9"
    client.containers.list.side_effect = lambda all=False, filters=None: created
    entry = cluster.start_node(client, Names(), patched.root, "gpuenv", "node2")
    assert entry.ip == "172.31.0.9"
    loaded = inventory.load(LabPaths(patched.root, "gpuenv"))
    assert [n.name for n in loaded.nodes] == ["gpuenv-node1", "gpuenv-node2"]
    assert loaded.node("gpuenv-node2").host_keys == ["ssh-ed25519 KEY-gpuenv-node2"]
    assert loaded.node("gpuenv-node2").ip == "172.31.0.9"


def test_purge_refuses_while_another_lab_is_up(patched):
    other = FakeContainer("two-node1", {"gpuenv.lab": "two"}, "two-net", "x")
    client, _ = _client(existing=[other])
    with pytest.raises(BadInput, match="two"):
        cluster.down(client, Names(), patched.root, "gpuenv", True, Silent())
    client.images.remove.assert_not_called()


def test_ssh_uses_the_lab_key_and_strict_host_key_checking(patched):
    client, _ = _client()
    _up(client, patched.root, nodes=1)
    argv = cluster.ssh_argv(patched.root, "gpuenv", "node1", ["hostname"])
    assert argv[0] == "ssh"
    assert "StrictHostKeyChecking=yes" in argv
    assert f"UserKnownHostsFile={LabPaths(patched.root, 'gpuenv').known_hosts}" in argv
    assert argv[-2:] == ["admin@172.31.0.2", "hostname"]
    with pytest.raises(BadInput, match="gpuenv-node5"):
        cluster.ssh_argv(patched.root, "gpuenv", "node5", [])
