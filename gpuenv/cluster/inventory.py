"""The nodes to validate, read from an Ansible inventory through ``ansible-inventory --list``.

Ansible does the parsing (every inventory format and plugin it knows, group_vars, host_vars,
``--limit`` patterns); this module turns its JSON into ``Host`` records with the connection
settings Ansible's ssh connection uses (``ansible_port``, ``ansible_user``,
``ansible_ssh_private_key_file``, ``ansible_ssh_common_args``/``ansible_ssh_extra_args`` word for
word, ``ansible_ssh_executable``), and refuses bad input before anything is launched: an ssh
argument gpuenv cannot honour is an error naming the host and the variable, never dropped.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuenv import proc, tools
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
    port: int | None = None  # ansible_port; None: ssh's own (~/.ssh/config, else 22)
    user: str | None = None
    key_file: str | None = None
    known_hosts: tuple[str, ...] = ()  # where host keys are looked up (for messages)
    # ansible_ssh_common_args + ansible_ssh_extra_args, word for word (checked by ssh_words).
    ssh_args: tuple[str, ...] = ()
    ssh_executable: str = "ssh"  # ansible_ssh_executable
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
    exe = tools.find("ansible-inventory")
    if exe is None:
        raise EnvironmentProblem(
            f"ansible-inventory not found in {tools.interpreter_bin()} nor on PATH: "
            "install gpuenv's controller extra from a checkout (pip install '.[controller]', "
            "docs/install.md)"
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


# ssh(1)'s options: flags without a value, and options that take one (OpenSSH 9).
_SSH_FLAGS = frozenset("46AaCfGgKkMNnqsTtVvXxYy")
_SSH_VALUED = frozenset("BbcDEeFIiJLlmOoPpQRSWw")
# Options that would change what gpuenv's command is or does: refused, naming why.
_SSH_REFUSED_FLAGS = {
    "f": "puts ssh in the background",
    "N": "runs no command",
    "G": "prints the configuration instead of connecting",
    "V": "prints the version instead of connecting",
    "s": "asks for a subsystem instead of a command",
    "t": "asks for a terminal (the commands run without one)",
    "M": "makes this a ControlMaster",
    "W": "forwards stdio instead of running a command",
    "O": "sends a control command instead of connecting",
    "Q": "queries algorithms instead of connecting",
}
_SSH_REFUSED_OPTIONS = {
    "stricthostkeychecking": ("no", "off", "accept-new"),
    "batchmode": ("no",),
    "requesttty": ("yes", "force"),
}
_SSH_REFUSED_ANY = ("remotecommand", "sessiontype", "forkafterauthentication")


def ssh_words(name: str, hostvars: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The words of ansible_ssh_common_args and ansible_ssh_extra_args, as Ansible passes them
    to ssh, and their ``-o`` options by lower-case key (the first value, as ssh takes it).
    BadInput, naming the host and the variable, for what gpuenv cannot honour."""
    words: list[str] = []
    opts: dict[str, str] = {}
    for var in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        text = str(hostvars.get(var) or "")
        try:
            mine = shlex.split(text)
        except ValueError as exc:
            raise BadInput(f"host {name}: {var} does not parse as shell words ({exc})") from exc

        def refuse(what: str, why: str, var: str = var) -> BadInput:
            return BadInput(f"host {name}: {var} has {what}, which gpuenv cannot honour: {why}")

        i = 0
        while i < len(mine):
            word = mine[i]
            if not word.startswith("-") or word == "-":
                raise refuse(repr(word), "ssh arguments must be options (-o Key=Value, -J host)")
            letters = word[1:]
            for j, letter in enumerate(letters):
                if letter in _SSH_REFUSED_FLAGS:
                    raise refuse(f"-{letter}", _SSH_REFUSED_FLAGS[letter])
                if letter in _SSH_FLAGS:
                    continue
                if letter not in _SSH_VALUED:
                    raise refuse(f"-{letter}", "ssh has no such option")
                value = letters[j + 1 :]
                if not value:
                    i += 1
                    if i >= len(mine):
                        raise refuse(f"-{letter}", "its value is missing")
                    value = mine[i]
                if letter == "o":
                    key, _, val = value.replace("=", " ", 1).partition(" ")
                    key, val = key.strip().lower(), val.strip()
                    if key in _SSH_REFUSED_ANY or val.lower() in _SSH_REFUSED_OPTIONS.get(key, ()):
                        why = (
                            "gpuenv verifies host keys: put the node's key in known_hosts instead"
                            if key == "stricthostkeychecking"
                            else "gpuenv runs its own command, without a terminal or prompt"
                        )
                        raise refuse(f"-o {value}", why)
                    opts.setdefault(key, val)
                break
            i += 1
        words += mine
    return words, opts


def _resolves(address: str) -> bool:
    try:
        socket.getaddrinfo(address, None)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def _host(name: str, hv: Mapping[str, Any], base: Path) -> Host:
    connection = str(hv.get("ansible_connection") or "ssh").removeprefix("ansible.builtin.")
    if connection not in ("ssh", "smart", "paramiko", "local"):
        raise BadInput(
            f"host {name}: ansible_connection {connection!r} is not one gpuenv can use "
            "(ssh or local)"
        )
    local = connection == "local"
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
    for var in ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password"):
        if hv.get(var):
            raise BadInput(
                f"host {name}: {var} is set; gpuenv cluster connects with keys only "
                "(ssh BatchMode): use ansible_ssh_private_key_file or an agent"
            )
    words, opts = ssh_words(name, hv)
    # Through a jump host or a proxy command the address is the jump host's to resolve.
    proxied = any(k in opts for k in ("proxyjump", "proxycommand")) or any(
        w.startswith("-J") for w in words
    )
    problem = None if proxied or _resolves(address) else f"address {address!r} does not resolve"
    raw_port = hv.get("ansible_port") or hv.get("ansible_ssh_port")
    try:
        port = None if raw_port is None else int(raw_port)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"host {name}: ansible_port {raw_port!r} is not a number") from exc
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
    # ssh reads ~/.ssh/config (or -F's file), which may name other known_hosts files.
    configured = os.path.isfile(os.path.expanduser("~/.ssh/config")) or any(
        w.startswith("-F") for w in words
    )
    if not known and not configured:
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
        ssh_args=tuple(words),
        ssh_executable=str(hv.get("ansible_ssh_executable") or "ssh"),
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
