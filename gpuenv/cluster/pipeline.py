"""Cluster validation as a pipeline of stages, from an inventory to one ClusterReport.

The stages are data (``STAGES``: name, what they need, the function): ``validate`` runs each
one whose needs are met and records why the others did not run. In order:

1. probe: every node answers with its facts (a node that does not resolve or answer is a failed
   ``reach`` by name, and the others go on without it).
1b. health: ``gpuenv health --json - --no-state`` on every node at once (gpuenv.health.fleet): a
   GPU whose finding asks for a reset or more is a FAIL naming it, before any launch.
2. check: ``gpuenv check --json -`` on every node at once; each node's run report is merged,
   its verdict included.
3. consistency: all nodes must agree on driver, CUDA, NCCL, Open MPI, Python stack, GPUs, NCCL env.
3b. slurm: where Slurm is (``--launcher srun``, or srun on a node): ``srun -N <all> hostname``,
   and a job asking for N GPUs sees exactly N (gpuenv.cluster.slurm).
4. rendezvous: the master port is reachable from every node; socket interfaces exist.
5. torch: ``torchrun`` across all nodes (c10d): all-reduce values (``allreduce``), bandwidth
   against a floor (``busbw``) and the transport NCCL used, and DDP (``ddp``); when the pair
   matrix is to be measured, the same launch measures it too (pair subgroups, one round of
   disjoint pairs at a time), so torch starts once per node for all of it.
6. mpi: ``mpirun`` of plain ``python3`` from the first node over the SSH mesh.
7. pairs: the node-pair bandwidth matrix (small clusters; from the all-node launch where it
   measured a pair, else a 2-node launch per pair) and, when the all-node run failed or was
   slow, bad-node isolation by parallel rounds of pairs, each pair its own 2-node launch.
8. fabric: on nodes with InfiniBand/RoCE ports, the ports' error counters after the multi-node
   runs against the probe's (``fabric-counters``), and ib_write_bw over every rail between the
   nodes of a ring, judged at ``fabric.pair_efficiency`` x the port rate (``fabric-pairs``).
9. dask (optional: run when asked, ``--with dask`` or a profile that requires it): a
   dask.distributed cluster across the nodes, the scheduler on the first, one worker per GPU,
   computing the seed documents' ``(x + x.T).mean(axis=0)`` on CuPy blocks (numpy blocks on
   CPU-only nodes), verified against numpy, and nothing left running on any node.

health, check and rendezvous read only the probe's facts and nothing of each other's, so they
run at the same time (``TOGETHER``), each on its own copy of the state, and their results are
put in the report in the order of this list.

With ``--launcher srun`` (``Options.slurm``), the multi-node launches (torch, pairs, dask, mpi) go
through ``State.launch``: one srun on the Slurm submit host whose tasks run the same per-node
commands, answered per node (gpuenv.cluster.slurm).

Every command on a node runs in a login shell as the cluster user, with plain ``python3``,
``torchrun`` and ``mpirun`` as a user types them (gpuenv.cluster.launch). The stages run and
gather; what their answers are worth (PASS, FAIL, SKIP) is gpuenv.cluster.judge's to say.
"""

from __future__ import annotations

import concurrent.futures as cf
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.checks import ddp as ddp_check
from gpuenv.checks import fabric as fabric_check
from gpuenv.checks import nccl_log
from gpuenv.cluster import causes, consistency, judge, launch, pairs, preflight
from gpuenv.cluster import slurm as slurm_launch
from gpuenv.cluster.defaults import (
    DEADLINE_S,
    ITERS,
    MATRIX_MAX_NODES,
    MIB,
    PAIR_BYTES,
    PORT,
    PROBE_DEADLINE_S,
    SIZES,
    STEPS,
)
from gpuenv.cluster.fanout import NodeAnswer, fan_out
from gpuenv.cluster.inventory import Host
from gpuenv.cluster.worker import PairPhase
from gpuenv.errors import GpuenvError
from gpuenv.floor import login_env, net
from gpuenv.health import fleet as health
from gpuenv.progress import Progress, Silent
from gpuenv.results import CLUSTER_NODE, ClusterReport, Result, RunReport, Status

# torchrun's own rendezvous and process-group timeouts sit this far inside the launch's
# deadline, so that its ranks report a missing peer before the controller kills them.
LAUNCH_MARGIN_S = 5.0
# The rendezvous preflight never needs more than this, whatever the launch deadline.
RENDEZVOUS_CAP_S = 60.0
# How many pair launches run at once in a round of the pair matrix or of isolation.
PAIR_PARALLELISM = 32
# The pair phase of the all-node launch: each pair's operations time out after this share of
# the launch's own timeout (at least PAIR_TIMEOUT_MIN_S), so that a partner that hangs is named
# by its peer well inside the launch's deadline.
PAIR_TIMEOUT_SHARE = 1 / 3
PAIR_TIMEOUT_MIN_S = 10.0
# The dask scheduler listens this far above the rendezvous port (the pair runs use the next 32).
DASK_PORT_OFFSET = 64


