"""The nvidia_driver role's platform probe (plugins/modules/nvidia_platform_info.py) read from
fixture trees: PCI functions under sys/bus/pci/devices, the Secure Boot EFI variable, /boot and
/lib/modules, GRUB's files. What the role's preflight stops on is decided here.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))

PLUGINS = "ansible_collections.gpuenv.cluster.plugins"
probe = importlib.import_module(f"{PLUGINS}.modules.nvidia_platform_info")
hw = importlib.import_module(f"{PLUGINS}.module_utils.nvidia_hw")

SB_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
PARAMS = {
    "flavour": "auto",
    "flavour_variable": "nvidia_driver_module_flavour",
    "branch": "550",
    "fabric": False,
    "driver_package": "",
    "fabricmanager_package": "",
    "packages": [],
}


def pci(root: Path, bdf: str, device: int, klass: int, vendor: int = 0x10DE) -> None:
    folder = root / "sys/bus/pci/devices" / bdf
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(f"0x{vendor:04x}\n")
    (folder / "device").write_text(f"0x{device:04x}\n")
    (folder / "class").write_text(f"0x{klass:06x}\n")


def gpu(root: Path, bdf: str, device: int) -> None:
    pci(root, bdf, device, 0x030200)


def no_commands(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
    raise AssertionError(f"ran {argv}")


def answers(**outputs: tuple[int, str]):
    def run(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        return outputs.get(argv[0].replace("-", "_"), (127, ""))

    return run


def read(root: Path, run=no_commands, **params: object) -> dict:
    return probe.read(run, {**PARAMS, "root": str(root), **params})


def test_blackwell_with_the_proprietary_module_is_refused_naming_gpu_and_flavour(tmp_path):
    gpu(tmp_path, "0000:1b:00.0", 0x2901)  # GB100 [B200]
    gpu(tmp_path, "0000:43:00.0", 0x2901)
    out = read(tmp_path, flavour="proprietary")
    assert out["flavour"] == "proprietary"  # what would be installed with the check off
    assert out["flavour_error"] == (
        "nvidia_driver_module_flavour=proprietary cannot drive GPU 0000:1b:00.0 (10de:2901, "
        "Blackwell): it needs the open kernel module; set nvidia_driver_module_flavour=open "
        "(or auto)"
    )
    assert read(tmp_path, flavour="auto")["flavour"] == "open"


def test_grace_hopper_needs_open_unlike_the_rest_of_hopper(tmp_path):
    gpu(tmp_path, "0009:01:00.0", 0x2342)  # GH100 [GH200 120GB / 480GB]
    out = read(tmp_path, flavour="proprietary")
    assert "needs the open kernel module" in out["flavour_error"]
    assert "Grace Hopper" in out["flavour_error"]
    hopper = tmp_path / "h100"
    gpu(hopper, "0000:1b:00.0", 0x2330)  # GH100 [H100 SXM5 80GB]
    assert read(hopper, flavour="proprietary")["flavour_error"] == ""
    assert read(hopper, flavour="open")["flavour"] == "open"


def test_pre_turing_cannot_use_open(tmp_path):
    gpu(tmp_path, "0000:3b:00.0", 0x1DB1)  # GV100GL [Tesla V100 SXM2 16GB]
    out = read(tmp_path, flavour="open")
    assert out["flavour_error"].startswith(
        "nvidia_driver_module_flavour=open cannot drive GPU 0000:3b:00.0 (10de:1db1, pre-Turing"
    )
    assert "set nvidia_driver_module_flavour=proprietary" in out["flavour_error"]
    assert read(tmp_path, branch="580")["flavour"] == "proprietary"


@pytest.mark.parametrize(("branch", "flavour"), [("535", "proprietary"), ("550", "proprietary"),
                                                 ("560", "open"), ("580", "open")])  # fmt: skip
def test_auto_follows_nvidia_default_where_both_drive_the_gpus(tmp_path, branch, flavour):
    gpu(tmp_path, "0000:1b:00.0", 0x2335)  # GH100 [H200 SXM 141GB]
    gpu(tmp_path, "0000:1c:00.0", 0x1E02)  # TU102 [TITAN RTX], the first Turing id
    assert read(tmp_path, branch=branch)["flavour"] == flavour


def test_gpus_needing_both_flavours_have_no_answer(tmp_path):
    gpu(tmp_path, "0000:1b:00.0", 0x2901)
    gpu(tmp_path, "0000:3b:00.0", 0x1DB1)
    out = read(tmp_path)
    assert out["flavour"] == "proprietary"  # branch 550's default, with the check off
    assert "0000:1b:00.0" in out["flavour_error"] and "0000:3b:00.0" in out["flavour_error"]


def test_no_gpu_no_flavour_and_no_complaint(tmp_path):
    pci(tmp_path, "0000:00:02.0", 0x1234, 0x030000, vendor=0x8086)  # someone else's VGA
    out = read(tmp_path, flavour="open")
    assert out["gpus"] == [] and out["flavour_error"] == "" and out["flavour"] == "open"
    assert read(tmp_path, branch="580")["flavour"] == "open"


def test_nvswitches_are_nvidia_bridges_of_class_0680(tmp_path):
    gpu(tmp_path, "0000:1b:00.0", 0x2330)
    for bus in ("07", "08", "09", "0a"):
        pci(tmp_path, f"0000:{bus}:00.0", 0x22A3, 0x068000)
    pci(tmp_path, "0000:0b:00.0", 0x2FFF, 0x068000)  # an id pci.ids does not name yet
    pci(tmp_path, "0000:0c:00.0", 0x22A3, 0x068000, vendor=0x15B3)  # not NVIDIA
    pci(tmp_path, "0000:1b:00.1", 0x22BA, 0x040300)  # NVIDIA audio function
    out = read(tmp_path)
    switches = out["nvswitches"]
    assert [s["bdf"] for s in switches] == [f"0000:0{n}:00.0" for n in (7, 8, 9, "a", "b")]
    assert switches[0]["name"] == "GH100 [H100 NVSwitch]"
    assert switches[-1]["name"] == "NVSwitch"
    assert [g["bdf"] for g in out["gpus"]] == ["0000:1b:00.0"]


def test_no_nvswitch_on_a_pcie_node(tmp_path):
    gpu(tmp_path, "0000:1b:00.0", 0x2331)
    assert read(tmp_path)["nvswitches"] == []


def efivar(root: Path, value: int) -> None:
    folder = root / "sys/firmware/efi/efivars"
    folder.mkdir(parents=True)
    (folder / SB_VAR).write_bytes(bytes([0x06, 0, 0, 0, value]))


@pytest.mark.parametrize(("value", "on"), [(1, True), (0, False)])
def test_secure_boot_from_the_efi_variable(tmp_path, value, on):
    efivar(tmp_path, value)
    out = read(tmp_path)
    assert out["secure_boot"] is on
    assert out["secure_boot_evidence"].endswith(f"{SB_VAR}: {value}")


def test_secure_boot_off_without_uefi(tmp_path):
    out = read(tmp_path)
    assert out["secure_boot"] is False
    assert "without UEFI" in out["secure_boot_evidence"]


def test_secure_boot_from_mokutil_when_the_variable_cannot_be_read(tmp_path):
    (tmp_path / "sys/firmware/efi/efivars").mkdir(parents=True)
    run = answers(mokutil=(0, "SecureBoot enabled\n"))
    assert read(tmp_path, run)["secure_boot"] is True
    unknown = read(tmp_path, answers())
    assert unknown["secure_boot"] is None
    assert "mokutil --sb-state: not installed" in unknown["secure_boot_evidence"]


def kernel(root: Path, release: str, module: str = "") -> None:
    (root / "boot").mkdir(exist_ok=True)
    (root / "boot" / f"vmlinuz-{release}").write_text("")
    folder = root / "lib/modules" / release / "kernel"
    folder.mkdir(parents=True)
    if module:
        path = root / "lib/modules" / release / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def running(root: Path, release: str) -> None:
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(release + "\n")


def test_next_boot_kernel_without_a_module_is_seen(tmp_path):
    # An unattended kernel upgrade installed 6.1.0-10 (sorted as a version: after 6.1.0-9), and
    # no headers for it, so DKMS built nothing there.
    kernel(tmp_path, "6.1.0-9-amd64", "updates/dkms/nvidia-current.ko")
    kernel(tmp_path, "6.1.0-10-amd64")
    running(tmp_path, "6.1.0-9-amd64")
    out = read(tmp_path)
    assert out["running_kernel"] == "6.1.0-9-amd64"
    assert out["boot_kernel"] == "6.1.0-10-amd64"
    assert "newest of /boot/vmlinuz-*" in out["boot_kernel_evidence"]
    assert out["modules"] == {
        "6.1.0-9-amd64": "/lib/modules/6.1.0-9-amd64/updates/dkms/nvidia-current.ko",
        "6.1.0-10-amd64": "",
    }


def test_grub_saved_entry_names_the_next_boot_kernel(tmp_path):
    kernel(tmp_path, "6.8.0-45-generic", "kernel/nvidia-550srv/nvidia.ko.zst")
    kernel(tmp_path, "6.8.0-50-generic")
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text("GRUB_DEFAULT=saved\nGRUB_TIMEOUT=5\n")
    (tmp_path / "boot/grub").mkdir()
    (tmp_path / "boot/grub/grubenv").write_text(
        "# GRUB Environment Block\nsaved_entry=gnulinux-advanced-1234>gnulinux-6.8.0-45-generic-"
        "advanced-1234\n"
    )
    out = read(tmp_path)
    assert out["boot_kernel"] == "6.8.0-45-generic"
    assert out["modules"]["6.8.0-45-generic"].endswith("nvidia-550srv/nvidia.ko.zst")
    # GRUB_DEFAULT=0: the saved entry is ignored, the newest kernel boots.
    (tmp_path / "etc/default/grub").write_text("GRUB_DEFAULT=0\n")
    assert read(tmp_path)["boot_kernel"] == "6.8.0-50-generic"


SMI_Q = """
==============NVSMI LOG==============

