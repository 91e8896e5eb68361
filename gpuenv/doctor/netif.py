"""Class 8: ``NCCL_SOCKET_IFNAME`` must select the interface holding the node's inventory address.

NCCL's bootstrap (and its socket transport) uses the interfaces ``NCCL_SOCKET_IFNAME`` picks:
a comma list of name prefixes; ``=`` before the list means exact names, ``^`` excludes.
If it picks nothing, or an interface other than the one the other nodes reach this node at
(the inventory's address), ranks wait at bootstrap until they time out.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from gpuenv.doctor.envvars import effective, global_settings
from gpuenv.doctor.findings import ClassReading, Finding, skipped
from gpuenv.doctor.system import System
from gpuenv.floor import net


def addresses(ip_o_addr: str) -> list[tuple[str, str]]:
    """(interface, address) pairs from ``ip -o addr show``."""
    pairs = []
    for line in ip_o_addr.splitlines():
        words = line.split()
        if len(words) >= 4 and words[2] in ("inet", "inet6"):
            pairs.append((words[1].split("@")[0], words[3].split("/")[0]))
    return pairs


def selects(spec: str, iface: str) -> bool:
    """Whether NCCL_SOCKET_IFNAME=``spec`` lets NCCL use ``iface``."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    hit = any(iface == n if exact else iface.startswith(n) for n in names)
    return not hit if exclude else hit


def _resolve(system: System, address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    out = system.run("getent-ahosts", ["getent", "ahosts", address])
    words = out.stdout.split() if out.ok else []
    return words[0] if words else None


def _interfaces(system: System) -> tuple[list[tuple[str, str]], str, str]:
    """(interface, address) pairs, where they were read, and why none could be ("" when read)."""
    out = system.run("ip-o-addr", ["ip", "-o", "addr", "show"])
    if out.ok:
        return addresses(out.stdout), "ip -o addr show", ""
    # No iproute2 (a minimal image, a GPU container): the kernel's own tables say the same.
    source = "/proc/net/fib_trie, /proc/net/if_inet6"
    pairs = net.addresses(str(system.root))
    why = "" if pairs else out.why("ip -o addr show (iproute2)") + f"; nothing in {source}"
    return pairs, source, why


def _selects_nothing(setting: Any, ifaces: list[str], source: str) -> Finding:
    return Finding(
        8,
        f"NCCL_SOCKET_IFNAME={setting.value} selects no interface of this node",
        "NCCL finds no interface to bootstrap over: every multi-node job fails at its start",
        (
            f"{setting.where()}: NCCL_SOCKET_IFNAME={setting.value}",
            f"{source}: {', '.join(ifaces) or 'no interface'}",
        ),
        (
            f"set NCCL_SOCKET_IFNAME to the cluster interface (one of {', '.join(ifaces)}) in"
            f" {setting.source}"
            if setting.line
            else "set NCCL_SOCKET_IFNAME to the cluster interface where the job's environment"
            " sets it, or unset it",
        ),
    )


def socket_ifname(system: System, address: str | None) -> ClassReading:
    setting = effective(global_settings(system), "NCCL_SOCKET_IFNAME")
    if not address:
        # Without the inventory's address the holder is unknown, but a setting that selects no
        # interface at all is wrong on any node.
        if setting is None:
            return skipped(8, "no inventory address: pass --address ADDR, or run with -i")
        pairs, source, why = _interfaces(system)
        ifaces = sorted({i for i, _ in pairs})
        if why:
            return skipped(8, why)
        reading = ClassReading(8, facts={"address": None, "nccl_socket_ifname": setting.value})
        if not any(selects(setting.value, i) for i in ifaces):
            reading.findings.append(_selects_nothing(setting, ifaces, source))
            return reading
        return skipped(
            8,
            f"no inventory address: NCCL_SOCKET_IFNAME={setting.value} selects an interface, but"
            " whether it is the one the other nodes reach needs it: pass --address ADDR, or run"
            " with -i",
        )
    ip = _resolve(system, address)
    if ip is None:
        return skipped(8, f"inventory address {address!r} does not resolve on this node")
    pairs, source, why = _interfaces(system)
    if why:
        return skipped(8, why)
    ifaces = sorted({i for i, _ in pairs})
    holder = next((i for i, a in pairs if a == ip), None)
    facts = {
        "address": ip,
        "interface": holder,
        "nccl_socket_ifname": setting.value if setting else None,
    }
    reading = ClassReading(8, facts=facts)
    if holder is None:
        reading.findings.append(
            Finding(
                8,
                f"inventory address {ip} is on no interface of this node",
                "the other nodes reach this one at an address it does not hold (NAT, or a "
                "stale inventory): NCCL and torch rendezvous advertise another address",
                (f"{source}: {', '.join(f'{i} {a}' for i, a in pairs)}",),
                ("set the node's gpuenv_cluster_address (or ansible_host) in the inventory to "
                 "an address from `ip -o addr show`",),
            )
        )  # fmt: skip
        return reading
    if setting is None or selects(setting.value, holder):
        return reading
    chosen = [i for i in ifaces if selects(setting.value, i)]
    reading.findings.append(
        Finding(
            8,
            f"NCCL_SOCKET_IFNAME={setting.value} does not select {holder}, which holds {ip}",
            f"NCCL bootstraps over {', '.join(chosen) if chosen else 'no interface at all'} "
            f"instead of {holder}: ranks on other nodes cannot connect and wait until timeout",
            (
                f"{setting.where()}: NCCL_SOCKET_IFNAME={setting.value}",
                f"{source}: {holder} holds {ip}",
                f"interfaces it selects: {', '.join(chosen) or 'none'} (of {', '.join(ifaces)})",
            ),
            (
                f"set NCCL_SOCKET_IFNAME={holder} in {setting.source}"
                if setting.line
                else f"export NCCL_SOCKET_IFNAME={holder} where the job's environment sets it",
            ),
        )
    )
    return reading
