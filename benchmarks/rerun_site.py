"""site.yml re-run on a converged lab: wall time and changed count.

    python benchmarks/rerun_site.py --nodes 3 --name h4lab [--distro trixie] [--runs 3]
    python benchmarks/rerun_site.py --nodes 12 --name h4lab12 --baseline-s 14.2
    python benchmarks/rerun_site.py --nodes 3 --name light3 --vars benchmarks/vars/light-trixie.yml

Brings the lab up when its inventory is missing (`gpuenv lab up`), converges it once with
site.yml (untimed, skipped with --no-converge), then re-runs `ansible-playbook site.yml` --runs
times from the command line with the project's ansible.cfg (pipelining, ControlPersist, fact
cache). Every timed run must end with changed=0 and failed=0 on every node.

Targets: the best re-run <= 20 s on 3 nodes; with --baseline-s (the 3-node figure) the best
re-run <= 2x that baseline. Prints one JSON record; exit code 0 when the targets are met, 1 when
not, 2 on bad input.
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
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")
TARGET_3_NODES_S = 20.0
TARGET_FACTOR = 2.0


def recap(output: str) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for line in output.splitlines():
        m = RECAP.match(line.strip())
        if m:
            rows[m.group(1)] = {
                "ok": int(m.group(2)),
                "changed": int(m.group(3)),
                "unreachable": int(m.group(4)),
                "failed": int(m.group(5)),
            }
    return rows


def site(inventory: Path, timeout_s: int, extra: list[str]) -> tuple[float, int, str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    bindir = Path(sys.executable).parent
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(bindir / "ansible-playbook"), "site.yml", "-i", str(inventory), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return time.monotonic() - t0, proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--name", required=True, help="lab name (inventory/lab-NAME)")
    parser.add_argument("--distro", default="trixie", choices=["trixie", "bookworm"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-converge", action="store_true", help="the lab is converged already")
    parser.add_argument("--baseline-s", type=float, help="3-node re-run time to compare with")
    parser.add_argument("--timeout-s", type=int, default=3600)
    parser.add_argument("--out", type=Path, help="also write the JSON record here")
    parser.add_argument(
        "--skip-tags", default="", help="stages to leave out, e.g. validate (recorded)"
    )
    parser.add_argument(
        "--vars",
        type=Path,
        action="append",
        default=[],
        help="variables file for -e @FILE (repeatable), e.g. benchmarks/vars/light-trixie.yml",
    )
    args = parser.parse_args()
    if args.nodes < 1 or args.runs < 1:
        print("rerun_site: --nodes and --runs must be >= 1", file=sys.stderr)
        return 2

    missing = [str(f) for f in args.vars if not f.is_file()]
    if missing:
        print(f"rerun_site: --vars file not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    inventory = ROOT / "inventory" / f"lab-{args.name}" / "hosts.yml"
    gpuenv = Path(sys.executable).with_name("gpuenv")
    if not inventory.exists():
        subprocess.run(
            [str(gpuenv), "lab", "up", "--nodes", str(args.nodes), "--name", args.name,
             "--distro", args.distro],
            check=True,
        )  # fmt: skip

    extra = ["--skip-tags", args.skip_tags] if args.skip_tags else []
    for file in args.vars:
        path = file.resolve()
        extra += ["-e", f"@{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"]
    record: dict[str, object] = {"nodes": args.nodes, "lab": args.name, "distro": args.distro}
    if not args.no_converge:
        wall, rc, out = site(inventory, args.timeout_s, extra)
        record["converge_s"] = round(wall, 1)
        if rc != 0:
            print(out[-5000:], file=sys.stderr)
            print(f"rerun_site: the converging run failed (rc {rc})", file=sys.stderr)
            return 1

    runs = []
    for _ in range(args.runs):
        wall, rc, out = site(inventory, args.timeout_s, extra)
        rows = recap(out)
        runs.append(
            {
                "wall_s": round(wall, 2),
                "rc": rc,
                "hosts": len(rows),
                "changed": sum(r["changed"] for r in rows.values()),
                "failed": sum(r["failed"] + r["unreachable"] for r in rows.values()),
            }
        )
        if rc != 0 or runs[-1]["changed"]:
            changed = [line for line in out.splitlines() if line.startswith(("changed:", "fatal:"))]
            print("\n".join(changed[-40:]), file=sys.stderr)
    best = min(r["wall_s"] for r in runs)
    limit = TARGET_FACTOR * args.baseline_s if args.baseline_s else TARGET_3_NODES_S
    clean = all(r["rc"] == 0 and r["changed"] == 0 and r["hosts"] == args.nodes for r in runs)
    record.update(
        runs=runs,
        best_s=best,
        limit_s=round(limit, 2),
        command=" ".join(
            ["ansible-playbook", "site.yml", "-i", str(inventory.relative_to(ROOT)), *extra]
        ),
        passed=clean and best <= limit,
        load_avg=os.getloadavg()[0],
    )
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
