"""The node floor's fabric reader (plugins/module_utils/fabric.py) and the rdma_fabric_info module
on the topology fixtures of tests/fixtures/fabric: each fixture's expected.yml states, by hand, the
NCCL settings the rdma_fabric role must write and the reader's key facts."""

from __future__ import annotations

import filecmp
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuenv.floor import fabric, net, pci
from gpuenv.floor.node import command_name

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/fabric"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.yml").is_file())
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))
module = importlib.import_module(
    "ansible_collections.gpuenv.cluster.plugins.modules.rdma_fabric_info"
)

# The reader's time on the 8-GPU, 8-rail fixture must stay well under a second.
READ_LIMIT_S = 0.5


def recorded(root: Path):
    """A run that answers from root/cmd/<command_name>.out (systemctl is-active: 0 for active)."""

    def run(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        out = root / "cmd" / f"{command_name(argv)}.out"
        if not out.is_file():
            return 127, ""
        text = out.read_text()
        return (0 if text.strip() == "active" else 3), text

    return run


def inputs(name: str) -> tuple[Path, dict, dict, str | None]:
    folder = FIXTURES / name
    nvml = json.loads((folder / "nvml.json").read_text()) if (folder / "nvml.json").exists() else {}
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").exists() else {}
    links = {k: tuple(v) for k, v in nvml.get("nvlink", {}).items()}
    return folder / "root", links, nvml.get("model_links", {}), env.get("CUDA_VISIBLE_DEVICES")


def read(name: str) -> fabric.Fabric:
    root, links, model, visible = inputs(name)
    return fabric.read(str(root), recorded(root), links, model, visible)


def key_facts(found: fabric.Fabric, settings: fabric.NcclSettings) -> dict:
    switch_pairs = [a for a in found.affinity if a.relation == fabric.PCIE_SWITCH]
    near = {
        a.gpu
        for a in found.affinity
        if a.relation != fabric.NO_AFFINITY and a.port in settings.rails
    }
    return {
        "gpus": len(found.gpus),
        "visible_gpus": sum(1 for g in found.gpus if g.visible),
        "nvswitches": len(found.nvswitches),
        "fabric_manager": found.fabric_manager,
        "ports": len(found.ports),
        "active_ports": sum(1 for p in found.ports if p.state == "ACTIVE"),
        "gdr": found.gdr.mode,
        "rails": list(settings.rails),
        "left_out": sorted(settings.left_out),
        "nvlink_short": [g.bdf for g in found.gpus if g.nvlink_short],
        "acs_redirect_pairs": sum(1 for a in switch_pairs if a.acs_redirect),
        "gpus_without_near_rail": sum(1 for g in found.gpus if g.bdf not in near)
        if settings.rails
        else 0,
    }


def test_there_are_at_least_twelve_topologies_each_citing_its_source():
    assert len(NAMES) >= 12
    for name in NAMES:
        assert "http" in (FIXTURES / name / "SOURCE.md").read_text(), name


@pytest.mark.parametrize("name", NAMES)
def test_reader_and_derivation_give_the_fixture_expectations(name):
    expected = yaml.safe_load((FIXTURES / name / "expected.yml").read_text())
    found = read(name)
    settings = fabric.derive(found)
    assert settings.conf() == expected["settings"]
    assert key_facts(found, settings) == expected["facts"]
    assert settings.problems == ()


@pytest.mark.parametrize("name", NAMES)
def test_the_module_gives_the_fixture_expectations(name):
    expected = yaml.safe_load((FIXTURES / name / "expected.yml").read_text())
    root, links, model, _ = inputs(name)
    params = {
        "root": str(root),
        "nvlink": {k: list(v) for k, v in links.items()},
        "model_links": model,
        "packages": [],
        "ib_hca": "",
        "gid_index": "",
        "tc": "",
        "sl": "",
        "socket_ifname": "",
    }
    answer = module.read(recorded(root), params)
    assert answer["nccl_conf"] == expected["settings"]
    assert answer["rdma"] is (expected["facts"]["ports"] > 0)
    assert answer["fabric"]["gdr"]["mode"] == expected["facts"]["gdr"]
    json.dumps(answer)  # what a module returns must be JSON


def test_reading_the_eight_gpu_eight_rail_node_takes_well_under_a_second():
    read("hgx-h100-8ib")  # warm the page cache as a node's sysfs is
    start_at = time.monotonic()
    found = read("hgx-h100-8ib")
    fabric.derive(found)
    assert time.monotonic() - start_at < READ_LIMIT_S
    assert len(found.gpus) == 8 and len(found.ports) == 8


def test_every_override_replaces_its_derived_value():
    found = read("roce-v2-gid3")
    settings = fabric.derive(
        found,
        {"ib_hca": "=mlx5_0:1", "gid_index": "5", "tc": "41", "sl": "3", "socket_ifname": "bond0"},
    )
    assert settings.conf() == {
        "NCCL_IB_HCA": "=mlx5_0:1",
        "NCCL_IB_GID_INDEX": "5",
        "NCCL_IB_TC": "41",
        "NCCL_IB_SL": "3",
        "NCCL_SOCKET_IFNAME": "bond0",
    }
    assert set(settings.origin.values()) == {"override"}
    assert set(fabric.derive(found, {"tc": ""}).origin.values()) == {"derived"}


def test_a_storage_port_is_never_a_rail_and_names_are_exact():
    settings = fabric.derive(read("storage-nic"))
    assert "mlx5_1:1" not in settings.rails
    assert "storage" in settings.left_out["mlx5_1:1"]
    # mlx5_1 is a prefix of mlx5_10: without "=" NCCL would match the storage port by prefix
    assert settings.ib_hca.startswith("=")


def test_gid_index_prefers_the_ipv4_mapped_roce_v2_entry():
    def port(*gids: fabric.Gid) -> fabric.RdmaPort:
        return fabric.RdmaPort(
            "mlx5_0", "1", "ACTIVE", "LinkUp", "", "Ethernet", gids, "", 0, "", ()
        )

    v2 = "RoCE v2"
    mapped = "0000:0000:0000:0000:0000:ffff:0a00:000b"
    six = "fd00:0000:0000:0000:0000:0000:0000:000b"
    assert fabric.gid_index([port(fabric.Gid(1, six, v2, ""), fabric.Gid(5, mapped, v2, ""))]) == (
        5,
        [],
    )
    assert fabric.gid_index([port(fabric.Gid(1, six, v2, ""))]) == (1, [])
    index, problems = fabric.gid_index([port(fabric.Gid(0, "fe80:" + mapped[5:], v2, ""))])
    assert index is None and "no RoCE v2 GID" in problems[0]


def test_port_counters_read_the_four_error_counters(tmp_path):
    base = tmp_path / "sys/class/infiniband/mlx5_0/ports/1/counters"
    base.mkdir(parents=True)
    for i, name in enumerate(net.ERROR_COUNTERS):
        (base / name).write_text(f"{i * 7}\n")
    assert net.port_counters(str(tmp_path), "mlx5_0", 1) == {
        "symbol_error": 0,
        "link_downed": 7,
        "port_rcv_errors": 14,
        "excessive_buffer_overrun_errors": 21,
    }
    assert net.port_counters(str(tmp_path), "mlx5_9", 1) == {}


def test_acs_control_walks_the_extended_capabilities(tmp_path):
    folder = tmp_path / "sys/bus/pci/devices/0000:00:01.0"
    folder.mkdir(parents=True)
    config = bytearray(0x200)
    config[0x100:0x104] = (0x0001 | (1 << 16) | (0x140 << 20)).to_bytes(4, "little")  # AER
    config[0x140:0x144] = (0x000D | (1 << 16)).to_bytes(4, "little")
    config[0x146:0x148] = (0x000C).to_bytes(2, "little")
    (folder / "config").write_bytes(bytes(config))
    assert pci.acs_control(str(tmp_path), "0000:00:01.0") == 0x000C
    (folder / "config").write_bytes(bytes(config[:64]))  # what sysfs shows a non-root reader
    assert pci.acs_control(str(tmp_path), "0000:00:01.0") is None


def test_gdr_is_off_without_peermem_on_the_proprietary_module_and_says_why():
    gdr = read("peermem-missing").gdr
    assert (gdr.mode, gdr.peermem_module, gdr.flavour) == ("off", True, "proprietary")
    assert "open module and Linux >= 5.12" in gdr.why


def test_the_committed_trees_are_what_the_script_builds(tmp_path):
    subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), str(tmp_path)], check=True)
    for name in NAMES:
        built, kept = tmp_path / name, FIXTURES / name
        for folder, _, files in os.walk(built):
            for file in files:
                path = Path(folder) / file
                twin = kept / path.relative_to(built)
                assert twin.exists() or twin.is_symlink(), twin
                if not path.is_symlink():
                    assert filecmp.cmp(path, twin, shallow=False), twin