@dataclass
class Options:
    check_args: list[str] = field(default_factory=lambda: ["--profile", "quick"])
    deadline_s: float = DEADLINE_S
    probe_deadline_s: float = PROBE_DEADLINE_S
    port: int = PORT
    nproc_per_node: int | None = None  # None: GPUs per node, or 1 without GPUs
    sizes: list[int] = field(default_factory=lambda: list(SIZES))
    iters: int = ITERS
    steps: int = STEPS
    pair_bytes: int = PAIR_BYTES
    min_busbw: float | None = None  # GB/s the all-node run must reach; None: from transport
    pair_relative: float = pairs.RELATIVE
    matrix_max_nodes: int = MATRIX_MAX_NODES
    # None: the node check's own (thresholds.yaml ddp.max_loss_ratio)
    max_loss_ratio: float | None = None
    stages: tuple[str, ...] = ()  # empty: every stage that is not optional
    dask_size: tuple[int, int] = (4096, 1024)  # n and chunk of the dask stage's x (n x n)
    gdr_required: bool | None = None  # None: thresholds.yaml fabric.gdr_required
    pair_efficiency: float | None = None  # None: thresholds.yaml fabric.pair_efficiency
    # --launcher srun: the multi-node launches are one srun each (gpuenv.cluster.slurm); None: ssh
    slurm: slurm_launch.Slurm | None = None
    # The cluster checks the profile requires, by kind of cluster ("gpu", "cpu"): a node check
    # is left to a cluster stage only when the cluster's verdict requires that stage's result.
    cluster_requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    progress: Progress = field(default_factory=Silent)


@dataclass
class State:
    """What the stages share: the nodes still in the run, their facts, the report being built."""

    hosts: list[Host]
    opts: Options
    report: ClusterReport
    probes: dict[str, dict[str, Any]] = field(default_factory=dict)
    alive: list[Host] = field(default_factory=list)
    busbw_ok: bool = True  # the all-node run was correct and fast enough (else: isolation)
    # The pair phase of the all-node launch: each pair it decided (GB/s, None: failed), why a
    # pair failed there, and the nodes whose launch failed after their sweep and DDP.
    launch_pairs: dict[pairs.Pair, float | None] = field(default_factory=dict)
    launch_pair_notes: dict[pairs.Pair, str] = field(default_factory=dict)
    launch_failures: dict[str, str] = field(default_factory=dict)
    # The node checks each node left to the cluster stages (`gpuenv check --left-to-cluster`).
    left: dict[str, list[str]] = field(default_factory=dict)

    def add(self, result: Result) -> None:
        self.report.results.append(result)

    def fan_out(
        self,
        hosts: Sequence[Host],
        command: Callable[[Host], str],
        label: str,
        deadline_s: float | None = None,
        stop_others: Callable[[Host], str] | None = None,
        quiet: bool = False,
    ) -> dict[str, NodeAnswer]:
        return fan_out(
            hosts,
            command,
            self.opts.deadline_s if deadline_s is None else deadline_s,
            label=label,
            progress=None if quiet else self.opts.progress,
            stop_others=stop_others,
        )

    def launch(
        self,
        hosts: Sequence[Host],
        command: Callable[[Host], str],
        label: str,
        deadline_s: float | None = None,
        stop_others: Callable[[Host], str] | None = None,
        quiet: bool = False,
    ) -> dict[str, NodeAnswer]:
        """A multi-node launch: ``fan_out`` over SSH, or one srun whose tasks run the same
        per-node commands (--launcher srun), answered per node the same way."""
        if self.opts.slurm is None:
            return self.fan_out(hosts, command, label, deadline_s, stop_others, quiet)
        deadline = self.opts.deadline_s if deadline_s is None else deadline_s
        gpus = min((_gpus(h, self) for h in hosts), default=0)
        return self.opts.slurm.launch(hosts, command, label, deadline,
                                      stop_others=stop_others is not None, gpus=gpus,
                                      progress=None if quiet else self.opts.progress)  # fmt: skip


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[State], None]
    multi_node: bool = False  # needs at least 2 nodes that answered
    needs: tuple[str, ...] = ()  # cluster results that must have PASSed first
    optional: bool = False  # runs only when asked (named in Options.stages)
    # The cluster results it gives under other names than its own (the verdict requires them by
    # those names): a stage that could not run gives each a SKIP, so a required one is not taken
    # for a stage the user left out.
    gives: tuple[str, ...] = ()


# ---------------------------------------------------------------- probe, check, consistency


def probe_stage(state: State) -> None:
    """Facts of every node; nodes that do not answer get a FAIL naming them."""
    opts = state.opts
    outcomes = state.fan_out(
        state.hosts,
        lambda h: shlex.join([h.python, "-m", "gpuenv.cluster.probe", "facts"]),
        "probe",
        deadline_s=opts.probe_deadline_s,
    )
    for name, out in outcomes.items():
        try:
            if not out.ok:
                raise ValueError(out.why())
            state.probes[name] = out.json()
            # The verdict reads them (a GPU node must be verified), consistency or not.
            state.report.facts[name] = dict(state.probes[name].get("facts", {}))
        except ValueError as exc:
            state.add(Result("reach", name, Status.FAIL, f"node did not answer: {exc}",
                             duration_s=out.duration_s))  # fmt: skip
            continue
        state.add(Result("reach", name, Status.PASS, f"answered in {out.duration_s:.1f} s",
                         duration_s=out.duration_s))  # fmt: skip
    state.alive = [h for h in state.hosts if h.name in state.probes]


def health_stage(state: State) -> None:
    """Each node's passive health scan (gpuenv health) before anything is launched, so that a
    GPU needing a reset or worse is named as sick, not found later as a slow pair."""
    outcomes = state.fan_out(
        state.alive,
        lambda h: shlex.join(health.node_argv(h, become=False)),
        "gpuenv health",
        deadline_s=min(state.opts.deadline_s, health.DEADLINE_S),
    )
    state.report.results.extend(health.results(health.gather(outcomes), health.CLUSTER_FAIL_ON))


# The node checks a cluster stage runs again across the nodes: check name -> stage.
COVERING_STAGES = {"ddp": "torch", "mpi": "mpi"}


