"""Cluster validation, stage by stage, from an inventory to one list of Results.

1. probe: every node answers with its facts (an unreachable node is named here, by the deadline).
2. check: ``gpuenv check --json -`` on every node at once; each node's run report is merged.
3. consistency: all nodes must agree on driver, CUDA, NCCL, Open MPI, Python stack, GPUs, NCCL env.
4. rendezvous: the master port is reachable from every node; socket interfaces exist.
5. torchrun across all nodes (c10d): all-reduce sweep and DDP (NCCL on GPUs, gloo on CPU).
6. mpirun across all nodes over the SSH mesh, with the generated hostfile.
7. pairs: the node-pair bandwidth matrix (small clusters) and, when the all-node run failed or
   was slow, bad-node isolation by parallel rounds of pairs.

Multi-node stages run on the nodes that answered; the others are already named as failed.
"""

from __future__ import annotations

import concurrent.futures as cf
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.cluster import consistency, launch, pairs, preflight
from gpuenv.cluster.fanout import Outcome, fan_out, progress
from gpuenv.cluster.inventory import Host
from gpuenv.results import Measurement, Result, RunReport, Status

MIB = 1 << 20
STAGES = ("check", "consistency", "rendezvous", "torch", "mpi", "pairs")


@dataclass
class Options:
    check_args: list[str] = field(default_factory=lambda: ["--profile", "quick"])
    deadline_s: float = 300.0  # per node command (gpuenv check, each launch)
    probe_deadline_s: float = 30.0
    port: int = 29400
    nproc_per_node: int | None = None  # None: GPUs per node, or 1 without GPUs
    sizes: list[int] = field(default_factory=lambda: [MIB, 8 * MIB, 64 * MIB])
    iters: int = 5
    steps: int = 5
    pair_bytes: int = 64 * MIB
    min_busbw: float | None = None  # GB/s the all-node run must reach; None: not judged
    pair_relative: float = 0.5
    matrix_max_nodes: int = 8
    stages: tuple[str, ...] = STAGES
    show_progress: bool = False


@dataclass
class ClusterRun:
    hosts: list[str]
    results: list[Result] = field(default_factory=list)
    facts: dict[str, dict[str, str]] = field(default_factory=dict)
    reports: dict[str, RunReport] = field(default_factory=dict)
    # busbw against message size, per node (from the torchrun stage)
    sweeps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # GB/s per node pair (None: the pair's run failed)
    matrix: dict[tuple[str, str], float | None] = field(default_factory=dict)
    isolation: pairs.Isolation | None = None
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        iso = self.isolation
        return {
            "kind": "gpuenv-cluster",
            "hosts": self.hosts,
            "duration_s": self.duration_s,
            "ok": not any(r.status.failed for r in self.results),
            "results": [r.to_dict() for r in self.results],
            "facts": self.facts,
            "sweeps": self.sweeps,
            "matrix": [{"a": a, "b": b, "busbw_gbps": v} for (a, b), v in self.matrix.items()],
            "isolation": None
            if iso is None
            else {
                "bad_nodes": iso.bad_nodes,
                "bad_links": [list(p) for p in iso.bad_links],
                "unresolved": iso.unresolved,
                "threshold_gbps": iso.threshold,
                "rounds": [
                    [{"a": a, "b": b, "busbw_gbps": v} for (a, b), v in r.items()]
                    for r in iso.rounds
                ],
            },
        }


def _skip(check: str, reason: str) -> Result:
    return Result(check, "cluster", Status.SKIP, reason)


def _node_failure(check: str, out: Outcome) -> Result:
    return Result(check, out.host, Status.FAIL, out.why(), duration_s=out.duration_s)


