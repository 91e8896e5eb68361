"""`gpuenv cluster --profile cpu` on a converged lab: wall time and where it goes, per stage.

    python benchmarks/cluster_cpu.py -i inventory/lab-ol/hosts.yml --runs 5
    python benchmarks/cluster_cpu.py -i inventory/lab-ol/hosts.yml --runs 5 \\
        --variant base=/tmp/base:/tmp/wheels/base/gpuenv-0.1.0-py3-none-any.whl \\
        --variant after=.:/tmp/wheels/after/gpuenv-0.1.0-py3-none-any.whl [--play]

Each run starts `python -m gpuenv cluster -i INVENTORY --profile cpu` as a user does (a new
process: Python's start, the CLI's imports, `ansible-inventory`, every stage), with a wrapper
that times each stage of gpuenv.cluster.pipeline as it runs (the probe and every entry of
``STAGES``; the same names on older trees). The wall time is the whole process's.

With ``--variant NAME=TREE:WHEEL`` (two or more), the variants take turns run by run (A B A B
...), so that a change of load on a shared machine falls on both: before each of its runs, the
variant's gpuenv wheel is installed into the nodes' cluster venv (untimed; the workers on the
nodes are then the same code as the controller's ``TREE``, checked by the hash of
gpuenv/cluster/worker.py) and the controller runs ``TREE`` through PYTHONPATH. ``--play`` also
times the validate stage of site.yml (``ansible-playbook TREE/playbooks/validate.yml``) per run.

With ``--floor``, each run also times the floor under the stages, through the same SSH logins
and launchers (gpuenv.cluster.fanout, the cluster user's login shell, ``torchrun`` with c10d
rendezvous on the first node, ``mpirun`` with the ``mpi`` role's hostfile): ``login``, one SSH
login per node running ``python3 -c pass``; ``torchrun``, the smallest DDP job a user could
launch across the nodes (``torchrun ... --no-python python3 -c JOB``, the text of
benchmarks/ddp_floor_job.py: import torch, a process group, DDP of one Linear layer, 5
steps); ``mpirun``, one rank per node importing mpi4py and numpy and meeting at a barrier.
What a stage takes above its floor is gpuenv's own.

Prints, per variant, each figure as min / median / max over the runs, and one JSON record
(``--out`` writes it to a file too). Exit 0 when every run of every variant exited 0.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_VENV = "/opt/gpuenv"
# The extra variables scripts/demo.sh gives site.yml on a Debian 12 lab.
DEMO_VARS = (
    "-e @inventory/pins/debian-12.yml -e gpu_env_install_torch=true"
    " -e gpu_env_torch_package=torch==2.13.0"
)
# Runs inside the timed process: wraps each stage with a timer, then runs the CLI as is.
DRIVER = r"""
import dataclasses, json, sys, time
from gpuenv.cluster import pipeline
timings = {}
def timed(name, fn):
    def run(state):
        t0 = time.monotonic()
        try:
            return fn(state)
        finally:
            timings[name] = timings.get(name, 0.0) + time.monotonic() - t0
    return run
pipeline.probe_stage = timed("probe", pipeline.probe_stage)
pipeline.STAGES = tuple(dataclasses.replace(s, run=timed(s.name, s.run)) for s in pipeline.STAGES)
from gpuenv.cli import main
try:
    rc = main(sys.argv[2:])
except SystemExit as exc:
    rc = exc.code
with open(sys.argv[1], "w") as fh:
    json.dump({"stages": timings, "pipeline": pipeline.__file__}, fh)
sys.exit(rc)
"""


# The floor: the same logins and launchers with the smallest jobs (run with PYTHONPATH=tree).
FLOOR = r"""
import json, shlex, sys, time
from gpuenv.cluster import fanout, inventory
JOB = open(sys.argv[3]).read()
hosts = inventory.load(sys.argv[2])
master, n = hosts[0], len(hosts)
rid = f"floor{time.time_ns()}"
def torchrun(h):
    argv = ["torchrun", f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master.rendezvous_address}:29390", f"--rdzv-id={rid}",
            f"--rdzv-conf=join_timeout=60,is_host={int(h is master)}", "--max-restarts=0",
            "--no-python", "python3", "-c", JOB]
    return shlex.join(argv)
mpi = (f"mpirun --hostfile {shlex.quote(master.hostfile)} --map-by ppr:1:node -np {n} python3 -c"
       " 'from mpi4py import MPI; import numpy; MPI.COMM_WORLD.Barrier()'")
