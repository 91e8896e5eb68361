"""First converge of the GPU stack against a plain `apt-get install` of the same packages.

    python benchmarks/converge_vs_apt.py [--distro trixie] [--no-warmup] [--keep] [--out FILE]

Brings up a lab of three fresh nodes (`gpuenv lab up --name gs-bench`, SSH with the project's
ansible.cfg: pipelining, ControlPersist, fact cache), all behind the lab's apt-cacher-ng:

1. node1 (warm-up, not timed): installs the packages so the cache holds every .deb;
2. node2 (baseline): the same deb822 non-free entry the roles write, then `apt-get update` and
   `apt-get install -y --no-install-recommends` of the packages the roles install;
3. node3 (converge): `ansible-playbook molecule/gpu-stack-<distro>/converge.yml` (preflight,
   driver, cuda, nccl stages) limited to node3, timed from the command line.

Prints a JSON record with both times and the ratio converge/apt (the target is <= 1.3) and exits
1 when the ratio is above it. `--keep` leaves the lab up for benchmarks/rerun_gpu_stack.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAB = "gs-bench"
INVENTORY = ROOT / "inventory" / f"lab-{LAB}" / "hosts.yml"
TARGET_RATIO = 1.3

# What the roles install on each distro with the scenario's variables (user-space driver: the lab
# nodes are containers). bookworm's NCCL is a wheel, not a package: only the apt part is compared.
STACK = {
    "trixie": {
        "vars": {
            "nvidia_driver_branch": "550",
            "cuda_toolkit_version": "12.4",
            "nccl_install_method": "distro",
            "nccl_version": "2.22",
        },
        "packages": [
            "nvidia-smi",
            "libcuda1",
            "libnvidia-ml1",
            "nvidia-cuda-toolkit",
            "libnccl2",
            "libnccl-dev",
        ],
    },
}

SOURCES = """Types: deb
URIs: http://deb.debian.org/debian
Suites: {codename} {codename}-updates
Components: contrib non-free non-free-firmware
Signed-By: {keyring}
"""


def sh(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, text=True, capture_output=True, check=True, **kw)  # type: ignore[call-overload]


def node(i: int) -> str:
    return f"{LAB}-node{i}"


def docker_exec(name: str, script: str) -> float:
    start = time.monotonic()
    sh(["docker", "exec", name, "bash", "-euo", "pipefail", "-c", script])
    return time.monotonic() - start


def plain_apt(name: str, codename: str, packages: list[str]) -> float:
    keyring = (
        "/usr/share/keyrings/debian-archive-keyring.pgp"
        if codename == "trixie"
        else "/usr/share/keyrings/debian-archive-keyring.gpg"
    )
    entry = SOURCES.format(codename=codename, keyring=keyring)
    script = (
        f"cat > /etc/apt/sources.list.d/gpuenv-debian-nonfree.sources <<'EOF'\n{entry}EOF\n"
        "export DEBIAN_FRONTEND=noninteractive\n"
        "apt-get update -qq\n"
        f"apt-get install -y -qq --no-install-recommends {' '.join(packages)} >/dev/null\n"
    )
    return docker_exec(name, script)


def ansible_env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}


def converge(distro: str, limit: str, extra: dict[str, str]) -> tuple[float, str]:
    playbook = ROOT / "molecule" / f"gpu-stack-{distro}" / "converge.yml"
    if not playbook.exists():
        playbook = ROOT / "molecule" / "gpu-stack-trixie" / "converge.yml"
    argv = ["ansible-playbook", "-i", str(INVENTORY), "--limit", limit, "-e", json.dumps(extra)]
    start = time.monotonic()
    proc = subprocess.run(
        [*argv, str(playbook)], text=True, capture_output=True, env=ansible_env(), check=False
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"converge failed (rc {proc.returncode})")
    return elapsed, recap(proc.stdout, limit)


def recap(stdout: str, host: str) -> str:
    match = re.search(rf"^{re.escape(host)}\s+:\s+(ok=.*)$", stdout, re.MULTILINE)
    return " ".join(match.group(1).split()) if match else "no recap"


def lab_up(distro: str, nodes: int) -> None:
    sh(["gpuenv", "lab", "up", "--nodes", str(nodes), "--name", LAB, "--distro", distro], cwd=ROOT)


def lab_down() -> None:
    subprocess.run(["gpuenv", "lab", "down", "--name", LAB], cwd=ROOT, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distro", default="trixie", choices=sorted(STACK))
    parser.add_argument("--no-warmup", action="store_true", help="the apt cache is warm already")
    parser.add_argument("--keep", action="store_true", help="leave the lab up for the rerun")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    stack = STACK[args.distro]
    lab_up(args.distro, 3)
    try:
        if not args.no_warmup:
            plain_apt(node(1), args.distro, stack["packages"])
        apt_s = plain_apt(node(2), args.distro, stack["packages"])
        converge_s, converge_recap = converge(args.distro, node(3), stack["vars"])
    finally:
        if not args.keep:
            lab_down()
    ratio = converge_s / apt_s
    record = {
        "distro": args.distro,
        "packages": stack["packages"],
        "apt_get_s": round(apt_s, 1),
        "converge_s": round(converge_s, 1),
        "ratio": round(ratio, 2),
        "target": TARGET_RATIO,
        "converge_recap": converge_recap,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
