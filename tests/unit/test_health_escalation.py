"""Replayed timelines: each a list of scans (hours after the start, what the node shows, what the
kernel log gained) and the action expected of a finding after each; clears and reboots between.
The rules are gpuenv/data/health_escalation.yaml's (docs/health.md, "History and escalation")."""

import json
from pathlib import Path

import pytest
import yaml
from healthnode import build

from gpuenv.checks.thresholds import load_thresholds
from gpuenv.errors import BadInput
from gpuenv.health import history
from gpuenv.health.scan import scan

T0_UNIX = 1_780_000_000.0
BOOTED_H = 1.0  # the node booted this long before the first scan
THRESHOLDS = load_thresholds()
BUS = {0: "18", 1: "2a", 2: "3a", 3: "5d", 4: "9a", 5: "ab", 6: "ba", 7: "db"}
UUID = "GPU-1d5e2a7c-40b1-4c3e-9e6f-0000000000{:02d}"
LINK = {"replay": 0, "recovery": 0, "crc_data": 0}


def xid(code, gpu, text="pid=4190, name=python3, Graphics SM Warp Exception"):
    return ("xid", code, gpu, text)


def sxid(code, text="Non-fatal, Link 32 egress non-posted PRIV error (First)"):
    return ("sxid", code, None, text)


def nvlink_crc(n):
    links = [{"link": i, "active": True, "counters": {**LINK, "crc_flit": n if i == 2 else 0}}
             for i in range(18)]  # fmt: skip
    return {"nvlinks": links}


