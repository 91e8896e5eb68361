"""The net_qos floor (plugins/module_utils/net_qos.py) and its module, on `tc -j` and `nft -j`
output captured from the lab images (tests/fixtures/net_qos/capture.sh: iproute2 6.1 on Debian 12,
whose HTB classes come out as text even with -j, and 6.15 on Debian 13)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpuenv.floor import net_qos as q

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "net_qos"
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))
# The shape capture.sh applied (the same Spec): 1000 Mbit/s, 80 % training, ports 29500 and
# 46000-46015, uid 1001.
CAPTURED = q.Spec("v0", 1000, 80, 100, q.parse_ports(["29500", "46000-46015"]), (1001,))


def sections(distro: str) -> dict[str, str]:
    found: dict[str, str] = {}
    name = ""
    for line in (FIXTURES / f"{distro}.txt").read_text().splitlines():
        if line.startswith("== "):
            name = line[3:]
            found[name] = ""
        else:
            found[name] += line + "\n"
    return found


def replay(distro: str, *, nft: str = "nft") -> q.Run:
    """A run that answers as the captured node did."""
    got = sections(distro)

    def run(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        if argv[:2] == ["tc", "-j"]:
            return 0, got[argv[2]]
        if argv[0] == "nft":
            return (0, got[nft]) if nft == "nft" else (1, "")
        return 127, ""

    return run


@pytest.mark.parametrize("distro", ["bookworm", "trixie"])
def test_the_applied_shape_reads_back_as_wanted(distro):
    have = q.live(replay(distro), "v0")
    assert q.differences(q.wanted(CAPTURED), have) == []
    assert q.ours(have)


def test_text_and_json_classes_read_the_same():
    text = q.parse_classes(sections("bookworm")["class"])
    json_ = q.parse_classes(sections("trixie")["class"])
    assert text == json_
    assert json_["1:10"] == {"parent": "1:1", "prio": 0, "rate": 800_000_000, "ceil": 10**9}
    assert json_["1:1"]["parent"] == "root"


@pytest.mark.parametrize(
    ("spec", "phrase"),
    [
        (q.Spec("v0", 2000, 80, 100, CAPTURED.ports, (1001,)), "class 1:1"),
        (q.Spec("v0", 1000, 70, 100, CAPTURED.ports, (1001,)), "class 1:10"),
        (q.Spec("v0", 1000, 80, 50, CAPTURED.ports, (1001,)), "class 1:20"),
        (q.Spec("v0", 1000, 80, 100, q.parse_ports(["29500"]), (1001,)), "port filters"),
        (q.Spec("v0", 1000, 80, 100, CAPTURED.ports, (1002,)), "nftables user rule"),
        (q.Spec("v0", 1000, 80, 100, CAPTURED.ports, ()), "nftables user rule"),
    ],
)
def test_any_changed_setting_is_a_difference(spec, phrase):
    found = q.differences(q.wanted(spec), q.live(replay("trixie"), "v0"))
    assert found and any(phrase in f for f in found), found


def test_a_fresh_interface_differs_and_is_not_ours():
    got = sections("trixie")

    def run(argv, timeout_s=60):
        return (0, got["fresh qdisc"]) if argv[2] == "qdisc" else (0, "[]")

    have = q.live(run, "v0", read_nft=False)
    assert not q.ours(have)
    assert q.differences(q.wanted(CAPTURED), have)[0].startswith("root qdisc {'kind': 'noqueue'")


def test_a_missing_nft_table_reads_as_none():
    have = q.live(replay("bookworm", nft="nft missing"), "v0")
    assert have["nft"] is None
    assert q.differences(q.wanted(CAPTURED), have) == [
        "nftables user rule None (want 'd2145b71605e')"
    ]


@pytest.mark.parametrize(
    ("low", "high", "blocks"),
    [
        (29500, 29500, [(29500, 0xFFFF)]),
        (46000, 46015, [(46000, 0xFFF0)]),
        (46000, 46999, None),
        (1, 65535, None),
    ],
)
def test_port_ranges_split_into_aligned_blocks_that_cover_exactly_the_range(low, high, blocks):
    found = q.port_blocks(low, high)
    if blocks is not None:
        assert found == blocks
    covered = {p for value, mask in found for p in range(value, value + (~mask & 0xFFFF) + 1)}
    assert covered == set(range(low, high + 1))
    assert all(value & ~mask & 0xFFFF == 0 for value, mask in found)


def test_apply_lines_are_what_was_captured():
    lines = q.apply_commands(CAPTURED)
    assert lines[1] == "tc qdisc add dev v0 root handle 1: htb default 20"
    assert "rate 800mbit ceil 1000mbit prio 0" in lines[3]
    assert "rate 200mbit ceil 1000mbit prio 1" in lines[4]
    assert sum("u32 match ip" in line for line in lines) == 4
    assert "meta skuid { 1001 } meta priority set 1:10" in lines[-1]
    assert q.remove_commands("v0")[0] == "tc qdisc del dev v0 root 2>/dev/null || true"


GOOD = {
    "net_qos_interface": "",
    "net_qos_rate_mbit": 1000,
    "net_qos_training_percent": 80,
    "net_qos_bulk_ceil_percent": 100,
    "net_qos_ports": ["29500", "46000-46999"],
    "net_qos_users": ["gpuenv"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"net_qos_ports": ["29500", "70000"]}, "net_qos_ports: '70000' is not within 1-65535"),
        ({"net_qos_ports": ["2000-1000"]}, "net_qos_ports: '2000-1000' is not within"),
        ({"net_qos_ports": ["ssh"]}, "net_qos_ports: 'ssh' is not a port"),
        ({"net_qos_ports": "29500"}, "net_qos_ports must be a list"),
        ({"net_qos_users": {"a": 1}}, "net_qos_users must be a list"),
        ({"net_qos_rate_mbit": "fast"}, "net_qos_rate_mbit must be a whole number"),
        ({"net_qos_rate_mbit": 0}, "net_qos_rate_mbit must be from 1"),
        ({"net_qos_training_percent": 100}, "net_qos_training_percent must be from 1 to 99"),
        ({"net_qos_bulk_ceil_percent": 10}, "net_qos_bulk_ceil_percent must be from 20"),
        ({"net_qos_interface": "a/b"}, "net_qos_interface 'a/b' is not an interface name"),
    ],
)
def test_bad_values_are_named(change, message):
    assert q.spec_error(GOOD) == ""
    assert q.spec_error({**GOOD, **change}).startswith(message)


def test_cap_net_admin_is_read_from_capeff():
    # docker's default set plus SYS_ADMIN (a lab node), then with --cap-add NET_ADMIN too.
    assert q.net_admin("Name:\tx\nCapEff:\t00000000a82425fb\n") is False
    assert q.net_admin("Name:\tx\nCapEff:\t00000000a82435fb\n") is True
    assert q.net_admin("CapEff:\t000001ffffffffff\n") is True
    assert q.net_admin(None) is None


def _module():
    spec = importlib.util.spec_from_file_location(
        "net_qos_info", ROOT / "plugins/modules/net_qos_info.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_module_answers_in_sync_for_the_captured_node(tmp_path):
    (tmp_path / "sys/class/net/v0").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text(
        "root:x:0:0::/root:/bin/sh\ngpuenv:x:1001:1001::/h:/bin/sh\n"
    )
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/status").write_text("CapEff:\t00000000a82425fb\n")
    params = {
        "interface": "v0",
        "rate_mbit": 1000,
        "training_percent": 80,
        "bulk_ceil_percent": 100,
        "ports": ["29500", "46000-46015"],
        "users": ["gpuenv", "nobody-here"],
    }
    found = _module().read(replay("trixie"), params, root=str(tmp_path))
    assert found["uids"] == [1001] and found["missing_users"] == ["nobody-here"]
    assert found["in_sync"] and found["differences"] == []
    assert found["permitted"] is False  # docker's default capabilities: no NET_ADMIN
    found = _module().read(replay("trixie"), {**params, "interface": "eth9"}, root=str(tmp_path))
    assert found["interface_exists"] is False and not found["in_sync"]