GPU 00000000:1B:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Fabric
        State                             : Completed
        Status                            : Success
GPU 00000000:43:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Fabric
        State                             : In Progress
        Status                            : N/A
"""


def test_fabric_state_names_the_gpu_whose_fabric_is_not_up(tmp_path):
    out = read(tmp_path, answers(nvidia_smi=(0, SMI_Q)), fabric=True)
    assert out["fabric"][0] == ["00000000:1B:00.0", "Completed", "Success"]
    assert out["fabric_error"] == "GPU 00000000:43:00.0: fabric State In Progress, Status N/A"
    healthy = SMI_Q.replace("In Progress", "Completed").replace("N/A", "Success")
    assert read(tmp_path, answers(nvidia_smi=(0, healthy)), fabric=True)["fabric_error"] == ""
    broken = read(tmp_path, answers(nvidia_smi=(9, "")), fabric=True)
    assert broken["fabric_error"] == "nvidia-smi -q failed (exit status 9)"


DPKG = (
    "cuda-drivers-550 550.163.01-1 install ok installed\n"
    "nvidia-fabricmanager-550 550.144.03-1 hold ok installed\n"
)


def test_fabric_manager_at_another_version_than_the_driver_is_named(tmp_path):
    run = answers(dpkg_query=(0, DPKG))
    out = read(
        tmp_path,
        run,
        packages=["cuda-drivers-550", "nvidia-fabricmanager-550"],
        driver_package="cuda-drivers-550",
        fabricmanager_package="nvidia-fabricmanager-550",
    )
    assert out["versions"] == {
        "cuda-drivers-550": "550.163.01-1",
        "nvidia-fabricmanager-550": "550.144.03-1",
    }
    assert out["fabricmanager_error"].startswith(
        "nvidia-fabricmanager-550 550.144.03-1 is not the driver's version "
        "(cuda-drivers-550 550.163.01-1)"
    )


@pytest.mark.parametrize(
    ("driver", "manager", "error"),
    [
        ("550.163.01-1", "550.163.01-1", ""),
        # Another Debian revision of the same upstream version is the same driver.
        ("1:550.163.01-0ubuntu0.24.04.1", "550.163.01-0ubuntu0.24.04.2", ""),
        ("550.163.01-1", None, "nvidia-fabricmanager-550 is not installed"),
    ],
)
def test_fabric_manager_version_compares_upstream_versions(driver, manager, error):
    versions = {"cuda-drivers-550": driver}
    if manager:
        versions["nvidia-fabricmanager-550"] = manager
    got = probe.fabricmanager_error(versions, "cuda-drivers-550", "nvidia-fabricmanager-550")
    assert got == error


def test_doctor_reads_the_same_table():
    from gpuenv.doctor import driver
    from gpuenv.floor import nvidia_hw

    assert Path(nvidia_hw.__file__).resolve() == Path(hw.__file__).resolve()
    assert driver.generation is nvidia_hw.generation
    assert hw.generation(0x2348) == ("Grace Hopper (GH200 144G HBM3e)", frozenset({"open"}))