# Each timeline: (name, [step, ...]); a step is a dict with
#   at_h: hours after T0; gpus: NVML changes by GPU index; events: kernel lines this step adds;
#   root: files to write under the node's root; reboot: a new boot before this scan;
#   clear: a finding id (or "*") recorded as repaired at at_h, instead of a scan;
#   expect: {(signal, gpu, subject): action} after the scan (action "absent": no such finding).
TIMELINES = [
    (
        "one correctable Xid is watched",
        [
            {"at_h": 0, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
        ],
    ),
    (
        "the same Xid three times in a day drains",
        [
            {"at_h": 0, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 5, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 20, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "drain"}},
        ],
    ),
    (
        "three Xids spread over three days stay watched",
        [
            {"at_h": 0, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 30, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 60, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
        ],
    ),
    (
        "three Xid lines in one scan count three times",
        [
            {"at_h": 0, "events": [xid(31, 4)] * 3, "expect": {("xid", 4, "31"): "drain"}},
        ],
    ),
    (
        "an Xid already seen is not counted again by later scans",
        [
            {"at_h": 0, "events": [xid(13, 2)], "expect": {("xid", 2, "13"): "watch"}},
            {"at_h": 1, "expect": {("xid", 2, "13"): "watch"}},
            {"at_h": 2, "expect": {("xid", 2, "13"): "watch"}},
            {"at_h": 3, "expect": {("xid", 2, "13"): "watch"}},
        ],
    ),
    (
        "Xid 79 again within a week after the reboot: replace",
        [
            {"at_h": -1, "expect": {("gpu.lost", 3, "0000:5d:00.0"): "absent"}},
            {
                "at_h": 0,
                "events": [xid(79, 3, "pid=0, GPU has fallen off the bus.")],
                "gpus": {"3": {"remove": True}},
                "expect": {("xid", 3, "79"): "reboot", ("gpu.lost", 3, "0000:5d:00.0"): "reboot"},
            },
            {"at_h": 1, "reboot": True, "expect": {("xid", 3, "79"): "absent"}},
            {
                "at_h": 50,
                "events": [xid(79, 3, "pid=0, GPU has fallen off the bus.")],
                "expect": {("xid", 3, "79"): "replace"},
            },
        ],
    ),
    (
        "Xid 79 again after ten days: reboot again",
        [
            {
                "at_h": 0,
                "events": [xid(79, 3, "pid=0, GPU has fallen off the bus.")],
                "expect": {("xid", 3, "79"): "reboot"},
            },
            {"at_h": 1, "reboot": True, "expect": {("xid", 3, "79"): "absent"}},
            {
                "at_h": 240,
                "events": [xid(79, 3, "pid=0, GPU has fallen off the bus.")],
                "expect": {("xid", 3, "79"): "reboot"},
            },
        ],
    ),
    (
        "a pending remap: reset, clear, and it is gone",
        [
            {
                "at_h": 0,
                "gpus": {"2": {"remap_pending": True}},
                "expect": {("row_remap.pending", 2, ""): "reset"},
            },
            {"at_h": 1, "clear": f"row_remap.pending:{UUID.format(2)}:"},
            {"at_h": 1.1, "expect": {("row_remap.pending", 2, ""): "none"}},
            {"at_h": 2, "expect": {("row_remap.pending", 2, ""): "none"}},
        ],
    ),
    (
        "a pending remap still pending after the reset: drain",
        [
            {
                "at_h": 0,
                "gpus": {"2": {"remap_pending": True}},
                "expect": {("row_remap.pending", 2, ""): "reset"},
            },
            {"at_h": 1, "clear": f"row_remap.pending:{UUID.format(2)}:"},
            {
                "at_h": 1.1,
                "gpus": {"2": {"remap_pending": True}},
                "expect": {("row_remap.pending", 2, ""): "drain"},
            },
        ],
    ),
    (
        "a pending remap left alone stays reset, however many scans see it",
        [
            {
                "at_h": h,
                "gpus": {"2": {"remap_pending": True}},
                "expect": {("row_remap.pending", 2, ""): "reset"},
            }
            for h in range(6)
        ],
    ),
    (
        "a lost GPU still lost after the reboot: replace",
        [
            {
                "at_h": 0,
                "gpus": {"6": {"remove": True}},
                "expect": {("gpu.lost", None, "0000:ba:00.0"): "reboot"},
            },
            {"at_h": 1, "clear": "*"},
            {
                "at_h": 1.5,
                "reboot": True,
                "gpus": {"6": {"remove": True}},
                "expect": {("gpu.lost", None, "0000:ba:00.0"): "replace"},
            },
        ],
    ),
    (
        "NVLink errors growing on three scans in a day: drain",
        [
            {
                "at_h": 0,
                "gpus": {"3": nvlink_crc(500)},
                "expect": {("nvlink.errors", 3, ""): "watch"},
            },
            {
                "at_h": 4,
                "gpus": {"3": nvlink_crc(900)},
                "expect": {("nvlink.errors", 3, ""): "watch"},
            },
            {
                "at_h": 8,
                "gpus": {"3": nvlink_crc(1500)},
                "expect": {("nvlink.errors", 3, ""): "drain"},
            },
        ],
    ),
    (
        "NVLink errors that stop growing are no longer a finding",
        [
            {
                "at_h": 0,
                "gpus": {"3": nvlink_crc(500)},
                "expect": {("nvlink.errors", 3, ""): "watch"},
            },
            {
                "at_h": 4,
                "gpus": {"3": nvlink_crc(510)},
                "expect": {("nvlink.errors", 3, ""): "none"},
            },
            {
                "at_h": 8,
                "gpus": {"3": nvlink_crc(510)},
                "expect": {("nvlink.errors", 3, ""): "none"},
            },
        ],
    ),
    (
        "PCIe replays growing three times in a day: drain",
        [
            {
                "at_h": 0,
                "gpus": {"5": {"pcie_replays": 200}},
                "expect": {("pcie.replay", 5, ""): "watch"},
            },
            {
                "at_h": 1,
                "gpus": {"5": {"pcie_replays": 900}},
                "expect": {("pcie.replay", 5, ""): "watch"},
            },
            {
                "at_h": 2,
                "gpus": {"5": {"pcie_replays": 3000}},
                "expect": {("pcie.replay", 5, ""): "drain"},
            },
        ],
    ),
    (
        "hardware slowdown appearing three times in a day: drain",
        [
            {
                "at_h": 0,
                "gpus": {"0": {"clock_reasons": 8}},
                "expect": {("throttle.hw_slowdown", 0, ""): "watch"},
            },
            {"at_h": 1, "expect": {("throttle.hw_slowdown", 0, ""): "none"}},
            {
                "at_h": 2,
                "gpus": {"0": {"clock_reasons": 8}},
                "expect": {("throttle.hw_slowdown", 0, ""): "watch"},
            },
            {"at_h": 3, "expect": {("throttle.hw_slowdown", 0, ""): "none"}},
            {
                "at_h": 4,
                "gpus": {"0": {"clock_reasons": 8}},
                "expect": {("throttle.hw_slowdown", 0, ""): "drain"},
            },
        ],
    ),
    (
        "hardware slowdown lasting through five scans counts once",
        [
            {
                "at_h": h,
                "gpus": {"0": {"clock_reasons": 8}},
                "expect": {("throttle.hw_slowdown", 0, ""): "watch"},
            }
            for h in range(5)
        ],
    ),
    (
        "InfiniBand errors growing three times in a day: drain",
        [
            {
                "at_h": h,
                "root": {"sys/class/infiniband/mlx5_1/ports/1/counters/symbol_error": f"{n}\n"},
                "expect": {("ib.errors", None, "mlx5_1/1"): want},
            }
            for h, n, want in ((0, 20, "watch"), (2, 45, "watch"), (4, 90, "drain"))
        ],
    ),
    (
        "a port down, repaired: the clear is kept only while needed",
        [
            {
                "at_h": 0,
                "root": {"sys/class/infiniband/mlx5_2/ports/1/state": "1: DOWN\n"},
                "expect": {("ib.state", None, "mlx5_2/1"): "drain"},
            },
            {"at_h": 1, "clear": "ib.state:node:mlx5_2/1"},
            {
                "at_h": 2,
                "root": {"sys/class/infiniband/mlx5_2/ports/1/state": "4: ACTIVE\n"},
                "expect": {("ib.state", None, "mlx5_2/1"): "none"},
            },
        ],
    ),
    (
        "an Xid from before the clear is history",
        [
            {"at_h": 0, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 1, "clear": f"xid:{UUID.format(1)}:13"},
            {"at_h": 2, "expect": {("xid", 1, "13"): "absent"}},
            {"at_h": 3, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
        ],
    ),
    (
        "clearing everything restarts the count",
        [
            {"at_h": 0, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 1, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 2, "clear": "*"},
            {"at_h": 3, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
            {"at_h": 4, "events": [xid(13, 1)], "expect": {("xid", 1, "13"): "watch"}},
        ],
    ),
    (
        "throttling most of the time between two scans is watched",
        [
            {
                "at_h": 0,
                "gpus": {"4": {"violation_power_ns": 0}},
                "expect": {("throttle.duration", 4, ""): "none"},
            },
            {
                "at_h": 1,
                "gpus": {"4": {"violation_power_ns": int(1800e9)}},
                "expect": {("throttle.duration", 4, ""): "watch"},
            },
            {
                "at_h": 2,
                "gpus": {"4": {"violation_power_ns": int(1810e9)}},
                "expect": {("throttle.duration", 4, ""): "none"},
            },
        ],
    ),
    (
        "uncorrectable errors again within a week: drain",
        [
            {
                "at_h": 0,
                "gpus": {"7": {"ecc_volatile_uncorrected": 1}},
                "expect": {("ecc.volatile_uncorrected", 7, ""): "watch"},
            },
            {"at_h": 1, "reboot": True, "expect": {("ecc.volatile_uncorrected", 7, ""): "none"}},
            {
                "at_h": 30,
                "gpus": {"7": {"ecc_volatile_uncorrected": 1}},
                "expect": {("ecc.volatile_uncorrected", 7, ""): "drain"},
            },
        ],
    ),
    (
        "counters that fell after a reboot count from zero, not negative",
        [
            {
                "at_h": 0,
                "gpus": {"5": {"pcie_replays": 50}},
                "expect": {("pcie.replay", 5, ""): "none"},
            },
            {
                "at_h": 1,
                "reboot": True,
                "gpus": {"5": {"pcie_replays": 120}},
                "expect": {("pcie.replay", 5, ""): "watch"},
            },
        ],
    ),
    (
        "a non-fatal NVSwitch error three times in a day: drain",
        [
            {
                "at_h": h,
                "events": [sxid(12028)],
                "expect": {("sxid", None, "0000:05:00.0/12028"): want},
            }
            for h, want in ((0, "watch"), (3, "watch"), (6, "drain"))
        ],
    ),
    (
        "a narrow link still narrow after the reseat: replace",
        [
            {
                "at_h": 0,
                "gpus": {"5": {"pcie_width": 8}},
                "expect": {("pcie.width", 5, ""): "drain"},
            },
            {"at_h": 1, "clear": f"pcie.width:{UUID.format(5)}:"},
            {
                "at_h": 2,
                "reboot": True,
                "gpus": {"5": {"pcie_width": 8}},
                "expect": {("pcie.width", 5, ""): "replace"},
            },
        ],
    ),
]


def _line(event, since_boot_s):
    kind, code, gpu, text = event
    if kind == "sxid":
        body = f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): {code}, {text}"
    else:
        body = f"NVRM: Xid (PCI:0000:{BUS[gpu]}:00): {code}, {text}"
    return f"[{since_boot_s:>12.6f}] node-a kernel: {body}\n"


def replay(tmp_path, steps):
    node = build(tmp_path, "hgx8")
    root = Path(node.root)
    base_log = node.kernel_log
    log = base_log
    state = history.empty_state()
    boot_unix = T0_UNIX - BOOTED_H * 3600
    boots = 0
    for n, step in enumerate(steps):
        now = T0_UNIX + step["at_h"] * 3600
        if "clear" in step:
            target = None if step["clear"] == "*" else step["clear"]
            history.clear(state, target, "tester", now)
            continue
        if step.get("reboot"):
            boots += 1
            boot_unix = now - 60
            log = base_log
            (root / "proc/sys/kernel/random/boot_id").write_text(f"boot-{boots}\n")
        (root / "proc/uptime").write_text(f"{now - boot_unix:.2f} 0.00\n")
        for rel, text in step.get("root", {}).items():
            (root / rel).write_text(text)
        for i, event in enumerate(step.get("events", [])):
            log += _line(event, now - boot_unix - 10 + i)
        report = scan(node.root, node.run(log), node.nvml(step.get("gpus")), THRESHOLDS, state, now)
        state = json.loads(json.dumps(report.state))  # what the file would hold
        for (signal, gpu, subject), want in step["expect"].items():
            found = [
                f for f in report.findings
                if f.signal == signal and f.gpu == gpu and f.subject == subject
            ]  # fmt: skip
            got = found[0].action if found else "absent"
            assert got == want, (n, signal, gpu, [f.evidence for f in found])
    return state


def test_there_are_at_least_20_timelines():
    assert len(TIMELINES) >= 20


@pytest.mark.parametrize("steps", [t[1] for t in TIMELINES], ids=[t[0] for t in TIMELINES])
def test_timeline(tmp_path, steps):
    replay(tmp_path, steps)


def test_a_clear_records_who_and_when(tmp_path):
    state = replay(tmp_path, TIMELINES[8][1][:1])
    ids = history.clear(state, None, "alice", T0_UNIX + 60)
    assert ids == [f"row_remap.pending:{UUID.format(2)}:"]
    assert state["clears"][-1] == {"finding": "*", "ids": ids, "by": "alice",
                                   "at_unix": T0_UNIX + 60}  # fmt: skip
    with pytest.raises(BadInput, match="not in the state file"):
        history.clear(state, "xid:GPU-nope:79", "alice", T0_UNIX)


def test_the_state_file_is_replaced_whole(tmp_path):
    path = tmp_path / "deep" / "health.json"
    history.save(path, history.empty_state())
    assert history.load(path)["kind"] == "gpuenv.health.state"
    assert [p.name for p in path.parent.iterdir()] == ["health.json"]  # no temporary left
    path.write_text("{not json")
    with pytest.raises(BadInput, match="not JSON"):
        history.load(path)
    assert history.load(tmp_path / "missing.json") == history.empty_state()


def test_shipped_rules_parse_and_name_known_signals():
    rules = history.shipped_rules()
    assert len(rules) >= 10
    signals = {
        "xid",
        "sxid",
        "row_remap.pending",
        "retired_pages.pending",
        "gpu.lost",
        "ecc.volatile_uncorrected",
        "nvlink.errors",
        "nvlink.state",
        "pcie.replay",
        "pcie.width",
        "throttle.hw_slowdown",
        "throttle.hw_thermal",
        "throttle.hw_power_brake",
        "temperature.slowdown",
        "ib.errors",
        "ib.state",
    }
    assert {r.signal for r in rules} <= signals


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "a", "signal": "xid", "action": "explode", "count": 1, "within_h": 1, "why": "w"},
         "action must be one of"),
        ({"id": "a", "signal": "xid", "action": "drain", "why": "w"}, "either count"),
        ({"id": "a", "signal": "xid", "action": "drain", "count": 0, "within_h": 1, "why": "w"},
         "count must be"),
        ({"id": "a", "signal": "xid", "action": "drain", "after_clear": True, "why": "w", "x": 1},
         "unknown key"),
    ],
)  # fmt: skip
def test_a_bad_rule_is_named(row, message):
    with pytest.raises(BadInput, match=message):
        history.parse_rules({"rules": [row]}, "rules.yaml")


def test_the_escalation_file_is_yaml_with_a_reason_per_rule():
    from gpuenv.checks.thresholds import DATA_DIR

    data = yaml.safe_load((DATA_DIR / "health_escalation.yaml").read_text(encoding="utf-8"))
    assert all(row["why"].strip() for row in data["rules"])
