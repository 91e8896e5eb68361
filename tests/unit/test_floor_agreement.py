"""One node, three readers, one answer: the driver role's module (nvidia_platform_info), `gpuenv
doctor` and the `system` check read the same fixture tree through the node floor and agree.

The tree (tests/fixtures/floor/debian-dkms) is a Debian 12 node with Debian's DKMS driver: its
module file is `updates/dkms/nvidia-current.ko`, Secure Boot is on, and the next boot starts a
newer kernel than the running one. Each variation below changes the tree and checks that the
three still agree, on a fault as on a healthy node.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest

from gpuenv.checks import system as system_check
from gpuenv.doctor import diagnosis, pci
from gpuenv.doctor.system import fixture

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))
platform_info = importlib.import_module(
    "ansible_collections.gpuenv.cluster.plugins.modules.nvidia_platform_info"
)

TREE = ROOT / "tests" / "fixtures" / "floor" / "debian-dkms"
PARAMS = {
    "flavour": "auto",
    "flavour_variable": "nvidia_driver_module_flavour",
    "branch": "535",
    "fabric": False,
    "driver_package": "",
    "fabricmanager_package": "",
    "packages": [],
}
SB_EVIDENCE = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c: 1"


def no_commands(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
    # The EFI variable is readable: nothing may ask mokutil (efivars first, one order).
    raise AssertionError(f"ran {argv}")


@pytest.fixture
def node(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    shutil.copytree(TREE, root, symlinks=True)
    return root


def three_readings(root: Path) -> tuple[dict, dict, list[str] | None]:
    module = platform_info.read(no_commands, {**PARAMS, "root": str(root)})
    doctor = {r.cls: r for r in diagnosis.diagnose(fixture(root), only=[4, 5])}
    return module, doctor, system_check.pci_gpus(root)


def test_the_module_the_doctor_and_the_system_check_agree_on_a_debian_dkms_node(node):
    module, doctor, checked = three_readings(node)
    gpus = ["0000:17:00.0", "0000:65:00.0"]  # not the audio function, the NVSwitch or the NIC
    assert [g["bdf"] for g in module["gpus"]] == gpus
    assert [d.bdf for d in pci.gpus(fixture(node))] == gpus
    assert checked == gpus
    assert [s["bdf"] for s in module["nvswitches"]] == ["0000:05:00.0"]

    assert module["secure_boot"] is True
    assert module["secure_boot_evidence"] == SB_EVIDENCE
    assert doctor[4].facts["secure_boot"] is True
    assert not doctor[4].skip and not doctor[4].findings  # signed by the DKMS key: healthy

    assert module["boot_kernel"] == "6.1.0-28-amd64" == doctor[5].facts["next_boot"]
    assert module["modules"]["6.1.0-28-amd64"] == (
        "/lib/modules/6.1.0-28-amd64/updates/dkms/nvidia-current.ko"
    )
    assert not doctor[5].skip and not doctor[5].findings


def test_they_agree_when_the_next_boot_kernel_lacks_the_module(node):
    shutil.rmtree(node / "lib/modules/6.1.0-28-amd64/updates")
    module, doctor, _ = three_readings(node)
    assert module["boot_kernel"] == "6.1.0-28-amd64"
    assert module["modules"]["6.1.0-28-amd64"] == ""
    (finding,) = doctor[5].findings
    assert finding.title == "next-boot kernel 6.1.0-28-amd64 has no NVIDIA module"


def test_they_agree_on_grubs_saved_entry(node):
    (node / "etc/default/grub").write_text("GRUB_DEFAULT=saved\n")
    (node / "boot/grub/grubenv").write_text(
        "saved_entry=gnulinux-advanced-1234>gnulinux-6.1.0-27-amd64-advanced-1234\n"
    )
    shutil.rmtree(node / "lib/modules/6.1.0-28-amd64/updates")  # no matter: 27 boots next
    module, doctor, _ = three_readings(node)
    assert module["boot_kernel"] == "6.1.0-27-amd64" == doctor[5].facts["next_boot"]
    assert not doctor[5].findings


def test_they_agree_when_secure_boot_is_off(node):
    var = node / "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    var.write_bytes(bytes([6, 0, 0, 0, 0]))
    module, doctor, _ = three_readings(node)
    assert module["secure_boot"] is False
    assert doctor[4].facts["secure_boot"] is False


def test_one_acs_path_rule_for_the_fabric_reader_and_the_doctor():
    """The bridges whose ACS matters lie below the last bridge both paths share; devices under
    different root ports share none (their traffic goes up anyway). The doctor asks the floor."""
    from gpuenv.doctor import acs
    from gpuenv.floor import fabric
    from gpuenv.floor.pci import Device

    root, up, down1, down2 = "0000:00:01.0", "0000:01:00.0", "0000:02:00.0", "0000:02:01.0"
    gpu = (root, up, down1)
    nic = (root, up, down2)
    assert fabric.path_bridges(gpu, nic) == (down1, down2)
    assert fabric.path_bridges(gpu, ("0000:00:02.0", "0000:05:00.0")) == ()
    # the switch's upstream port (often without an ACS capability) is not on the path
    assert up not in fabric.path_bridges(gpu, nic)
    devices = [
        Device("0000:03:00.0", 0x10DE, 0x2335, 0x030200, gpu, "nvidia"),
        Device("0000:04:00.0", 0x15B3, 0x1021, 0x020000, nic, "mlx5_core"),
    ]
    assert set(acs.path_bridges(devices)) == {down1, down2}
