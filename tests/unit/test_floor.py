"""The node floor's readers (plugins/module_utils, the package's gpuenv.floor) on fixture trees:
one rule each, the rule the roles and the package both apply."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuenv.floor import boot, net, ompi, pci
from gpuenv.floor.node import command_name, resolve_under

SB_VAR = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def device(root: Path, bdf: str, vendor: int, dev: int, klass: int, path: str = "") -> None:
    real = root / "sys/devices" / (path or "pci0000:00") / bdf
    real.mkdir(parents=True)
    (real / "vendor").write_text(f"0x{vendor:04x}\n")
    (real / "device").write_text(f"0x{dev:04x}\n")
    (real / "class").write_text(f"0x{klass:06x}\n")
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, links), links / bdf)


def answers(**outputs: tuple[int, str]):
    def run(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        return outputs.get(command_name(argv), (127, ""))

    return run


def test_a_gpu_is_an_nvidia_vga_or_3d_controller_and_nothing_else(tmp_path):
    device(tmp_path, "0000:01:00.0", 0x10DE, 0x2330, 0x030200)  # 3D controller
    device(tmp_path, "0000:02:00.0", 0x10DE, 0x2684, 0x030000)  # VGA controller
    device(tmp_path, "0000:02:00.1", 0x10DE, 0x22BA, 0x040300)  # its audio function
    device(tmp_path, "0000:03:00.0", 0x10DE, 0x1234, 0x038000)  # "other display": not counted
    device(tmp_path, "0000:04:00.0", 0x1002, 0x740F, 0x030200)  # another vendor's GPU
    device(tmp_path, "0000:05:00.0", 0x10DE, 0x22A3, 0x068000)  # NVSwitch
    device(tmp_path, "0000:06:00.0", 0x15B3, 0x1021, 0x020700)  # ConnectX-7, InfiniBand
    root = str(tmp_path)
    assert [d.bdf for d in pci.gpus(root) or []] == ["0000:01:00.0", "0000:02:00.0"]
    (switch,) = pci.nvswitches(root)
    assert switch.describe() == {
        "bdf": "0000:05:00.0",
        "device": "0x22a3",
        "name": "GH100 [H100 NVSwitch]",
    }
    assert [d.bdf for d in pci.nics(root)] == ["0000:06:00.0"]
    assert pci.gpus(str(tmp_path / "no-sysfs")) is None


def test_the_bridges_above_a_device_come_from_its_sysfs_path(tmp_path):
    path = "pci0000:00/0000:00:01.0/0000:15:00.0/0000:16:00.0"
    device(tmp_path, "0000:17:00.0", 0x10DE, 0x2330, 0x030200, path)
    (gpu,) = pci.gpus(str(tmp_path)) or []
    assert gpu.bridges == ("0000:00:01.0", "0000:15:00.0", "0000:16:00.0")
    assert gpu.describe()["generation"] == "Turing, Ampere, Ada or Hopper"


def test_links_with_absolute_targets_stay_inside_the_root(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink("/real", tmp_path / "link")
    assert resolve_under(str(tmp_path), "/link/x") == "/real/x"


def test_command_names_are_the_fixture_file_names():
    assert command_name(["mokutil", "--sb-state"]) == "mokutil-sb-state"
    assert command_name(["/usr/bin/ompi_info", "--parsable", "--all"]) == "ompi_info-parsable-all"


def test_secure_boot_reads_the_efi_variable_before_mokutil(tmp_path):
    var = tmp_path / SB_VAR
    var.parent.mkdir(parents=True)
    var.write_bytes(bytes([6, 0, 0, 0, 1]))
    disagreeing = answers(**{"mokutil-sb-state": (0, "SecureBoot disabled\n")})
    assert boot.secure_boot(str(tmp_path), disagreeing).enabled is True
    var.unlink()
    assert boot.secure_boot(str(tmp_path), disagreeing).enabled is False
    unknown = boot.secure_boot(str(tmp_path), answers())
    assert (unknown.uefi, unknown.enabled) == (True, None)
    assert "mokutil --sb-state: not installed" in unknown.evidence
    assert boot.secure_boot(str(tmp_path / "bios"), answers()).uefi is False


def kernels(root: Path, *releases: str) -> None:
    (root / "boot").mkdir(exist_ok=True)
    for release in releases:
        (root / "boot" / f"vmlinuz-{release}").write_text("")


@pytest.mark.parametrize(
    ("grub", "grubenv", "expected"),
    [
        ("GRUB_DEFAULT=0\n", "saved_entry=6.1.0-9-amd64\n", "6.1.0-10-amd64"),  # not saved: newest
        (
            "GRUB_DEFAULT=saved\n",
            "saved_entry=gnulinux-6.1.0-9-amd64-advanced-x\n",
            "6.1.0-9-amd64",
        ),
        (
            "GRUB_DEFAULT=saved\n",
            "saved_entry=6.1.0-9-amd64\nnext_entry=6.1.0-10-amd64\n",
            "6.1.0-10-amd64",
        ),
        ('GRUB_DEFAULT="Advanced options>Debian, with Linux 6.1.0-9-amd64"\n', "", "6.1.0-9-amd64"),
        ("GRUB_DEFAULT=saved\n", "saved_entry=a-removed-kernel\n", "6.1.0-10-amd64"),
    ],
)
def test_the_next_boot_kernel_follows_grub(tmp_path, grub, grubenv, expected):
    kernels(tmp_path, "6.1.0-9-amd64", "6.1.0-10-amd64")
    (tmp_path / "etc/default").mkdir(parents=True)
    (tmp_path / "etc/default/grub").write_text(grub)
    (tmp_path / "boot/grub").mkdir()
    (tmp_path / "boot/grub/grubenv").write_text(grubenv)
    assert boot.next_boot_kernel(str(tmp_path))[0] == expected


def test_no_kernel_in_boot_means_no_next_boot_kernel(tmp_path):
    assert boot.next_boot_kernel(str(tmp_path))[0] == ""


@pytest.mark.parametrize(
    "name", ["nvidia.ko", "nvidia.ko.zst", "nvidia-current.ko", "nvidia-current.ko.xz"]
)
def test_nvidia_module_files_include_debians_nvidia_current(tmp_path, name):
    folder = tmp_path / "lib/modules/6.1.0-10-amd64/updates/dkms"
    folder.mkdir(parents=True)
    (folder / name).write_text("")
    (folder / "nvidia-uvm.ko").write_text("")  # not the core module
    assert boot.module_files(str(tmp_path), "6.1.0-10-amd64") == [
        f"/lib/modules/6.1.0-10-amd64/updates/dkms/{name}"
    ]


def ompi_info(built: str, switch: str | None = None) -> str:
    lines = [
        "ompi:version:full:4.1.6",
        f"mca:mpi:base:param:mpi_built_with_cuda_support:value:{built}",
    ]
    if switch is not None:
        lines.append(f"mca:opal:base:param:opal_cuda_support:value:{switch}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "aware"),
    [
        (ompi_info("true"), True),
        (ompi_info("true", "true"), True),
        (ompi_info("true", "false"), False),  # conda-forge's build: built with, switched off
        (ompi_info("false", "true"), False),
        ("ompi:version:full:4.1.6\n", False),
    ],
)
def test_open_mpi_is_cuda_aware_when_built_with_it_and_not_switched_off(text, aware):
    assert ompi.cuda_awareness(text)[0] is aware
    got = ompi.read(answers(**{"ompi_info-parsable-all": (0, text)}))
    assert got is not None and got["version"] == "4.1.6" and got["cuda_aware"] is aware


def test_no_open_mpi_is_none():
    assert ompi.read(answers()) is None


def test_rdma_ports_and_the_default_route(tmp_path):
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (found,) = net.rdma_ports(str(tmp_path))
    assert (found.name, found.active, found.phys_state, found.rate_gbytes) == (
        "mlx5_0/1",
        True,
        "LinkUp",
        50.0,
    )
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/route").write_text(
        "Iface\tDestination\tGateway\nib0\t0000A8C0\t00000000\neth0\t00000000\t0100A8C0\n"
    )
    (tmp_path / "sys/class/net/eth0").mkdir(parents=True)
    (tmp_path / "sys/class/net/eth0/speed").write_text("100000\n")
    assert net.default_route_interface(str(tmp_path)) == "eth0"
    assert net.interface_speed(str(tmp_path), "eth0") == 12.5


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.0.0.0/24 2 0 2
        |-- 10.0.0.0
           /24 link UNICAST
        |-- 10.0.0.11
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.0.0.11
        /32 host LOCAL
"""
ROUTE = (
    "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    "eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
)


def test_addresses_without_iproute2_come_from_procfs(tmp_path):
    (tmp_path / "proc/net").mkdir(parents=True)
    (tmp_path / "proc/net/fib_trie").write_text(FIB_TRIE)
    (tmp_path / "proc/net/route").write_text(ROUTE)
    (tmp_path / "proc/net/if_inet6").write_text(
        "fe800000000000000000000000000001 02 40 20 80     eth0\n"
    )
    assert net.addresses(str(tmp_path)) == [
        ("eth0", "10.0.0.11"),
        ("lo", "127.0.0.1"),
        ("eth0", "fe80::1"),
    ]
