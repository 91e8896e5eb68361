"""A re-run of the GPU stack on a converged node: changed=0, in a few seconds.

    python benchmarks/converge_vs_apt.py --keep     # leaves gs-bench-node3 converged
    python benchmarks/rerun_gpu_stack.py [--runs 3] [--out FILE]

Runs the same converge playbook `--runs` times against gs-bench-node3 with the project's
ansible.cfg (SSH pipelining, ControlPersist, jsonfile fact cache) and prints each run's wall time
and recap. Exit 1 when any run reports a change or fails. `--down` removes the lab afterwards.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from converge_vs_apt import INVENTORY, STACK, converge, lab_down, node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--distro", default="trixie", choices=sorted(STACK))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--down", action="store_true", help="remove the lab afterwards")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not INVENTORY.exists():
        raise SystemExit(f"{INVENTORY} is missing: run benchmarks/converge_vs_apt.py --keep first")
    runs = []
    try:
        for _ in range(args.runs):
            seconds, recap = converge(args.distro, node(3), STACK[args.distro]["vars"])
            runs.append({"seconds": round(seconds, 1), "recap": recap})
    finally:
        if args.down:
            lab_down()
    text = json.dumps({"node": node(3), "runs": runs}, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    clean = all(
        " changed=0 " in r["recap"] + " " and " failed=0 " in r["recap"] + " " for r in runs
    )
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