got = {}
for name, hs, cmd in (("login", hosts, lambda h: "python3 -c pass"),
                      ("torchrun", hosts, torchrun), ("mpirun", [master], lambda h: mpi)):
    t0 = time.monotonic()
    out = fanout.fan_out(hs, cmd, 120.0)
    got[name] = time.monotonic() - t0
    bad = [f"{k}: {o.why()}" for k, o in out.items() if not o.ok]
    if bad:
        raise SystemExit(f"floor {name} failed: {'; '.join(bad)}")
json.dump(got, open(sys.argv[1], "w"))
"""


def floor_run(tree: Path, inventory: str, env: dict[str, str], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "floor.json"
        job = str(ROOT / "benchmarks" / "ddp_floor_job.py")
        done = run([sys.executable, "-c", FLOOR, str(out), inventory, job],
                   {**env, "PYTHONPATH": str(tree)}, timeout_s, cwd=tree)  # fmt: skip
        if done.returncode:
            raise SystemExit(f"the floor run failed:\n{done.stdout}{done.stderr}")
        return json.loads(out.read_text())


def spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


def run(
    argv: list[str], env: dict[str, str], timeout_s: float, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """``argv`` in ``cwd``: a variant's runs start in its own tree, because ``python -c`` and
    ``python -m`` put the working folder before PYTHONPATH (from ROOT a variant would import
    ROOT's gpuenv, whatever PYTHONPATH says)."""
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def install_wheel(inventory: str, wheel: Path, tree: Path, env: dict[str, str]) -> None:
    """The variant's gpuenv on every node's cluster venv, checked by worker.py's hash."""
    ansible = str(Path(sys.executable).parent / "ansible")
    dest = f"/tmp/{wheel.name}"
    pip = f"{NODE_VENV}/bin/python -m pip install -q --no-deps --force-reinstall --no-index {dest}"
    for module, args in (("ansible.builtin.copy", f"src={wheel} dest={dest} mode=0644"),
                         ("ansible.builtin.command", pip)):  # fmt: skip
        done = run([ansible, "all", "-i", inventory, "-b", "-m", module, "-a", args], env, 600)
        if done.returncode:
            raise SystemExit(f"installing {wheel} on the nodes failed:\n{done.stdout}{done.stderr}")
    want = hashlib.sha256((tree / "gpuenv/cluster/worker.py").read_bytes()).hexdigest()
    probe = (f"{NODE_VENV}/bin/python -c 'import gpuenv.cluster.worker as w, hashlib;"
             " print(hashlib.sha256(open(w.__file__, \"rb\").read()).hexdigest())'")  # fmt: skip
    done = run([ansible, "all", "-i", inventory, "-m", "ansible.builtin.shell", "-a", probe], env,
               120)  # fmt: skip
    if done.stdout.count(want) < 1 or done.returncode:
        raise SystemExit(f"the nodes do not run {tree}'s worker.py:\n{done.stdout}{done.stderr}")


def one_run(tree: Path, inventory: str, extra: list[str], env: dict[str, str],
            timeout_s: float) -> dict:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        stages_file = Path(tmp) / "stages.json"
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-c", DRIVER, str(stages_file), "cluster", "-i", inventory,
                "--profile", "cpu", "--no-progress", "--json", str(report), *extra]  # fmt: skip
        env = {**env, "PYTHONPATH": str(tree)}
        t0 = time.monotonic()
        done = run(argv, env, timeout_s, cwd=tree)
        wall = time.monotonic() - t0
        got = json.loads(stages_file.read_text()) if stages_file.exists() else {}
        stages = got.get("stages", {})
        if got and not Path(got["pipeline"]).resolve().is_relative_to(tree.resolve()):
            raise SystemExit(f"the run imported {got['pipeline']}, not {tree}'s gpuenv")
        data = json.loads(report.read_text()) if report.exists() else {}
    failed = [f"{r['check']}@{r['node']}" for r in data.get("results", [])
              if r["status"] in ("FAIL", "ERROR")]  # fmt: skip
    return {"rc": done.returncode, "wall_s": wall, "stages_s": stages, "failed": failed,
            "stderr_tail": done.stderr[-600:] if done.returncode else ""}  # fmt: skip


