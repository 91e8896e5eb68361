"""The broken-cluster set: `gpuenv cluster` over real lab nodes made bad, each fault named.

Run by molecule/cluster/verify.yml last (it leaves the nodes broken; destroy follows), or by
hand with the same environment molecule sets:

    python molecule/cluster/broken_test.py --nodes cl-node1 cl-node2 cl-node3

The controller reaches the nodes over SSH as the lab image's admin user (root may not log in) with
a key made for this run, their host keys read through docker (sshinv.py). Then:

- cl-node2 loses mpi4py from the cluster venv;
- cl-node3 shows an NVIDIA GPU on its PCI bus (a sysfs fixture read through GPUENV_ROOT) that no
  driver answers for;
- a fourth host, ghost, has a name that does not resolve.

`gpuenv cluster --profile cpu` must end not OK (exit 1), name each fault at its node (the missing
mpi4py through the cluster's mpirun, which the nodes' mpi checks are left to), and still run the
healthy node's own checks without a failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sshinv import inventory, on

VENV = "/opt/gpuenv"
FIXTURE = "/opt/gpuenv-fixture"
GPU_ADDRESS = "0000:17:00.0"
DEADLINE_S = 240


def log(msg: str) -> None:
    print(f"broken_test: {msg}", flush=True)


def check(cond: bool, what: str, evidence: object = "") -> None:
    if not cond:
        raise SystemExit(f"broken_test: FAIL: {what}\n{evidence}")
    log(f"ok: {what}")


def break_nodes(nodes: list[str]) -> None:
    on(nodes[1], f"{VENV}/bin/python", "-m", "pip", "uninstall", "-q", "-y", "mpi4py")
    dev = f"{FIXTURE}/sys/bus/pci/devices/{GPU_ADDRESS}"
    # vendor, device and class, as sysfs has them (the node floor reads all three)
    on(nodes[2], "sh", "-c", f"mkdir -p {dev} && echo 0x10de >{dev}/vendor"
                             f" && echo 0x2330 >{dev}/device"
                             f" && echo 0x030200 >{dev}/class")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", nargs=3, required=True, help="healthy, no-mpi4py, pci-fixture")
    parser.add_argument("--user", default="gpuenv", help="the cluster user (ssh_mesh_user)")
    args = parser.parse_args()
    nodes: list[str] = args.nodes
    with tempfile.TemporaryDirectory(prefix="gpuenv-broken-") as tmp:
        faults = {
            nodes[-1]: {"gpuenv_cluster_env": {"GPUENV_ROOT": FIXTURE}},
            "ghost": {"ansible_host": "ghost.invalid"},
        }
        inv = inventory(Path(tmp), nodes, args.user, faults)
        break_nodes(nodes)
        log(f"faults: no mpi4py on {nodes[1]}, a PCI GPU without driver on {nodes[2]}, ghost")
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "gpuenv", "cluster", "-i", str(inv), "--profile", "cpu",
             "--json", "-", "--no-progress", "--deadline", "120", "--skip", "pairs"],
            capture_output=True, text=True, timeout=DEADLINE_S,
        )  # fmt: skip
        wall = time.monotonic() - began
    log(f"gpuenv cluster exit {done.returncode} in {wall:.1f}s")
    print(done.stderr[-3000:], file=sys.stderr)
    report = json.loads(done.stdout)
    by_key = {(r["node"], r["check"]): r for r in report["results"]}

    class Results(dict):
        def __missing__(self, key):
            raise SystemExit(f"broken_test: FAIL: no result {key}; the report: {by_key}")

    results = Results(by_key)
    problems = report["verdict"]["problems"]
    check(done.returncode == 1 and report["verdict"]["ok"] is False, "the verdict is red", problems)

    reach = results[("ghost", "reach")]
    check(reach["status"] == "FAIL" and "does not resolve" in reach["reason"],
          "ghost: FAIL reach, its name does not resolve", reach)  # fmt: skip

    system = results[(nodes[2], "system")]
    check(system["status"] == "FAIL" and GPU_ADDRESS in system["reason"],
          f"{nodes[2]}: FAIL system naming the GPU the driver does not see", system)  # fmt: skip

    # The nodes have no GPUs: each node's mpi check is left to the cluster's mpirun, which
    # stands for it (docs/cluster.md), so the missing mpi4py is named there and by consistency.
    verdicts = report["node_verdicts"]
    check(all("mpi" in verdicts[n]["left_to_cluster"] for n in nodes[:2])
          and (nodes[1], "mpi") not in by_key,
          "the nodes' mpi checks were left to the cluster's mpirun", verdicts)  # fmt: skip
    check(any("cluster mpi FAIL" in p and f"on {nodes[1]} failed" in p for p in problems),
          f"the verdict names the cluster mpirun's failure on {nodes[1]}", problems)  # fmt: skip
    consistency = results[("cluster", "consistency")]
    check(consistency["status"] == "FAIL" and "pkg.mpi4py" in consistency["reason"]
          and nodes[1] in consistency["reason"],
          f"consistency names pkg.mpi4py missing on {nodes[1]}", consistency)  # fmt: skip

    mpi = results[("cluster", "mpi")]
    check(mpi["status"] == "FAIL" and f"on {nodes[1]} failed" in mpi["reason"]
          and "mpi4py" in mpi["reason"]
          and nodes[1] in mpi["details"].get("node_checks_left_here", []),
          f"the cluster mpirun names {nodes[1]}'s rank and its import error, and stands for"
          " the nodes' mpi checks", mpi)  # fmt: skip

    # Its own checks all hold; what it left to the cluster's torch stage stands nowhere (the
    # set has no torch: that stage SKIPs), so its verdict names only that, never a failure.
    healthy = verdicts[nodes[0]]
    check(results[(nodes[0], "reach")]["status"] == "PASS"
          and not [r for r in report["results"] if r["node"] == nodes[0]
                   and r["status"] in ("FAIL", "ERROR")]
          and healthy["problems"]
          and all(p.startswith("left to gpuenv cluster's launches: ") for p in healthy["problems"]),
          f"{nodes[0]} (healthy) ran its own checks and none failed; only the checks it left to"
          " a cluster stage that could not run are unverified", healthy)  # fmt: skip
    check(wall < DEADLINE_S, f"the whole run took {wall:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
