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