def probe_nodes(hosts: Sequence[Host], opts: Options, run: ClusterRun) -> dict[str, dict]:
    """Facts of every node; nodes that do not answer get a FAIL naming them."""
    outcomes = fan_out(
        hosts,
        lambda h: f"{shlex.quote(h.python)} -m gpuenv.cluster.probe facts",
        opts.probe_deadline_s,
        label="probe",
        show_progress=opts.show_progress,
    )
    probes: dict[str, dict] = {}
    for name, out in outcomes.items():
        try:
            if not out.ok:
                raise ValueError(out.why())
            probes[name] = out.json()
        except ValueError as exc:
            run.results.append(
                Result(
                    "reach",
                    name,
                    Status.FAIL,
                    f"node did not answer: {exc}",
                    duration_s=out.duration_s,
                )
            )
            continue
        run.results.append(
            Result(
                "reach",
                name,
                Status.PASS,
                f"answered in {out.duration_s:.1f} s",
                duration_s=out.duration_s,
            )
        )
    return probes


def check_nodes(hosts: Sequence[Host], opts: Options, run: ClusterRun) -> None:
    def command(h: Host) -> str:
        argv = [h.python, "-m", "gpuenv", "check", "--json", "-", "--node", h.name]
        return shlex.join([*argv, *opts.check_args])

    outcomes = fan_out(
        hosts, command, opts.deadline_s, label="gpuenv check", show_progress=opts.show_progress
    )
    for name, out in outcomes.items():
        try:
            if out.rc not in (0, 1):
                raise ValueError(out.why())
            report = RunReport.from_dict(out.json())
        except (ValueError, KeyError, TypeError) as exc:
            run.results.append(
                Result(
                    "check",
                    name,
                    Status.ERROR,
                    f"gpuenv check gave no report: {exc}",
                    duration_s=out.duration_s,
                )
            )
            continue
        run.reports[name] = report
        run.results.extend(report.results)


def _expected_nproc(host: Host, probes: dict[str, dict], opts: Options) -> int:
    if opts.nproc_per_node:
        return opts.nproc_per_node
    count = int(probes.get(host.name, {}).get("facts", {}).get("gpu.count", "0") or 0)
    return max(1, count)


