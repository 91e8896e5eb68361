"""Labs: bring nodes up and down, stop and start one, report status."""

from __future__ import annotations

import contextlib
import io
import re
import socket
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv import proc
from gpuenv.errors import BadInput, EnvironmentProblem
from gpuenv.lab import cache, images, inventory, keys, lock
from gpuenv.lab.inventory import LabInventory, NodeEntry
from gpuenv.lab.recipe import ADMIN_UID, ADMIN_USER
from gpuenv.lab.settings import (
    DEFAULT_MIRROR,
    LABEL_DISTRO,
    LABEL_LAB,
    LABEL_NODE,
    LABEL_OWNER,
    LabPaths,
    Names,
    debian_mirror,
    node_name,
    resolve_node,
)
from gpuenv.progress import Progress

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

SSH_READY_DEADLINE_S = 90
STOP_TIMEOUT_S = 10

# systemd as PID 1 in a container on these hosts (cgroup v1; --privileged is refused).
SYSTEMD_RUN_OPTIONS: dict[str, object] = {
    "cap_add": ["SYS_ADMIN"],
    "cgroupns": "host",
    "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
    "tmpfs": {"/run": "", "/run/lock": ""},
}


def run_options(*, net_admin: bool = False) -> dict[str, object]:
    """docker create's options for a node: systemd as PID 1, plus NET_ADMIN when asked (tc)."""
    caps = ["SYS_ADMIN", "NET_ADMIN"] if net_admin else ["SYS_ADMIN"]
    return {**SYSTEMD_RUN_OPTIONS, "cap_add": caps}


@dataclass
class NodeStatus:
    name: str
    state: str  # docker's: running, exited, created, ...
    ip: str
    distro: str


@dataclass
class LabStatus:
    name: str
    network: str
    nodes: list[NodeStatus] = field(default_factory=list)
    hosts_file: Path | None = None


def network_name(lab: str) -> str:
    return f"{lab}-net"


def _node_index(container: Container) -> int:
    return int(container.labels.get(LABEL_NODE, "0"))


def lab_containers(client: docker.DockerClient, names: Names, lab: str) -> list[Container]:
    found = client.containers.list(
        all=True, filters={"label": [f"{LABEL_OWNER}={names.prefix}", f"{LABEL_LAB}={lab}"]}
    )
    return sorted(found, key=_node_index)


def check_free(client: docker.DockerClient, names: Names, lab: str) -> None:
    """BadInput when a lab of that name, or anything with its object names, exists."""
    from docker.errors import NotFound

    existing = lab_containers(client, names, lab)
    if existing:
        running = sum(1 for c in existing if c.status == "running")
        raise BadInput(
            f"a lab named {lab!r} already exists ({len(existing)} nodes, {running} running): "
            f"use it, take it down with `gpuenv lab down --name {lab}`, or choose another --name"
        )
    pattern = re.compile(rf"{re.escape(lab)}-node[0-9]+")
    clashes = [
        c.name
        for c in client.containers.list(all=True, filters={"name": f"{lab}-node"})
        if pattern.fullmatch(c.name or "")
    ]
    try:
        network = client.networks.get(network_name(lab))
    except NotFound:
        network = None
    if network is not None:
        if (network.attrs.get("Labels") or {}).get(LABEL_LAB) == lab:
            raise BadInput(
                f"network {network_name(lab)} is left over from lab {lab!r}: "
                f"run `gpuenv lab down --name {lab}` first"
            )
        clashes.append(f"network {network_name(lab)}")
    if clashes:
        raise BadInput(
            f"lab name {lab!r} clashes with existing docker objects ({', '.join(clashes)}); "
            "choose another --name"
        )


def _authorized_keys_tar(public_key: str) -> bytes:
    buf = io.BytesIO()
    data = (public_key.strip() + "\n").encode()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("authorized_keys")
        info.size = len(data)
        info.mode = 0o600
        info.uid = info.gid = ADMIN_UID
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _container_ip(container: Container, network: str) -> str:
    container.reload()
    nets = container.attrs["NetworkSettings"]["Networks"] or {}
    return str((nets.get(network) or {}).get("IPAddress") or "")


def _ssh_banner(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=1) as sock:
            sock.settimeout(2)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _wait_ssh(container: Container, network: str, deadline_s: float) -> str:
    """Wait until sshd answers on the node's lab address; return that address."""
    deadline = time.monotonic() + deadline_s
    while True:
        ip = _container_ip(container, network)
        if container.status != "running":
            raise EnvironmentProblem(
                f"node {container.name} stopped while booting ({container.status}); "
                f"see `docker logs {container.name}`"
            )
        if ip and _ssh_banner(ip):
            return ip
        if time.monotonic() > deadline:
            raise EnvironmentProblem(
                f"sshd on {container.name} ({ip or 'no address'}) did not answer within "
                f"{deadline_s:.0f}s; see `docker exec {container.name} journalctl -u ssh`"
            )
        time.sleep(0.2)


