"""`gpuenv cluster`: validate every node of an Ansible inventory, together (docs/cluster.md)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuenv.cli.argtypes import output_target, positive
from gpuenv.errors import BadInput

if TYPE_CHECKING:
    from gpuenv.results import ClusterReport


def _sizes(text: str) -> list[int]:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for word in text.split(","):
        word = word.strip().upper().removesuffix("IB").removesuffix("B")
        scale = units.get(word[-1:], 1) if word else 1
        number = word[:-1] if word[-1:] in units else word
        try:
            value = int(float(number) * scale)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad size {word!r} (e.g. 1M,64M,1G)") from None
        if value < 4 or value % 4:
            raise argparse.ArgumentTypeError(f"size {word!r}: must be a multiple of 4 bytes")
        out.append(value)
    return sorted(out)


def _mib_list(sizes: Sequence[int]) -> str:
    return ",".join(f"{s >> 20}M" for s in sizes)


def register(subparsers: Any) -> None:
    from gpuenv.cluster import defaults, pairs

    p = subparsers.add_parser(
        "cluster",
        help="validate all nodes of an inventory: checks, consistency, multi-node runs, pairs",
        description="Fan out `gpuenv check` to every node, compare their stacks, run NCCL/gloo, "
        "DDP and MPI across nodes, and isolate bad nodes. Exit 0 when the run is OK by its "
        "profile's rules, 1 when not, 2 on bad input (nothing launched).",
    )
    p.add_argument(
        "-i",
        "--inventory",
        required=True,
        action="append",
        help="Ansible inventory source (file, folder, plugin); repeat for several, as ansible does",
    )
    p.add_argument("-l", "--limit", help="Ansible host pattern restricting the nodes")
    p.add_argument("--json", metavar="FILE", help="write the cluster report as JSON ('-': stdout)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML (one testsuite per node)")
    p.add_argument("--html", metavar="FILE", help="write the self-contained HTML report")
    p.add_argument(
        "--deadline",
        type=positive(float, "seconds > 0"),
        default=defaults.DEADLINE_S,
        help="deadline of each node's command and of each launch"
        f" (default {defaults.DEADLINE_S:g})",
    )
    p.add_argument(
        "--port",
        type=int,
        default=defaults.PORT,
        help=f"rendezvous port on the first node; pair runs use the next ones"
        f" (default {defaults.PORT})",
    )
    p.add_argument(
        "--min-busbw",
        type=positive(float, "GB/s > 0"),
        metavar="GBPS",
        help="all-node busbw below this fails and starts bad-node isolation",
    )
    p.add_argument(
        "--pair-relative",
        type=positive(float, "a fraction > 0"),
        default=pairs.RELATIVE,
        help="without --min-busbw, a pair fails below this x the median"
        f" (default {pairs.RELATIVE:g})",
    )
    p.add_argument(
        "--nproc-per-node",
        type=positive(int, "a whole number > 0"),
        help="ranks per node for torchrun (default: its GPUs, 1 without GPUs)",
    )
    p.add_argument(
        "--sizes",
        type=_sizes,
        help=f"all-reduce sizes across nodes (default {_mib_list(defaults.SIZES)}, or the"
        " profile's cluster.sizes_mib: 1M,8M under cpu)",
    )
    p.add_argument(
        "--pair-size",
        type=_sizes,
        help=f"all-reduce size of each pair test (default {_mib_list([defaults.PAIR_BYTES])},"
        " or the profile's cluster.pair_mib: 8M under cpu)",
    )
    p.add_argument(
        "--matrix-max-nodes",
        type=int,
        default=defaults.MATRIX_MAX_NODES,
        help="measure the full pair matrix up to this many nodes"
        f" (default {defaults.MATRIX_MAX_NODES})",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="STAGES",
        help="comma-separated stages to leave out: health, check, consistency, slurm, rendezvous,"
        " torch, mpi, pairs, dask (docs/cluster.md)",
    )
    p.add_argument(
        "--with",
        dest="with_stages",
        action="append",
        default=[],
        metavar="STAGES",
        help="comma-separated optional stages to add: dask (a profile that requires one, such as"
        " frameworks, adds it by itself)",
    )
    p.add_argument(
        "--profile",
        default="quick",
        help="quick or full (GPU clusters), cpu (CPU-only clusters such as the lab), frameworks"
        " (quick plus the optional framework checks and the dask stage), examples (quick plus"
        " the examples check on every node); the nodes' checks run with it too (default quick)",
    )
    p.add_argument(
        "--check-args",
        default="",
        help="more arguments for `gpuenv check` on the nodes (e.g. '--expect-gpus 8')",
    )
    p.add_argument(
        "--thresholds",
        metavar="FILE",
        help="a thresholds file (docs/checks.md): checked here, judged by here and on the nodes",
    )
    p.add_argument(
        "--no-gdr-required",
        action="store_true",
        help="do not require GPUDirect RDMA where GPUs talk over InfiniBand/RoCE (default: the"
        " thresholds' fabric.gdr_required, true)",
    )
    p.add_argument(
        "--launcher",
        choices=("ssh", "srun"),
        default="ssh",
        help="how the multi-node runs start: ssh (each node over SSH, default) or srun (one srun"
        " per run on the Slurm submit host, inside an allocation; docs/slurm.md)",
    )
    p.add_argument(
        "--slurm-host",
        metavar="HOST",
        help="the inventory host that runs srun (default: the slurm_controller group's host)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress display")
    p.set_defaults(func=handler)


def _names(option: str, items: Sequence[str], known: tuple[str, ...]) -> list[str]:
    wanted = [s.strip() for item in items for s in item.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in known]
    if unknown:
        raise BadInput(
            f"{option}: unknown stage(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return wanted


def _stages(
    skip: Sequence[str], add: Sequence[str] = (), required: Sequence[str] = ()
) -> tuple[str, ...]:
    """The stages to run: every stage that is not optional, the optional ones ``--with`` names or
    the profile requires (``required``: its cluster checks), less those ``--skip`` names."""
    from gpuenv.cluster.pipeline import OPTIONAL_STAGES, STAGE_NAMES

    left_out = _names("--skip", skip, STAGE_NAMES)
    added = _names("--with", list(add), OPTIONAL_STAGES) + [
        s for s in OPTIONAL_STAGES if s in required
    ]
    return tuple(
        s for s in STAGE_NAMES if s not in left_out and (s not in OPTIONAL_STAGES or s in added)
    )


def _stage_names() -> tuple[str, ...]:
    from gpuenv.cluster.pipeline import STAGE_NAMES

    return STAGE_NAMES


def handler(args: argparse.Namespace) -> int:
    _names("--skip", args.skip, _stage_names())
    if args.slurm_host and args.launcher != "srun":
        raise BadInput("--slurm-host goes with --launcher srun")
    if not 1024 <= args.port <= 65000:
        raise BadInput(f"--port {args.port}: expected 1024..65000")
    if args.matrix_max_nodes < 0:
        raise BadInput("--matrix-max-nodes: expected a whole number >= 0")
    try:
        check_args = shlex.split(args.check_args)
    except ValueError as exc:
        raise BadInput(f"--check-args: {exc}") from exc
    reserved = ("--json", "--junit", "--node", "--profile", "--thresholds-text",
                "--left-to-cluster")  # fmt: skip
    if set(reserved) & {a.partition("=")[0] for a in check_args}:
        raise BadInput(f"--check-args: {', '.join(reserved)} are set by gpuenv cluster")
    from gpuenv.cli.check import validate_node_args

    validate_node_args("--check-args", check_args)
    output_target("--json", args.json, stdout_ok=True)
    output_target("--junit", args.junit)
    output_target("--html", args.html)

    from gpuenv.checks.profiles import requirements
    from gpuenv.checks.thresholds import load_thresholds

    thresholds = load_thresholds(args.thresholds)
    if args.thresholds:
        if "--thresholds" in check_args:
            raise BadInput("--thresholds: give it once (here, or a node path in --check-args)")
        # The nodes judge with the same file: its text goes with their command line.
        check_args += ["--thresholds-text", Path(args.thresholds).read_text(encoding="utf-8")]
    requirements(thresholds, args.profile, gpu_node=True)  # an unknown profile stops here
    cluster_requires = {
        "gpu" if gpu else "cpu": tuple(requirements(thresholds, args.profile, gpu, "cluster") or ())
        for gpu in (True, False)
    }
    required = [name for names in cluster_requires.values() for name in names]
    stages = _stages(args.skip, args.with_stages, required)
    sizes, pair_bytes = _launch_sizes(args, thresholds)

    from rich.console import Console

    from gpuenv.cluster import defaults, inventory, pipeline

    hosts = inventory.load(args.inventory, args.limit)  # BadInput before anything is launched
    out = Console(stderr=args.json == "-")
    out.print(f"gpuenv cluster: {len(hosts)} node(s): {', '.join(h.name for h in hosts)}")
    slurm = _slurm(args, hosts)  # --launcher srun: BadInput before anything is launched
    opts = pipeline.Options(
        check_args=["--profile", args.profile, *check_args],
        deadline_s=args.deadline,
        probe_deadline_s=min(defaults.PROBE_DEADLINE_S, args.deadline),
        port=args.port,
        nproc_per_node=args.nproc_per_node,
        sizes=sizes,
        pair_bytes=pair_bytes,
        min_busbw=args.min_busbw,
        pair_relative=args.pair_relative,
        matrix_max_nodes=args.matrix_max_nodes,
        max_loss_ratio=float(thresholds["ddp"]["max_loss_ratio"]),  # the node check's own
        stages=stages,
        gdr_required=False if args.no_gdr_required else bool(thresholds["fabric"]["gdr_required"]),
        pair_efficiency=float(thresholds["fabric"]["pair_efficiency"]),
        slurm=slurm,
        cluster_requires=cluster_requires,
    )
    report = _run(opts, hosts, args.profile, thresholds, out, not args.no_progress)
    _write_reports(report, args, out)
    return 0 if report.ok else 1


def _launch_sizes(args: argparse.Namespace, thresholds: Any) -> tuple[list[int], int]:
    """The all-reduce sizes of the all-node launch and the pair size: the options, else the
    profile's ``cluster`` entry (thresholds.yaml), else the defaults."""
    from gpuenv.cluster import defaults

    own = thresholds["profiles"][args.profile].get("cluster", {})

    def to_bytes(mib: float) -> int:  # whole float32 elements, at least one
        return max(4, int(mib * defaults.MIB) // 4 * 4)

    sizes = args.sizes or sorted(to_bytes(m) for m in own.get("sizes_mib", []))
    sizes = sizes or list(defaults.SIZES)
    if args.pair_size:
        return sizes, args.pair_size[-1]
    return sizes, to_bytes(own["pair_mib"]) if "pair_mib" in own else defaults.PAIR_BYTES


def _slurm(args: argparse.Namespace, hosts: list[Any]) -> Any:
    """The Slurm the srun launcher goes through (None for ssh): its submit host from
    --slurm-host or the slurm_controller group, every host matched to a Slurm node."""
    from gpuenv.cluster import inventory, slurm

    if args.launcher != "srun":
        return None
    where = args.slurm_host or slurm.SUBMIT_GROUP
    try:
        group = inventory.load(args.inventory, where)
    except BadInput as exc:
        if args.slurm_host:
            raise BadInput(f"--slurm-host {args.slurm_host}: {exc}") from exc
        group = []
    submit = slurm.submit_host(hosts, args.slurm_host, group)
    return slurm.connect(submit, hosts)


def _run(
    opts: Any, hosts: list[Any], profile: str, thresholds: Any, out: Any, live: bool
) -> ClusterReport:
    import datetime as dt

    from gpuenv import __version__
    from gpuenv.checks.profiles import assess_cluster
    from gpuenv.cluster import pipeline
    from gpuenv.report import console as console_report
    from gpuenv.report.live import Steps

    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if live:
        with Steps(out) as steps:
            opts.progress = steps
            report = pipeline.validate(hosts, opts)
    else:
        report = pipeline.validate(hosts, opts)
    report.profile = profile
    report.started_at = started
    report.command = ["gpuenv", *sys.argv[1:]]
    report.gpuenv_version = __version__
    report.verdict = assess_cluster(thresholds, profile, report)
    console_report.print_cluster_summary(report, out)
    return report


def _write_reports(report: ClusterReport, args: argparse.Namespace, out: Any) -> None:
    from gpuenv.report import jsonreport, junit
    from gpuenv.results import CLUSTER_NODE

    if args.json:
        jsonreport.write(report, args.json)
    if args.junit:
        verdicts = {n: r.verdict for n, r in report.node_reports.items()}
        if report.verdict is not None:
            verdicts[CLUSTER_NODE] = report.verdict
        junit.write(report.results, args.junit, "gpuenv.cluster", verdicts)
    if args.html:
        from gpuenv.report import html

        html.write(report, args.html)
        out.print(f"HTML report: {args.html}")