def left_to_cluster(h: Host, state: State) -> list[str]:
    """The node checks that the cluster's own launches run with every rank of node ``h``, so
    that the node's `gpuenv check` leaves them out and torch starts once per node per run.

    ``ddp``: the all-node torchrun runs DDP with a rank on each of the node's GPUs (on a node
    without GPUs, its CPU ranks over gloo, as the node's check does). ``mpi``: only on a node
    without GPUs, where the node's check and the cluster's mpirun both pass numpy buffers; on a
    GPU node the node's check passes CuPy buffers between its GPUs, which the cluster's run does
    not. Nothing is left when the user chose the node checks (``--only`` in --check-args), the
    cluster's verdict does not require the covering result, its stage is not selected, or fewer
    than two nodes answered (the multi-node stages then cannot run).
    """
    opts = state.opts
    if len(state.alive) < 2 or any(a.partition("=")[0] == "--only" for a in opts.check_args):
        return []
    kind = "gpu" if any(_gpus(n, state) for n in state.alive) else "cpu"
    required = opts.cluster_requires.get(kind, ())
    gpus = _gpus(h, state)
    left = []
    for check, stage in COVERING_STAGES.items():
        if check not in required or (opts.stages and stage not in opts.stages):
            continue
        if check == "ddp" and gpus and _nproc(h, state) != gpus:
            continue
        if check == "mpi" and gpus:
            continue
        left.append(check)
    return left


def check_stage(state: State) -> None:
    state.left = {h.name: left_to_cluster(h, state) for h in state.alive}

    def command(h: Host) -> str:
        argv = [h.python, "-m", "gpuenv", "check", "--json", "-", "--node", h.name]
        if h.expect_gpus is not None:
            argv += ["--expect-gpus", str(h.expect_gpus)]
        if state.left[h.name]:
            argv += ["--left-to-cluster", ",".join(state.left[h.name])]
        return shlex.join([*argv, *state.opts.check_args])

    left = sorted({c for names in state.left.values() for c in names})
    label = "gpuenv check" + (f" ({', '.join(left)}: in the cluster launches)" if left else "")
    outcomes = state.fan_out(state.alive, command, label)
    for name, out in outcomes.items():
        try:
            if out.rc not in (0, 1):
                raise ValueError(out.why())
            report = RunReport.from_dict(out.json())
        except (ValueError, KeyError, TypeError) as exc:
            state.add(Result("check", name, Status.ERROR, f"gpuenv check gave no report: {exc}",
                             duration_s=out.duration_s))  # fmt: skip
            continue
        state.report.node_reports[name] = report
        state.report.results.extend(report.results)
        _name_login_settings(report, state.probes.get(name, {}))


def _name_login_settings(report: RunReport, probe: Mapping[str, Any]) -> None:
    """A node's failed checks name the job variables its login files set (LD_LIBRARY_PATH in
    /etc/profile.d/zz-site.sh, CUDA_VISIBLE_DEVICES in /etc/environment): the commands ran in
    the user's SSH login, so a setting there is the likeliest cause the user can mend."""
    found = probe.get("login_env") or {}
    if not isinstance(found, Mapping) or not found:
        return
    note = f" [login environment: {login_env.describe(found)}]"
    for result in report.results:
        # A failed rank's reason already names its library's login settings (checks.rank_cause).
        if result.status in (Status.FAIL, Status.ERROR) and "login_env" not in result.details:
            result.reason += note


def consistency_stage(state: State) -> None:
    began_at = time.monotonic()
    reports = state.report.node_reports
    state.report.facts = {
        h.name: consistency.node_facts(
            state.probes[h.name].get("facts", {}),
            reports[h.name].results if h.name in reports else [],
        )
        for h in state.alive
    }
    state.add(consistency.consistency_result(state.report.facts, time.monotonic() - began_at))


def rendezvous_stage(state: State) -> None:
    gone = [h.name for h in state.hosts if h not in state.alive]
    deadline_s = min(RENDEZVOUS_CAP_S, state.opts.deadline_s)
    r = preflight.rendezvous_result(
        state.alive, state.alive[0], state.opts.port, state.probes, deadline_s
    )
    if gone:
        r.reason += f" (without {', '.join(gone)}, which did not answer)"
    state.add(r)
    state.add(preflight.nccl_known_bad_result(state.alive, state.probes))
    state.add(preflight.cuda_compat_result(state.alive, state.probes))


# ---------------------------------------------------------------- multi-node launches


def _nproc(host: Host, state: State) -> int:
    if state.opts.nproc_per_node:
        return state.opts.nproc_per_node
    return max(1, _gpus(host, state))


def _gpus(host: Host, state: State) -> int:
    return int(state.probes.get(host.name, {}).get("facts", {}).get("gpu.count", "0") or 0)


def _link_gbps(state: State, transports: nccl_log.Transports) -> float | None:
    """The slowest node's link for the transport NCCL used: IB rate or NIC speed (GB/s)."""
    key = "ib.rate_gbps" if nccl_log.NET_IB in transports.families else "net.speed_gbps"
    speeds = []
    for h in state.alive:
        value = state.probes.get(h.name, {}).get("links", {}).get(key)
        if value is None:
            return None
        speeds.append(float(value))
    return min(speeds) if speeds else None


def _active_ib(state: State) -> dict[str, list[str]]:
    return {
        h.name: list(state.probes.get(h.name, {}).get("links", {}).get("ib.active_ports", []))
        for h in state.alive
    }


def _node_fabrics(state: State) -> dict[str, fabric_check.NodeFabric]:
    """Every answering node's fabric as the probe read it (nodes without IB/RoCE ports included:
    the rules say what a node without rails may do); empty where a probe did not read it."""
    found = {}
    for h in state.alive:
        node = fabric_check.from_links(state.probes.get(h.name, {}).get("links", {}))
        if node is None:
            return {}
        found[h.name] = node
    return found