def torch_stage(
    hosts: Sequence[Host], probes: dict[str, dict], opts: Options, run: ClusterRun
) -> tuple[bool, float | None]:
    """torchrun across all nodes; returns (ran fine, busbw at the largest size)."""
    master = hosts[0]
    nprocs = {h.name: _expected_nproc(h, probes, opts) for h in hosts}
    start = time.monotonic()
    rid = launch.run_id("all")
    outcomes = fan_out(
        hosts,
        lambda h: launch.torchrun(
            h,
            master,
            len(hosts),
            opts.port,
            rid,
            nprocs[h.name],
            opts.sizes,
            opts.iters,
            opts.steps,
            opts.deadline_s - 5,
        ),
        opts.deadline_s,
        label="torchrun all nodes",
        show_progress=opts.show_progress,
        stop_others=lambda _h: launch.stop(rid),
    )
    duration = time.monotonic() - start
    bad: dict[str, str] = {}
    ddp_bad: dict[str, str] = {}
    backend = "?"
    for name, out in outcomes.items():
        got = [p for p in launch.payloads(out) if p.get("kind") == "torch"]
        if not out.ok or not got:
            bad[name] = out.why() if not out.ok else "no result from its ranks"
            continue
        p = got[0]
        backend = p.get("backend", backend)
        run.sweeps[name] = p.get("sweep", [])
        if not all(s.get("correct") for s in p.get("sweep", [])):
            bad[name] = "all-reduce gave wrong values"
        ddp = p.get("ddp", {})
        if not ddp.get("params_identical"):
            ddp_bad[name] = "parameters differ between ranks after the steps"
        elif not (ddp.get("loss_last") is not None and ddp["loss_last"] < ddp["loss_first"]):
            ddp_bad[name] = f"loss did not fall ({ddp.get('loss_first')} -> {ddp.get('loss_last')})"
    world = sum(nprocs.values())
    largest = [s[-1]["busbw_gbps"] for s in run.sweeps.values() if s]
    busbw = min(largest) if largest and not bad else None
    measurements = [Measurement("nodes", len(hosts)), Measurement("ranks", world)]
    if busbw is not None:
        measurements.append(
            Measurement(
                "busbw",
                round(busbw, 3),
                "GB/s",
                threshold=opts.min_busbw,
                bound="min" if opts.min_busbw is not None else None,
            )
        )
    details = {"backend": backend, "sizes": opts.sizes, "per_node_failure": bad}
    if bad:
        reason = "torchrun across nodes failed: " + "; ".join(f"{n}: {w}" for n, w in bad.items())
        status = Status.FAIL
    elif opts.min_busbw is not None and busbw is not None and busbw < opts.min_busbw:
        reason = f"busbw {busbw:.2f} GB/s < {opts.min_busbw} GB/s"
        status = Status.FAIL
    else:
        size = opts.sizes[-1] / MIB
        reason = (
            f"{world} ranks on {len(hosts)} nodes ({backend}): "
            f"busbw {busbw or 0.0:.2f} GB/s at {size:g} MiB"
        )
        status = Status.PASS
    run.results.append(
        Result(
            "allreduce",
            "cluster",
            status,
            reason,
            measurements,
            duration_s=duration,
            details=details,
        )
    )
    if bad:
        run.results.append(
            Result(
                "ddp",
                "cluster",
                Status.FAIL,
                "not run to the end: torchrun across nodes failed",
                duration_s=duration,
            )
        )
    else:
        first = launch.payloads(outcomes[master.name])
        step_s = first[0].get("ddp", {}).get("step_time_s") if first else None
        run.results.append(
            Result(
                "ddp",
                "cluster",
                Status.FAIL if ddp_bad else Status.PASS,
                "; ".join(f"{n}: {w}" for n, w in ddp_bad.items())
                or f"{world} ranks: parameters identical, loss fell",
                [Measurement("step_time", round(step_s or 0.0, 4), "s")],
                duration_s=duration,
                details={"backend": backend},
            )
        )
    return not bad, busbw


def mpi_stage(hosts: Sequence[Host], opts: Options, run: ClusterRun) -> None:
    master = hosts[0]
    cmd = launch.mpirun(master, hosts, 8 * MIB, opts.iters)
    out = fan_out(
        [master], lambda _h: cmd, opts.deadline_s, label="mpirun", show_progress=opts.show_progress
    )[master.name]
    got = [p for p in launch.payloads(out) if p.get("kind") == "mpi"]
    if not out.ok or not got:
        why = out.why() if not out.ok else "no result from rank 0"
        run.results.append(
            Result(
                "mpi",
                "cluster",
                Status.FAIL,
                f"mpirun from {master.name}: {why}",
                duration_s=out.duration_s,
                details={"command": cmd},
            )
        )
        return
    p = got[0]
    spread = len(set(p.get("rank_hosts", [])))
    want = 1 if master.local else len(hosts)
    ok = bool(p.get("correct")) and spread >= want and p.get("world_size") == len(hosts)
    reason = (
        f"{p.get('world_size')} ranks on {spread} host(s), all-reduce "
        f"{'correct' if p.get('correct') else 'WRONG'}, busbw {p.get('busbw_gbps', 0):.2f} GB/s"
    )
    if spread < want:
        reason += f"; expected ranks on {want} hosts"
    run.results.append(
        Result(
            "mpi",
            "cluster",
            Status.PASS if ok else Status.FAIL,
            reason,
            [Measurement("busbw", round(float(p.get("busbw_gbps", 0.0)), 3), "GB/s")],
            versions={"mpi": str(p.get("mpi", ""))},
            duration_s=out.duration_s,
            details={"rank_hosts": p.get("rank_hosts", []), "command": cmd},
        )
    )


