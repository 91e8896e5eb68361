"""Every pins file (inventory/pins/) names a stack the roles' preflight tables accept on its OS.

The same rules as roles/*/tasks/checks.yml, read from the roles' own vars files, so a pins file
and a table cannot drift apart unnoticed. (The real preflight run on these files, with faked
Ubuntu facts, is in docs/sources.md.)
"""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PINS = {
    "debian-12.yml": "Debian-12.yml",
    "debian-13.yml": "Debian-13.yml",
    "ubuntu-22.04.yml": "Ubuntu-22.yml",
    "ubuntu-24.04.yml": "Ubuntu-24.yml",
}


def _role_vars(role, name):
    paths = [p for p in ROOT.glob(f"**/roles/{role}/vars/{name}") if ".venv" not in p.parts]
    assert paths, f"no roles/{role}/vars/{name}"
    return yaml.safe_load(paths[0].read_text())


def _major(version):
    return int(version.split(".")[0])


@pytest.mark.parametrize(("pins", "os_vars"), sorted(PINS.items()))
def test_pins_pass_the_roles_tables(pins, os_vars):
    pin = yaml.safe_load((ROOT / "inventory" / "pins" / pins).read_text())
    driver = _role_vars("nvidia_driver", os_vars)["__nvidia_driver_os"]
    cuda = _role_vars("cuda_toolkit", os_vars)["__cuda_toolkit_os"]
    nccl = _role_vars("nccl", os_vars)["__nccl_os"]
    min_driver = _role_vars("cuda_toolkit", "main.yml")["__cuda_toolkit_min_driver"]
    nccl_pip = _role_vars("nccl", "main.yml")["__nccl_pip_builds"]

    offer = driver[pin["nvidia_driver_install_method"]]
    assert not offer["branches"] or pin["nvidia_driver_branch"] in offer["branches"]
    offer = cuda[pin["cuda_toolkit_install_method"]]
    assert not offer["versions"] or pin["cuda_toolkit_version"] in offer["versions"]
    need = min_driver[pin["cuda_toolkit_version"]]["driver"]
    assert int(pin["nvidia_driver_branch"]) >= _major(need)
    cuda_major = pin["cuda_toolkit_version"].split(".")[0]
    method = pin["nccl_install_method"]
    assert method in nccl
    minor = ".".join(pin["nccl_version"].split(".")[:2])
    if method == "distro":
        assert minor in nccl["distro"]["versions"]
        assert cuda_major in nccl["distro"]["cuda_majors"]
    elif method == "pip":
        build = nccl_pip[cuda_major]
        assert tuple(map(int, build["min"].split("."))) <= tuple(map(int, minor.split(".")))
        assert tuple(map(int, minor.split("."))) <= tuple(map(int, build["max"].split(".")))


@pytest.mark.parametrize("pins", ["ubuntu-22.04.yml", "ubuntu-24.04.yml"])
def test_ubuntu_pins_say_they_are_untested(pins):
    assert "UNTESTED" in (ROOT / "inventory" / "pins" / pins).read_text()