def read_host_keys(container: Container) -> list[str]:
    """The node's real host public keys, read over the docker API (not over the network)."""
    result = container.exec_run(["sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub"])
    if result.exit_code != 0:
        raise EnvironmentProblem(f"cannot read the host keys of {container.name}")
    found = []
    for line in result.output.decode().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(("ssh-", "ecdsa-")):
            found.append(f"{parts[0]} {parts[1]}")
    if not found:
        raise EnvironmentProblem(f"{container.name} has no SSH host keys")
    return found


def _boot(container: Container, network: str) -> NodeEntry:
    container.start()
    ip = _wait_ssh(container, network, SSH_READY_DEADLINE_S)
    return NodeEntry(str(container.name), ip, read_host_keys(container))


def up(
    client: docker.DockerClient,
    names: Names,
    root: Path,
    lab: str,
    nodes: int,
    distro: str,
    ca_bundle: Path,
    progress: Progress,
    mirror: str = DEFAULT_MIRROR,
    net_admin: bool = False,
) -> LabInventory:
    """Create and boot a lab; on any failure, remove what this call created.

    ``mirror`` is a sources preset: the images are debootstrapped from its Debian mirror and the
    inventory hands it to the roles. ``net_admin`` adds CAP_NET_ADMIN to the nodes (tc, the
    net_qos role); without it they have CAP_SYS_ADMIN only, as molecule's platforms do.
    """
    check_free(client, names, lab)
    paths = LabPaths(root, lab)
    with lock.exclusive(root, names, progress):
        images.ensure_images(
            client, names, root, [distro], ca_bundle, progress, debian_mirror(mirror)
        )
        cache.ensure_cache(client, names, root, progress)
    net = network_name(lab)
    labels = {LABEL_OWNER: names.prefix, LABEL_LAB: lab}
    created: list[Container] = []
    try:
        cache.ensure_network(client, names, net, labels)
        public_key = keys.ensure_key(paths.private_key)
        progress.begin("nodes", f"lab {lab}: {nodes} nodes, {distro}")
        archive = _authorized_keys_tar(public_key)
        for i in range(1, nodes + 1):
            name = node_name(lab, i)
            container = client.containers.create(
                names.node_image(distro),
                name=name,
                hostname=name,
                detach=True,
                network=net,
                labels={**labels, LABEL_NODE: str(i), LABEL_DISTRO: distro},
                **run_options(net_admin=net_admin),
            )
            created.append(container)
            container.put_archive(f"/home/{ADMIN_USER}/.ssh", archive)
        entries = _boot_all(created, net, progress)
        inv = LabInventory(lab, distro, entries, mirror=mirror, net_admin=net_admin)
        inventory.clear_facts(paths, [e.name for e in entries])
        close_control_masters([e.ip for e in entries])
        inventory.write(inv, paths)
        progress.end("nodes", f"{nodes} nodes answer ssh; inventory {paths.hosts_file}")
        return inv
    except BaseException:
        _remove(client, names, created, net)
        raise


def _boot_all(containers: list[Container], network: str, progress: Progress) -> list[NodeEntry]:
    done = 0

    def boot(container: Container) -> NodeEntry:
        nonlocal done
        entry = _boot(container, network)
        done += 1
        progress.update("nodes", f"{done}/{len(containers)} up ({entry.name} {entry.ip})")
        return entry

    with ThreadPoolExecutor(max_workers=min(len(containers), 16)) as pool:
        return list(pool.map(boot, containers))


def _remove(
    client: docker.DockerClient, names: Names, containers: list[Container], net: str
) -> None:
    from docker.errors import NotFound

    def rm(container: Container) -> None:
        with contextlib.suppress(NotFound):
            container.remove(force=True)

    if containers:
        with ThreadPoolExecutor(max_workers=min(len(containers), 16)) as pool:
            list(pool.map(rm, containers))
    cache.remove_network(client, names, net)


@dataclass
class DownReport:
    removed_nodes: list[str]
    purged: list[str]
    problems: list[str]


def down(
    client: docker.DockerClient,
    names: Names,
    root: Path,
    lab: str,
    purge: bool,
    progress: Progress,
) -> DownReport:
    """Remove a lab's containers, network and inventory; with purge also images and cache."""
    paths = LabPaths(root, lab)
    if purge:
        others = sorted({str(c.labels.get(LABEL_LAB)) for c in _all_lab_containers(client, names)})
        others = [o for o in others if o != lab]
        if others:
            raise BadInput(
                f"--purge removes the images and cache every lab uses, but lab(s) "
                f"{', '.join(others)} are still up: take them down first"
            )
    containers = lab_containers(client, names, lab)
    progress.begin("down", f"lab {lab}: removing {len(containers)} nodes")
    old = inventory.load(paths)
    ips = [n.ip for n in old.nodes] if old else []
    _remove(client, names, containers, network_name(lab))
    close_control_masters(ips)
    inventory.remove(paths)
    inventory.clear_facts(paths, [str(c.name) for c in containers])
    progress.end("down", f"lab {lab} removed")
    report = DownReport([str(c.name) for c in containers], [], [])
    if purge:
        progress.begin("purge", "purge: images, cache container and volume")
        cache.remove_network(client, names, names.molecule_network)
        cache.remove_cache(client, names)
        report.purged += [names.cache_container, names.cache_volume, names.molecule_network]
        report.problems += images.remove_images(client, names)
        images.remove_tarballs(names, root)
        progress.end("purge", "done")
    return report


