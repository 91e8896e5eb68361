#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: an interface's tc and nftables state against the net_qos role's wanted one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: net_qos_info
short_description: Read an interface's traffic control state and compare it with net_qos's
description:
  - One look at the node for the C(net_qos) role; changes nothing, so check mode is the same run.
  - Reads C(tc -j qdisc/class/filter show) and C(nft -j list table inet gpuenv_net_qos), and
    returns whether they are the wanted state (HTB root, a training and a bulk class, u32 port
    filters, the nftables user rule), with the shell lines that apply or remove it.
  - Also says whether the node may change traffic control at all (C(CAP_NET_ADMIN)).
options:
  interface:
    description: The interface to shape.
    type: str
    required: true
  rate_mbit:
    description: The total rate of the HTB root, Mbit/s.
    type: int
    default: 1000
  training_percent:
    description: The training class's guaranteed share of the rate.
    type: int
    default: 80
  bulk_ceil_percent:
    description: The most the bulk class may take, as a share of the rate.
    type: int
    default: 100
  ports:
    description: Ports (C(29500)) or ranges (C(46000-46999)) of training traffic.
    type: list
    elements: str
    default: []
  users:
    description: Users whose sockets' traffic is training traffic.
    type: list
    elements: str
    default: []
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Compare the interface's traffic control with the wanted one
  gpuenv.cluster.net_qos_info:
    interface: eth0
    rate_mbit: 1000
    ports: ["29500"]
    users: [gpuenv]
  register: found
"""

RETURN = r"""
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
permitted:
  description: Whether this process has C(CAP_NET_ADMIN) (null when /proc does not say).
  type: bool
  returned: always
interface_exists:
  description: Whether I(interface) is in /sys/class/net.
  type: bool
  returned: always
uids:
  description: The uids of I(users) that exist.
  type: list
  elements: int
  returned: always
missing_users:
  description: The names of I(users) that are not in /etc/passwd.
  type: list
  elements: str
  returned: always
in_sync:
  description: Whether tc and nftables hold exactly the wanted state.
  type: bool
  returned: always
ours:
  description: Whether the interface carries an HTB root with handle 1 (the role's).
  type: bool
  returned: always
differences:
  description: What differs from the wanted state, one phrase each.
  type: list
  elements: str
  returned: always
apply_lines:
  description: Shell lines that make the wanted state from any state.
  type: list
  elements: str
  returned: always
remove_lines:
  description: Shell lines that put the interface back and drop the user rule.
  type: list
  elements: str
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils import net_qos as q
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    installed,
    read_under,
)


def uids(root: str, users: list[str]) -> tuple[list[int], list[str]]:
    """The uids of ``users`` from the node's /etc/passwd, and the names it does not hold."""
    table = {}
    for line in (read_under(root, "/etc/passwd") or "").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit():
            table[fields[0]] = int(fields[2])
    return sorted({table[u] for u in users if u in table}), [u for u in users if u not in table]


def read(run: Run, params: dict, root: str = "/") -> dict:
    """The module's answer for its parameters."""
    found, missing = uids(root, params["users"])
    spec = q.Spec(
        params["interface"],
        params["rate_mbit"],
        params["training_percent"],
        params["bulk_ceil_percent"],
        q.parse_ports(params["ports"]),
        tuple(found),
    )
    q.check_spec(spec)
    exists = os.path.isdir(os.path.join(root, "sys/class/net", spec.interface))
    have = q.live(run, spec.interface) if exists else None
    diff = q.differences(q.wanted(spec), have) if have else ["no such interface"]
    return {
        "debs": installed(run, params.get("packages", [])),
        "permitted": q.net_admin(read_under(root, "/proc/self/status")),
        "interface_exists": exists,
        "uids": found,
        "missing_users": missing,
        "in_sync": not diff,
        "ours": bool(have and q.ours(have)),
        "differences": diff,
        "apply_lines": q.apply_commands(spec),
        "remove_lines": q.remove_commands(spec.interface),
    }


def _read(run: Run, params: dict) -> dict:
    try:
        return read(run, params)
    except q.QosError as exc:
        return {"failed": True, "msg": str(exc)}


def main() -> None:
    spec = {
        "interface": {"type": "str", "required": True},
        "rate_mbit": {"type": "int", "default": 1000},
        "training_percent": {"type": "int", "default": 80},
        "bulk_ceil_percent": {"type": "int", "default": 100},
        "ports": {"type": "list", "elements": "str", "default": []},
        "users": {"type": "list", "elements": "str", "default": []},
    }
    exit_with_reading(AnsibleModule, spec, _read)


if __name__ == "__main__":
    main()
