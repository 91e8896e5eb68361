"""The cluster stages' judges: what a stage measured goes in, its Results come out.

gpuenv.cluster.pipeline runs the stages (fan-outs, launches) and gathers what the nodes
answered; the rules that turn those answers into PASS, FAIL or SKIP live here, as functions of
plain data, so that they read (and are tested) without a node. Every Result here belongs to the
whole cluster (node ``CLUSTER_NODE``). A measurement without a pass mark is never a PASS: it is
a SKIP that names what is missing.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.checks import dask as dask_check
from gpuenv.checks import fabric, nccl_log
from gpuenv.cluster import pairs
from gpuenv.cluster.defaults import MIB
from gpuenv.results import CLUSTER_NODE, Measurement, Result, Status


def skip(check: str, reason: str) -> Result:
    return Result(check, CLUSTER_NODE, Status.SKIP, reason)


def _mib(nbytes: int) -> str:
    return f"{nbytes / MIB:g} MiB"


def torchrun_failed(bad: Mapping[str, str], world: int, details: dict[str, Any],
                    duration_s: float) -> list[Result]:  # fmt: skip
    """The all-node torchrun did not complete on every node: allreduce names the nodes, and
    busbw and ddp did not run to the end."""
    why = "; ".join(f"{n}: {w}" for n, w in bad.items())
    return [
        Result("allreduce", CLUSTER_NODE, Status.FAIL,
               f"torchrun across nodes failed: {why}", [_ranks(world)], duration_s=duration_s,
               details=details),
        *(Result(check, CLUSTER_NODE, Status.FAIL,
                 "not run to the end: torchrun across nodes failed") for check in ("busbw", "ddp")),
    ]  # fmt: skip


def _ranks(world: int) -> Measurement:
    return Measurement("ranks", world, "", 2.0, "min")


def allreduce(world: int, nodes: int, backend: str, sizes: Sequence[int],
              details: dict[str, Any], duration_s: float) -> Result:  # fmt: skip
    """Every node's ranks reported correct all-reduce values at every size."""
    return Result("allreduce", CLUSTER_NODE, Status.PASS,
                  f"{world} ranks on {nodes} nodes ({backend}): values verified at"
                  f" {len(sizes)} sizes", [_ranks(world)], duration_s=duration_s,
                  details=details)  # fmt: skip


def ddp(problems: Mapping[str, str], world: int, step_s: float, max_loss_ratio: float,
        backend: str, duration_s: float) -> Result:  # fmt: skip
    """The DDP step across nodes, by the node check's own rule (gpuenv.checks.ddp.problems)."""
    return Result(
        "ddp", CLUSTER_NODE, Status.FAIL if problems else Status.PASS,
        "; ".join(f"{n}: {w}" for n, w in problems.items())
        or f"{world} ranks: parameters identical, loss fell to <= {max_loss_ratio} x",
        [Measurement("step_time", round(step_s, 4), "s"), _ranks(world)],
        duration_s=duration_s, details={"backend": backend},
    )  # fmt: skip


@dataclass
class Bandwidth:
    """What the all-node bandwidth is judged with."""

    sweeps: Mapping[str, Sequence[Mapping[str, Any]]]  # node -> busbw against size
    backend: str
    transports: nccl_log.Transports
    link_gbps: float | None  # the slowest node's link for the transport NCCL used
    active_ib: Mapping[str, list[str]]  # node -> its active InfiniBand/RoCE ports
    min_busbw: float | None  # --min-busbw
    size: int  # bytes of the largest all-reduce
    # node -> its fabric (ports, settings, GDR facts), where the probe read it
    nodes: Mapping[str, fabric.NodeFabric] = field(default_factory=dict)
    # node -> what NCCL's log said there (every local rank's log together)
    per_node: Mapping[str, nccl_log.Transports] = field(default_factory=dict)
    gpu_nodes: frozenset[str] = frozenset()  # nodes whose ranks ran on GPUs
    gdr_required: bool = True  # thresholds.yaml fabric.gdr_required / --no-gdr-required


