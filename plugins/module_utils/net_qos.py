# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Training traffic before bulk flows on one interface: the wanted tc state, the commands that make
it, and the live state as ``tc -j`` reports it, compared.

The shape (docs/roles/net_qos.md): an HTB root ``1:`` whose unclassified traffic goes to the bulk
class, one inner class ``1:1`` at the interface's rate, under it the training class ``1:10``
(guaranteed share, may borrow up to the whole rate, served first) and the bulk class ``1:20``
(the rest, capped at its ceiling). Training traffic is recognised two ways: by TCP/UDP port (u32
filters on source and destination port, ranges split into aligned blocks) and by the sending
process's user (an nftables rule in the output hook that sets the packet's priority to ``1:10``,
which HTB takes without a filter). HTB rather than mqprio: mqprio maps priorities onto a NIC's
hardware queues and shapes nothing without a hardware offload or a shaper under it, veths and
many Ethernet NICs have one queue, and the kernels seen here have no sch_mqprio at all.

Standard library only. ``run(argv, timeout_s) -> (rc, stdout)`` is injected; nothing here starts
a process.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

Run = Callable[..., tuple[int, str]]

ROOT_HANDLE = "1:"
PARENT_CLASS = "1:1"
TRAINING_CLASS = "1:10"
BULK_CLASS = "1:20"
# HTB's default: the minor number of the class that takes unclassified traffic (hex, as tc says).
DEFAULT_MINOR = 0x20
# Bytes a class may send per round among classes of one priority. HTB's own guess (rate / r2q)
# is far above its 200000-byte limit at Gbit rates and makes the kernel warn.
QUANTUM = 60000
# The u32 filters' priority (tc's "pref").
FILTER_PREF = 1
NFT_TABLE = "gpuenv_net_qos"
NFT_FAMILY = "inet"
# Offset of the TCP/UDP ports in an IPv4 packet without options (u32's "ip sport/dport").
PORT_OFFSET = 20
CAP_NET_ADMIN = 12
_PORTS = re.compile(r"^([0-9]{1,5})(?:-([0-9]{1,5}))?$")
_RATE = re.compile(r"^([0-9.]+)([KMGT]?)bit$")
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


class QosError(ValueError):
    """A value that is not what it should be; the message names the variable."""


