#!/usr/bin/env python3
"""`make demo`'s first run on this machine, phase by phase, over several fresh runs.

    python benchmarks/demo_first_run.py [--runs 2] [--prefix gpuenvdemo] [--name demofr]
                                        [--keep-base] [--limit] [--json FILE]
    python benchmarks/demo_first_run.py --floor-only LAB [--prefix gpuenvdemo] [--json FILE]

Each run starts fresh for the lab: `gpuenv lab down --purge` of its own object prefix
(GPUENV_LAB_PREFIX, so the `gpuenv` images, cache and labs other work uses are never touched)
removes the images, the cache container, its apt volume and the debootstrap tarballs. What a
newcomer's machine would not have either but every run here keeps: the controller's `.venv`
(scripts/venv.sh), the host packages (scripts/host-prereqs.sh) and pip's own download cache (the
demo's wheels are fetched from it, not from PyPI). With --keep-base the debootstrap tarballs stay
too (a run then measures everything but the two debootstraps).

Then the demo's own steps, timed one by one (scripts/demo.sh runs the same):

1. wheels: `pip download` of the demo's cluster-venv wheels into the lab's wheelhouse;
2. images: `gpuenv lab build --distro bookworm` (debootstrap of Debian 12 and of the cache's
   Debian 13, the node and cache images, the cache container);
3. lab up: `gpuenv lab up --nodes 3 --distro bookworm --name NAME` (the nodes);
4. site.yml: `ansible-playbook site.yml` with the demo's variables, validation included; it must
   exit 0 with the verdict OK. Its stages and slowest tasks come from profile_tasks (ansible.cfg).

With --limit, after the last run and with the apt cache warm, the machine's floor for the same
work: the packages site.yml installed (`apt-mark showmanual` on a converged node, less the image's)
and the same venv, installed by plain `apt-get install` and `pip install` on one fresh node, then
on three fresh nodes at once. The lab is taken down at the end (the images and cache stay).

Prints each phase's figure per run with min/median/max and the load average around it. It does
not start with less than --min-free-gib (25) free under /var/lib/docker: other labs share the disk,
and a run that fills it breaks theirs (their preflight wants 10 GiB free).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = "inventory/pins/debian-12.yml"
TORCH = "torch==2.13.0"
# The demo's cluster-venv packages on Debian 12 nodes (gpu_env_packages and the torch pin).
VENV_PACKAGES = ["numpy", "mpi4py==4.1.2", TORCH]
DEMO_VARS = ["-e", f"@{PINS}", "-e", "gpu_env_install_torch=true",
             "-e", f"gpu_env_torch_package={TORCH}"]  # fmt: skip

_TASK = re.compile(r"^(TASK|RUNNING HANDLER) \[(?P<name>.*)\] \*+\s*$")
_PLAY = re.compile(r"^PLAY \[(?P<name>.*)\] \*+\s*$")
_STAMP = re.compile(r"\((?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?)\)\s+\d+:\d\d:\d\d")
_RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)")


@dataclass
class Profile:
    """site.yml's time by play (stage) and by task, from profile_tasks' timestamp lines."""

    plays: dict[str, float] = field(default_factory=dict)
    tasks: list[tuple[str, str, float]] = field(default_factory=list)

    def slowest(self, n: int) -> list[tuple[str, str, float]]:
        return sorted(self.tasks, key=lambda t: -t[2])[:n]


def parse_profile(output: str) -> Profile:
    """profile_tasks prints, under each task's header, the time since the previous task began:
    that is the previous task's duration, booked to the play that task ran in."""
    profile = Profile()
    play = ""
    current: tuple[str, str] | None = None
    pending_header: str | None = None
    for line in output.splitlines():
        m = _PLAY.match(line)
        if m:
            play = m.group("name")
            continue
        m = _TASK.match(line)
        if m:
            pending_header = m.group("name")
            continue
        stamp = _STAMP.search(line)
        if stamp is None:
            continue
        took = int(stamp["h"]) * 3600 + int(stamp["m"]) * 60 + float(stamp["s"])
        if current is not None:
            profile.tasks.append((current[0], current[1], took))
            profile.plays[current[0]] = profile.plays.get(current[0], 0.0) + took
        current = (play, pending_header) if pending_header is not None else None
        pending_header = None
    return profile


