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


def test_shared_wheelhouse_is_one_folder_per_machine(tmp_path, monkeypatch):
    monkeypatch.delenv(settings.WHEELHOUSE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.shared_wheelhouse() == tmp_path / "xdg" / "gpuenv" / "lab-wheels"
    monkeypatch.setenv(settings.WHEELHOUSE_ENV, str(tmp_path / "mine"))
    assert settings.shared_wheelhouse() == tmp_path / "mine"


def test_a_checkouts_wheels_move_into_the_shared_folder_behind_a_link(tmp_path):
    shared = tmp_path / "shared"
    (shared / "bootstrap").mkdir(parents=True)
    (shared / "torch-2.13.0+cpu.whl").write_text("the shared one")
    checkout = tmp_path / "co"
    local = settings.wheelhouse_dir(checkout)
    (local / "bootstrap").mkdir(parents=True)
    (local / "torch-2.13.0+cpu.whl").write_text("the checkout's copy")
    (local / "numpy-2.4.6.whl").write_text("numpy")
    (local / "bootstrap" / "gpuenv-abc.tar.gz").write_text("tarball")

    assert settings.link_wheelhouse(checkout, shared) == shared
    assert local.is_symlink() and local.resolve() == shared
    assert (shared / "torch-2.13.0+cpu.whl").read_text() == "the shared one"
    assert (shared / "numpy-2.4.6.whl").read_text() == "numpy"
    assert (shared / "bootstrap" / "gpuenv-abc.tar.gz").read_text() == "tarball"
    # Written through the checkout's path, found in the served folder; a second call is a no-op.
    (local / "nccl.whl").write_text("nccl")
    assert settings.link_wheelhouse(checkout, shared) == shared
    assert (shared / "nccl.whl").read_text() == "nccl"


def test_a_link_to_another_folder_is_repointed_and_a_file_in_the_way_is_named(tmp_path):
    checkout = tmp_path / "co"
    local = settings.wheelhouse_dir(checkout)
    local.parent.mkdir(parents=True)
    local.symlink_to(tmp_path, target_is_directory=True)
    settings.link_wheelhouse(checkout, tmp_path / "shared")
    assert local.resolve() == tmp_path / "shared"
    local.unlink()
    local.write_text("not a folder")
    with pytest.raises(BadInput, match="is a file"):
        settings.link_wheelhouse(checkout, tmp_path / "shared")
