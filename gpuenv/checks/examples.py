"""`examples`: the seed documents' methods (examples/), run the way users run them, judged by
their own verification line.

Optional (``--only examples``, or the ``examples`` profile, which requires it). One driver
process (launcher placement, one rank) waits at its gate like the other launched checks, then
starts each example as docs/examples.md tells users to: ``mpirun -n N python3 FILE``, torchrun
(``python3 -m torch.distributed.run``, the same program), ``horovodrun``, ``python3 FILE``; with
this node's Python (``sys.executable``), one example after the other, each in its own process
session under its own deadline (gpuenv.proc: on expiry the whole session is killed), its output
to a file.

Each example checks its own answer and ends with one line ``EXAMPLE-RESULT {json}``. An example
PASSes only when that line says ``"ok": true`` and it exited 0 (and, on a GPU node, it ran on the
GPU: ``"device": "cuda"``); it SKIPs, before anything is started, naming what is missing (a
module, a launcher, nvcc); anything else FAILs with the example's own error lines: its ``ok:
false`` line, a crash (the signal, from the exit status or the launcher's words), an exit
without the line, a deadline. On a CPU-only node the examples that need a GPU (NCCL, PyCUDA)
do not apply: they are named in the reason, never run, never counted.

The check FAILs when any example failed; else SKIPs when any was skipped (naming each and why,
and what passed), so that a profile requiring it is not OK while a method users run cannot run;
else PASSes. ``profiles.<profile>.examples.run`` names the examples to run (a site without
Horovod leaves it out; every example where the profile does not say).

The examples travel inside gpuenv's wheel as the package ``gpuenv.examples`` (pyproject.toml
maps it to the checkout's examples/, as it maps gpuenv.floor), so that a node with gpuenv
installed from the wheel has them; from a checkout they are found beside the package.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from gpuenv import proc
from gpuenv.checks import ranklog
from gpuenv.checks.base import (
    Context,
    NodeInfo,
    Placement,
    always_needed,
    has_module,
    is_open_mpi,
    mpirun_flags,
)
from gpuenv.checks.pycuda import nvcc
from gpuenv.results import Measurement, Result, Status

NAME = "examples"
DESCRIPTION = (
    "the seed documents' methods (examples/) run as users run them (mpirun, torchrun,"
    " horovodrun, python3), each judged by its own EXAMPLE-RESULT line"
)
PLACEMENT = Placement.LAUNCHER
OPTIONAL = True
needed = always_needed

RESULT_PREFIX = "EXAMPLE-RESULT "
MIN_RANKS = 2  # a collective with itself proves nothing; where a GPU of its own is not needed
EACH_S = 180.0  # one example's deadline, unless the profile says (examples.each_s)
SPARE_S = 2.0  # kept from the check's deadline to report what ran
ERROR_LINES = 6  # of an example's output, in a FAIL's reason
TAIL_LINES = 30  # of an example's output, in the details
LINE_CHARS = 300
# Lines of an example's output that say what went wrong (a traceback's last line, sys.exit's
# message, a launcher's report of a rank's death).
ERROR_WORDS = re.compile(
    r"Error|ERROR|error:|FAILED|Traceback|Segmentation fault|exited on signal|[Ss]ignal \d+"
    r"|core dumped|Killed|Abort|NCCL WARN"
)
SIGNAL_WORDS = re.compile(r"exited on signal (\d+)|[Ss]ignal (\d+) \(SIG|exitcode\s*:\s*-(\d+)")


@dataclass(frozen=True)
class Example:
    """One file of examples/: how it is started and what it needs."""

    name: str
    launcher: str  # mpirun, torchrun, horovodrun or python
    modules: tuple[str, ...]  # imported wherever it runs
    gpu_modules: tuple[str, ...] = ()  # imported too where it runs on GPUs
    tools: tuple[str, ...] = ()  # executables it needs
    on_cpu: bool = True  # it has a CPU-only run
    crash_hint: str = ""  # what a crash of it most often means


EXAMPLES = (
    Example(
        "mpi_cupy", "mpirun", ("mpi4py", "numpy"), ("cupy",), ("mpirun",),
        crash_hint="MPI read a CuPy device buffer as host memory: this MPI is not CUDA-aware, and"
        " users' comm.Bcast(cupy_array) crashes the same way (docs/examples.md)",
    ),
    Example("nccl_cupy_mpi", "mpirun", ("mpi4py", "cupy"), (), ("mpirun",), on_cpu=False),
    Example("dask_cupy", "python", ("dask", "distributed", "numpy"), ("cupy",)),
    Example("ddp_torchrun", "torchrun", ("torch",)),
    Example("tf_mirrored", "python", ("tensorflow", "numpy")),
    Example(
        "horovod_cupy", "horovodrun", ("horovod", "tensorflow", "numpy"), ("cupy",),
        ("horovodrun",),
    ),
    Example("pycuda_kernel", "python", ("pycuda", "numpy"), (), ("nvcc",), on_cpu=False),
)  # fmt: skip
BY_NAME = {e.name: e for e in EXAMPLES}


def examples_dir() -> Path | None:
    """Where the example files are: the package gpuenv.examples (the wheel, an editable
    install), else the checkout's examples/ beside the gpuenv package; None when neither."""
    try:
        spec = find_spec("gpuenv.examples")
    except (ImportError, ValueError):
        spec = None
    places = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    places.append(Path(__file__).resolve().parents[2] / "examples")
    return next((p for p in places if (p / f"{EXAMPLES[0].name}.py").is_file()), None)


