import stat

import yaml

from gpuenv.lab import inventory, keys, settings
from gpuenv.lab.inventory import LabInventory, NodeEntry
from gpuenv.lab.settings import LabPaths

KEY1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOne"
KEY2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITwo"


def _inv():
    return LabInventory(
        "gpuenv",
        "trixie",
        [
            NodeEntry("gpuenv-node1", "172.30.0.2", [KEY1]),
            NodeEntry("gpuenv-node2", "172.30.0.3", [KEY2]),
        ],
    )


def test_hosts_file_is_what_ansible_needs(tmp_path):
    paths = LabPaths(tmp_path, "gpuenv")
    inventory.write(_inv(), paths)
    data = yaml.safe_load(paths.hosts_file.read_text())
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    assert hosts["gpuenv-node2"]["ansible_host"] == "172.30.0.3"
    variables = data["all"]["vars"]
    assert variables["ansible_user"] == "admin"
    assert variables["ansible_become"] is True
    assert variables["gpuenv_lab"] is True
    assert variables["gpuenv_lab_apt_proxy"] == "http://apt-cache:3142"
    assert variables["gpuenv_lab_wheelhouse_url"] == "http://apt-cache:8080/"
    args = variables["ansible_ssh_common_args"]
    assert f"UserKnownHostsFile={paths.known_hosts.resolve()}" in args
    assert "StrictHostKeyChecking=yes" in args
    assert variables["ansible_ssh_private_key_file"] == str(paths.private_key.resolve())


def test_known_hosts_lists_each_nodes_own_keys_by_name_and_address(tmp_path):
    paths = LabPaths(tmp_path, "gpuenv")
    inventory.write(_inv(), paths)
    lines = paths.known_hosts.read_text().splitlines()
    assert lines == [f"gpuenv-node1,172.30.0.2 {KEY1}", f"gpuenv-node2,172.30.0.3 {KEY2}"]


def test_written_inventory_loads_back(tmp_path):
    paths = LabPaths(tmp_path, "gpuenv")
    inventory.write(_inv(), paths)
    loaded = inventory.load(paths)
    assert loaded == _inv()
    inventory.remove(paths)
    assert inventory.load(paths) is None
    assert not paths.inventory_dir.exists()


def test_stale_facts_of_recreated_nodes_are_dropped(tmp_path):
    paths = LabPaths(tmp_path, "gpuenv")
    paths.fact_cache.mkdir(parents=True)
    (paths.fact_cache / "gpuenv-node1").write_text("{}")
    (paths.fact_cache / "other-host").write_text("{}")
    inventory.clear_facts(paths, ["gpuenv-node1", "gpuenv-node2"])
    assert not (paths.fact_cache / "gpuenv-node1").exists()
    assert (paths.fact_cache / "other-host").exists()


def test_lab_key_is_private_and_reused(tmp_path):
    private = tmp_path / ".gpuenv/lab/gpuenv/id_ed25519"
    public = keys.ensure_key(private)
    assert public.startswith("ssh-ed25519 ")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
    private.chmod(0o644)
    assert keys.ensure_key(private) == public
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_down_forgets_the_recorded_host_keys_but_keeps_the_cluster_key(tmp_path):
    paths = LabPaths(tmp_path, "gpuenv")
    inventory.write(_inv(), paths)
    record = tmp_path / ".gpuenv" / "ssh" / "lab" / "host_keys.yml"
    record.parent.mkdir(parents=True)
    record.write_text("gpuenv-node1: {}\n")
    cluster_key = record.parent / "id_gpuenv"
    cluster_key.write_text("key")
    assert paths.host_key_record == record
    inventory.remove(paths)
    assert not record.exists()
    assert cluster_key.exists()


def test_lab_inventory_carries_its_distros_pins(tmp_path):
    for distro, pins in (("bookworm", "debian-12.yml"), ("trixie", "debian-13.yml")):
        paths = LabPaths(tmp_path / distro, "gpuenv")
        inv = _inv()
        inv.distro = distro
        inventory.write(inv, paths)
        # Where ansible-playbook -i inventory/lab/hosts.yml reads group variables from.
        written = paths.inventory_dir / "group_vars" / "all" / "pins.yml"
        source = yaml.safe_load((settings.PINS_DIR / pins).read_text())
        assert yaml.safe_load(written.read_text()) == source
        assert f"from inventory/pins/{pins}" in written.read_text()
        inventory.remove(paths)
        assert not paths.inventory_dir.exists()


def test_mirror_preset_and_net_admin_go_to_the_roles_and_load_back(tmp_path):
    paths = LabPaths(tmp_path, "qos")
    inv = _inv()
    inv.mirror, inv.net_admin = "tuna", True
    inventory.write(inv, paths)
    variables = yaml.safe_load(paths.hosts_file.read_text())["all"]["vars"]
    assert variables["gpuenv_sources_preset"] == "tuna"
    assert variables["gpuenv_lab_net_admin"] is True
    assert inventory.load(paths) == inv
    # The default preset leaves the roles' own default (and a user's group_vars) in force.
    inventory.write(_inv(), paths)
    variables = yaml.safe_load(paths.hosts_file.read_text())["all"]["vars"]
    assert "gpuenv_sources_preset" not in variables
    assert variables["gpuenv_lab_net_admin"] is False
