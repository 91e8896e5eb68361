"""The nodes to validate, read from an Ansible inventory through ``ansible-inventory --list``.

Ansible does the parsing (every inventory format and plugin it knows, group_vars, host_vars,
``--limit`` patterns); this module turns its JSON into ``Host`` records with the connection
settings fabric needs, and refuses bad input before anything is launched.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv import proc
from gpuenv.errors import BadInput, EnvironmentProblem

# The defaults of roles/ssh_mesh (ssh_mesh_user) and roles/mpi (mpi_hostfile).
DEFAULT_CLUSTER_USER = "gpuenv"
DEFAULT_HOSTFILE = "/etc/gpuenv/mpi-hostfile"
_INVENTORY_TIMEOUT_S = 120


@dataclass(frozen=True)
class Host:
    """One node and how to reach it."""

    name: str
    address: str  # what the controller connects to (ansible_host)
    rendezvous_address: str  # what the other nodes use to reach this one
    local: bool = False  # ansible_connection=local: run as local processes, no SSH
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: tuple[str, ...] = ()
    # The Python the commands run: plain python3 from the login environment, as users run it.
    python: str = "python3"
    env: Mapping[str, str] = field(default_factory=dict)
    become_user: str | None = None  # the cluster user mpirun runs as (the SSH mesh's user)
    hostfile: str = DEFAULT_HOSTFILE  # the Open MPI hostfile the mpi role wrote on the node
    # Why this node cannot be reached at all (its name does not resolve): it is reported as a
    # failed `reach` by name, and the other nodes are validated without it.
    problem: str | None = None
    # How many GPUs the node must have (gpuenv_expect_gpus); None: as many as its PCI bus shows.
    expect_gpus: int | None = None


def _ansible_inventory(
    inventory: str | Sequence[str], limit: str | None, export: bool = False
) -> dict[str, Any]:
    exe = shutil.which("ansible-inventory")
    if exe is None:
        raise EnvironmentProblem(
            "ansible-inventory not found on PATH: "
            "install the controller extra (pip install 'gpuenv[controller]')"
        )
    sources = [inventory] if isinstance(inventory, str) else list(inventory)
    argv = [exe, *(w for src in sources for w in ("-i", src)), "--list"]
    inventory = ", ".join(sources)
    if limit:
        argv += ["--limit", limit]
    if export:
        argv.append("--export")  # each group's own variables, not merged into its hosts'
    env = {
        **os.environ,
        # A source that does not parse must be an error, not an empty inventory.
        "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
        "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
    }
    done = proc.capture(argv, _INVENTORY_TIMEOUT_S, env=env)
    if done.returncode is None:
        raise BadInput(
            f"inventory {inventory}: ansible-inventory did not answer in {_INVENTORY_TIMEOUT_S} s"
        )
    if done.returncode != 0:
        raise BadInput(f"inventory {inventory} does not parse: {_why(done.stderr)}")
    try:
        data = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise BadInput(f"inventory {inventory}: ansible-inventory printed no JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise BadInput(f"inventory {inventory}: unexpected ansible-inventory output")
    return data


def _why(stderr: str) -> str:
    """The lines of ansible's parse failure that say what and where."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    keep: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("[ERROR]") or line.startswith("Origin:"):
            keep.append(line)
        elif line == "<<< caused by >>>" and i + 1 < len(lines):
            keep.append(lines[i + 1])
    unique = list(dict.fromkeys(keep))[:4]
    return " / ".join(unique) if unique else " ".join(stderr.split())[-600:]


def _groups(data: Mapping[str, Any]) -> list[str]:
    names = {k for k in data if k != "_meta"}
    for node in data.values():
        if isinstance(node, Mapping):
            names.update(node.get("children", []))
    return sorted(names)


def _hosts_in(data: Mapping[str, Any], group: str, seen: set[str] | None = None) -> list[str]:
    """Hosts of a group and its children, in inventory order, each once."""
    seen = set() if seen is None else seen
    node = data.get(group, {})
    out: list[str] = []
    for host in node.get("hosts", []):
        if host not in seen:
            seen.add(host)
            out.append(host)
    for child in node.get("children", []):
        out += _hosts_in(data, child, seen)
    return out


def _ssh_options(hostvars: Mapping[str, Any]) -> dict[str, str]:
    """-o Key=Value options from ansible_ssh_common_args / ansible_ssh_extra_args."""
    words: list[str] = []
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        words += shlex.split(str(hostvars.get(var) or ""))
    opts: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-o" and i + 1 < len(words):
            word, i = words[i + 1], i + 1
        elif word.startswith("-o"):
            word = word[2:]
        else:
            i += 1
            continue
        key, _, value = word.replace("=", " ", 1).partition(" ")
        opts[key.strip().lower()] = value.strip()
        i += 1
    return opts


