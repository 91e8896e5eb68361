"""`gpuenv health`: a passive one-shot scan of this node's GPUs, NVSwitches and InfiniBand ports
(docs/health.md). No daemon, no DCGM: NVML, the kernel log, sysfs.

Exit 0 when no finding reaches --fail-on, 1 when one does, 2 on bad input (nothing scanned).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any

from gpuenv.cli.argtypes import output_target, positive
from gpuenv.errors import BadInput
from gpuenv.health.dcgm import LEVELS as DCGM_LEVELS  # standard library only
from gpuenv.health.findings import ACTIONS, MUST_NOT_RUN_JOBS  # the ladder (standard library only)
from gpuenv.health.slurm import CACHE_FILE, CACHE_S  # standard library only


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "health",
        help="scan this node's GPUs for ECC, row remap, Xid, throttling, PCIe, NVLink, IB faults",
        description="Read NVML, the kernel log and sysfs once; each signal becomes a finding with"
        " an action (none, watch, reset, reboot, drain, replace) and its source. Exit 0 healthy,"
        " 1 a finding at or above --fail-on, 2 on bad input.",
    )
    p.add_argument("-i", "--inventory", help="scan every node of this Ansible inventory at once")
    p.add_argument("-l", "--limit", help="with -i: Ansible host pattern restricting the nodes")
    p.add_argument("--deadline", type=positive(float, "seconds > 0"), metavar="SECONDS",
                   help="with -i: deadline of each node's scan (default 60)")  # fmt: skip
    p.add_argument("--become", action="store_true",
                   help="with -i: scan as root (sudo -n), reading and writing each node's state"
                   " file; otherwise the nodes scan with --no-state")  # fmt: skip
    p.add_argument("--html", metavar="FILE", help="with -i: write the node x signal table as HTML")
    p.add_argument("--fail-on", choices=ACTIONS[1:], default=MUST_NOT_RUN_JOBS, metavar="ACTION",
                   help="exit 1 when a finding's action is this or above (watch, reset, reboot,"
                   f" drain, replace; default {MUST_NOT_RUN_JOBS}: a node that needs a reset or"
                   " more must not take the next job). A looser value is your choice: the verdict"
                   " line still names what the node needs")  # fmt: skip
    p.add_argument("--thresholds", metavar="FILE", help="YAML overriding the health section")
    p.add_argument("--dcgm", type=int, choices=DCGM_LEVELS, metavar="LEVEL",
                   help="also run DCGM's `dcgmi diag -r LEVEL` (1, 2 or 3) under a deadline and"
                   " merge its results; no dcgmi or host engine: SKIP with the reason")  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="write the JSON report ('-': stdout)")
    p.add_argument("--prometheus", metavar="FILE",
                   help="write the Prometheus text format (atomically; node-exporter's textfile"
                   " collector reads *.prom)")  # fmt: skip
    p.add_argument(
        "--state", metavar="FILE", help="history file (default /var/lib/gpuenv/health.json)"
    )
    p.add_argument("--no-state", action="store_true", help="neither read nor write a history file")
    p.add_argument("--clear", action="store_true",
                   help="record a repair (who and when) instead of scanning: every finding, or"
                   " --finding ID")  # fmt: skip
    p.add_argument("--finding", metavar="ID", help="with --clear: the finding's id (see --json)")
    p.add_argument("--node", help="node name in the report and, with --slurm, in Slurm (default:"
                   " $SLURMD_NODENAME under --slurm, else the short host name)")  # fmt: skip
    p.add_argument("--slurm", action="store_true",
                   help="Slurm's HealthCheckProgram: drain this node with a reason starting"
                   " 'gpuenv:' and the top finding (a scan that fails drains too), resume it when"
                   " healthy only if gpuenv drained it (docs/slurm.md)")  # fmt: skip
    p.add_argument("--prolog", action="store_true",
                   help="Slurm's prolog: pass on a fresh healthy cached verdict, else scan; never"
                   " calls slurmctld; a scan that fails fails the prolog")  # fmt: skip
    p.add_argument(
        "--scan-failed",
        metavar="WHY",
        help="with --slurm: scan nothing; drain with 'gpuenv: health scan failed: WHY' by the same"
        " rule (someone else's drain is kept) and record it in the cache. The health-check script"
        " calls it when a scan ends without a verdict (docs/slurm.md)",
    )
    p.add_argument(
        "--cache",
        metavar="FILE",
        help=f"with --slurm/--prolog: the verdict cache (default {CACHE_FILE})",
    )
    p.add_argument(
        "--cache-s",
        type=positive(float, "seconds > 0"),
        metavar="SECONDS",
        help=f"with --prolog: trust a cached verdict this long (default {CACHE_S:g})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="list the clean signals too")
    p.add_argument("--root", metavar="DIR", help="read a recorded node under DIR (tests)")
    p.add_argument("--nvml-fixture", metavar="FILE", help="answer NVML from this JSON (tests)")
    p.add_argument("--kernel-log", metavar="FILE", help="read the kernel log from FILE (tests)")
    p.set_defaults(func=handler)


def _validate_fleet(args: argparse.Namespace) -> None:
    for option in ("thresholds", "prometheus", "state", "no_state", "clear", "finding", "node",
                   "root", "nvml_fixture", "kernel_log", "dcgm"):  # fmt: skip
        if getattr(args, option):
            name = option.replace("_", "-")
            raise BadInput(f"--{name} is for one node's scan; with -i each node scans itself")
    output_target("--json", args.json, stdout_ok=True)
    output_target("--html", args.html)


def _validate_slurm(args: argparse.Namespace) -> None:
    if args.slurm and args.prolog:
        raise BadInput("--slurm and --prolog together: the health check or the prolog")
    if not (args.slurm or args.prolog):
        for option in ("cache", "cache_s"):
            if getattr(args, option) is not None:
                raise BadInput(f"--{option.replace('_', '-')} needs --slurm or --prolog")
        return
    if args.cache_s is not None and not args.prolog:
        raise BadInput("--cache-s is the prolog's: it needs --prolog")
    for option in ("inventory", "clear", "json", "prometheus"):
        if getattr(args, option):
            raise BadInput(f"--{option} does not go with --slurm/--prolog")


def _validate(args: argparse.Namespace) -> None:
    _validate_slurm(args)
    if args.inventory:
        _validate_fleet(args)
        return
    for option in ("limit", "deadline", "become", "html"):
        if getattr(args, option):
            raise BadInput(f"--{option} needs -i INVENTORY")
    if args.finding and not args.clear:
        raise BadInput("--finding needs --clear")
    if args.clear and args.no_state:
        raise BadInput("--clear records into the state file: drop --no-state")
    if args.clear:
        for option in ("json", "prometheus", "nvml_fixture", "kernel_log", "dcgm"):
            if getattr(args, option):
                raise BadInput(f"--{option.replace('_', '-')} is for a scan, not --clear")
    if args.no_state and args.state:
        raise BadInput("--state and --no-state together")
    for option, path in (("--root", args.root),):
        if path is not None and not Path(path).is_dir():
            raise BadInput(f"{option} {path}: not a folder")
    for option, path in (("--nvml-fixture", args.nvml_fixture), ("--kernel-log", args.kernel_log)):
        if path is not None and not Path(path).is_file():
            raise BadInput(f"{option} {path}: not a file")
    output_target("--json", args.json, stdout_ok=True)
    output_target("--prometheus", args.prometheus)
    if not args.no_state:
        _state_writable(_state_path(args))


def _state_writable(path: str) -> None:
    """The state file's folder is made when missing (/var/lib/gpuenv on a fresh node): the
    nearest folder that exists must let us write."""
    target = Path(path)
    if target.is_dir():
        raise BadInput(f"--state {path}: a folder, not a file")
    folder = target.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(
            f"--state {path}: cannot write under {folder} (run as root, or give --state FILE"
            " or --no-state)"
        )
    if target.exists() and not os.access(target, os.W_OK):
        raise BadInput(f"--state {path}: not writable")


def _state_path(args: argparse.Namespace) -> str:
    from gpuenv.health.history import DEFAULT_STATE

    return args.state or DEFAULT_STATE


def _who() -> str:
    return os.environ.get("SUDO_USER") or os.environ.get("USER") or f"uid {os.getuid()}"


def _runner(args: argparse.Namespace) -> Any:
    from gpuenv import proc

    if args.kernel_log is None:
        return proc.command_output
    text = Path(args.kernel_log).read_text(encoding="utf-8", errors="replace")

    def recorded(argv: list[str], timeout_s: float = 0.0) -> tuple[int, str]:
        return (0, text) if argv[0] == "journalctl" else (127, "")

    return recorded


def _without_nvml(root: str) -> Any:
    """No nvidia-ml-py: fine on a node with no NVIDIA GPU on its bus and no nvidia module (a CPU
    node, a lab container: the scan has nothing to find), bad input where there is one to read."""
    from gpuenv.floor import health as floor
    from gpuenv.floor import pci
    from gpuenv.health.nvml import NoNvml

    devices = pci.devices(root) or []
    if any(d.is_gpu for d in devices) or floor.module_version(root):
        raise BadInput("nvidia-ml-py (pynvml) is not installed: pip install nvidia-ml-py")
    return NoNvml("nvidia-ml-py is not installed and no NVIDIA GPU is on the PCI bus")


def _fleet(args: argparse.Namespace) -> int:
    from gpuenv.cluster import inventory
    from gpuenv.health import fleet
    from gpuenv.health.history import write_atomic
    from gpuenv.report import health as render

    hosts = inventory.load(args.inventory, args.limit)  # BadInput before anything runs
    deadline_s = args.deadline if args.deadline is not None else fleet.DEADLINE_S
    scanned = fleet.scan_fleet(hosts, deadline_s, become=args.become)
    if args.json == "-":
        sys.stdout.write(render.fleet_json(scanned, args.fail_on))
    else:
        if args.json:
            write_atomic(args.json, render.fleet_json(scanned, args.fail_on))
        render.fleet_console(scanned, args.fail_on, args.verbose)
    if args.html:
        write_atomic(args.html, render.fleet_html(scanned, args.fail_on))
    return 1 if scanned.failing(args.fail_on) else 0


def handler(args: argparse.Namespace) -> int:
    if args.scan_failed is not None:
        return _scan_failed(args)  # no scan: nothing of the scanner is loaded
    _validate(args)
    if args.inventory:
        return _fleet(args)
    from gpuenv.checks.thresholds import load_thresholds
    from gpuenv.health import history

    thresholds = load_thresholds(args.thresholds)  # unknown keys, wrong types: exit 2 here
    state_path = None if args.no_state else _state_path(args)
    state = history.load(state_path) if state_path else history.empty_state()
    if args.clear:
        ids = history.clear(state, args.finding, _who(), time.time())
        history.save(state_path, state)
        when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"cleared {len(ids)} finding(s) by {_who()} at {when}: {', '.join(ids) or '-'}")
        return 0

    if args.slurm or args.prolog:
        return _slurm(args, thresholds, state, state_path)

    from gpuenv.report import health as render

    report = _scan(args, thresholds, state)
    if state_path:
        history.save(state_path, report.state)
    if args.json == "-":
        sys.stdout.write(render.to_json(report))
    else:
        if args.json:
            history.write_atomic(args.json, render.to_json(report))
        render.console(report, args.fail_on, args.verbose)
    if args.prometheus:
        history.write_atomic(args.prometheus, render.prometheus(report))
    return 1 if report.failing(args.fail_on) else 0


def _scan(args: argparse.Namespace, thresholds: Any, state: Any) -> Any:
    from gpuenv.health.nvml import FakeNvml, PynvmlNvml
    from gpuenv.health.scan import scan

    if args.nvml_fixture:
        nvml: Any = FakeNvml.from_file(args.nvml_fixture)
        try:
            nvml.read()  # a fixture this gpuenv cannot read is bad input, not a crash
        except (ValueError, TypeError, KeyError) as exc:
            raise BadInput(f"--nvml-fixture {args.nvml_fixture}: {exc}") from None
    else:
        try:
            nvml = PynvmlNvml()
        except ImportError:
            nvml = _without_nvml(args.root or "/")
    report = scan(args.root or "/", _runner(args), nvml, thresholds, state, node=args.node)
    if args.dcgm:
        from gpuenv import proc
        from gpuenv.health import dcgm

        merged = dcgm.diagnose(args.dcgm, proc.command_output)
        report.findings += merged.findings
        report.skipped += merged.skipped
    return report


def _slurm(args: argparse.Namespace, thresholds: Any, state: Any, state_path: str | None) -> int:
    """--slurm and --prolog (docs/slurm.md). Exit 0 healthy, 1 not (or the scan failed: never a
    pass), 3 when slurmctld could not be told (the HealthCheckProgram script then drains)."""
    from gpuenv.health import history, slurm

    cache = args.cache or slurm.CACHE_FILE

    def problem() -> str | None:
        report = _scan(args, thresholds, state)
        if state_path:
            history.save(state_path, report.state)
        return slurm.problem_of(report, args.fail_on)

    if args.prolog:
        usable, cached = slurm.cached_verdict(
            cache, args.cache_s if args.cache_s is not None else slurm.CACHE_S, time.time()
        )
        if usable:
            print(f"cached verdict: {cached or 'healthy'}")
            return 0 if cached is None else 1
        try:
            found = problem()
        # Fail-closed: whatever stopped the scan fails the prolog, named.
        except Exception as exc:
            found = slurm.scan_failed(f"{type(exc).__name__}: {exc}")
        slurm.write_verdict(cache, found, time.time())
        print(found or "healthy")
        return 0 if found is None else 1
    return _tell_slurm(args, problem)


def _scan_failed(args: argparse.Namespace) -> int:
    """--slurm --scan-failed=WHY: the health-check script's record of a scan without a verdict."""
    from gpuenv.health import slurm

    if not args.slurm:
        raise BadInput("--scan-failed goes with --slurm")
    why = " ".join(args.scan_failed.split())
    if not why:
        raise BadInput("--scan-failed needs the cause, in words")
    return _tell_slurm(args, lambda: slurm.scan_failed(why))


def _tell_slurm(args: argparse.Namespace, problem: Any) -> int:
    from gpuenv import proc
    from gpuenv.health import slurm

    node = args.node or os.environ.get("SLURMD_NODENAME") or _short_host()
    outcome = slurm.health_check(
        node, problem, args.cache or slurm.CACHE_FILE, proc.command_output, time.time
    )
    *lines, verdict = outcome.lines()
    stream = sys.stdout if outcome.decision is not None else sys.stderr
    for line in lines:
        print(line, file=stream)
    print(verdict)
    return outcome.exit_code


def _short_host() -> str:
    import socket

    return socket.gethostname().split(".")[0]
