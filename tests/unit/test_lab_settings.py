import pytest

from gpuenv.errors import BadInput
from gpuenv.lab import settings


@pytest.mark.parametrize("value", ["0", "-1", "33", "abc", "", "1.5"])
def test_bad_node_counts_are_rejected(value):
    with pytest.raises(BadInput, match="--nodes"):
        settings.validate_nodes(value)


@pytest.mark.parametrize("value", ["1", "3", "32"])
def test_node_counts_in_range_are_accepted(value):
    assert settings.validate_nodes(value) == int(value)


def test_unknown_distro_names_the_choices():
    with pytest.raises(BadInput, match="trixie, bookworm"):
        settings.validate_distro("jessie")


@pytest.mark.parametrize("name", ["Gpuenv", "1lab", "a_b", "lab--x", "x" * 30, "-lab", "lab-"])
def test_bad_lab_names_are_rejected(name):
    with pytest.raises(BadInput, match="lab name"):
        settings.validate_name(name)


def test_node_short_and_full_names_resolve():
    assert settings.resolve_node("gpuenv", "node2") == "gpuenv-node2"
    assert settings.resolve_node("lab2", "lab2-node10") == "lab2-node10"
    with pytest.raises(BadInput, match="no node"):
        settings.resolve_node("lab2", "gpuenv-node1")
    with pytest.raises(BadInput):
        settings.resolve_node("gpuenv", "node0")


def test_default_lab_writes_inventory_lab_and_others_lab_dash_name(tmp_path):
    assert settings.LabPaths(tmp_path, "gpuenv").hosts_file == tmp_path / "inventory/lab/hosts.yml"
    other = settings.LabPaths(tmp_path, "two")
    assert other.known_hosts == tmp_path / "inventory/lab-two/known_hosts"
    assert other.private_key == tmp_path / ".gpuenv/lab/two/id_ed25519"


def test_prefix_from_environment_names_every_object(monkeypatch):
    monkeypatch.setenv("GPUENV_LAB_PREFIX", "bench")
    names = settings.Names.from_env()
    assert names.node_image("trixie") == "bench/node:trixie"
    assert (names.cache_container, names.cache_volume, names.molecule_network) == (
        "bench-cache",
        "bench-apt-cache",
        "bench-molecule",
    )
    monkeypatch.setenv("GPUENV_LAB_PREFIX", "Bad Prefix")
    with pytest.raises(BadInput, match="GPUENV_LAB_PREFIX"):
        settings.Names.from_env()


def test_default_names_are_the_agreed_ones(monkeypatch):
    monkeypatch.delenv("GPUENV_LAB_PREFIX", raising=False)
    names = settings.Names.from_env()
    assert names.node_image("bookworm") == "gpuenv/node:bookworm"
    assert names.cache_container == "gpuenv-cache"
    assert names.cache_volume == "gpuenv-apt-cache"
    assert names.molecule_network == "gpuenv-molecule"