def _resolves(address: str) -> bool:
    try:
        socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def _host(name: str, hv: Mapping[str, Any], base: Path) -> Host:
    local = str(hv.get("ansible_connection", "ssh")) == "local"
    address = str(hv.get("ansible_host") or name)
    env = hv.get("gpuenv_cluster_env") or {}
    if not isinstance(env, Mapping):
        raise BadInput(f"host {name}: gpuenv_cluster_env must be a mapping of variable: value")
    python = str(hv.get("gpuenv_cluster_python") or "python3")
    expect = hv.get("gpuenv_expect_gpus")
    if expect is not None and (type(expect) is not int or expect < 0):
        raise BadInput(f"host {name}: gpuenv_expect_gpus must be a number >= 0, not {expect!r}")
    rendezvous = str(hv.get("gpuenv_cluster_address") or ("127.0.0.1" if local else address))
    hostfile = str(hv.get("gpuenv_cluster_hostfile") or hv.get("mpi_hostfile") or DEFAULT_HOSTFILE)
    if local:
        return Host(
            name=name,
            address=address,
            rendezvous_address=rendezvous,
            local=True,
            python=python,
            env={str(k): str(v) for k, v in env.items()},
            hostfile=hostfile,
            expect_gpus=expect,
        )
    problem = None if _resolves(address) else f"address {address!r} does not resolve"
    try:
        port = int(hv.get("ansible_port") or hv.get("ansible_ssh_port") or 22)
    except (TypeError, ValueError) as exc:
        raise BadInput(
            f"host {name}: ansible_port {hv.get('ansible_port')!r} is not a number"
        ) from exc
    key = hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file")
    key_file = None
    if key:
        key_path = Path(os.path.expanduser(str(key)))
        key_path = key_path if key_path.is_absolute() else base / key_path
        if not key_path.is_file():
            raise BadInput(f"host {name}: private key {key_path} does not exist")
        if key_path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise BadInput(
                f"host {name}: private key {key_path} is readable by others; chmod 600 it"
            )
        key_file = str(key_path)
    opts = _ssh_options(hv)
    if opts.get("stricthostkeychecking", "yes").lower() in ("no", "off", "accept-new"):
        raise BadInput(
            f"host {name}: StrictHostKeyChecking={opts['stricthostkeychecking']} in its ssh args; "
            "gpuenv verifies host keys: put the node's key in known_hosts instead"
        )
    known: list[str] = []
    for entry in shlex.split(opts.get("userknownhostsfile", "")):
        path = Path(os.path.expanduser(entry))
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise BadInput(f"host {name}: UserKnownHostsFile {path} does not exist")
        known.append(str(path))
    if not known:
        known = [
            p
            for p in (os.path.expanduser("~/.ssh/known_hosts"), "/etc/ssh/ssh_known_hosts")
            if os.path.isfile(p)
        ]
    if not known:
        raise BadInput(
            f"host {name}: no known_hosts file (none in ansible_ssh_common_args, "
            "~/.ssh/known_hosts or /etc/ssh/ssh_known_hosts): host keys cannot be verified"
        )
    user = str(hv["ansible_user"]) if hv.get("ansible_user") else None
    cluster_user = str(
        hv.get("gpuenv_cluster_user") or hv.get("ssh_mesh_user") or DEFAULT_CLUSTER_USER
    )
    return Host(
        name=name,
        address=address,
        rendezvous_address=rendezvous,
        port=port,
        user=user,
        key_file=key_file,
        known_hosts=tuple(known),
        python=python,
        env={str(k): str(v) for k, v in env.items()},
        become_user=None if cluster_user == user else cluster_user,
        hostfile=hostfile,
        problem=problem,
        expect_gpus=expect,
    )


def load(inventory: str | Sequence[str], limit: str | None = None) -> list[Host]:
    """The hosts of one inventory source or several (as ``ansible-playbook -i A -i B`` reads
    them), restricted to ``limit``, first host first; BadInput when unusable."""
    sources = [inventory] if isinstance(inventory, str) else list(inventory)
    for source in sources:
        if not Path(source).exists():
            raise BadInput(f"inventory {source} does not exist")
    inventory = ", ".join(sources)
    data = _ansible_inventory(sources, limit)
    # One ansible-inventory call: with --limit its output still lists every group (as a child
    # of another), so an empty group and a pattern that matches nothing can be told apart.
    groups = _groups(data)
    hostvars: Mapping[str, Mapping[str, Any]] = data.get("_meta", {}).get("hostvars", {})
    names = _hosts_in(data, "all")
    if not names:
        if limit and limit in groups:
            raise BadInput(f"group {limit!r} in inventory {inventory} is empty")
        if limit:
            raise BadInput(
                f"limit {limit!r} matches no host in inventory {inventory} "
                f"(groups: {', '.join(groups)})"
            )
        raise BadInput(f"inventory {inventory} has no hosts (groups: {', '.join(groups)})")
    # Relative key and known_hosts paths mean what they mean to ansible: relative to the cwd.
    return [_host(n, hostvars.get(n, {}), Path.cwd()) for n in names]


def export(inventory: str) -> tuple[dict[str, Any], list[str]]:
    """``ansible-inventory --list --export`` (each group with its own ``vars``), and the groups."""
    if not Path(inventory).exists():
        raise BadInput(f"inventory {inventory} does not exist")
    data = _ansible_inventory(inventory, None, export=True)
    return data, _groups(data)


def require_hosts(hosts: Sequence[Host], minimum: int, what: str) -> None:
    if len(hosts) < minimum:
        raise BadInput(f"{what} needs at least {minimum} hosts; the selection has {len(hosts)}")
