"""Read what roles/ssh_mesh manages on a node, in one call, and print it as JSON.

Runs on the node (ansible.builtin.command: python3 -c <this file> ARGS) and changes nothing:
    USER SERVICE KEY_NAME KEY_BLOB PACKAGE[,PACKAGE...]
Prints: the packages installed, the SSH server's enabled/active state, the cluster user (home,
ids, primary group name, shell, the cluster key file's checksum and attributes, the
authorized_keys lines holding KEY_BLOB) or null, and the host keys as 'type base64'.
"""

import grp
import hashlib
import json
import os
import pwd
import sys

# Where and which host keys setup's ssh_pub_keys facts read (the first folder holding any wins).
HOST_KEY_DIRS = ("/etc/ssh", "/etc/openssh", "/etc")
HOST_KEY_TYPES = ("dsa", "rsa", "ecdsa", "ed25519")


if "run" not in globals():  # run as a file (tests): the helpers come from roles/gpuenv_common
    sys.path.insert(
        0, os.path.join(os.path.dirname(__file__), "..", "..", "gpuenv_common", "files")
    )
    from probe_lib import installed, run


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
        group = grp.getgrgid(pw.pw_gid).gr_name
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


def host_keys() -> list[str]:
    for folder in HOST_KEY_DIRS:
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


def main(user: str, service: str, key_name: str, blob: str, packages: str) -> None:
    state = {
        "debs": installed([name for name in packages.split(",") if name]),
        "service": {
            what: run(["systemctl", f"is-{what}", service])[1].strip()
            for what in ("enabled", "active")
        },
        "user": account(user, key_name, blob),
        "host_keys": host_keys(),
    }
    print(json.dumps(state))


if __name__ == "__main__":
    main(*sys.argv[1:])