def play_run(tree: Path, inventory: str, play_vars: list[str], env: dict[str, str],
             timeout_s: float) -> dict:  # fmt: skip
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    argv = [playbook, "-i", inventory, str(tree / "playbooks/validate.yml"), *play_vars]
    t0 = time.monotonic()
    done = run(argv, {**env, "PYTHONPATH": str(tree)}, timeout_s, cwd=tree)
    return {
        "rc": done.returncode,
        "wall_s": time.monotonic() - t0,
        "stderr_tail": (done.stdout + done.stderr)[-600:] if done.returncode else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=TREE:WHEEL (two or more take turns); default: this tree as is",
    )
    parser.add_argument("--play", action="store_true", help="also time playbooks/validate.yml")
    parser.add_argument("--play-vars", default=DEMO_VARS,
                        help="extra arguments of the validate play (the demo's)")  # fmt: skip
    parser.add_argument("--extra", default="", help="more `gpuenv cluster` arguments")
    parser.add_argument(
        "--floor", action="store_true", help="also time the floor: logins, torchrun, mpirun"
    )
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    variants: list[tuple[str, Path, Path | None]] = []
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        tree, _, wheel = rest.partition(":")
        if not name or not tree or not wheel or not Path(wheel).is_file():
            parser.error(f"--variant {spec!r}: expected NAME=TREE:WHEEL with an existing wheel")
        variants.append((name, Path(tree).resolve(), Path(wheel).resolve()))
    if not variants:
        variants = [("this tree", ROOT, None)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    extra = shlex.split(args.extra)
    records: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for i in range(args.runs):
        for name, tree, wheel in variants:
            if wheel is not None and (len(variants) > 1 or i == 0):
                install_wheel(args.inventory, wheel, tree, env)
            rec = one_run(tree, args.inventory, extra, env, args.timeout_s)
            if args.play:
                rec["play"] = play_run(tree, args.inventory, shlex.split(args.play_vars), env,
                                       args.timeout_s)  # fmt: skip
            if args.floor:
                rec["floor_s"] = floor_run(tree, args.inventory, env, args.timeout_s)
            records[name].append(rec)
            play = f", validate play {rec['play']['wall_s']:.1f} s" if args.play else ""
            print(
                f"run {i + 1} {name}: rc {rec['rc']}, {rec['wall_s']:.1f} s{play}; "
                + ", ".join(f"{k} {v:.1f}" for k, v in rec["stages_s"].items())
                + (f"; not passed: {', '.join(rec['failed'])}" if rec["failed"] else "")
                + (
                    "; floor: " + ", ".join(f"{k} {v:.1f}" for k, v in rec["floor_s"].items())
                    if args.floor
                    else ""
                ),
                flush=True,
            )
    summary: dict[str, dict] = {}
    for name, recs in records.items():
        stages = list(dict.fromkeys(k for r in recs for k in r["stages_s"]))
        summary[name] = {
            "runs": len(recs),
            "exit_codes": [r["rc"] for r in recs],
            "wall_s": spread([r["wall_s"] for r in recs]),
            "stages_s": {k: spread([r["stages_s"].get(k, 0.0) for r in recs]) for k in stages},
        }
        if args.floor:
            summary[name]["floor_s"] = {k: spread([r["floor_s"][k] for r in recs])
                                        for k in recs[0]["floor_s"]}  # fmt: skip
        if args.play:
            summary[name]["validate_play_s"] = spread([r["play"]["wall_s"] for r in recs])
            summary[name]["validate_play_rc"] = [r["play"]["rc"] for r in recs]
        print(f"\n{name} ({len(recs)} runs, min / median / max s)")
        w = summary[name]["wall_s"]
        print(f"  gpuenv cluster --profile cpu  {w['min']} / {w['median']} / {w['max']}")
        for k, v in summary[name]["stages_s"].items():
            print(f"    {k:<12} {v['min']} / {v['median']} / {v['max']}")
        for k, v in summary[name].get("floor_s", {}).items():
            print(f"  floor {k:<10} {v['min']} / {v['median']} / {v['max']}")
        if args.play:
            v = summary[name]["validate_play_s"]
            print(f"  validate play  {v['min']} / {v['median']} / {v['max']}")
    record = {"inventory": args.inventory, "summary": summary, "runs": records,
              "load_average": os.getloadavg()}  # fmt: skip
    print(json.dumps(record))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    ok = all(r["rc"] == 0 and (not args.play or r["play"]["rc"] == 0)
             for recs in records.values() for r in recs)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
