#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: read what the ssh_mesh role manages on a node, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: ssh_mesh_info
short_description: Read the SSH packages, server, cluster user and host keys of a node
description:
  - One look at the node for the C(ssh_mesh) role; changes nothing, so check mode is the same run.
  - On a converged node every step of the role is skipped on the strength of this answer.
options:
  user:
    description: The cluster user.
    type: str
    required: true
  service:
    description: The SSH server's systemd unit.
    type: str
    required: true
  key_name:
    description: File name of the cluster key in the user's C(~/.ssh).
    type: str
    required: true
  key_blob:
    description:
      - The cluster public key's base64 part, to find its lines in C(authorized_keys); empty before
        the key exists.
    type: str
    default: ""
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Look at the SSH packages, the SSH server, the cluster user and the host keys
  gpuenv.cluster.ssh_mesh_info:
    user: gpuenv
    service: ssh
    key_name: id_gpuenv
    packages: [openssh-client, openssh-server]
  register: found
"""

RETURN = r"""
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
service:
  description: The server's C(systemctl is-enabled) and C(is-active) answers.
  type: dict
  returned: always
  sample: {enabled: enabled, active: active}
user:
  description:
    - The cluster user (home, home_exists, uid, gid, group, shell, key, authorized), null when it
      does not exist. I(key) is the key file's sha1, mode, uid and gid (null when missing);
      I(authorized) the C(authorized_keys) lines holding I(key_blob).
  type: dict
  returned: always
host_keys:
  description: The node's SSH host public keys as C(type base64), sorted.
  type: list
  elements: str
  returned: always
"""

import grp
import hashlib
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    installed,
)

# Where and which host keys setup's ssh_pub_keys facts read (the first folder holding any wins).
HOST_KEY_DIRS = ("/etc/ssh", "/etc/openssh", "/etc")
HOST_KEY_TYPES = ("dsa", "rsa", "ecdsa", "ed25519")


def file_state(path: str) -> dict | None:
    try:
        st = os.lstat(path)
        with open(path, "rb") as handle:
            sha1 = hashlib.sha1(handle.read()).hexdigest()
    except OSError:
        return None
    return {"sha1": sha1, "mode": f"{st.st_mode & 0o7777:04o}", "uid": st.st_uid, "gid": st.st_gid}


def account(user: str, key_name: str, blob: str) -> dict | None:
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    try:
        group: str | None = grp.getgrgid(pw.pw_gid).gr_name
    except KeyError:
        group = None
    ssh_dir = os.path.join(pw.pw_dir, ".ssh")
    authorized: list[str] = []
    if blob:
        try:
            with open(os.path.join(ssh_dir, "authorized_keys"), encoding="utf-8") as handle:
                authorized = [line.strip() for line in handle if blob in line.split()]
        except (OSError, UnicodeDecodeError):
            authorized = []
    return {
        "home": pw.pw_dir,
        "home_exists": os.path.isdir(pw.pw_dir),
        "uid": pw.pw_uid,
        "gid": pw.pw_gid,
        "group": group,
        "shell": pw.pw_shell,
        "key": file_state(os.path.join(ssh_dir, key_name)),
        "authorized": authorized,
    }


def host_keys(folders: tuple[str, ...] = HOST_KEY_DIRS) -> list[str]:
    for folder in folders:
        keys = []
        for kind in HOST_KEY_TYPES:
            try:
                with open(f"{folder}/ssh_host_{kind}_key.pub", encoding="utf-8") as handle:
                    fields = handle.read().split()
            except (OSError, UnicodeDecodeError):
                continue
            if len(fields) >= 2:
                keys.append(f"{fields[0]} {fields[1]}")
        if keys:
            return sorted(keys)
    return []


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    return {
        "debs": installed(run, params["packages"]),
        "service": {
            what: run(["systemctl", f"is-{what}", params["service"]])[1].strip()
            for what in ("enabled", "active")
        },
        "user": account(params["user"], params["key_name"], params["key_blob"]),
        "host_keys": host_keys(),
    }


def main() -> None:
    spec = {
        "user": {"type": "str", "required": True},
        "service": {"type": "str", "required": True},
        "key_name": {"type": "str", "required": True, "no_log": False},
        "key_blob": {"type": "str", "default": "", "no_log": False},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