def recap(output: str) -> dict[str, dict[str, int]]:
    rows: dict[str, dict[str, int]] = {}
    for line in output.splitlines():
        m = _RECAP.match(line.strip())
        if m:
            keys = ("ok", "changed", "unreachable", "failed")
            rows[m.group(1)] = dict(zip(keys, map(int, m.groups()[1:]), strict=True))
    return rows


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 1),
        "median": round(statistics.median(values), 1),
        "max": round(max(values), 1),
    }


def load() -> float:
    return round(os.getloadavg()[0], 1)


class Runner:
    def __init__(self, prefix: str, name: str) -> None:
        bindir = Path(sys.executable).parent
        self.gpuenv = str(bindir / "gpuenv")
        self.ansible_playbook = str(bindir / "ansible-playbook")
        self.name = name
        self.env = {
            **os.environ,
            "GPUENV_LAB_PREFIX": prefix,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            # Wide enough for `gpuenv lab` to print each step with its time in the log.
            "COLUMNS": "200",
        }
        self.hosts = f"inventory/lab-{name}/hosts.yml"

    def timed(self, argv: list[str], log: Path) -> tuple[float, int, str]:
        t0 = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.run(
                argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, check=False
            )
        return time.monotonic() - t0, proc.returncode, log.read_text(errors="replace")

    def must(self, what: str, argv: list[str], log: Path) -> tuple[float, str]:
        took, rc, text = self.timed(argv, log)
        if rc != 0:
            sys.exit(f"demo_first_run: {what} failed (rc {rc}); see {log}\n{text[-3000:]}")
        return took, text

    def down(self, log: Path, *, purge: bool, name: str = "") -> None:
        self.must("lab down", [self.gpuenv, "lab", "down", "--name", name or self.name]
                  + (["--purge"] if purge else []), log)  # fmt: skip


def fresh(runner: Runner, prefix: str, keep_base: bool, logs: Path) -> None:
    """Remove the prefix's lab, images, cache and (without keep_base) debootstrap tarballs."""
    tarballs = sorted((ROOT / ".cache" / "lab").glob(f"{prefix}-base-*.tar"))
    kept = {t: t.with_suffix(".kept") for t in tarballs} if keep_base else {}
    for tar, aside in kept.items():
        tar.rename(aside)
    try:
        runner.down(logs / "down.log", purge=True)
    finally:
        for tar, aside in kept.items():
            aside.rename(tar)


