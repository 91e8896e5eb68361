#!/usr/bin/env python3
"""Time `gpuenv lab up` from a cold cache and a warm one; the figures are quoted in docs/lab.md.

    python benchmarks/lab_up.py [--nodes 3] [--distro trixie] [--warm-runs 3]

Cold: after `lab down --purge` (no images, no debootstrap tarball, no cache container or volume).
Warm: images and cache in place, lab down before each run. Every `lab up` is followed by
`ansible all -m ansible.builtin.ping` with host-key checking on, so a timing only counts when
the lab works.

The run uses its own object prefix (GPUENV_LAB_PREFIX, default `gpuenvbench`) and lab name, so
purging for the cold run never touches the `gpuenv` images, cache or labs other work relies on.
Needs root (debootstrap) and a running Docker engine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(argv: list[str], env: dict[str, str]) -> float:
    """Run a command, fail loudly, return its wall time in seconds."""
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--distro", default="trixie")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--prefix", default="gpuenvbench")
    parser.add_argument("--keep", action="store_true", help="leave images and cache at the end")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    env = dict(os.environ, GPUENV_LAB_PREFIX=args.prefix, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    bin_dir = Path(sys.executable).parent
    gpuenv = str(bin_dir / "gpuenv")
    ansible = str(bin_dir / "ansible")
    name = args.prefix
    hosts = f"inventory/lab-{name}/hosts.yml"
    up = [gpuenv, "lab", "up", "--nodes", str(args.nodes), "--distro", args.distro, "--name", name]
    ping = [ansible, "all", "-i", hosts, "-m", "ansible.builtin.ping"]
    down = [gpuenv, "lab", "down", "--name", name]

    run([*down, "--purge"], env)
    cold = run(up, env)
    cold_ping = run(ping, env)
    warm: list[float] = []
    for _ in range(args.warm_runs):
        run(down, env)
        warm.append(run(up, env))
        run(ping, env)
    run([*down, "--purge"] if not args.keep else down, env)

    figures = {
        "nodes": args.nodes,
        "distro": args.distro,
        "cold_up_s": round(cold, 1),
        "cold_ping_s": round(cold_ping, 1),
        "warm_up_s": [round(w, 1) for w in warm],
        "warm_up_median_s": round(statistics.median(warm), 1) if warm else None,
        "host": f"{platform.node()} {os.cpu_count()} cpus, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
