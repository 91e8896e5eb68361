"""``gpuenv lab``: a local cluster of systemd containers that behave like nodes."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.errors import BadInput, EnvironmentProblem
from gpuenv.lab import settings

if TYPE_CHECKING:
    import docker

    from gpuenv.report.live import Steps


def register(subparsers: argparse._SubParsersAction) -> None:
    lab = subparsers.add_parser(
        "lab",
        help="local container cluster for trying and testing gpuenv",
        description="A local cluster of systemd containers built from Debian's archive.",
    )
    sub = lab.add_subparsers(dest="lab_command", metavar="ACTION", required=True)

    build = sub.add_parser("build", help="build the node images, the cache and molecule network")
    build.add_argument(
        "--distro",
        action="append",
        metavar="DISTRO",
        help=f"node image to build ({', '.join(settings.DISTROS)}); repeatable; default: all",
    )
    _add_ca_bundle(build)
    _add_mirror(build)
    build.set_defaults(func=_build)

    up = sub.add_parser("up", help="start a lab of N nodes and write its Ansible inventory")
    up.add_argument("--nodes", required=True, metavar="N", help=f"1 to {settings.MAX_NODES}")
    up.add_argument(
        "--distro",
        default=settings.DEFAULT_DISTRO,
        metavar="DISTRO",
        help=f"{' or '.join(settings.DISTROS)} (default: %(default)s)",
    )
    _add_name(up)
    _add_ca_bundle(up)
    _add_mirror(up)
    up.add_argument(
        "--net-admin",
        action="store_true",
        help="give the nodes CAP_NET_ADMIN (tc: the net_qos role and its benchmark)",
    )
    up.set_defaults(func=_up)

    down = sub.add_parser("down", help="remove a lab's nodes, network and inventory")
    _add_name(down)
    down.add_argument(
        "--purge",
        action="store_true",
        help="also remove the images, the cache container and its volume",
    )
    down.set_defaults(func=_down)

    status = sub.add_parser("status", help="list labs and their nodes")
    status.add_argument("--name", help="only this lab")
    status.set_defaults(func=_status)

    for action, helptext, func in (
        ("stop", "stop one node (simulates a lost machine)", _stop),
        ("start", "start a stopped node again (same host keys)", _start),
    ):
        parser = sub.add_parser(action, help=helptext)
        parser.add_argument("node", metavar="NODE", help="node1, node2, ... or <lab>-node1")
        _add_name(parser)
        parser.set_defaults(func=func)

    ssh = sub.add_parser("ssh", help="ssh to a node as admin, host key checked")
    ssh.add_argument("node", metavar="NODE", help="node1, node2, ... or <lab>-node1")
    ssh.add_argument("command", nargs=argparse.REMAINDER, help="command to run (default: shell)")
    _add_name(ssh)
    ssh.set_defaults(func=_ssh)


def _add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name",
        default=settings.DEFAULT_LAB,
        help="lab name; docker objects are <name>-node<i>, <name>-net (default: %(default)s)",
    )


def _add_ca_bundle(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ca-bundle",
        type=Path,
        default=settings.DEFAULT_CA_BUNDLE,
        help="PEM bundle the nodes trust (default: %(default)s)",
    )


def _add_mirror(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mirror",
        metavar="PRESET",
        help="mirror preset for debootstrap, apt and pip on the nodes"
        f" ({', '.join(sorted(settings.MIRROR_PRESETS))}; default: ${settings.MIRROR_ENV},"
        f" else {settings.DEFAULT_MIRROR})",
    )


def _steps() -> Steps:
    from gpuenv.report.live import Steps

    return Steps()


def _build(args: argparse.Namespace) -> int:
    from gpuenv.lab import build

    distros = [settings.validate_distro(d) for d in (args.distro or settings.DISTROS)]
    mirror = settings.validate_mirror(args.mirror)
    if not args.ca_bundle.is_file():
        raise BadInput(f"--ca-bundle {args.ca_bundle}: no such file")
    names, client = _names_and_client()
    with _steps() as progress:
        states = build.build(
            client,
            names,
            Path.cwd(),
            distros,
            args.ca_bundle,
            progress,
            settings.debian_mirror(mirror),
        )
    for state in states:
        print(f"{state.tag}  recipe {state.digest}  {'built' if state.built else 'up to date'}")
    print(f"cache {names.cache_container} on network {names.molecule_network} as apt-cache")
    return 0


def _names_and_client() -> tuple[settings.Names, docker.DockerClient]:
    from gpuenv.lab import docker_client

    names = settings.Names.from_env()
    return names, docker_client.connect()


def _up(args: argparse.Namespace) -> int:
    from gpuenv.lab import cluster

    # All input is checked before docker is touched, so bad input creates nothing.
    nodes = settings.validate_nodes(args.nodes)
    distro = settings.validate_distro(args.distro)
    lab = settings.validate_name(args.name)
    mirror = settings.validate_mirror(args.mirror)
    if not args.ca_bundle.is_file():
        raise BadInput(f"--ca-bundle {args.ca_bundle}: no such file")
    names, client = _names_and_client()
    started = time.monotonic()
    with _steps() as progress:
        inv = cluster.up(
            client,
            names,
            Path.cwd(),
            lab,
            nodes,
            distro,
            args.ca_bundle,
            progress,
            mirror=mirror,
            net_admin=args.net_admin,
        )
    paths = settings.LabPaths(Path.cwd(), lab)
    for node in inv.nodes:
        print(f"{node.name}  {node.ip}  {distro}")
    print(f"lab {lab} up in {time.monotonic() - started:.1f}s")
    print(f"inventory: {_rel(paths.hosts_file)}   known_hosts: {_rel(paths.known_hosts)}")
    print(f"try: ansible all -i {_rel(paths.hosts_file)} -m ansible.builtin.ping")
    return 0


def _down(args: argparse.Namespace) -> int:
    from gpuenv.lab import cluster

    lab = settings.validate_name(args.name)
    names, client = _names_and_client()
    with _steps() as progress:
        report = cluster.down(client, names, Path.cwd(), lab, args.purge, progress)
    if report.removed_nodes:
        print(f"lab {lab}: removed {len(report.removed_nodes)} nodes and network {lab}-net")
    else:
        print(f"lab {lab}: no nodes to remove; network {lab}-net is gone too")
    if report.purged:
        print(f"purged: {', '.join(report.purged)}, images {names.prefix}/*")
    for problem in report.problems:
        print(f"not removed: {problem}", file=sys.stderr)
    return 1 if report.problems else 0


def _status(args: argparse.Namespace) -> int:
    from rich.console import Console

    from gpuenv.lab import cache, cluster
    from gpuenv.report.lab import print_status

    names, client = _names_and_client()
    labs = cluster.status(client, names, Path.cwd())
    if args.name:
        labs = [lab for lab in labs if lab.name == settings.validate_name(args.name)]
    cache_line = f"cache {names.cache_container}: {cache.cache_state(client, names)}"
    print_status(Console(), cache_line, labs, args.name, _rel)
    return 0


def _stop(args: argparse.Namespace) -> int:
    from gpuenv.lab import cluster

    lab = settings.validate_name(args.name)
    names, client = _names_and_client()
    print(f"stopped {cluster.stop_node(client, names, Path.cwd(), lab, args.node)}")
    return 0


def _start(args: argparse.Namespace) -> int:
    from gpuenv.lab import cluster

    lab = settings.validate_name(args.name)
    names, client = _names_and_client()
    entry = cluster.start_node(client, names, Path.cwd(), lab, args.node)
    print(f"started {entry.name} at {entry.ip} (same host keys)")
    return 0


def _ssh(args: argparse.Namespace) -> int:
    from gpuenv.lab import cluster

    lab = settings.validate_name(args.name)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    argv = cluster.ssh_argv(Path.cwd(), lab, args.node, command)
    if shutil.which("ssh") is None:
        raise EnvironmentProblem("ssh is not installed: sudo apt-get install openssh-client")
    os.execvp(argv[0], argv)
    return 1  # not reached: execvp replaces this process


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