def one_run(runner: Runner, args: argparse.Namespace, logs: Path) -> dict[str, object]:
    logs.mkdir(parents=True, exist_ok=True)
    fresh(runner, args.prefix, args.keep_base, logs)
    phases: dict[str, dict[str, float]] = {}

    def phase(key: str, what: str, argv: list[str]) -> str:
        before = load()
        took, text = runner.must(what, argv, logs / f"{key}.log")
        phases[key] = {"s": round(took, 1), "load_before": before, "load_after": load()}
        print(f"  {key}: {took:.1f} s (load {before} -> {phases[key]['load_after']})", flush=True)
        return text

    wheels = str(ROOT / ".cache" / "lab" / "wheels")
    py = sys.executable
    phase("wheels", "pip download", [py, "-m", "pip", "download", "-q", "-c", "constraints.txt",
                                     "-d", wheels, *VENV_PACKAGES])  # fmt: skip
    lab = [runner.gpuenv, "lab"]
    phase("images", "lab build", [*lab, "build", "--distro", "bookworm"])
    phase("lab_up", "lab up", [*lab, "up", "--nodes", "3", "--distro", "bookworm", "--name",
                               runner.name])  # fmt: skip
    before = load()
    took, rc, text = runner.timed(
        [runner.ansible_playbook, "site.yml", "-i", runner.hosts, *DEMO_VARS], logs / "site.log"
    )
    phases["site"] = {"s": round(took, 1), "load_before": before, "load_after": load()}
    rows = recap(text)
    bad = any(r["failed"] + r["unreachable"] for r in rows.values())
    if rc != 0 or len(rows) != 3 or bad:
        sys.exit(f"demo_first_run: site.yml failed (rc {rc}); see {logs / 'site.log'}")
    verdict = json.loads((ROOT / "reports/validate/cluster.json").read_text())["verdict"]
    if not verdict.get("ok"):
        sys.exit(f"demo_first_run: the verdict is not OK: {verdict}")
    print(f"  site: {took:.1f} s (load {before} -> {phases['site']['load_after']})", flush=True)
    profile = parse_profile(text)
    return {
        "phases": phases,
        "total_s": round(sum(p["s"] for p in phases.values()), 1),
        "recap": rows,
        "verdict": {k: verdict.get(k) for k in ("ok", "profile", "node_kind", "gpu_verified")},
        "stages_s": {k: round(v, 1) for k, v in sorted(profile.plays.items(), key=lambda i: -i[1])},
        "slowest_tasks": [[p, t, round(s, 1)] for p, t, s in profile.slowest(12)],
    }


# --- the machine's floor: plain apt-get and pip, one node alone, then three at once -----------

IMAGE_MANUAL = "apt-mark showmanual"


