"""Helpers of the opt-in lab tests that move lab nodes between docker networks and read logs."""

from __future__ import annotations

import posixpath
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpuenv.lab import inventory
from gpuenv.lab.cluster import close_control_masters
from gpuenv.lab.settings import LabPaths

ROOT = Path(__file__).resolve().parents[2]
GPUENV = [sys.executable, "-m", "gpuenv"]
# python3 -m http.server's access log: 10.0.0.3 - - [01/Dec/2026 10:00:00] "GET /x HTTP/1.1" 200 -
_ACCESS_RE = re.compile(r'^(\S+) - - \[[^\]]+\] "(\w+) (\S+) HTTP/[\d.]+" (\d{3})')


@dataclass(frozen=True)
class Access:
    client: str
    method: str
    path: str
    status: int


def parse_access_log(text: str) -> list[Access]:
    """Requests in the log, paths normalised (apt asks a flat repository for /apt/./InRelease)."""
    found = []
    for line in text.splitlines():
        m = _ACCESS_RE.match(line)
        if m:
            path = posixpath.normpath(m.group(3))
            found.append(Access(m.group(1), m.group(2), path, int(m.group(4))))
    return found


def gpuenv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUENV, *args], cwd=ROOT, capture_output=True, text=True, check=False)


def readdress(lab: str, addresses: dict[str, str]) -> LabPaths:
    """Rewrite a lab's inventory and known_hosts for the nodes' new addresses (same host keys)."""
    paths = LabPaths(ROOT, lab)
    inv = inventory.load(paths)
    assert inv is not None, f"lab {lab} has no inventory"
    close_control_masters([n.ip for n in inv.nodes])
    for node in inv.nodes:
        node.ip = addresses[node.name]
    inventory.write(inv, paths)
    return paths


def wait_port(container_ip: str, port: int, deadline_s: float = 30) -> None:
    import socket

    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection((container_ip, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.3)


def run_playbook(
    inventories: list[Path], playbook: Path, *args: str, timeout_s: float = 900
) -> tuple[dict[str, int], float]:
    """ansible-playbook from the checkout; asserts it succeeded, returns changed= per host from
    the recap and the seconds it took."""
    started_at = time.monotonic()
    argv = ["ansible-playbook", *(a for i in inventories for a in ("-i", str(i))), str(playbook)]
    done = subprocess.run(
        [*argv, *args], capture_output=True, text=True, check=False, cwd=ROOT, timeout=timeout_s
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    recap = done.stdout[done.stdout.rindex("PLAY RECAP") :]
    changed = {
        line.split()[0]: int(line.split("changed=")[1].split()[0])
        for line in recap.splitlines()
        if "changed=" in line
    }
    return changed, time.monotonic() - started_at


def converge_idempotent(
    inventories: list[Path], playbook: Path, timeout_s: float = 900
) -> dict[str, float]:
    """Converge, then assert that a second run and check mode change nothing; prints and returns
    the seconds each took."""
    changed, converge_s = run_playbook(inventories, playbook, timeout_s=timeout_s)
    print(f"\nconverge: {converge_s:.1f} s, changed {changed}")
    again, again_s = run_playbook(inventories, playbook, timeout_s=timeout_s)
    print(f"second run: {again_s:.1f} s, changed {again}")
    assert set(again.values()) == {0}, again
    checked, check_s = run_playbook(inventories, playbook, "--check", timeout_s=timeout_s)
    print(f"check mode: {check_s:.1f} s, changed {checked}")
    assert set(checked.values()) == {0}, checked
    return {"converge_s": converge_s, "second_run_s": again_s, "check_s": check_s}
