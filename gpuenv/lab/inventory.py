"""The Ansible inventory and known_hosts a lab writes for itself."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field

import yaml

from gpuenv.errors import EnvironmentProblem
from gpuenv.lab.recipe import ADMIN_USER
from gpuenv.lab.settings import (
    APT_PROXY_URL,
    DEFAULT_MIRROR,
    DISTRO_PINS,
    PINS_DIR,
    WHEELHOUSE_URL,
    LabPaths,
)

GROUP = "gpu_nodes"


@dataclass
class NodeEntry:
    name: str
    ip: str
    host_keys: list[str] = field(default_factory=list)  # "ssh-ed25519 AAAA..."


@dataclass
class LabInventory:
    lab: str
    distro: str
    nodes: list[NodeEntry]
    mirror: str = DEFAULT_MIRROR  # a sources preset (gpuenv_sources_preset)
    net_admin: bool = False  # the nodes have CAP_NET_ADMIN (tc works)

    def node(self, name: str) -> NodeEntry | None:
        return next((n for n in self.nodes if n.name == name), None)


def render_hosts(inv: LabInventory, paths: LabPaths) -> str:
    known_hosts = paths.known_hosts.resolve()
    data = {
        "all": {
            "children": {
                GROUP: {"hosts": {n.name: {"ansible_host": n.ip} for n in inv.nodes}},
            },
            "vars": {
                "ansible_user": ADMIN_USER,
                "ansible_become": True,
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": str(paths.private_key.resolve()),
                "ansible_ssh_common_args": (
                    f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
                    "-o IdentitiesOnly=yes"
                ),
                "gpuenv_lab": True,
                "gpuenv_lab_name": inv.lab,
                "gpuenv_lab_distro": inv.distro,
                "gpuenv_lab_apt_proxy": APT_PROXY_URL,
                "gpuenv_lab_wheelhouse_url": WHEELHOUSE_URL,
                # Lab nodes are containers without GPUs (they may see their host's PCI bus):
                # validate them as CPU-only nodes, and say so in the verdict.
                "gpuenv_expect_gpus": 0,
                "validate_profile": "cpu",
                "gpuenv_lab_net_admin": inv.net_admin,
                **({"gpuenv_sources_preset": inv.mirror} if inv.mirror != DEFAULT_MIRROR else {}),
            },
        }
    }
    header = (
        f"# Written by `gpuenv lab up --name {inv.lab}`; rewritten by `lab start`, removed by"
        " `lab down`.\n---\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def render_known_hosts(inv: LabInventory) -> str:
    lines = [
        f"{n.name},{n.ip} {key}" for n in inv.nodes for key in n.host_keys if n.ip and key.strip()
    ]
    return "\n".join(lines) + "\n"


def render_pins(distro: str) -> str:
    """The distro's pins file (inventory/pins/) with a header saying where it came from."""
    source = PINS_DIR / DISTRO_PINS[distro]
    if not source.is_file():
        raise EnvironmentProblem(
            f"{source} is missing: the lab runs from a gpuenv checkout (with inventory/pins/)"
        )
    body = source.read_text().removeprefix("---\n")
    return (
        f"# Written by `gpuenv lab up` from inventory/pins/{source.name} (the {distro} lab's GPU"
        " stack); `-e` on the command line still overrides it.\n---\n" + body
    )


def write(inv: LabInventory, paths: LabPaths) -> None:
    paths.inventory_dir.mkdir(parents=True, exist_ok=True)
    paths.known_hosts.write_text(render_known_hosts(inv))
    paths.hosts_file.write_text(render_hosts(inv, paths))
    paths.pins_file.parent.mkdir(parents=True, exist_ok=True)
    paths.pins_file.write_text(render_pins(inv.distro))


def load(paths: LabPaths) -> LabInventory | None:
    """What the last ``lab up``/``lab start`` wrote, or None."""
    if not paths.hosts_file.exists():
        return None
    data = yaml.safe_load(paths.hosts_file.read_text()) or {}
    top = data.get("all", {})
    hosts = top.get("children", {}).get(GROUP, {}).get("hosts", {}) or {}
    variables = top.get("vars", {})
    keys: dict[str, list[str]] = {}
    if paths.known_hosts.exists():
        for line in paths.known_hosts.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                keys.setdefault(parts[0].split(",")[0], []).append(" ".join(parts[1:3]))
    nodes = [
        NodeEntry(name, str((hv or {}).get("ansible_host", "")), keys.get(name, []))
        for name, hv in hosts.items()
    ]
    return LabInventory(
        str(variables.get("gpuenv_lab_name", paths.name)),
        str(variables.get("gpuenv_lab_distro", "")),
        nodes,
        mirror=str(variables.get("gpuenv_sources_preset", DEFAULT_MIRROR)),
        net_admin=bool(variables.get("gpuenv_lab_net_admin", False)),
    )


def remove(paths: LabPaths) -> None:
    for path in (paths.hosts_file, paths.known_hosts, paths.host_key_record, paths.pins_file):
        path.unlink(missing_ok=True)
    for folder in (paths.pins_file.parent, paths.pins_file.parent.parent, paths.inventory_dir):
        with contextlib.suppress(OSError):
            folder.rmdir()


def clear_facts(paths: LabPaths, node_names: list[str]) -> None:
    """Drop Ansible's cached facts for nodes that are new containers now."""
    for name in node_names:
        entry = paths.fact_cache / name
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