def sh(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def dexec(node: str, script: str) -> str:
    return sh(["docker", "exec", node, "bash", "-euo", "pipefail", "-c", script])


def manual_packages(node: str) -> set[str]:
    return set(dexec(node, IMAGE_MANUAL).split())


def floor_script(packages: list[str], sources: str) -> str:
    """apt-get update + install of ``packages`` with the converged node's apt sources, then the
    cluster venv with pip from the lab's wheelhouse, as gpu_env's pip.conf gives it."""
    return (
        f"{sources}\n"
        "export DEBIAN_FRONTEND=noninteractive\n"
        "apt-get update -qq\n"
        f"apt-get install -y -qq --no-install-recommends {' '.join(packages)} >/dev/null\n"
        "python3 -m venv /opt/floor\n"
        "/opt/floor/bin/pip install -q --disable-pip-version-check"
        " --find-links http://apt-cache:8080/ --trusted-host apt-cache"
        f" {' '.join(VENV_PACKAGES)}\n"
    )


def copy_sources(node: str) -> str:
    """A shell snippet that writes the converged node's apt sources files on another node."""
    listing = dexec(node, "cd /etc/apt && find sources.list.d preferences.d -type f").split()
    parts = []
    for rel in listing:
        text = dexec(node, f"cat /etc/apt/{rel}")
        parts.append(f"cat > /etc/apt/{rel} <<'GPUENV_EOF'\n{text}GPUENV_EOF")
    return "\n".join(parts)


def timed_exec(node: str, script: str) -> float:
    t0 = time.monotonic()
    dexec(node, script)
    return time.monotonic() - t0


def floor(runner: Runner, logs: Path, source: str = "") -> dict[str, object]:
    """What site.yml installed, read from the converged lab (the run's, which then goes: the
    disk holds only so many nodes with CUDA; or ``source``, another converged lab, left as it
    is); a fresh 1-node lab installs it alone, then a fresh 3-node lab on its three nodes at
    once."""
    converged = f"{source or runner.name}-node1"
    sources = copy_sources(converged)
    after = manual_packages(converged)
    if not source:
        runner.down(logs / "down.log", purge=False)
    lab = f"{runner.name}-floor"
    record: dict[str, object] = {"venv": VENV_PACKAGES, "load_before": load()}
    script = ""
    for count, key in ((1, "one_node_s"), (3, "three_nodes_at_once_s")):
        up = [runner.gpuenv, "lab", "up", "--nodes", str(count), "--distro", "bookworm",
              "--name", lab]  # fmt: skip
        runner.must("lab up (floor)", up, logs / f"floor-up{count}.log")
        try:
            nodes = [f"{lab}-node{i}" for i in range(1, count + 1)]
            if not script:
                record["packages"] = sorted(after - manual_packages(nodes[0]))
                script = floor_script(record["packages"], sources)  # type: ignore[arg-type]
            with ThreadPoolExecutor(max_workers=count) as pool:
                t0 = time.monotonic()
                list(pool.map(timed_exec, nodes, [script] * count))
                record[key] = round(time.monotonic() - t0, 1)
        finally:
            runner.down(logs / "floor-down.log", purge=False, name=lab)
    record["load_after"] = load()
    return record


# A fresh run holds three nodes with CUDA 11.8, the apt cache volume (about 2.6 GB) and the images:
# more than 17 GB was seen before the CUDA install had finished (docs/benchmarks.md).
MIN_FREE_GIB = 25
DOCKER_ROOT = Path("/var/lib/docker")


def free_gib(path: Path) -> float:
    return shutil.disk_usage(path if path.exists() else ROOT).free / 2**30


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--prefix", default="gpuenvdemo", help="GPUENV_LAB_PREFIX for the run")
    parser.add_argument("--name", default="demofr", help="the lab's name")
    parser.add_argument("--keep-base", action="store_true", help="keep the debootstrap tarballs")
    parser.add_argument("--limit", action="store_true", help="also measure the machine's floor")
    parser.add_argument(
        "--floor-only",
        metavar="LAB",
        help="no runs: only the floor, reading what site.yml installed from converged lab LAB",
    )
    parser.add_argument("--logs", type=Path, default=ROOT / ".cache" / "bench" / "demo_first_run")
    parser.add_argument("--json", type=Path, help="also write the record here")
    parser.add_argument("--min-free-gib", type=float, default=MIN_FREE_GIB)
    args = parser.parse_args()
    if args.runs < 1:
        print("demo_first_run: --runs must be >= 1", file=sys.stderr)
        return 2
    # Labs of other work share the disk: a run that fills it breaks theirs too.
    free = free_gib(DOCKER_ROOT)
    if free < args.min_free_gib:
        print(
            f"demo_first_run: {free:.1f} GiB free under {DOCKER_ROOT}, a run needs about"
            f" {args.min_free_gib} GiB (--min-free-gib): not started",
            file=sys.stderr,
        )
        return 1
    runner = Runner(args.prefix, args.name)
    if args.floor_only:
        print(f"floor, from lab {args.floor_only} (load {load()})", flush=True)
        text = json.dumps({"floor": floor(runner, args.logs, args.floor_only)}, indent=2)
        print(text)
        if args.json:
            args.json.write_text(text + "\n")
        return 0
    runs = []
    try:
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs} (load {load()})", flush=True)
            runs.append(one_run(runner, args, args.logs / f"run{i + 1}"))
            print(f"  total: {runs[-1]['total_s']} s", flush=True)
            limit = floor(runner, args.logs) if args.limit and i == args.runs - 1 else None
            runner.down(args.logs / "down.log", purge=False)
    except BaseException:
        subprocess.run([runner.gpuenv, "lab", "down", "--name", runner.name], cwd=ROOT,
                       env=runner.env, check=False, capture_output=True)  # fmt: skip
        raise
    keys = list(runs[0]["phases"])  # type: ignore[call-overload]
    record: dict[str, object] = {
        "command": " ".join(["python", "benchmarks/demo_first_run.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "kept": "the controller's .venv, host packages, pip's download cache"
        + (", the debootstrap tarballs" if args.keep_base else ""),
        "phases_s": {k: spread([r["phases"][k]["s"] for r in runs]) for k in keys},  # type: ignore[index]
        "total_s": spread([float(r["total_s"]) for r in runs]),  # type: ignore[arg-type]
        "runs": runs,
    }
    if args.limit:
        record["floor"] = limit
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