def pair_tester(
    hosts: Sequence[Host],
    opts: Options,
    label: str,
    known: dict[pairs.Pair, float | None] | None = None,
) -> Callable[[Sequence[pairs.Pair]], dict[pairs.Pair, float | None]]:
    """Runs a round of disjoint pairs at once, each pair its own 2-node torchrun launch.

    Pairs already measured (``known``, e.g. the matrix) are answered without a new launch.
    """
    by_name = {h.name: h for h in hosts}
    counter = [0]
    cache = known if known is not None else {}

    def one_pair(a: str, b: str, port: int) -> float | None:
        rid = launch.run_id(f"{label}{counter[0]}-{port}")
        master = by_name[a]
        outcomes = fan_out(
            [by_name[a], by_name[b]],
            lambda h: launch.torchrun(h, master, 2, port, rid, 1, [opts.pair_bytes],
                                      opts.iters, 1, opts.deadline_s - 5),
            opts.deadline_s,
            stop_others=lambda _h: launch.stop(rid),
        )  # fmt: skip
        values = []
        for n in (a, b):
            got = [p for p in launch.payloads(outcomes[n]) if p.get("kind") == "torch"]
            if outcomes[n].ok and got and all(s.get("correct") for s in got[0]["sweep"]):
                values.append(got[0]["sweep"][-1]["busbw_gbps"])
        return min(values) if len(values) == 2 else None

    def test_round(round_pairs: Sequence[pairs.Pair]) -> dict[pairs.Pair, float | None]:
        counter[0] += 1
        measured: dict[pairs.Pair, float | None] = {}
        todo = []
        for a, b in round_pairs:
            hit = next((cache[k] for k in ((a, b), (b, a)) if k in cache), False)
            if hit is False:
                todo.append((a, b))
            else:
                measured[(a, b)] = hit
        title = f"{label} round {counter[0]} ({len(todo)} pairs)"
        with (
            progress(title, len(todo), opts.show_progress and bool(todo)) as advance,
            cf.ThreadPoolExecutor(max_workers=max(1, min(32, len(todo)))) as pool,
        ):
            futures = {
                pool.submit(one_pair, a, b, opts.port + 1 + i): (a, b)
                for i, (a, b) in enumerate(todo)
            }
            for fut in cf.as_completed(futures):
                pair = futures[fut]
                measured[pair] = fut.result()
                cache[pair] = measured[pair]
                advance(f"{pair[0]}-{pair[1]}")
        return measured

    return test_round


def matrix_stage(hosts: Sequence[Host], opts: Options, run: ClusterRun) -> None:
    names = [h.name for h in hosts]
    tester = pair_tester(hosts, opts, "matrix")
    start = time.monotonic()
    for round_pairs in pairs.all_pairs_rounds(names):
        run.matrix.update(tester(round_pairs))
    failed = [f"{a}-{b}" for (a, b), v in run.matrix.items() if v is None]
    values = [v for v in run.matrix.values() if v is not None]
    med = statistics.median(values) if values else 0.0
    slow = [
        f"{a}-{b} ({v:.2f} GB/s)"
        for (a, b), v in run.matrix.items()
        if v is not None and v < opts.pair_relative * med
    ]
    status = Status.FAIL if failed or slow else Status.PASS
    reason = (
        "; ".join(
            filter(
                None,
                [
                    f"pairs failed: {', '.join(failed)}" if failed else "",
                    f"pairs below {opts.pair_relative:g} x median {med:.2f} GB/s: {', '.join(slow)}"
                    if slow
                    else "",
                ],
            )
        )
        or f"{len(run.matrix)} pairs, median {med:.2f} GB/s at {opts.pair_bytes / MIB:g} MiB"
    )
    run.results.append(
        Result(
            "pair-matrix",
            "cluster",
            status,
            reason,
            [
                Measurement("pairs", len(run.matrix)),
                Measurement("median_busbw", round(med, 3), "GB/s"),
            ],
            duration_s=time.monotonic() - start,
        )
    )