def _fabric_thresholds(opts: Options) -> tuple[bool, float]:
    """(GPUDirect RDMA required, the pair test's share of the port rate): Options, else
    thresholds.yaml's ``fabric`` section."""
    from gpuenv.checks.thresholds import load_thresholds

    if opts.gdr_required is not None and opts.pair_efficiency is not None:
        return opts.gdr_required, opts.pair_efficiency
    shipped = load_thresholds()["fabric"]
    required = opts.gdr_required if opts.gdr_required is not None else shipped["gdr_required"]
    share = opts.pair_efficiency or shipped["pair_efficiency"]
    return bool(required), float(share)


def _max_loss_ratio(opts: Options) -> float:
    if opts.max_loss_ratio is not None:
        return opts.max_loss_ratio
    from gpuenv.checks.thresholds import load_thresholds

    return float(load_thresholds()["ddp"]["max_loss_ratio"])


def _pair_phase(state: State, inner_s: float) -> PairPhase | None:
    """The pair phase the all-node launch runs: when the pairs stage is selected and the
    cluster is small enough for the full matrix."""
    opts = state.opts
    selected = "pairs" in opts.stages if opts.stages else True
    if not selected or len(state.alive) > opts.matrix_max_nodes:
        return None
    timeout_s = max(PAIR_TIMEOUT_MIN_S, inner_s * PAIR_TIMEOUT_SHARE)
    return PairPhase(tuple(h.name for h in state.alive), opts.pair_bytes, opts.iters,
                            timeout_s)  # fmt: skip


def torch_stage(state: State) -> None:
    """torchrun across all nodes: values (allreduce), bandwidth (busbw), DDP (ddp), and the
    pair matrix's phase (pairs_stage judges it)."""
    opts, hosts = state.opts, state.alive
    master = hosts[0]
    nprocs = {h.name: _nproc(h, state) for h in hosts}
    began_at = time.monotonic()
    rid = launch.run_id("all")
    inner_s = opts.deadline_s - LAUNCH_MARGIN_S
    phase = _pair_phase(state, inner_s)
    outcomes = state.launch(
        hosts,
        lambda h: launch.torchrun(h, master, len(hosts), opts.port, rid, nprocs[h.name],
                                  opts.sizes, opts.iters, opts.steps, inner_s, phase),
        "torchrun all nodes" + (" (sweep, DDP, pairs)" if phase else ""),
        stop_others=lambda _h: launch.stop(rid),
    )  # fmt: skip
    if phase is not None:
        _gather_pairs(state, phase, outcomes)
    duration_s = time.monotonic() - began_at
    max_loss_ratio = _max_loss_ratio(opts)
    bad: dict[str, str] = {}
    ddp_bad: dict[str, str] = {}
    backend = "?"
    posted: list[Mapping[str, Any]] = []
    per_node: dict[str, nccl_log.Transports] = {}
    gpu_nodes: set[str] = set()
    first: dict[str, Any] = {}
    for name, out in outcomes.items():
        got = [p for p in launch.payloads(out) if p.get("kind") == "torch"]
        # With a pair phase, a node reports its sweep and DDP before the phase starts: a launch
        # that failed after that failed in the pair phase, which the pairs stage judges.
        if not got or (not out.ok and phase is None):
            bad[name] = (
                causes.launch_failure(out, state.probes.get(name))
                if not out.ok
                else "no result from its ranks"
            )
            continue
        p = got[0]
        first = first or p
        backend = p.get("backend", backend)
        state.report.sweeps[name] = p.get("sweep", [])
        if not all(s.get("correct") for s in p.get("sweep", [])):
            bad[name] = "all-reduce gave wrong values"
        posted.append(p.get("transport") or {})
        per_node[name] = nccl_log.merge([p.get("transport") or {}])
        if p.get("backend") == "nccl":
            gpu_nodes.add(name)
        found = ddp_check.problems(p.get("ddp", {}), max_loss_ratio)
        if found:
            ddp_bad[name] = "; ".join(found)
    world = sum(nprocs.values())
    details: dict[str, Any] = {"backend": backend, "sizes": opts.sizes, "per_node_failure": bad}
    if bad:
        for r in judge.torchrun_failed(bad, world, details, duration_s):
            state.add(r)
        state.busbw_ok = False
        return
    state.add(judge.allreduce(world, len(hosts), backend, opts.sizes, details, duration_s))
    transports = nccl_log.merge(posted)
    gdr_required, _ = _fabric_thresholds(opts)
    busbw, floor = judge.busbw(
        judge.Bandwidth(state.report.sweeps, backend, transports, _link_gbps(state, transports),
                        _active_ib(state), opts.min_busbw, opts.sizes[-1],
                        nodes=_node_fabrics(state), per_node=per_node,
                        gpu_nodes=frozenset(gpu_nodes), gdr_required=gdr_required)
    )  # fmt: skip
    state.report.thresholds["busbw_floor_gbps"] = floor
    if busbw.status is Status.FAIL:
        state.busbw_ok = False
    state.add(busbw)
    step_s = first.get("ddp", {}).get("step_time_s") or 0.0
    state.add(judge.ddp(ddp_bad, world, step_s, max_loss_ratio, backend, duration_s))


