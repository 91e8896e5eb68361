"""Fault test for the cluster plumbing: a node lost mid-run, then a re-keyed node.

Run by molecule/cluster/verify.yml on the converged scenario (or by hand with the same
environment molecule sets):

    python molecule/cluster/fault_test.py --inventory INV --playbook molecule/cluster/converge.yml \
        --victim cl-node3 --others cl-node1 cl-node2

0. Bad variables (unknown user, malformed key path, empty group) stop the
   run in preflight with a message naming the variable, before anything changes.
1. The victim's container is stopped while the run is in its ssh stage: the run goes on for the
   others (failed=0, unreachable=0, their last stage done), the recap names the victim, and the
   others keep the victim's recorded host keys.
2. The victim comes back; a re-run converges every node and the mesh is complete again.
3. The victim gets new host keys: the ssh stage fails on it alone, naming it; the others keep
   refusing the new key; with ssh_mesh_accept_changed_host_keys naming it, a re-run accepts it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
DEADLINE_S = 900


def log(msg: str) -> None:
    print(f"fault_test: {msg}", flush=True)


def recap(output: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for line in output.splitlines():
        m = RECAP.match(line.strip())
        if m:
            out[m.group(1)] = {
                "ok": int(m.group(2)),
                "changed": int(m.group(3)),
                "unreachable": int(m.group(4)),
                "failed": int(m.group(5)),
            }
    return out


def playbook(args: argparse.Namespace, *extra: str, stop_at: str | None = None) -> tuple[int, str]:
    """Run the playbook; when stop_at appears in its output, stop the victim's container."""
    cmd = [args.ansible_playbook, "-i", args.inventory, args.playbook, *extra]
    log("running " + " ".join(cmd))
    # Plain output: the recap is parsed (molecule forces colour otherwise).
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "false", "ANSIBLE_NOCOLOR": "true"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env
    )
    assert proc.stdout is not None
    lines: list[str] = []
    start = time.monotonic()
    for line in proc.stdout:
        lines.append(line)
        if stop_at and stop_at in line:
            log(f"'{stop_at}' reached: stopping {args.victim}")
            docker.from_env().containers.get(args.victim).stop(timeout=10)
            stop_at = None
        if time.monotonic() - start > DEADLINE_S:
            proc.kill()
            raise SystemExit(f"fault_test: FAIL: the playbook ran over {DEADLINE_S}s")
    rc = proc.wait()
    output = "".join(lines)
    log(f"rc={rc} recap={json.dumps(recap(output))}")
    return rc, output


Proc = subprocess.CompletedProcess[str]


def node(name: str, *cmd: str) -> Proc:
    return subprocess.run(
        ["docker", "exec", name, *cmd], capture_output=True, text=True, check=False
    )


def host_keys(name: str) -> set[str]:
    res = node(name, "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub")
    return {" ".join(line.split()[:2]) for line in res.stdout.splitlines() if line.strip()}


def known_keys(observer: str, alias: str) -> set[str]:
    res = node(observer, "ssh-keygen", "-F", alias, "-f", "/etc/ssh/ssh_known_hosts")
    return {
        " ".join(line.split()[1:3])
        for line in res.stdout.splitlines()
        if line and not line.startswith("#")
    }


def ssh_as_cluster_user(args: argparse.Namespace, src: str, dst: str) -> Proc:
    return node(
        src,
        "sudo",
        "-u",
        args.user,
        "-H",
        "ssh",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        dst,
        "hostname",
    )


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"fault_test: FAIL: {what}")
    log(f"ok: {what}")


def wait_booted(name: str) -> None:
    for _ in range(60):
        res = node(name, "systemctl", "is-system-running", "--wait")
        if res.stdout.strip() in ("running", "degraded"):
            return
        time.sleep(1)
    raise SystemExit(f"fault_test: FAIL: {name} did not finish booting")


BAD_INPUTS = [
    ({"ssh_mesh_user": "nosuchuser", "ssh_mesh_user_create": False}, 'ssh_mesh_user "nosuchuser"'),
    ({"ssh_mesh_private_key_file": "keys/id_cluster"}, "ssh_mesh_private_key_file"),
    ({"ssh_mesh_group": "gpuenv_empty"}, 'ssh_mesh_group "gpuenv_empty"'),
]


