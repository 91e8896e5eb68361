"""`gpuenv lab` from the command line: bad input and a missing engine, without docker."""

from unittest import mock

import docker
import pytest

from gpuenv.cli import main
from gpuenv.lab import docker_client


@pytest.fixture
def connect(monkeypatch):
    fake = mock.Mock(side_effect=AssertionError("docker must not be touched on bad input"))
    monkeypatch.setattr(docker_client, "connect", fake)
    return fake


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "0"], "--nodes must be from 1 to 32, got 0"),
        (["--nodes", "abc"], "whole number"),
        (["--nodes", "2", "--distro", "jessie"], "unknown distro 'jessie'"),
        (["--nodes", "2", "--name", "No Spaces"], "lab name 'No Spaces' is not valid"),
        (["--nodes", "2", "--ca-bundle", "/nonexistent.pem"], "--ca-bundle"),
    ],
)
def test_bad_input_exits_2_before_docker(argv, message, connect, capsys):
    assert main(["lab", "up", *argv]) == 2
    assert message in capsys.readouterr().err
    connect.assert_not_called()


def test_build_with_unknown_distro_exits_2(connect, capsys):
    assert main(["lab", "build", "--distro", "sid"]) == 2
    assert "unknown distro 'sid'" in capsys.readouterr().err
    connect.assert_not_called()


def test_docker_not_running_says_what_to_run(monkeypatch, capsys):
    def refuse(**kwargs):
        raise docker.errors.DockerException("Error while fetching server API version")

    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.setattr(docker_client.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert main(["lab", "up", "--nodes", "2"]) == 1
    err = capsys.readouterr().err
    assert "Docker engine is not running" in err
    assert "systemctl start docker" in err


def test_docker_not_installed_says_how_to_install(monkeypatch, capsys):
    def refuse(**kwargs):
        raise docker.errors.DockerException("no socket")

    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.setattr(docker_client.shutil, "which", lambda name: None)
    assert main(["lab", "status"]) == 1
    assert "apt-get install docker.io" in capsys.readouterr().err


def test_ssh_to_a_lab_that_is_not_up_is_bad_input(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["lab", "ssh", "node1"]) == 2
    assert "is lab 'gpuenv' up?" in capsys.readouterr().err


def test_unknown_mirror_preset_exits_2_naming_it(connect, capsys, monkeypatch):
    monkeypatch.delenv("GPUENV_MIRROR", raising=False)
    assert main(["lab", "up", "--nodes", "2", "--mirror", "tsinghua"]) == 2
    err = capsys.readouterr().err
    assert "--mirror='tsinghua' is not a known mirror preset" in err
    assert "valid: aliyun, official, tuna, ustc" in err
    monkeypatch.setenv("GPUENV_MIRROR", "nosuch")
    assert main(["lab", "build"]) == 2
    assert "GPUENV_MIRROR='nosuch' is not a known mirror preset" in capsys.readouterr().err
    connect.assert_not_called()


def test_mirror_preset_reaches_debootstrap_and_the_inventory(monkeypatch, tmp_path):
    from pathlib import Path

    from gpuenv.lab import cluster

    seen = {}

    def fake_up(client, names, root, lab, nodes, distro, ca, progress, **kw):
        seen.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr(docker_client, "connect", lambda: object())
    monkeypatch.setattr(cluster, "up", fake_up)
    monkeypatch.setenv("GPUENV_MIRROR", "ustc")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(SystemExit):
        main(["lab", "up", "--nodes", "1", "--ca-bundle", str(ca), "--net-admin"])
    assert seen == {"mirror": "ustc", "net_admin": True}
    # The option beats the environment.
    with pytest.raises(SystemExit):
        main(["lab", "up", "--nodes", "1", "--ca-bundle", str(ca), "--mirror", "tuna"])
    assert seen == {"mirror": "tuna", "net_admin": False}
    assert Path(ca).exists()