def _gather_pairs(state: State, phase: PairPhase, outcomes: Mapping[str, NodeAnswer]) -> None:
    """The pair phase's lines: a pair both of whose nodes reported correct values is measured
    (the slower end's busbw, as a pair's own launch gives it); a pair that a node started and
    did not finish with correct values failed, with why (the error, wrong values, or which node
    never joined it); a pair no node started (the launch ended first) is left to a launch of
    its own."""
    lines: dict[pairs.Pair, dict[str, Mapping[str, Any]]] = {}
    started: dict[pairs.Pair, set[str]] = {}
    for name, out in outcomes.items():
        got = launch.payloads(out)
        for p in got:
            key = (str(p.get("a")), str(p.get("b")))
            if p.get("kind") == "pair":
                lines.setdefault(key, {})[str(p.get("node"))] = p
            elif p.get("kind") == "pair-start":
                started.setdefault(key, set()).add(str(p.get("node")))
        if not out.ok and any(p.get("kind") == "torch" for p in got):
            state.launch_failures[name] = causes.launch_failure(out, state.probes.get(name))
    for round_pairs in pairs.all_pairs_rounds(phase.nodes):
        for a, b in round_pairs:
            got = lines.get((a, b), {})
            if len(got) == 2 and all("error" not in p and p.get("correct") for p in got.values()):
                state.launch_pairs[(a, b)] = min(float(p["busbw_gbps"]) for p in got.values())
            elif got or started.get((a, b)):
                state.launch_pairs[(a, b)] = None
                state.launch_pair_notes[(a, b)] = _pair_failure(
                    (a, b), got, started.get((a, b), set()), state.launch_failures
                )


def _pair_failure(
    pair: pairs.Pair,
    got: Mapping[str, Mapping[str, Any]],
    started: set[str],
    failures: Mapping[str, str],
) -> str:
    """Why a pair of the pair phase failed, naming its nodes: the error or wrong values a node
    reported, a node that joined and never finished, a node that never joined."""
    why = [f"{n}: {p['error']}" for n, p in got.items() if "error" in p]
    why += [f"{n}: all-reduce gave wrong values" for n, p in got.items()
            if "error" not in p and not p.get("correct")]  # fmt: skip
    for n in pair:
        if n in got:
            continue
        left = f" ({failures[n]})" if n in failures else ""
        if n in started:
            why.append(f"{n} joined the pair and never finished it{left}")
        else:
            waited = ", ".join(sorted(started | set(got)))
            why.append(f"{n} never joined the pair ({waited} waited){left}")
    return "; ".join(why)


def mpi_stage(state: State) -> None:
    hosts, opts = state.alive, state.opts
    master = hosts[0]
    cmd = launch.mpirun(master, hosts, 8 * MIB, opts.iters)
    if opts.slurm is not None:  # the ranks through Slurm (gpuenv.cluster.slurm.Slurm.mpi)
        worker = [master.python, "-m", "gpuenv.cluster.worker", "mpi", f"--bytes={8 * MIB}",
                  f"--iters={opts.iters}"]  # fmt: skip
        cmd = opts.slurm.mpi_command(hosts, worker, opts.deadline_s)
        out = opts.slurm.run_mpi(hosts, worker, opts.deadline_s)
    else:
        out = state.fan_out([master], lambda _h: cmd, "mpirun")[master.name]
    got = [p for p in launch.payloads(out) if p.get("kind") == "mpi"]
    if not out.ok or not got:
        why = (
            causes.mpirun_failure(out, hosts, state.probes, master.local)
            if not out.ok
            else "no result from rank 0"
        )
        state.add(judge.mpi_failed(master.name, why, cmd, out.duration_s))
        return
    want = 1 if master.local else len(hosts)
    state.add(judge.mpi(got[0], len(hosts), want, cmd, out.duration_s))