def _fabric_problems(bw: Bandwidth) -> list[str]:
    """The rules of the rails across nodes (gpuenv.checks.fabric): no socket fallback where a
    node has rails, every active rail used, GPUDirect RDMA where GPUs talk over IB/RoCE."""
    if not bw.nodes:
        return nccl_log.inter_node_problems(bw.transports, bw.active_ib)
    if not bw.transports.seen:
        return ["NCCL's log shows no connection (NCCL_DEBUG=INFO lines missing): transport unknown"]
    found = fabric.fallback_problems(bw.nodes, bw.transports)
    found += fabric.rail_use_problems(bw.nodes, bw.per_node)
    found += fabric.rate_problems_across(bw.nodes)
    if bw.gdr_required:
        for name, node in sorted(bw.nodes.items()):
            t = bw.per_node.get(name, nccl_log.Transports())
            found += fabric.gdr_problems(name, node, t, name in bw.gpu_nodes)
    return found


def _derived_floor(bw: Bandwidth, link: float | None) -> tuple[float | None, str]:
    """The floor from what NCCL used: the rails of every node (``fabric.rails_floor``) over
    IB/RoCE, else the slowest node's link for the transport."""
    if nccl_log.NET_IB in bw.transports.families and bw.nodes:
        floor, source = fabric.rails_floor(bw.nodes, bw.per_node)
        if floor is not None:
            return floor, source
        why = f"; rails unknown: {source}"
    else:
        why = ""
    floor = nccl_log.floor_gbps(bw.transports, link)
    return floor, f"{bw.transports.summary()} on {link} GB/s links{why}" if floor else ""


def busbw(bw: Bandwidth) -> tuple[Result, float | None]:
    """The all-node bandwidth against a floor, and that floor: --min-busbw, else derived from the
    transport NCCL used and the rails it used (docs/cluster.md, "The cross-node floor"). No
    floor: SKIP naming what is missing."""
    largest = [s[-1]["busbw_gbps"] for s in bw.sweeps.values() if s]
    value = min(largest) if largest else 0.0
    nccl = bw.backend == "nccl"
    details: dict[str, Any] = {"transport": bw.transports.to_dict(), "backend": bw.backend}
    problems = _fabric_problems(bw) if nccl else []
    link = bw.link_gbps if nccl else None
    floor, source = bw.min_busbw, "--min-busbw"
    if floor is None and nccl:
        floor, source = _derived_floor(bw, link)
    details.update(floor_gbps=floor, floor_from=source, link_gbps=link)
    size = _mib(bw.size)
    m = Measurement("busbw", round(value, 3), "GB/s", floor, "min" if floor is not None else None)
    if floor is not None and value < floor:
        problems.append(f"busbw {value:.2f} GB/s at {size} < {floor:.2f} GB/s ({source})")
    if nccl and nccl_log.NET_IB in bw.transports.families and largest:
        problems += fabric.one_rail_problems(bw.nodes, value)
    if problems:
        return Result("busbw", CLUSTER_NODE, Status.FAIL, "; ".join(problems), [m],
                      details=details), floor  # fmt: skip
    if floor is None:
        missing = (
            f"{bw.backend} has no NCCL transport to derive a floor from"
            if not nccl
            else "the nodes' link speeds are unknown (no /sys/class/net or infiniband rate)"
        )
        return Result("busbw", CLUSTER_NODE, Status.SKIP,
                      f"busbw {value:.2f} GB/s at {size} NOT JUDGED: {missing};"
                      " give --min-busbw", [m], details=details), floor  # fmt: skip
    return Result("busbw", CLUSTER_NODE, Status.PASS,
                  f"busbw {value:.2f} GB/s at {size} >= {floor:.2f} GB/s ({source})",
                  [m], details=details), floor  # fmt: skip


def mpi_failed(master: str, why: str, command: str, duration_s: float) -> Result:
    return Result("mpi", CLUSTER_NODE, Status.FAIL, f"mpirun from {master}: {why}",
                  duration_s=duration_s, details={"command": command})  # fmt: skip