def isolation_stage(hosts: Sequence[Host], opts: Options, run: ClusterRun) -> None:
    start = time.monotonic()
    tester = pair_tester(hosts, opts, "isolate", known=dict(run.matrix))
    iso = pairs.isolate(
        [h.name for h in hosts], tester, opts.min_busbw, relative=opts.pair_relative
    )
    run.isolation = iso
    parts = []
    if iso.bad_nodes:
        parts.append(f"bad node(s): {', '.join(iso.bad_nodes)}")
    if iso.bad_links:
        parts.append(f"bad link(s): {', '.join(f'{a}-{b}' for a, b in iso.bad_links)}")
    if iso.unresolved:
        parts.append(f"undecided: {', '.join(iso.unresolved)}")
    run.results.append(
        Result(
            "isolation",
            "cluster",
            Status.PASS if iso.ok else Status.FAIL,
            "; ".join(parts) or "every pair passed: no bad node found",
            [
                Measurement("rounds", len(iso.rounds)),
                Measurement("pair_threshold", round(iso.threshold or 0.0, 3), "GB/s"),
            ],
            duration_s=time.monotonic() - start,
            details={
                "bad_nodes": iso.bad_nodes,
                "bad_links": [list(p) for p in iso.bad_links],
                "unresolved": iso.unresolved,
            },
        )
    )


def validate(hosts: Sequence[Host], opts: Options | None = None) -> ClusterRun:
    """Run every stage in ``opts.stages`` over ``hosts``; never raises for a node's failure."""
    opts = opts or Options()
    start = time.monotonic()
    run = ClusterRun(hosts=[h.name for h in hosts])
    probes = probe_nodes(hosts, opts, run)
    alive = [h for h in hosts if h.name in probes]
    gone = [h.name for h in hosts if h.name not in probes]
    if "check" in opts.stages:
        check_nodes(alive, opts, run)
    if "consistency" in opts.stages:
        t0 = time.monotonic()
        run.facts = {
            h.name: consistency.node_facts(
                probes[h.name].get("facts", {}),
                run.reports[h.name].results if h.name in run.reports else [],
            )
            for h in alive
        }
        run.results.append(consistency.consistency_result(run.facts, time.monotonic() - t0))
    multi = [s for s in ("rendezvous", "torch", "mpi", "pairs") if s in opts.stages]
    if len(alive) < 2:
        for s in multi:
            run.results.append(_skip(s, f"{len(alive)} node(s) answered; multi-node runs need 2"))
    else:
        excluded = f" (without {', '.join(gone)}, which did not answer)" if gone else ""
        rdzv_ok = True
        if "rendezvous" in multi:
            r = preflight.rendezvous_result(
                alive, alive[0], opts.port, probes, min(60.0, opts.deadline_s)
            )
            r.reason += excluded
            run.results.append(r)
            rdzv_ok = r.status is Status.PASS
        if not rdzv_ok:
            for s in multi[1:]:
                run.results.append(_skip(s, "the rendezvous preflight failed"))
        else:
            missing = {
                stage: pkg
                for stage, pkg in (("torch", "torch"), ("pairs", "torch"), ("mpi", "mpi4py"))
                if stage in multi
                and not any(f"pkg.{pkg}" in probes[h.name].get("facts", {}) for h in alive)
            }
            for stage, pkg in missing.items():
                run.results.append(
                    _skip(stage, f"{pkg} is not installed on any node (cluster venv)")
                )
            multi = [s for s in multi if s not in missing]
            torch_ok = True
            if "torch" in multi:
                torch_ok, busbw = torch_stage(alive, probes, opts, run)
                slow = opts.min_busbw is not None and (busbw is None or busbw < opts.min_busbw)
                torch_ok = torch_ok and not slow
            if "mpi" in multi:
                mpi_stage(alive, opts, run)
            if "pairs" in multi:
                if len(alive) <= opts.matrix_max_nodes:
                    matrix_stage(alive, opts, run)
                if not torch_ok:
                    isolation_stage(alive, opts, run)
    run.duration_s = time.monotonic() - start
    return run