def unavailable(ctx: Context, node: NodeInfo) -> str | None:
    if examples_dir() is None:
        return "the examples are not installed (gpuenv.examples is missing from this gpuenv)"
    unknown = sorted(set(ctx.profile_params(NAME).get("run") or []) - set(BY_NAME))
    if unknown:
        return f"examples.run names no example: {', '.join(unknown)}; known: {', '.join(BY_NAME)}"
    return None


def world(ctx: Context, node: NodeInfo) -> int:
    return 1  # the driver; the examples' ranks are their launchers'


def command(ctx: Context, node: NodeInfo, world: int) -> list[str]:
    return [sys.executable, "-m", "gpuenv.checks.examples", "--gpus", str(len(node.gpus))]


def environment(ctx: Context, node: NodeInfo) -> dict[str, str]:
    return {}


# ---------------------------------------------------------------- what runs, and how


@dataclass
class Planned:
    """One example on this node: its command line, or why it is not run."""

    name: str
    argv: list[str]
    skip: str | None = None  # a missing piece: the example SKIPs
    not_applicable: str | None = None  # a GPU-only example on a CPU-only node


def _tool(name: str) -> str | None:
    return nvcc() if name == "nvcc" else shutil.which(name)


def command_of(
    example: Example, path: Path, gpus: int, params: Mapping[str, Any], open_mpi: bool
) -> list[str]:
    """The command line a user types for ``example`` on a node with ``gpus`` GPUs."""
    py, file = sys.executable, str(path)
    array = ["--array", "cupy" if gpus else "numpy"]
    shared = max(MIN_RANKS, gpus)  # ranks may share a GPU (or the CPU)
    if example.name == "mpi_cupy":
        return ["mpirun", "-n", str(shared), *mpirun_flags(open_mpi), py, file, *array]
    if example.name == "nccl_cupy_mpi":  # NCCL: a GPU of its own for every rank
        return ["mpirun", "-n", str(gpus), *mpirun_flags(open_mpi), py, file]
    if example.name == "dask_cupy":
        n, chunk = int(params.get("dask_n", 2048)), int(params.get("dask_chunk", 512))
        return [py, file, *array, "--n", str(n), "--chunk", str(chunk)]
    if example.name == "ddp_torchrun":
        return [py, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                "--nproc-per-node", str(shared), "--max-restarts", "0",
                file, "--device", "cuda" if gpus else "cpu"]  # fmt: skip
    if example.name == "horovod_cupy":
        return ["horovodrun", "-np", str(shared), "-H", f"localhost:{shared}", py, file, *array]
    return [py, file]


def plan(
    gpus: int,
    params: Mapping[str, Any],
    folder: Path,
    found: Callable[[str], bool] = has_module,
    tool: Callable[[str], str | None] = _tool,
    open_mpi: bool = True,
) -> list[Planned]:
    """Each example (those ``params["run"]`` names, or all) on a node with ``gpus`` GPUs."""
    wanted = params.get("run") or [e.name for e in EXAMPLES]
    planned = []
    for example in (e for e in EXAMPLES if e.name in wanted):
        if not gpus and not example.on_cpu:
            planned.append(Planned(example.name, [], not_applicable="needs a GPU"))
            continue
        modules = [*example.modules, *(example.gpu_modules if gpus else ())]
        missing = [f"{m} not installed" for m in modules if not found(m)]
        missing += [f"{t} not found on PATH" for t in example.tools if tool(t) is None]
        argv = command_of(example, folder / f"{example.name}.py", gpus, params, open_mpi)
        planned.append(Planned(example.name, argv, skip="; ".join(missing) or None))
    return planned