def pair_tester(
    state: State, label: str, known: dict[pairs.Pair, float | None] | None = None
) -> Callable[[Sequence[pairs.Pair]], dict[pairs.Pair, float | None]]:
    """Runs a round of disjoint pairs at once, each pair its own 2-node torchrun launch.

    Pairs already measured (``known``, e.g. the matrix) are answered without a new launch.
    """
    opts = state.opts
    by_name = {h.name: h for h in state.alive}
    counter = [0]
    cache = known if known is not None else {}
    inner_s = opts.deadline_s - LAUNCH_MARGIN_S

    def one_pair(a: str, b: str, port: int) -> float | None:
        rid = launch.run_id(f"{label}{counter[0]}-{port}")
        master = by_name[a]
        outcomes = state.launch(
            [by_name[a], by_name[b]],
            lambda h: launch.torchrun(h, master, 2, port, rid, 1, [opts.pair_bytes],
                                      opts.iters, 1, inner_s),
            f"pair {a}-{b}",
            stop_others=lambda _h: launch.stop(rid),
            quiet=True,
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
        if not todo:
            return measured
        key = f"{label} round {counter[0]}"
        opts.progress.begin(key, f"{key}: {len(todo)} pairs")
        with cf.ThreadPoolExecutor(max_workers=max(1, min(PAIR_PARALLELISM, len(todo)))) as pool:
            futures = {
                pool.submit(one_pair, a, b, opts.port + 1 + i): (a, b)
                for i, (a, b) in enumerate(todo)
            }
            for fut in cf.as_completed(futures):
                pair = futures[fut]
                measured[pair] = fut.result()
                cache[pair] = measured[pair]
                opts.progress.update(key, f"{pair[0]}-{pair[1]}")
        opts.progress.end(key, f"{len(todo)} pairs")
        return measured

    return test_round


def pairs_stage(state: State) -> None:
    if len(state.alive) <= state.opts.matrix_max_nodes:
        matrix_stage(state)
    if not state.busbw_ok:
        isolation_stage(state)


def matrix_stage(state: State) -> None:
    """Every pair once: from the all-node launch's pair phase where it decided the pair, else
    (the launch did not run, or ended before the pair) by the pair's own 2-node launch."""
    opts = state.opts
    tester = pair_tester(state, "matrix", known=dict(state.launch_pairs))
    began_at = time.monotonic()
    matrix = state.report.matrix
    for round_pairs in pairs.all_pairs_rounds([h.name for h in state.alive]):
        matrix.update(tester(round_pairs))
    floor = state.report.thresholds.get("busbw_floor_gbps") or opts.min_busbw
    result, marks = judge.pair_matrix(
        matrix, floor, opts.pair_relative, opts.pair_bytes, time.monotonic() - began_at,
        notes=state.launch_pair_notes,
        in_launch=len([p for p in matrix if p in state.launch_pairs]),
        launch_failures=state.launch_failures,
    )  # fmt: skip
    state.report.thresholds.update(marks)
    state.add(result)


def isolation_stage(state: State) -> None:
    opts = state.opts
    began_at = time.monotonic()
    # Only pairs measured by launches of their own are reused: the all-node launch ran beside
    # the node(s) at fault, so isolation does not take its word for any pair.
    own = {p: v for p, v in state.report.matrix.items() if p not in state.launch_pairs}
    tester = pair_tester(state, "isolate", known=own)
    iso = pairs.isolate(
        [h.name for h in state.alive], tester, opts.min_busbw, relative=opts.pair_relative
    )
    state.report.isolation = {
        "bad_nodes": iso.bad_nodes,
        "bad_links": [list(p) for p in iso.bad_links],
        "unresolved": iso.unresolved,
        "threshold_gbps": iso.threshold,
        "rounds": [[{"a": a, "b": b, "busbw_gbps": v} for (a, b), v in r.items()]
                   for r in iso.rounds],
    }  # fmt: skip
    state.add(judge.isolation(iso, time.monotonic() - began_at))


def dask_stage(state: State) -> None:
    """A dask.distributed cluster across the nodes: scheduler and client on the first node, one
    worker per GPU (one per CPU-only node) on every node; CuPy blocks when every node has GPUs."""
    opts, hosts = state.opts, state.alive
    master = hosts[0]
    workers = {h.name: _nproc(h, state) for h in hosts}
    gpus = {h.name: _gpus(h, state) for h in hosts}
    total = sum(workers.values())
    blocks = "cupy" if all(gpus.values()) else "numpy"
    rid = launch.run_id("dask")
    port = opts.port + DASK_PORT_OFFSET
    inner_s = opts.deadline_s - LAUNCH_MARGIN_S
    began_at = time.monotonic()
    outcomes = state.launch(
        hosts,
        lambda h: launch.dask(h, master, port, rid, workers[h.name], gpus[h.name], total,
                              blocks, opts.dask_size, inner_s),
        "dask across nodes",
        stop_others=lambda _h: launch.stop_dask(rid),
    )  # fmt: skip
    answers: dict[str, Mapping[str, Any] | str] = {}
    for name, out in outcomes.items():
        got = [p for p in launch.payloads(out) if str(p.get("kind", "")).startswith("dask")]
        answers[name] = got[0] if out.ok and got else out.why() if not out.ok else (
            "no result from its driver")  # fmt: skip
    # Emulated nodes (one machine) share its GPUs: as many distinct ones as one node has.
    distinct = max(gpus.values()) if master.local else sum(gpus.values())
    state.add(judge.dask(judge.DaskRun(
        answers, total, distinct, master.local, blocks, f"{master.name}:{port}",
        time.monotonic() - began_at,
    )))  # fmt: skip


# ---------------------------------------------------------------- Slurm


def slurm_stage(state: State) -> None:
    """``srun -N <all> hostname`` and the GPU confinement of a job (gpuenv.cluster.slurm): through
    the launcher's Slurm, else through the first node whose probe found srun; SKIP without."""
    opts = state.opts
    hostnames = {h.name: str(state.probes[h.name].get("hostname", "")) for h in state.alive}
    found = opts.slurm
    if found is None:
        submit = next((h for h in state.alive if state.probes[h.name].get("slurm_srun")), None)
        if submit is None:
            state.add(judge.skip("slurm", "--launcher is ssh and no node has srun (no Slurm)"))
            return
        try:
            found = slurm_launch.query(submit, opts.probe_deadline_s)
        except GpuenvError as exc:
            state.add(Result("slurm", CLUSTER_NODE, Status.FAIL, str(exc)))
            return
    missing = found.map_hosts(state.alive, hostnames)
    hosts = [h for h in state.alive if h.name not in missing]
    if not hosts:
        state.add(judge.skip("slurm", f"no node of the run is a Slurm node on {found.submit.name}"
                             f" (Slurm has {', '.join(sorted(found.nodes))})"))  # fmt: skip
        return
    gpus = {h.name: _gpus(h, state) for h in hosts}
    results = slurm_launch.stage(found, hosts, gpus, opts.deadline_s, opts.progress)
    if missing:
        results[0].reason += f" (not Slurm nodes, left out: {', '.join(missing)})"
    state.report.results.extend(results)


# ---------------------------------------------------------------- the fabric

# perftest's run over one rail: its out-of-band TCP port (one per rail), its length, its
# deadline, and the pause that lets the server listen before its client connects.
PERFTEST_PORT = 18515
PERFTEST_RUN_S = 3
PERFTEST_DEADLINE_S = 20
PERFTEST_START_S = 1


def _rail_pairs(
    state: State, nodes: Mapping[str, fabric_check.NodeFabric]
) -> list[tuple[Host, Host, list[tuple[net.Port, net.Port]]]]:
    """The ring of node pairs (each node the client of the next), each with its active rails
    matched by GPU-NIC affinity: the client's rail nearest GPU k to the server's rail nearest
    GPU k (the rail-aligned pairs NCCL's traffic takes); rails without a known GPU follow in
    name order."""
    hosts = [h for h in state.alive if nodes.get(h.name) and nodes[h.name].active_rails]
    pairs_ = []
    for i, client in enumerate(hosts):
        server = hosts[(i + 1) % len(hosts)]
        if server is client or (len(hosts) == 2 and i == 1):
            continue
        mine, theirs = _by_gpu(nodes[client.name]), _by_gpu(nodes[server.name])
        matched = [(mine.pop(k), theirs.pop(k)) for k in [k for k in mine if k in theirs]]
        # As many runs as the node with fewer rails has.
        matched += list(zip(mine.values(), theirs.values(), strict=False))
        pairs_.append((client, server, matched))
    return pairs_


def _by_gpu(node: fabric_check.NodeFabric) -> dict[int | str, net.Port]:
    """A node's active rails keyed by the index of their nearest GPU (the rail's name where the
    probe read no affinity, or two rails share a GPU), in GPU then name order."""
    found: dict[int | str, net.Port] = {}
    for p in sorted(node.active_rails, key=lambda p: p.name):
        gpu = node.rail_gpu.get(f"{p.device}:{p.port}")
        found[gpu if gpu is not None and gpu not in found else p.name] = p

    def order(key: int | str) -> tuple[int, int, str]:
        return (1, 0, key) if isinstance(key, str) else (0, key, "")

    return {k: found[k] for k in sorted(found, key=order)}


def _perftest(
    port: net.Port, tcp_port: int, gid: str | None, cuda_gpu: int | None, dmabuf: bool = False
) -> list[str]:
    argv = ["timeout", str(PERFTEST_DEADLINE_S), "ib_write_bw", "-d", port.device, "-i",
            port.port, "-p", str(tcp_port), "--report_gbits", "-F",
            "-D", str(PERFTEST_RUN_S)]  # fmt: skip
    if gid:
        argv += ["-x", gid]
    if cuda_gpu is not None:
        argv.append(f"--use_cuda={cuda_gpu}")
        if dmabuf:
            # GPU memory through dma-buf instead of nvidia_peermem (perftest's --use_cuda_dmabuf)
            argv.append("--use_cuda_dmabuf")
    return argv


def _dmabuf_only(node: fabric_check.NodeFabric) -> bool:
    return not node.gdr.peermem and bool(node.gdr.dmabuf)


def _cuda_gpu(node: fabric_check.NodeFabric, port: net.Port, cuda: bool) -> int | None:
    """The GPU next to the port for a GPU-memory run (GPU 0 where the affinity is unknown)."""
    return node.rail_gpu.get(f"{port.device}:{port.port}", 0) if cuda else None


def fabric_stage(state: State) -> None:
    """Port error counters after the multi-node runs against the probe's, and ib_write_bw over
    every rail between paired nodes (GPU memory where GPUDirect RDMA is possible)."""
    began_at = time.monotonic()
    nodes = _node_fabrics(state)
    with_ports = [h for h in state.alive if nodes.get(h.name) and nodes[h.name].ports]
    if not with_ports:
        why = "no InfiniBand/RoCE port on any node" if nodes else "the probe read no fabric"
        state.add(judge.skip("fabric-counters", why))
        state.add(judge.skip("fabric-pairs", why))
        return
    read = state.fan_out(
        with_ports,
        lambda h: shlex.join([h.python, "-m", "gpuenv.cluster.probe", "counters"]),
        "port counters",
        deadline_s=state.opts.probe_deadline_s,
    )
    after: dict[str, Mapping[str, Mapping[str, int]] | str] = {}
    for name, out in read.items():
        try:
            after[name] = out.json()["counters"] if out.ok else out.why()
        except (ValueError, KeyError) as exc:
            after[name] = f"no counters in the answer: {exc}"
    before = {h.name: nodes[h.name].before for h in with_ports}
    state.add(judge.fabric_counters(before, after, time.monotonic() - began_at))
    _pair_runs(state, nodes)


def _pair_runs(state: State, nodes: Mapping[str, fabric_check.NodeFabric]) -> None:
    began_at = time.monotonic()
    links = {h.name: state.probes.get(h.name, {}).get("links", {}) for h in state.alive}
    missing = [n for n, lk in links.items() if nodes.get(n) and nodes[n].rails
               and not lk.get("tools.ib_write_bw")]  # fmt: skip
    pairs_ = _rail_pairs(state, nodes)
    if missing or not pairs_:
        why = (
            f"perftest's ib_write_bw not found on {', '.join(missing)} (Debian: apt install"
            " perftest)"
            if missing
            else "fewer than two nodes have an active rail"
        )
        state.add(judge.skip("fabric-pairs", why))
        return
    _, efficiency = _fabric_thresholds(state.opts)
    serve: dict[str, list[str]] = {}
    ask: dict[str, list[str]] = {}
    runs: list[judge.RailRun] = []
    for client, server, rails in pairs_:
        cuda = all((bool(nodes[n].gdr.peermem) or bool(nodes[n].gdr.dmabuf)) and _gpus(h, state)
                   for n, h in ((client.name, client), (server.name, server)))  # fmt: skip
        client_node, server_node = nodes[client.name], nodes[server.name]
        gid = client_node.settings.get("NCCL_IB_GID_INDEX") or client_node.derived.get(
            "NCCL_IB_GID_INDEX"
        )
        for i, (mine, theirs) in enumerate(rails):
            tcp = PERFTEST_PORT + i
            asked = _perftest(
                mine, tcp, gid, _cuda_gpu(client_node, mine, cuda), _dmabuf_only(client_node)
            )
            serve.setdefault(server.name, []).append(
                shlex.join(
                    _perftest(
                        theirs,
                        tcp,
                        gid,
                        _cuda_gpu(server_node, theirs, cuda),
                        _dmabuf_only(server_node),
                    )
                )
                + " >/dev/null 2>&1"
            )
            ask.setdefault(client.name, []).append(
                f"sleep {PERFTEST_START_S}; echo GPUENV_RAIL {i};"
                f" {shlex.join([*asked, server.rendezvous_address])} 2>&1"
            )  # fmt: skip
            rates = [r for r in (mine.rate_gbytes, theirs.rate_gbytes) if r]
            runs.append(judge.RailRun(client.name, server.name, f"{mine.device}:{mine.port}",
                                      min(rates) if rates else None, "", cuda))  # fmt: skip
    hosts = [h for h in state.alive if h.name in serve or h.name in ask]

    def command(h: Host) -> str:
        server_loop = "; ".join(serve.get(h.name, [])) or "true"
        client_loop = "; ".join(ask.get(h.name, [])) or "true"
        return f"( {server_loop} ) & ( {client_loop} ); wait"

    count = max(len(r) for _, _, r in pairs_)
    deadline_s = count * (PERFTEST_DEADLINE_S + PERFTEST_START_S) + 10
    out = state.fan_out(hosts, command, "ib_write_bw pairs", deadline_s=deadline_s)
    for client, _, rails in pairs_:
        answer = out[client.name]
        parts = answer.stdout.split("GPUENV_RAIL ")[1:] if answer.ok else []
        for i in range(len(rails)):
            run = next(r for r in runs if r.client == client.name
                       and r.rail == f"{rails[i][0].device}:{rails[i][0].port}")  # fmt: skip
            run.output = parts[i].partition("\n")[2] if i < len(parts) else answer.why()
    state.add(judge.fabric_pairs(runs, efficiency, time.monotonic() - began_at))


STAGES: tuple[Stage, ...] = (
    Stage("health", health_stage),
    Stage("check", check_stage),
    Stage("consistency", consistency_stage),
    Stage("slurm", slurm_stage),
    Stage("rendezvous", rendezvous_stage, multi_node=True),
    Stage(
        "torch",
        torch_stage,
        multi_node=True,
        needs=("rendezvous",),
        gives=("allreduce", "busbw", "ddp"),
    ),
    Stage("mpi", mpi_stage, multi_node=True, needs=("rendezvous",)),
    Stage("pairs", pairs_stage, multi_node=True, needs=("rendezvous",)),
    Stage("fabric", fabric_stage, multi_node=True, needs=("rendezvous",)),
    Stage("dask", dask_stage, multi_node=True, needs=("rendezvous",), optional=True),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
# Stages that read only the probe's facts and write nothing the others read: one step, all at
# once (health's and rendezvous' few light processes beside the nodes' checks).
TOGETHER = ("health", "check", "rendezvous")
OPTIONAL_STAGES = tuple(s.name for s in STAGES if s.optional)
# The stage that needs a Python package on the nodes, and which (from the probe's facts).
_PACKAGES = {"torch": "torch", "pairs": "torch", "mpi": "mpi4py", "dask": "distributed"}


def validate(hosts: Sequence[Host], opts: Options | None = None) -> ClusterReport:
    """Run the selected stages over ``hosts``; never raises for a node's failure."""
    opts = opts or Options()
    began_at = time.monotonic()
    state = State(list(hosts), opts, ClusterReport(hosts=[h.name for h in hosts]))
    probe_stage(state)
    selected = [s for s in STAGES if (s.name in opts.stages if opts.stages else not s.optional)]
    together = [s for s in selected if s.name in TOGETHER]
    for stage in selected:
        if stage in together[1:]:
            continue  # ran with the first of them
        if stage in together:
            _run_together(together, state)
        else:
            _run_stage(stage, state)
    state.report.duration_s = time.monotonic() - began_at
    return state.report


def _run_stage(stage: Stage, state: State) -> None:
    why = _why_not(stage, state)
    if why:
        state.add(judge.skip(stage.name, why))
        for name in stage.gives:
            state.add(judge.skip(name, f"the {stage.name} stage did not run: {why}"))
    else:
        stage.run(state)
    _name_left(state, stage)


def _run_together(stages: Sequence[Stage], state: State) -> None:
    """``stages`` at the same time, each on its own copy of the state (the probe's facts shared,
    read only); then their results, node reports and left-out checks, in ``stages``' order."""
    copies = [
        State(state.hosts, state.opts, ClusterReport(hosts=state.report.hosts),
              probes=state.probes, alive=state.alive)
        for _ in stages
    ]  # fmt: skip
    with cf.ThreadPoolExecutor(len(stages), thread_name_prefix="gpuenv-stage") as pool:
        done = [pool.submit(_run_stage, s, c) for s, c in zip(stages, copies, strict=True)]
        for fut in done:
            fut.result()
    for copy in copies:
        state.report.results.extend(copy.report.results)
        state.report.node_reports.update(copy.report.node_reports)
        state.left.update(copy.left)


def _name_left(state: State, stage: Stage) -> None:
    """A cluster result that stands for node checks the nodes left to its stage says so, and
    which nodes: its PASS is their PASS, its FAIL or SKIP their failure."""
    for check, covering in COVERING_STAGES.items():
        nodes = sorted(n for n, left in state.left.items() if check in left)
        if covering != stage.name or not nodes:
            continue
        for r in reversed(state.report.results):
            if r.check == check and r.node == CLUSTER_NODE:
                r.reason += f" [stands for the {check} check of {', '.join(nodes)}]"
                r.details["node_checks_left_here"] = nodes
                break


def _why_not(stage: Stage, state: State) -> str | None:
    """Why a stage cannot run now; None when it can."""
    if stage.multi_node and len(state.alive) < 2:
        return f"{len(state.alive)} node(s) answered; multi-node runs need 2"
    for need in stage.needs:
        got = [r for r in state.report.results if r.check == need and r.node == CLUSTER_NODE]
        if not got or got[-1].status is not Status.PASS:
            return f"the {need} stage did not pass"
    package = _PACKAGES.get(stage.name)
    if package and not any(
        f"pkg.{package}" in state.probes[h.name].get("facts", {}) for h in state.alive
    ):
        return f"{package} is not installed on any node (cluster venv)"
    return None