def mpi(payload: Mapping[str, Any], nodes: int, want_hosts: int, command: str,
        duration_s: float) -> Result:  # fmt: skip
    """mpirun's rank 0 report: a correct all-reduce over one rank per node, spread over
    ``want_hosts`` hosts (1 for emulated nodes, which share one)."""
    p = payload
    spread = len(set(p.get("rank_hosts", [])))
    ok = bool(p.get("correct")) and spread >= want_hosts and p.get("world_size") == nodes
    ok = ok and nodes >= 2
    reason = (
        f"{p.get('world_size')} ranks on {spread} host(s), all-reduce "
        f"{'correct' if p.get('correct') else 'WRONG'}, {p.get('busbw_gbps', 0):.2f} GB/s"
        f" (plain python3 from {p.get('python', '?')})"
    )
    if spread < want_hosts:
        reason += f"; expected ranks on {want_hosts} hosts"
    return Result(
        "mpi", CLUSTER_NODE, Status.PASS if ok else Status.FAIL, reason,
        [Measurement("ranks", int(p.get("world_size", 0)), "", 2.0, "min"),
         Measurement("busbw", round(float(p.get("busbw_gbps", 0.0)), 3), "GB/s")],
        versions={"mpi": str(p.get("mpi", ""))}, duration_s=duration_s,
        details={"rank_hosts": p.get("rank_hosts", []), "command": command},
    )  # fmt: skip


def pair_matrix(matrix: Mapping[pairs.Pair, float | None], floor: float | None,
                relative: float, pair_bytes: int, duration_s: float,
                notes: Mapping[pairs.Pair, str] | None = None, in_launch: int = 0,
                launch_failures: Mapping[str, str] | None = None,
                ) -> tuple[Result, dict[str, float | None]]:  # fmt: skip
    """Every pair against ``relative`` x the median and against the floor (the all-node run's,
    or --min-busbw); the pass marks it used, for the report's plots. ``notes``: why a pair
    failed where it is known (the pair phase of the all-node launch names the node that gave
    the error and the one that sent nothing); ``in_launch``: how many pairs that launch
    measured (the others had launches of their own); ``launch_failures``: the nodes whose
    all-node launch failed in its pair phase, and why."""
    notes = notes or {}
    failed = [f"{a}-{b}" + (f" ({notes[(a, b)]})" if (a, b) in notes else "")
              for (a, b), v in matrix.items() if v is None]  # fmt: skip
    values = [v for v in matrix.values() if v is not None]
    med = statistics.median(values) if values else 0.0
    mark = relative * med
    marks = {"pair_median_gbps": med, "pair_relative_gbps": mark, "pair_floor_gbps": floor}
    slow = [f"{a}-{b} ({v:.2f} GB/s)" for (a, b), v in matrix.items()
            if v is not None and v < mark]  # fmt: skip
    below = [f"{a}-{b} ({v:.2f} GB/s)" for (a, b), v in matrix.items()
             if v is not None and floor is not None and v < floor]  # fmt: skip
    problems = [
        *([f"pairs failed: {', '.join(failed)}"] if failed else []),
        *([f"pairs below {relative:g} x median {med:.2f} GB/s: {', '.join(slow)}"]
          if slow else []),
        *([f"pairs below the floor {floor:.2f} GB/s: {', '.join(below)}"] if below else []),
        *([f"the all-node launch failed in its pair phase: "
           f"{'; '.join(f'{n}: {w}' for n, w in launch_failures.items())}"]
          if launch_failures else []),
    ]  # fmt: skip
    ms = [Measurement("pairs", len(matrix)),
          Measurement("median_busbw", round(med, 3), "GB/s", floor,
                      "min" if floor is not None else None)]  # fmt: skip
    details: dict[str, Any] = {"in_all_node_launch": in_launch,
                               "own_launches": len(matrix) - in_launch}  # fmt: skip
    if launch_failures:
        details["all_node_launch_failed"] = dict(launch_failures)
    if problems:
        return Result("pair-matrix", CLUSTER_NODE, Status.FAIL, "; ".join(problems), ms,
                      duration_s=duration_s, details=details), marks  # fmt: skip
    text = f"{len(matrix)} pairs, median {med:.2f} GB/s at {_mib(pair_bytes)}"
    if floor is None:
        return Result("pair-matrix", CLUSTER_NODE, Status.SKIP,
                      f"{text}; every pair >= {relative:g} x median, but NOT JUDGED"
                      " against an absolute floor (none derived; give --min-busbw)", ms,
                      duration_s=duration_s, details=details), marks  # fmt: skip
    return Result("pair-matrix", CLUSTER_NODE, Status.PASS,
                  f"{text}; every pair >= {floor:.2f} GB/s and >= {relative:g} x"
                  " median", ms, duration_s=duration_s, details=details), marks  # fmt: skip