# ---------------------------------------------------------------- reading an example's output


@dataclass
class Output:
    """What an example's output says: its result line (parsed), its error lines, its tail."""

    result: dict[str, Any] | None
    unreadable: str | None  # a result line that is not a JSON object
    errors: list[str]
    tail: list[str]
    signal: int | None  # a signal a launcher said killed one of its ranks


def read_output(text: str) -> Output:
    """Parse an example's whole output (stdout and stderr together)."""
    lines = text.splitlines()
    result = unreadable = None
    errors = []
    for line in lines:
        at = line.find(RESULT_PREFIX)
        if at >= 0:  # the last one counts (a launcher may prefix it: "[1,0]<stdout>:")
            try:
                parsed = json.loads(line[at + len(RESULT_PREFIX) :])
            except json.JSONDecodeError as exc:
                result, unreadable = None, f"unreadable {RESULT_PREFIX.strip()} line ({exc})"
                continue
            if isinstance(parsed, dict):
                result, unreadable = parsed, None
            else:
                result, unreadable = None, f"{RESULT_PREFIX.strip()} line is not a JSON object"
        elif ERROR_WORDS.search(line):
            errors.append(line.strip()[:LINE_CHARS])
    said = SIGNAL_WORDS.search(text)
    signal = next((int(g) for g in said.groups() if g), None) if said else None
    tail = [line[:LINE_CHARS] for line in lines[-TAIL_LINES:]]
    return Output(result, unreadable, errors[-ERROR_LINES:], tail, signal)


def _exit_words(returncode: int | None, signal: int | None) -> str:
    words = proc.describe_exit(returncode)
    if signal is not None and (returncode is None or returncode >= 0):
        words += f"; a rank exited on {proc.describe_exit(-signal)}"
    return words


def judge_one(ran: Mapping[str, Any], gpu_node: bool) -> tuple[Status | None, str]:
    """One example's verdict from what the driver saw; None: it does not apply here."""
    if ran.get("not_applicable"):
        return None, str(ran["not_applicable"])
    if ran.get("skip"):
        return Status.SKIP, str(ran["skip"])
    result, rc = ran.get("result"), ran.get("returncode")
    said = [*ran.get("errors", [])] or ran.get("tail", [])[-3:]
    evidence = f": {' | '.join(said)}" if said else ""
    if ran.get("timed_out"):
        return Status.FAIL, (
            f"deadline {float(ran['deadline_s']):g} s expired; its process session was killed"
            f"{evidence}"
        )
    if result is None:
        how = _exit_words(rc, ran.get("signal"))
        text = f"{how}, without its {RESULT_PREFIX.strip()} line"
        if ran.get("unreadable"):
            text = f"{how}, {ran['unreadable']}"
        crashed = (rc is not None and rc < 0) or ran.get("signal") is not None
        hint = BY_NAME[ran["name"]].crash_hint if ran.get("name") in BY_NAME else ""
        if crashed and hint and gpu_node:
            text += f" ({hint})"
        return Status.FAIL, text + evidence
    if result.get("ok") is not True:
        return Status.FAIL, f"its own check failed: {result.get('error', 'no error given')}"
    if rc != 0:
        return Status.FAIL, f"reported ok but exited with {_exit_words(rc, ran.get('signal'))}"
    if gpu_node and result.get("device") != "cuda":
        return Status.FAIL, (
            f"ran on {result.get('device', 'an unnamed device')} on a GPU node: its GPU path was"
            " not exercised"
        )
    return Status.PASS, str(result.get("checked", "verified"))


