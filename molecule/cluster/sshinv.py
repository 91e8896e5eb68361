"""An SSH inventory of lab nodes for `gpuenv cluster`, which reaches nodes over SSH (the
scenario's own inventory uses the docker connection): the lab image's admin user with a key made
for the run, the nodes' host keys read through docker (a channel the tests trust) into a
known_hosts of its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import docker

ADMIN = "admin"  # the lab image's sudo user (gpuenv/lab/recipe.py)


def on(name: str, *cmd: str) -> str:
    done = subprocess.run(["docker", "exec", name, *cmd], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"docker exec {name} {cmd} failed: {done.stderr.strip()}")
    return done.stdout


def address(client: docker.DockerClient, name: str) -> str:
    networks = client.containers.get(name).attrs["NetworkSettings"]["Networks"]
    return next(n["IPAddress"] for n in networks.values() if n.get("IPAddress"))


def inventory(
    tmp: Path, nodes: list[str], user: str, more: dict[str, dict[str, object]] | None = None
) -> Path:
    """hosts.yml in ``tmp`` for ``nodes``; ``more`` adds variables per host, or hosts."""
    client = docker.from_env()
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    public = (tmp / "id_ed25519.pub").read_text().strip()
    known = []
    hosts: dict[str, dict[str, object]] = {}
    for name in nodes:
        ip = address(client, name)
        home = f"/home/{ADMIN}/.ssh"
        keys = f"{home}/authorized_keys"
        on(name, "sh", "-c", f"mkdir -p {home} && echo '{public}' >>{keys}"
                             f" && chown -R {ADMIN}: {home} && chmod 600 {keys}")  # fmt: skip
        for line in on(name, "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub").splitlines():
            if line.strip():
                known.append(f"{ip} {' '.join(line.split()[:2])}")
        # Nodes reach each other by container name, as the mpi role's hostfile lists them.
        hosts[name] = {"ansible_host": ip, "gpuenv_cluster_address": name}
    (tmp / "known_hosts").write_text("\n".join(known) + "\n")
    for name, variables in (more or {}).items():
        hosts.setdefault(name, {}).update(variables)
    inv = {
        "all": {
            "vars": {
                "ansible_user": ADMIN,
                "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": f"-o UserKnownHostsFile={tmp / 'known_hosts'}",
                "gpuenv_cluster_user": user,
            },
            "hosts": hosts,
        }
    }
    path = tmp / "hosts.yml"
    path.write_text(json.dumps(inv))  # JSON is YAML
    return path