@dataclass(frozen=True)
class Spec:
    interface: str
    rate_mbit: int
    training_percent: int
    bulk_ceil_percent: int
    ports: tuple[tuple[int, int], ...]  # inclusive ranges
    uids: tuple[int, ...]

    @property
    def training_mbit(self) -> int:
        return max(1, self.rate_mbit * self.training_percent // 100)

    @property
    def bulk_mbit(self) -> int:
        return max(1, self.rate_mbit - self.training_mbit)

    @property
    def bulk_ceil_mbit(self) -> int:
        return max(self.bulk_mbit, self.rate_mbit * self.bulk_ceil_percent // 100)

    def digest(self) -> str:
        """Names this configuration in the nftables rule's comment."""
        text = json.dumps([TRAINING_CLASS, sorted(self.uids)])
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_ports(items: list[str] | tuple[str, ...], variable: str = "net_qos_ports") -> tuple:
    """``["29500", "46000-46999"]`` -> ((29500, 29500), (46000, 46999)); bad -> QosError."""
    ranges = []
    for item in items:
        found = _PORTS.match(str(item).strip())
        if not found:
            raise QosError(f"{variable}: {item!r} is not a port or a range LOW-HIGH")
        low = int(found.group(1))
        high = int(found.group(2) or low)
        if not 1 <= low <= high <= 65535:
            raise QosError(f"{variable}: {item!r} is not within 1-65535 with LOW <= HIGH")
        ranges.append((low, high))
    return tuple(sorted(set(ranges)))


def port_blocks(low: int, high: int) -> list[tuple[int, int]]:
    """The inclusive range as aligned (value, mask) blocks that u32 can match, fewest first
    to last: 46000-46999 -> [(46000, 0xfff0), (46016, 0xffc0), ...]."""
    blocks = []
    port = low
    while port <= high:
        size = port & -port if port else 1 << 16
        while size > 1 and port + size - 1 > high:
            size //= 2
        blocks.append((port, 0xFFFF & ~(size - 1)))
        port += size
    return blocks


def check_spec(spec: Spec) -> None:
    """Raise QosError naming the variable when a value cannot work."""
    if not spec.interface or "/" in spec.interface or len(spec.interface) > 15:
        raise QosError(f"net_qos_interface {spec.interface!r} is not an interface name")
    if not 1 <= spec.rate_mbit <= 10**7:
        raise QosError(f"net_qos_rate_mbit must be from 1 to 10000000, got {spec.rate_mbit}")
    if not 1 <= spec.training_percent <= 99:
        raise QosError(
            f"net_qos_training_percent must be from 1 to 99, got {spec.training_percent}"
        )
    if not 100 - spec.training_percent <= spec.bulk_ceil_percent <= 100:
        raise QosError(
            f"net_qos_bulk_ceil_percent must be from {100 - spec.training_percent} (the bulk"
            f" share) to 100, got {spec.bulk_ceil_percent}"
        )


def spec_error(variables: dict) -> str:
    """Why the net_qos variables cannot work ("" when they can), naming the variable: the
    role's check before anything changes (the filter gpuenv.cluster.net_qos_error)."""
    try:
        ports = parse_ports(_strings(variables.get("net_qos_ports"), "net_qos_ports"))
        _strings(variables.get("net_qos_users"), "net_qos_users")
        numbers = {}
        for name in ("net_qos_rate_mbit", "net_qos_training_percent", "net_qos_bulk_ceil_percent"):
            value = variables.get(name)
            if isinstance(value, bool) or not str(value).strip().isdigit():
                raise QosError(f"{name} must be a whole number, got {value!r}")
            numbers[name] = int(str(value))
        check_spec(
            Spec(
                str(variables.get("net_qos_interface") or "default-route"),
                numbers["net_qos_rate_mbit"],
                numbers["net_qos_training_percent"],
                numbers["net_qos_bulk_ceil_percent"],
                ports,
                (),
            )
        )
    except QosError as exc:
        return str(exc)
    return ""


def _strings(value: object, variable: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, (str, int)) and not isinstance(v, bool) for v in value
    ):
        raise QosError(f"{variable} must be a list of strings, got {value!r}")
    return [str(v) for v in value]


def _filter_keys(spec: Spec) -> list[tuple[int, int, int]]:
    """(offset, value, mask) of each u32 match, as tc -j reports them: sport then dport."""
    keys = []
    for low, high in spec.ports:
        for value, mask in port_blocks(low, high):
            keys.append((PORT_OFFSET, value << 16, mask << 16))  # source port: high half
            keys.append((PORT_OFFSET, value, mask))  # destination port: low half
    return keys


def wanted(spec: Spec) -> dict:
    """The tc state the apply commands make, in the form ``live`` returns."""
    mbit = 10**6
    return {
        "qdisc": {"kind": "htb", "handle": ROOT_HANDLE, "default": DEFAULT_MINOR},
        "classes": {
            PARENT_CLASS: {
                "parent": "root",
                "prio": None,
                "rate": spec.rate_mbit * mbit,
                "ceil": spec.rate_mbit * mbit,
            },
            TRAINING_CLASS: {
                "parent": PARENT_CLASS,
                "prio": 0,
                "rate": spec.training_mbit * mbit,
                "ceil": spec.rate_mbit * mbit,
            },
            BULK_CLASS: {
                "parent": PARENT_CLASS,
                "prio": 1,
                "rate": spec.bulk_mbit * mbit,
                "ceil": spec.bulk_ceil_mbit * mbit,
            },
        },
        "filters": sorted([*k, TRAINING_CLASS] for k in _filter_keys(spec)),
        "nft": spec.digest() if spec.uids else None,
    }


def apply_commands(spec: Spec) -> list[str]:
    """Shell lines that put the wanted state in place from any state (the unit's start)."""
    dev = spec.interface
    htb = f"htb quantum {QUANTUM}"
    lines = [
        f"tc qdisc del dev {dev} root 2>/dev/null || true",
        f"tc qdisc add dev {dev} root handle {ROOT_HANDLE} htb default {DEFAULT_MINOR:x}",
        f"tc class add dev {dev} parent {ROOT_HANDLE} classid {PARENT_CLASS} {htb}"
        f" rate {spec.rate_mbit}mbit ceil {spec.rate_mbit}mbit",
        f"tc class add dev {dev} parent {PARENT_CLASS} classid {TRAINING_CLASS} {htb}"
        f" rate {spec.training_mbit}mbit ceil {spec.rate_mbit}mbit prio 0",
        f"tc class add dev {dev} parent {PARENT_CLASS} classid {BULK_CLASS} {htb}"
        f" rate {spec.bulk_mbit}mbit ceil {spec.bulk_ceil_mbit}mbit prio 1",
    ]
    for low, high in spec.ports:
        for value, mask in port_blocks(low, high):
            for end in ("sport", "dport"):
                lines.append(
                    f"tc filter add dev {dev} parent {ROOT_HANDLE} protocol ip prio {FILTER_PREF}"
                    f" u32 match ip {end} {value} 0x{mask:04x} flowid {TRAINING_CLASS}"
                )
    lines += nft_commands(spec)
    return lines


def nft_commands(spec: Spec) -> list[str]:
    """The user rule: replaced as a whole (nft -f is atomic), or removed when no user is named."""
    drop = f"nft delete table {NFT_FAMILY} {NFT_TABLE} 2>/dev/null || true"
    if not spec.uids:
        return [drop]
    uids = ", ".join(str(u) for u in sorted(spec.uids))
    ruleset = (
        f"table {NFT_FAMILY} {NFT_TABLE} {{\n"
        "  chain output {\n"
        "    type filter hook output priority mangle; policy accept;\n"
        f"    meta skuid {{ {uids} }} meta priority set {TRAINING_CLASS}"
        f' comment "{spec.digest()}"\n'
        "  }\n"
        "}\n"
    )
    return [drop, f"nft -f - <<'NFT'\n{ruleset}NFT"]


def remove_commands(interface: str) -> list[str]:
    """Shell lines that put the interface back (its kernel default qdisc) and drop the rule."""
    return [
        f"tc qdisc del dev {interface} root 2>/dev/null || true",
        f"nft delete table {NFT_FAMILY} {NFT_TABLE} 2>/dev/null || true",
    ]


def rate_bits(value: object) -> int | None:
    """A rate as tc reports it: a JSON number (bytes/s) or text such as ``800Mbit``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value * 8
    found = _RATE.match(str(value))
    if not found:
        return None
    return round(float(found.group(1)) * _UNITS[found.group(2)])


def _json(text: str) -> list | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, list) else None


def parse_qdisc(text: str) -> dict | None:
    """The root qdisc of ``tc -j qdisc show dev IF``: kind, handle, default (htb), or None."""
    for entry in _json(text) or []:
        if isinstance(entry, dict) and entry.get("root"):
            default = (entry.get("options") or {}).get("default")
            return {
                "kind": entry.get("kind"),
                "handle": entry.get("handle"),
                "default": int(str(default), 16) if default is not None else None,
            }
    return None


def parse_classes(text: str) -> dict[str, dict]:
    """``tc -j class show dev IF``. iproute2 6.1 (Debian 12) prints HTB classes as text even
    with -j ("class htb 1:10 parent 1:1 prio 0 rate 800Mbit ceil 1Gbit ..."); both are read."""
    data = _json(text)
    classes: dict[str, dict] = {}
    if data is not None:
        for entry in data:
            if not isinstance(entry, dict) or entry.get("class") != "htb":
                continue
            classes[str(entry.get("handle"))] = {
                "parent": "root" if entry.get("root") else entry.get("parent"),
                "prio": entry.get("prio") if not entry.get("root") else None,
                "rate": rate_bits(entry.get("rate")),
                "ceil": rate_bits(entry.get("ceil")),
            }
        return classes
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or words[:2] != ["class", "htb"]:
            continue
        fields: dict[str, str] = {}
        rest = words[3:]
        while rest:
            if rest[0] == "root":
                fields["parent"] = "root"
                rest = rest[1:]
            elif len(rest) >= 2:
                fields.setdefault(rest[0], rest[1])
                rest = rest[2:]
            else:
                break
        root = fields.get("parent") == "root"
        classes[words[2]] = {
            "parent": fields.get("parent"),
            "prio": None if root or "prio" not in fields else int(fields["prio"]),
            "rate": rate_bits(fields.get("rate")),
            "ceil": rate_bits(fields.get("ceil")),
        }
    return classes


def parse_filters(text: str) -> list[list]:
    """The u32 matches of ``tc -j filter show dev IF parent 1:`` as [offset, value, mask,
    flowid], sorted; a filter of another kind, or with several keys, is kept as a marker."""
    found = []
    for entry in _json(text) or []:
        options = entry.get("options") if isinstance(entry, dict) else None
        if not options or ("match" not in options and "flowid" not in options):
            continue  # the u32 hash table entries
        match = options.get("match")
        if entry.get("kind") != "u32" or not isinstance(match, dict):
            found.append([-1, 0, 0, f"{entry.get('kind')}:{options.get('flowid')}"])
            continue
        found.append(
            [
                int(match.get("off", 0)),
                int(str(match.get("value", "0")), 16),
                int(str(match.get("mask", "0")), 16),
                options.get("flowid"),
            ]
        )
    return sorted(found)


def nft_digest(rc: int, text: str) -> str | None:
    """The comment of the table's user rule (``nft -j list table inet gpuenv_net_qos``)."""
    if rc != 0:
        return None
    for entry in (json.loads(text) if text.strip() else {}).get("nftables", []):
        rule = entry.get("rule") if isinstance(entry, dict) else None
        if rule and rule.get("comment"):
            return str(rule["comment"])
    return ""


def live(run: Run, interface: str, read_nft: bool = True) -> dict:
    """What the interface has now, in the form of ``wanted``."""
    _, qdisc = run(["tc", "-j", "qdisc", "show", "dev", interface])
    _, classes = run(["tc", "-j", "class", "show", "dev", interface])
    _, filters = run(["tc", "-j", "filter", "show", "dev", interface, "parent", ROOT_HANDLE])
    state = {
        "qdisc": parse_qdisc(qdisc),
        "classes": parse_classes(classes),
        "filters": parse_filters(filters),
        "nft": None,
    }
    if read_nft:
        rc, out = run(["nft", "-j", "list", "table", NFT_FAMILY, NFT_TABLE])
        try:
            state["nft"] = nft_digest(rc, out)
        except ValueError:
            state["nft"] = ""
    return state


def differences(want: dict, have: dict) -> list[str]:
    """What differs, one phrase each; empty when the interface is as wanted."""
    found = []
    if have["qdisc"] != want["qdisc"]:
        found.append(f"root qdisc {have['qdisc']} (want {want['qdisc']})")
    for handle in sorted(set(want["classes"]) | set(have["classes"])):
        if want["classes"].get(handle) != have["classes"].get(handle):
            found.append(
                f"class {handle} {have['classes'].get(handle)} (want {want['classes'].get(handle)})"
            )
    if have["filters"] != want["filters"]:
        found.append(f"{len(have['filters'])} port filters (want {len(want['filters'])})")
    if have["nft"] != want["nft"]:
        found.append(f"nftables user rule {have['nft']!r} (want {want['nft']!r})")
    return found


def ours(have: dict) -> bool:
    """Whether the interface carries this role's HTB root (removal leaves other qdiscs alone)."""
    qdisc = have.get("qdisc") or {}
    return qdisc.get("kind") == "htb" and qdisc.get("handle") == ROOT_HANDLE


def net_admin(status_text: str | None) -> bool | None:
    """Whether /proc/self/status's CapEff holds CAP_NET_ADMIN (None when unreadable)."""
    for line in (status_text or "").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    return None