def judge(
    ctx: Context, node: NodeInfo, payloads: Mapping[int, Mapping[str, Any]], world: int
) -> Result:
    payload = payloads[0]
    gpu_node = node.has_gpu
    outcomes: dict[str, list[str]] = {"PASS": [], "FAIL": [], "SKIP": [], "n/a": []}
    details: dict[str, Any] = {"folder": payload.get("folder"), "examples": {}}
    ms = []
    for ran in payload["examples"]:
        status, text = judge_one(ran, gpu_node)
        key = status.value if status else "n/a"
        outcomes[key].append(f"{ran['name']}: {text}")
        details["examples"][ran["name"]] = {
            "status": key,
            "reason": text,
            "command": shlex.join(ran.get("argv", [])),
            **{k: ran[k] for k in ("returncode", "elapsed_s", "result", "tail") if k in ran},
        }
        if "elapsed_s" in ran:
            ms.append(Measurement(f"{ran['name']}_time", round(float(ran["elapsed_s"]), 2), "s"))
    applicable = len(payload["examples"]) - len(outcomes["n/a"])
    ms.insert(0, Measurement("passed", len(outcomes["PASS"]), "", float(applicable), "min"))
    where = "" if gpu_node else " (CPU-only node: no GPU verified)"
    parts = [
        f"{len(outcomes['PASS'])} of {applicable} passed{where}",
        *(f"FAIL {t}" for t in outcomes["FAIL"]),
        *(f"SKIP {t}" for t in outcomes["SKIP"]),
        *([f"not for a CPU-only node: {', '.join(t.split(':')[0] for t in outcomes['n/a'])}"]
          if outcomes["n/a"] else []),
    ]  # fmt: skip
    if outcomes["FAIL"]:
        status = Status.FAIL
    elif outcomes["SKIP"] or not applicable:
        status = Status.SKIP
        if not applicable:
            parts.append("no example applies here")
    else:
        status = Status.PASS
        parts[0] += ": " + "; ".join(outcomes["PASS"])
    return Result(NAME, ctx.node, status, "; ".join(parts), ms, {}, details=details)


# ---------------------------------------------------------------- the driver


def run_one(planned: Planned, deadline_s: float, workdir: Path) -> dict[str, Any]:
    """Start one planned example in its own process session; what it did, for the judge."""
    seen: dict[str, Any] = {
        "name": planned.name,
        "argv": planned.argv,
        "skip": planned.skip,
        "not_applicable": planned.not_applicable,
    }
    if planned.skip or planned.not_applicable:
        return seen
    env = {k: v for k, v in os.environ.items() if k != ranklog.CONFIG_ENV}
    launch = proc.Launch(planned.argv, workdir / f"{planned.name}.log", env, cwd=str(workdir))
    outcome = proc.wait(launch.start(), deadline_s)
    out = read_output(launch.output())
    seen.update(
        returncode=outcome.returncode,
        timed_out=outcome.timed_out,
        deadline_s=deadline_s,
        elapsed_s=round(outcome.elapsed_s, 3),
        result=out.result,
        unreadable=out.unreadable,
        errors=out.errors,
        tail=out.tail,
        signal=out.signal,
    )
    return seen


def run_all(
    planned: Sequence[Planned],
    each_s: float,
    remaining_s: Callable[[], float],
    mark: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Each example in turn, in a folder of its own that is removed afterwards."""
    workdir = Path(tempfile.mkdtemp(prefix="gpuenv-examples-"))
    seen = []
    try:
        for item in planned:
            mark(item.name)
            left_s = remaining_s() - SPARE_S
            if left_s <= 0 and not (item.skip or item.not_applicable):
                seen.append({
                    "name": item.name, "argv": item.argv, "returncode": None, "timed_out": True,
                    "deadline_s": 0.0, "errors": ["not started: the check's deadline was spent"],
                })  # fmt: skip
                continue
            seen.append(run_one(item, min(each_s, left_s), workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return seen


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuenv.checks.examples")
    parser.add_argument("--gpus", type=int, default=0)
    args = parser.parse_args(argv)
    log = ranklog.RankLog(ranklog.RankConfig.load().events, 0)
    log.mark(NAME, "start")
    folder = examples_dir()
    if folder is None:
        raise SystemExit("gpuenv.checks.examples: the examples are not installed")
    open_mpi = is_open_mpi()  # a second of mpirun, paid before the gate
    log.mark(NAME, "ready")
    ranklog.wait_gate()
    rank = ranklog.launched_rank(NAME, 0, 1)
    with ranklog.Heartbeat(log, NAME):
        planned = plan(args.gpus, rank.params, folder, open_mpi=open_mpi)
        each_s = float(rank.params.get("each_s", EACH_S))
        began_at = time.monotonic()
        seen = run_all(planned, each_s, rank.remaining_s, rank.mark)
        log.result(NAME, {
            "examples": seen,
            "folder": str(folder),
            "python": sys.executable,
            "elapsed_s": round(time.monotonic() - began_at, 3),
        })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