def _all_lab_containers(client: docker.DockerClient, names: Names) -> list[Container]:
    return list(
        client.containers.list(
            all=True, filters={"label": [f"{LABEL_OWNER}={names.prefix}", LABEL_LAB]}
        )
    )


def status(client: docker.DockerClient, names: Names, root: Path) -> list[LabStatus]:
    labs: dict[str, LabStatus] = {}
    for container in sorted(_all_lab_containers(client, names), key=_node_index):
        lab = str(container.labels[LABEL_LAB])
        entry = labs.setdefault(lab, LabStatus(lab, network_name(lab)))
        ip = ""
        if container.status == "running":
            ip = str(
                (container.attrs["NetworkSettings"]["Networks"].get(entry.network) or {}).get(
                    "IPAddress", ""
                )
            )
        entry.nodes.append(
            NodeStatus(str(container.name), container.status, ip, container.labels[LABEL_DISTRO])
        )
    for entry in labs.values():
        hosts = LabPaths(root, entry.name).hosts_file
        entry.hosts_file = hosts if hosts.exists() else None
    return [labs[k] for k in sorted(labs)]


def _node_container(client: docker.DockerClient, names: Names, lab: str, node: str) -> Container:
    full = resolve_node(lab, node)
    for container in lab_containers(client, names, lab):
        if container.name == full:
            return container
    raise BadInput(f"lab {lab!r} has no node {full!r}; see `gpuenv lab status`")


def stop_node(client: docker.DockerClient, names: Names, root: Path, lab: str, node: str) -> str:
    """Stop one node as if it were lost; its disk, keys and inventory entry stay."""
    container = _node_container(client, names, lab, node)
    old = inventory.load(LabPaths(root, lab))
    entry = old.node(str(container.name)) if old else None
    container.stop(timeout=STOP_TIMEOUT_S)
    if entry:
        close_control_masters([entry.ip])
    return str(container.name)


def start_node(
    client: docker.DockerClient, names: Names, root: Path, lab: str, node: str
) -> NodeEntry:
    """Start a stopped node; it keeps its host keys, its (maybe new) address is rewritten."""
    container = _node_container(client, names, lab, node)
    paths = LabPaths(root, lab)
    if container.status == "running":
        entry = NodeEntry(
            str(container.name),
            _wait_ssh(container, network_name(lab), SSH_READY_DEADLINE_S),
            read_host_keys(container),
        )
    else:
        entry = _boot(container, network_name(lab))
    inv = inventory.load(paths) or LabInventory(lab, container.labels[LABEL_DISTRO], [])
    inv.nodes = [n for n in inv.nodes if n.name != entry.name] + [entry]
    inv.nodes.sort(key=lambda n: int(n.name.rsplit("node", 1)[1]))
    inventory.write(inv, paths)
    return entry


def ssh_argv(root: Path, lab: str, node: str, command: list[str]) -> list[str]:
    """The ssh command line that reaches a node with strict host-key checking."""
    paths = LabPaths(root, lab)
    inv = inventory.load(paths)
    full = resolve_node(lab, node)
    entry = inv.node(full) if inv else None
    if entry is None or not entry.ip:
        raise BadInput(
            f"no inventory entry for {full!r} in {paths.hosts_file}: is lab {lab!r} up? "
            "(`gpuenv lab status`)"
        )
    return [
        "ssh",
        "-i",
        str(paths.private_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={paths.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"HostKeyAlias={full}",
        f"{ADMIN_USER}@{entry.ip}",
        *command,
    ]


def close_control_masters(ips: list[str]) -> None:
    """Close Ansible's persistent SSH masters to these addresses.

    A master left from an earlier container with the same address would carry Ansible's next
    connection to a machine that no longer exists.
    """
    import hashlib

    cpdir = Path.home() / ".ansible" / "cp"
    if not cpdir.is_dir():
        return
    for ip in ips:
        for port in ("None", "22"):
            digest = hashlib.sha1(f"{ip}-{port}-{ADMIN_USER}".encode()).hexdigest()[:10]
            sock = cpdir / digest
            if sock.exists():
                proc.capture(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", ip], 10)
                sock.unlink(missing_ok=True)