def isolation(iso: pairs.Isolation, duration_s: float) -> Result:
    """Bad-node isolation: PASS when every pair passed, else the nodes and links it found."""
    parts = []
    if iso.bad_nodes:
        parts.append(f"bad node(s): {', '.join(iso.bad_nodes)}")
    if iso.bad_links:
        parts.append(f"bad link(s): {', '.join(f'{a}-{b}' for a, b in iso.bad_links)}")
    if iso.unresolved:
        parts.append(f"undecided: {', '.join(iso.unresolved)}")
    return Result(
        "isolation", CLUSTER_NODE, Status.PASS if iso.ok else Status.FAIL,
        "; ".join(parts) or "every pair passed: no bad node found",
        [Measurement("rounds", len(iso.rounds)),
         Measurement("pair_threshold", round(iso.threshold or 0.0, 3), "GB/s")],
        duration_s=duration_s,
        details={"bad_nodes": iso.bad_nodes, "bad_links": [list(p) for p in iso.bad_links],
                 "unresolved": iso.unresolved},
    )  # fmt: skip


@dataclass
class DaskRun:
    """What the dask stage's nodes answered."""

    answers: Mapping[str, Mapping[str, Any] | str]  # node -> its driver's report, or why none
    total: int  # workers on every node together
    distinct_gpus: int  # GPUs the workers may use, counted once
    emulated: bool  # the nodes share one machine (and one address)
    blocks: str  # "cupy" or "numpy"
    scheduler: str  # NODE:PORT of the scheduler (on the first node)
    duration_s: float


def dask(run: DaskRun) -> Result:
    """A dask cluster across the nodes: every worker joined and computed, the client's result
    equals numpy's, every process exited cleanly and nothing was left running."""
    found: list[str] = []
    client: Mapping[str, Any] = {}
    left: dict[str, list[str]] = {}
    for name, answer in run.answers.items():
        if isinstance(answer, str):
            found.append(f"{name}: {answer}")
            continue
        if answer["kind"] == "dask":
            client = answer
        if answer.get("left_running"):
            left[name] = list(answer["left_running"])
        failed = [c for c in answer.get("exit_codes", []) if c != 0]
        if failed:
            found.append(f"{name}: dask process(es) exited with {sorted(set(failed))}")
    found += [f"{n}: still running after shutdown: {', '.join(p)}" for n, p in left.items()]
    nodes = len(run.answers)
    if client:
        found += dask_check.problems(client, run.total, run.distinct_gpus)
        spread = len(client.get("worker_hosts", []))
        if spread < (1 if run.emulated else nodes):  # emulated nodes share one address
            found.append(f"workers on {spread} of {nodes} nodes")
    ms = [
        Measurement("workers", len(client.get("workers", [])), "", float(run.total), "min"),
        Measurement("compute_time", round(float(client.get("compute_s", 0.0)), 3), "s"),
    ]
    details = {
        "blocks": run.blocks,
        "workers": client.get("workers", []),
        "left_running": left,
        "worker_gpus": client.get("worker_gpus", {}),
        "scheduler": run.scheduler,
    }
    if found:
        return Result("dask", CLUSTER_NODE, Status.FAIL, "; ".join(found), ms,
                      duration_s=run.duration_s, details=details)  # fmt: skip
    where = "CuPy blocks" if run.blocks == "cupy" else "numpy blocks (CPU-only nodes)"
    master = run.scheduler.rsplit(":", 1)[0]
    return Result(
        "dask", CLUSTER_NODE, Status.PASS,
        f"{run.total} workers on {nodes} nodes (scheduler on {master}), {where}:"
        f" (x + x.T).mean(axis=0) of {client['n']}x{client['n']} equals numpy's; every worker"
        " computed; nothing left running",
        ms, versions={"dask": client["dask"], "distributed": client["distributed"]},
        duration_s=run.duration_s, details=details,
    )  # fmt: skip