def bad_input(args: argparse.Namespace, tmp: Path) -> None:
    """Each bad variable fails the preflight play (the stages are skipped by tag regardless)."""
    extra_inventory = tmp / "empty-group.yml"
    extra_inventory.write_text("all:\n  children:\n    gpuenv_empty:\n      hosts: {}\n")
    for variables, named in BAD_INPUTS:
        rc, out = playbook(
            args,
            "-i",
            str(extra_inventory),
            "--skip-tags",
            "ssh,mpi,env",
            "-e",
            json.dumps(variables),
        )
        r = recap(out)
        check(rc != 0 and named in out, f"{variables} fails in preflight naming {named}")
        check(all(v["changed"] == 0 for v in r.values()), f"nothing changed: {r}")


def lost_node(args: argparse.Namespace, others: list[str]) -> None:
    before = host_keys(args.victim)
    rc, out = playbook(args, stop_at=args.stop_at)
    r = recap(out)
    check(rc != 0, "the run reports a failure when a node is lost")
    check(
        r.get(args.victim, {}).get("unreachable", 0) + r.get(args.victim, {}).get("failed", 0) > 0,
        f"the recap names {args.victim} as unreachable or failed: {r.get(args.victim)}",
    )
    for name in others:
        check(
            r.get(name, {}).get("failed") == 0 and r.get(name, {}).get("unreachable") == 0,
            f"{name} finished the run: {r.get(name)}",
        )
    check(args.last_task in out, f"the last stage ran on the others ('{args.last_task}')")
    for name in others:
        check(
            known_keys(name, args.victim) == before,
            f"{name} keeps {args.victim}'s recorded host keys while it is away",
        )

    log(f"starting {args.victim} again")
    docker.from_env().containers.get(args.victim).start()
    wait_booted(args.victim)
    rc, out = playbook(args)
    r = recap(out)
    check(rc == 0, "a re-run after the node returned converges")
    check(all(v["failed"] == 0 and v["unreachable"] == 0 for v in r.values()), f"recap {r}")
    mesh_complete(args, [*others, args.victim])


def mesh_complete(args: argparse.Namespace, nodes: list[str]) -> None:
    for src in nodes:
        for dst in nodes:
            check(known_keys(src, dst) == host_keys(dst), f"{src} knows {dst}'s real host keys")
            res = ssh_as_cluster_user(args, src, dst)
            check(res.returncode == 0, f"{src} -> {dst} ssh, strict checking: {res.stderr.strip()}")


def rekeyed_node(args: argparse.Namespace, others: list[str]) -> None:
    old = host_keys(args.victim)
    res = node(
        args.victim,
        "sh",
        "-c",
        "rm -f /etc/ssh/ssh_host_*key* && ssh-keygen -A && systemctl restart ssh",
    )
    check(res.returncode == 0, f"{args.victim} got new host keys: {res.stderr.strip()}")
    new = host_keys(args.victim)
    check(new.isdisjoint(old), "the new host keys differ from the old ones")
    rc, out = playbook(args, "--tags", "ssh")
    r = recap(out)
    check(rc != 0, "the run fails when a node's host keys changed")
    check(r.get(args.victim, {}).get("failed", 0) == 1, f"{args.victim}: {r.get(args.victim)}")
    check(
        f"{args.victim}: host keys changed since they were recorded" in out,
        "the failure message names the re-keyed node",
    )
    for name in others:
        check(r.get(name, {}).get("failed") == 0, f"{name} is not failed: {r.get(name)}")
        check(known_keys(name, args.victim) == old, f"{name} still trusts only the recorded keys")
        res = ssh_as_cluster_user(args, name, args.victim)
        check(
            res.returncode != 0 and "verification failed" in res.stderr.lower(),
            f"{name} -> {args.victim} is refused while the new key is not accepted",
        )
    accept = json.dumps({"ssh_mesh_accept_changed_host_keys": [args.victim]})
    rc, out = playbook(args, "--tags", "ssh", "-e", accept)
    check(rc == 0, "a re-run that accepts the new keys converges")
    mesh_complete(args, [*others, args.victim])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--playbook", required=True)
    parser.add_argument("--victim", required=True)
    parser.add_argument("--others", nargs="+", required=True)
    parser.add_argument("--user", default="gpuenv")
    parser.add_argument("--stop-at", default="PLAY [Stage ssh")
    parser.add_argument(
        "--last-task",
        default="TASK [gpuenv.cluster.gpu_env : Write pip's settings and the cluster environment]",
    )
    parser.add_argument(
        "--ansible-playbook", default=str(Path(sys.executable).with_name("ansible-playbook"))
    )
    args = parser.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuenv-fault-") as tmp:
        bad_input(args, Path(tmp))
    lost_node(args, args.others)
    rekeyed_node(args, args.others)
    log(f"PASSED in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