# ---------------------------------------------------------------- the fabric stage


def fabric_counters(
    before: Mapping[str, Mapping[str, Mapping[str, int]]],
    after: Mapping[str, Mapping[str, Mapping[str, int]] | str],
    duration_s: float,
) -> Result:
    """Every node's port error counters before the multi-node runs and after them: a counter
    that grew FAILs naming node and port; a node that did not answer the second read FAILs."""
    found: list[str] = []
    for name, now in sorted(after.items()):
        if isinstance(now, str):
            found.append(f"{name}: counters not read after the runs: {now}")
            continue
        found += [f"{name} {p}" for p in fabric.counter_problems(before.get(name, {}), now)]
    ports = sum(len(v) for v in before.values())
    ms = [Measurement("ports", ports)]
    if found:
        return Result("fabric-counters", CLUSTER_NODE, Status.FAIL, "; ".join(found), ms,
                      duration_s=duration_s)  # fmt: skip
    return Result("fabric-counters", CLUSTER_NODE, Status.PASS,
                  f"no error counter grew on {ports} port(s) of {len(after)} node(s) during the"
                  " multi-node runs", ms, duration_s=duration_s)  # fmt: skip


@dataclass
class RailRun:
    """One ib_write_bw run between two nodes over one rail."""

    client: str
    server: str
    rail: str  # mlx5_0:1 (the client's device and port)
    rate_gbps: float | None  # the slower end's port rate, GB/s
    output: str  # the client's ib_write_bw output (or why there is none)
    cuda: bool  # --use_cuda: GPU memory at both ends (GPUDirect RDMA)


def fabric_pairs(runs: Sequence[RailRun], efficiency: float, duration_s: float) -> Result:
    """Every rail between paired nodes at >= ``efficiency`` x the port rate (perftest's
    ib_write_bw average); a run without a summary FAILs naming the pair and rail."""
    found, ms, judged = [], [], 0
    for run in runs:
        where = f"{run.client} -> {run.server} over {run.rail}"
        got = fabric.parse_ib_write_bw(run.output)
        if got is None:
            tail = " ".join(run.output.strip().splitlines()[-2:])[-200:]
            found.append(f"{where}: ib_write_bw gave no result ({tail or 'no output'})")
            continue
        mark = efficiency * run.rate_gbps if run.rate_gbps else None
        name = f"{run.client}-{run.server}.{run.rail}"
        ms.append(Measurement(name, round(got["average_gbps"], 2), "GB/s", mark,
                              "min" if mark else None))  # fmt: skip
        if mark is None:
            found.append(f"{where}: port rate unknown, {got['average_gbps']:.1f} GB/s not judged")
        elif got["average_gbps"] < mark:
            found.append(
                f"{where}: {got['average_gbps']:.1f} GB/s < {efficiency:g} x {run.rate_gbps:g} GB/s"
                f" port rate{' (GPU memory)' if run.cuda else ''}"
            )
        else:
            judged += 1
    if found:
        return Result("fabric-pairs", CLUSTER_NODE, Status.FAIL, "; ".join(found), ms,
                      duration_s=duration_s)  # fmt: skip
    memory = "GPU memory (--use_cuda)" if runs and all(r.cuda for r in runs) else "host memory"
    return Result("fabric-pairs", CLUSTER_NODE, Status.PASS,
                  f"{judged} rail run(s) by ib_write_bw, {memory}: each >= {efficiency:g} x its"
                  " port rate", ms, duration_s=duration_s)  # fmt: skip
