"""Cluster validation through Slurm: the ``srun`` launcher and the ``slurm`` stage (docs/slurm.md).

With ``gpuenv cluster --launcher srun`` every multi-node launch is ONE ``srun`` on the Slurm
submit host (the inventory's ``slurm_controller`` host, or ``--slurm-host``), run there in the
cluster user's SSH login like every other node command (gpuenv.cluster.fanout):
``srun -N n -w <nodes> --ntasks-per-node=1 --exclusive --label ...``, GPUs asked as gres where the
nodes have them. Each task runs the command the ssh launcher would have run on its node (chosen
by ``$SLURMD_NODENAME`` in a ``case``), in a login shell under coreutils ``timeout``; its first line
names its node and its last line its exit status, and srun's ``--label`` prefixes tell the tasks'
lines apart. The output is split back into one ``NodeAnswer`` per node, so the stages judge an
srun launch exactly as an ssh one; a task that hung or never started is named by its node.

Slurm names nodes by their short hostname (``roles/slurm`` writes ``NodeName=<hostname>
NodeAddr=<address>``), not by the inventory's name: each host is matched to a Slurm node by name,
short name, hostname (from the probe), or address, and a host Slurm does not know stops the run
by name before anything is launched.

The MPI ranks start with ``srun --mpi=pmix`` when ``srun --mpi=list`` offers pmix (Debian 12's
Slurm has mpi_pmix_v4, which dlopens libpmix from libpmix-dev: the slurm role installs it), else
with ``mpirun`` inside an allocation (``salloc``: Open MPI starts its daemons with srun).
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.cluster.fanout import KILL_AFTER_S, NodeAnswer, fan_out, shell_command
from gpuenv.cluster.inventory import Host
from gpuenv.errors import BadInput, EnvironmentProblem
from gpuenv.progress import Progress, Silent
from gpuenv.results import CLUSTER_NODE, Measurement, Result, Status

LAUNCHERS = ("ssh", "srun")
SUBMIT_GROUP = "slurm_controller"  # roles/slurm's slurm_controller_group default
# How long srun may wait for its allocation (--immediate) before it gives up.
ALLOC_WAIT_S = 60
# The deadline of the submit host's query (command -v srun, scontrol, srun --mpi=list).
QUERY_DEADLINE_S = 30.0
TASK_MARK = "GPUENV_TASK"  # first line of a task: its Slurm node
RC_MARK = "GPUENV_TASK_RC"  # last line of a task: its exit status and milliseconds
_SECTION = "GPUENV_SECTION"
# srun --label: "<task>: <line>" (the task number right-aligned to the widest).
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
# srun's own words about a task: "srun: error: node3: task 2: Exited with exit code 1".
_SRUN_TASK = re.compile(r"^srun: \w+: (\S+): tasks? [\d,-]+: (.*)$")
_MS = 1000.0


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``scontrol show node -o`` describes it."""

    name: str
    addr: str = ""
    hostname: str = ""
    state: str = ""
    cpus: int = 0
    gres: str = ""

    @property
    def gpus(self) -> int:
        return gres_gpus(self.gres)


def gres_gpus(gres: str) -> int:
    """GPUs in a Gres= value: ``gpu:hopper:8(S:0-1)`` → 8, ``gpu:2,shard:4`` → 2, ``(null)`` → 0."""
    total = 0
    for item in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _words(line: str) -> dict[str, str]:
    """KEY=VALUE words of a one-line record; the first of a key wins (a Reason= comes last and
    may hold anything)."""
    found: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep and key not in found:
            found[key] = value
    return found


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node -o``: one line per node."""
    nodes = {}
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        w = _words(line)
        cpus = w.get("CPUTot", "0")
        nodes[w["NodeName"]] = SlurmNode(
            w["NodeName"], w.get("NodeAddr", ""), w.get("NodeHostName", ""), w.get("State", ""),
            int(cpus) if cpus.isdigit() else 0, w.get("Gres", ""),
        )  # fmt: skip
    return nodes


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = Value`` lines (cgroup.conf's section included)."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            found.setdefault(key.strip(), value.strip())
    return found


def parse_mpi_list(text: str) -> tuple[str, ...]:
    """``srun --mpi=list``: the plugin types, one per line (22.05: indented names under a
    heading; 23.x: ``srun: MPI types are...`` then ``srun: none`` ...)."""
    found = []
    for line in text.splitlines():
        word = line.strip().removeprefix("srun:").strip()
        if re.fullmatch(r"[a-z][a-z0-9_]*", word):
            found.append(word)
    return tuple(found)


def _short(name: str) -> str:
    return name.split(".")[0]


def match_nodes(
    hosts: Sequence[Host], nodes: Mapping[str, SlurmNode], hostnames: Mapping[str, str] = {}
) -> tuple[dict[str, str], list[str]]:
    """({inventory name: Slurm NodeName}, the hosts Slurm does not know).

    A host is its Slurm node when the NodeName is its inventory name, short name or hostname
    (as the probe read it), or when the node's NodeAddr/NodeHostName is the host's address.
    """
    found: dict[str, str] = {}
    missing = []
    for h in hosts:
        names = {h.name, _short(h.name)}
        if hostnames.get(h.name):
            names |= {hostnames[h.name], _short(hostnames[h.name])}
        addresses = {h.address, h.rendezvous_address, *names}
        hit = next((n for n in nodes if n in names), None) or next(
            (n.name for n in nodes.values() if {n.addr, n.hostname} & addresses), None
        )
        if hit is None:
            missing.append(h.name)
        else:
            found[h.name] = hit
    return found, missing


@dataclass
class Slurm:
    """The Slurm cluster as the submit host sees it, and how to launch through it."""

    submit: Host
    srun: str  # srun's path in the cluster user's login on the submit host
    nodes: dict[str, SlurmNode]
    config: dict[str, str] = field(default_factory=dict)
    mpi_plugins: tuple[str, ...] = ()
    names: dict[str, str] = field(default_factory=dict)  # inventory name -> Slurm NodeName

    # ------------------------------------------------------------ what Slurm offers

    def map_hosts(self, hosts: Sequence[Host], hostnames: Mapping[str, str] = {}) -> list[str]:
        """Match ``hosts`` to Slurm nodes (kept in ``names``); the hosts Slurm does not know."""
        found, missing = match_nodes(hosts, self.nodes, hostnames)
        self.names.update(found)
        return missing

    def require(self, hosts: Sequence[Host]) -> None:
        """BadInput naming every host not matched to a Slurm node (before anything is launched)."""
        missing = [h.name for h in hosts if h.name not in self.names]
        if missing:
            raise BadInput(
                f"--launcher srun: {', '.join(missing)} not a Slurm node on {self.submit.name}"
                f" (Slurm has {', '.join(sorted(self.nodes)) or 'no nodes'}); NodeName is the"
                " node's hostname (roles/slurm): validate Slurm's nodes only (--limit"
                " slurm_compute) or add the node to slurm.conf"
            )

    @property
    def mpi(self) -> str:
        """How MPI ranks start: ``pmix`` (srun --mpi=pmix) or ``mpirun`` (inside salloc)."""
        return "pmix" if "pmix" in self.mpi_plugins else "mpirun"

    def device_constraint_off(self) -> str | None:
        """Why a job's GPUs are not confined to it; None when cgroup device constraint is on."""
        task = self.config.get("TaskPlugin", "")
        if "task/cgroup" not in task:
            return f"TaskPlugin is {task or 'unset'} (no task/cgroup): jobs see every GPU"
        constrain = self.config.get("ConstrainDevices", "")
        if constrain.lower() != "yes":
            return f"cgroup.conf ConstrainDevices is {constrain or 'not set'}: jobs see every GPU"
        return None

    # ------------------------------------------------------------ launches

    def _on_submit(self, command: str, deadline_s: float, label: str) -> NodeAnswer:
        return fan_out([self.submit], lambda _h: command, deadline_s, label=label)[self.submit.name]

    def launch(
        self,
        hosts: Sequence[Host],
        command: Callable[[Host], str],
        label: str,
        deadline_s: float,
        stop_others: bool = False,
        gpus: int = 0,
        progress: Progress | None = None,
        exclusive: bool = True,
    ) -> dict[str, NodeAnswer]:
        """One srun over ``hosts``, each task running ``command(host)``; one answer per host.
        With ``stop_others`` the first task that fails ends the others (--kill-on-bad-exit)."""
        if not hosts:
            return {}
        progress = progress or Silent()
        by_node = {self.names[h.name]: h for h in hosts}
        commands = {n: shell_command([], h.env) + " " + command(h) if h.env else command(h)
                    for n, h in by_node.items()}  # fmt: skip
        cpus = min((self.nodes[n].cpus for n in by_node if n in self.nodes), default=0)
        argv = srun_argv(self.srun, list(by_node), deadline_s, label, gpus=gpus,
                         cpus=cpus if exclusive else 0, kill_on_bad_exit=stop_others,
                         exclusive=exclusive)  # fmt: skip
        line = shlex.join([*argv, "bash", "-c", task_script(commands, deadline_s)])
        progress.begin(label, f"{label}: srun over {len(hosts)} node(s) from {self.submit.name}")
        out = self._on_submit(line, deadline_s + ALLOC_WAIT_S + 2 * KILL_AFTER_S, label)
        answers = split_output(out, by_node, deadline_s)
        failed = sum(not a.ok for a in answers.values())
        progress.end(label, f"{len(hosts) - failed}/{len(hosts)} ok",
                          "FAIL" if failed else "PASS")  # fmt: skip
        return {h.name: answers[h.name] for h in hosts}

    def mpi_command(self, hosts: Sequence[Host], worker: Sequence[str], deadline_s: float) -> str:
        """The MPI stage's ranks, one per node, started through Slurm (see ``mpi``)."""
        nodes = [self.names[h.name] for h in hosts]
        if self.mpi == "pmix":
            argv = srun_argv(self.srun, nodes, deadline_s, "mpi", kill_on_bad_exit=True,
                             mpi="pmix")  # fmt: skip
            inner = f"cd && exec {shlex.join(worker)}"
            return shlex.join([*argv, "bash", "-lc", inner])
        salloc = [_sibling(self.srun, "salloc"), "-N", str(len(nodes)), "-w", ",".join(nodes),
                  "--ntasks-per-node=1", "--exclusive", f"--time={_minutes(deadline_s)}",
                  f"--immediate={ALLOC_WAIT_S}", "--job-name=gpuenv-mpi"]  # fmt: skip
        mpirun = ["mpirun", "--map-by", "ppr:1:node", "-np", str(len(nodes)), *worker]
        return shlex.join([*salloc, *mpirun])

    def run_mpi(
        self, hosts: Sequence[Host], worker: Sequence[str], deadline_s: float
    ) -> NodeAnswer:
        """The MPI launch from the submit host; its answer stands for the first host (rank 0)."""
        cmd = self.mpi_command(hosts, worker, deadline_s)
        out = self._on_submit(cmd, deadline_s + ALLOC_WAIT_S + 2 * KILL_AFTER_S, "srun mpi")
        named = failed_tasks(out.stderr, {self.names[h.name]: h for h in hosts})
        if named and not out.error:
            out.error = f"{out.why()}; {named}"
        out.host = hosts[0].name
        return out


def _minutes(deadline_s: float) -> int:
    """srun's --time in whole minutes: the deadline and the kill's grace, rounded up."""
    return max(1, math.ceil((deadline_s + 2 * KILL_AFTER_S) / 60))


def _sibling(srun: str, tool: str) -> str:
    return srun.rsplit("/", 1)[0] + "/" + tool if "/" in srun else tool


def srun_argv(
    srun: str,
    nodes: Sequence[str],
    deadline_s: float,
    label: str,
    gpus: int = 0,
    cpus: int = 0,
    kill_on_bad_exit: bool = False,
    mpi: str = "none",
    exclusive: bool = True,
) -> list[str]:
    """srun's words for one task per node on exactly ``nodes``, under the deadline."""
    argv = [srun, "-N", str(len(nodes)), "-w", ",".join(nodes), "--ntasks-per-node=1"]
    if exclusive:
        argv.append("--exclusive")
    if cpus:
        argv.append(f"--cpus-per-task={cpus}")  # the task's launcher starts the node's ranks
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-")
    argv += [
        f"--time={_minutes(deadline_s)}", f"--immediate={ALLOC_WAIT_S}",
        f"--job-name=gpuenv-{slug}", f"--mpi={mpi}", "--label",
        f"--kill-on-bad-exit={int(kill_on_bad_exit)}",
    ]  # fmt: skip
    return argv


def task_script(commands: Mapping[str, str], deadline_s: float) -> str:
    """What every task runs: its node's command (by ``$SLURMD_NODENAME``) in a login shell under
    coreutils ``timeout``, between a line naming the node and one with its exit status."""
    groups: dict[str, list[str]] = {}
    for node, command in commands.items():
        groups.setdefault(command, []).append(node)
    arms = [f"  {'|'.join(shlex.quote(n) for n in nodes)}) c={shlex.quote(command)} ;;"
            for command, nodes in groups.items()]  # fmt: skip
    seconds = max(1, int(deadline_s))
    return "\n".join([
        'n="${SLURMD_NODENAME:-}"',
        f'echo "{TASK_MARK} $n"',
        'case "$n" in',
        *arms,
        '  *) echo "gpuenv: Slurm node $n is not in this launch" >&2; exit 3 ;;',
        "esac",
        "s=$(date +%s%N)",
        f'timeout -k {KILL_AFTER_S} {seconds} bash -lc "cd && $c"',
        "rc=$?",
        f'echo "{RC_MARK} $rc $(( ($(date +%s%N) - s) / 1000000 ))"',
        "exit $rc",
    ])  # fmt: skip


@dataclass
class _Task:
    node: str = ""
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    rc: int | None = None
    ms: float = 0.0


def _labelled(text: str, tasks: dict[int, _Task], out: bool) -> list[str]:
    """Sort srun's labelled lines into their tasks; the lines without a label (srun's own)."""
    loose = []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if not m:
            loose.append(line)
            continue
        task = tasks.setdefault(int(m.group(1)), _Task())
        body = m.group(2)
        if out and body.startswith(TASK_MARK + " ") and not task.node:
            task.node = body.split(" ", 1)[1].strip()
        elif out and body.startswith(RC_MARK + " "):
            words = body.split()
            if len(words) >= 2 and words[1].lstrip("-").isdigit():
                task.rc = int(words[1])
            if len(words) >= 3 and words[2].isdigit():
                task.ms = float(words[2])
        else:
            (task.stdout if out else task.stderr).append(body)
    return loose


def split_output(
    out: NodeAnswer, by_node: Mapping[str, Host], deadline_s: float
) -> dict[str, NodeAnswer]:
    """One NodeAnswer per host (by inventory name) from the srun's answer on the submit host."""
    tasks: dict[int, _Task] = {}
    _labelled(out.stdout, tasks, out=True)
    loose = _labelled(out.stderr, tasks, out=False)
    seen = {t.node: t for t in tasks.values() if t.node}
    about: dict[str, list[str]] = {}
    general = []
    for line in loose:
        m = _SRUN_TASK.match(line.strip())
        if m and m.group(1) in by_node:
            about.setdefault(m.group(1), []).append(line.strip())
        elif line.strip():
            general.append(line.strip())
    first_failed = next((t.node for t in tasks.values() if t.rc not in (None, 0)), "")
    answers = {}
    for node, host in by_node.items():
        task = seen.get(node)
        notes = "\n".join([*about.get(node, []), *general])
        if task is None:
            why = out.error or (f"srun exit status {out.rc}" if out.rc else "srun ended")
            tail = f": {general[-1]}" if general else ""
            answers[host.name] = NodeAnswer(
                host.name, None, "", notes, out.duration_s,
                f"its Slurm task (node {node}) never started ({why}{tail})",
            )  # fmt: skip
            continue
        stderr = "\n".join([*task.stderr, *([notes] if notes else [])])
        stdout = "\n".join(task.stdout)
        duration_s = task.ms / _MS if task.ms else out.duration_s
        error = ""
        if task.rc is None:
            if first_failed and first_failed != node:
                error = f"stopped because {_host_of(first_failed, by_node)} failed first"
            else:
                error = f"did not finish within {deadline_s:.0f} s (node {node}); killed"
        elif task.rc in (124, 137):
            error = f"did not finish within {deadline_s:.0f} s; killed on the node ({node})"
        answers[host.name] = NodeAnswer(host.name, task.rc, stdout, stderr, duration_s, error)
    return answers


def _host_of(node: str, by_node: Mapping[str, Host]) -> str:
    host = by_node.get(node)
    return host.name if host else node


def failed_tasks(stderr: str, by_node: Mapping[str, Host]) -> str:
    """The nodes srun says a task failed on, by their inventory names ("" when none)."""
    named = []
    for line in stderr.splitlines():
        m = _SRUN_TASK.match(line.strip())
        if m and m.group(1) in by_node:
            named.append(f"{_host_of(m.group(1), by_node)}: {m.group(2)}")
    return "; ".join(dict.fromkeys(named))


# ---------------------------------------------------------------- the submit host


def query_command() -> str:
    """What the submit host runs to describe its Slurm: srun's path, the nodes, the
    configuration, and the MPI plugins, in marked sections."""
    return "; ".join([
        f"echo {_SECTION} srun; command -v srun || true",
        f"echo {_SECTION} nodes; scontrol show node -o || echo {_SECTION} failed scontrol",
        f"echo {_SECTION} config; scontrol show config || true",
        f"echo {_SECTION} mpi; srun --mpi=list 2>&1 || true",
    ])  # fmt: skip


def _sections(text: str) -> dict[str, str]:
    found: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith(_SECTION + " "):
            current = line.split(" ", 1)[1].strip()
            found.setdefault(current, [])
        elif current:
            found[current].append(line)
    return {k: "\n".join(v) for k, v in found.items()}


def parse_query(submit: Host, out: NodeAnswer) -> Slurm:
    """A Slurm from the submit host's answer; BadInput/EnvironmentProblem naming what is wrong."""
    where = f"{submit.name} (as {submit.become_user or submit.user or 'the current user'})"
    if out.rc is None:
        raise EnvironmentProblem(f"the Slurm submit host {where} did not answer: {out.why()}")
    parts = _sections(out.stdout)
    srun = parts.get("srun", "").strip()
    if not srun:
        raise BadInput(
            f"--launcher srun: srun not found in the login of {where}: install slurm-client there"
            " (roles/slurm) or name another submit host (--slurm-host)"
        )
    if "failed scontrol" in out.stdout or not parts.get("nodes", "").strip():
        tail = " ".join(out.stderr.strip().splitlines()[-2:])
        raise EnvironmentProblem(
            f"scontrol show node on {where} gave no nodes: slurmctld down or munge failing?"
            + (f" ({tail})" if tail else "")
        )
    return Slurm(
        submit, srun.splitlines()[-1], parse_nodes(parts["nodes"]),
        parse_config(parts.get("config", "")), parse_mpi_list(parts.get("mpi", "")),
    )  # fmt: skip


def query(submit: Host, deadline_s: float = QUERY_DEADLINE_S) -> Slurm:
    out = fan_out([submit], lambda _h: query_command(), deadline_s, label="slurm query")
    return parse_query(submit, out[submit.name])


def submit_host(hosts: Sequence[Host], named: str | None, group: Sequence[Host]) -> Host:
    """The submit host: ``named`` (--slurm-host) among the inventory's hosts, else the one of the
    ``slurm_controller`` group; BadInput when there is none."""
    known = {h.name: h for h in [*group, *hosts]}
    if named:
        if named not in known:
            raise BadInput(
                f"--slurm-host {named}: not a host of the inventory (hosts:"
                f" {', '.join(sorted(known))})"
            )
        return known[named]
    if not group:
        raise BadInput(
            f"--launcher srun needs a Slurm submit host: the inventory has no {SUBMIT_GROUP}"
            " group; name one with --slurm-host"
        )
    return group[0]


def connect(submit: Host, hosts: Sequence[Host]) -> Slurm:
    """--launcher srun: the submit host's Slurm, with every host matched to its Slurm node;
    BadInput naming a host Slurm does not know (the hosts' own hostnames are read, read-only,
    only for those that neither name nor address matched)."""
    found = query(submit)
    unmatched = found.map_hosts(hosts)
    if unmatched:
        asked = fan_out([h for h in hosts if h.name in unmatched], lambda _h: "hostname -s",
                        QUERY_DEADLINE_S, label="hostnames")  # fmt: skip
        names = {n: a.stdout.strip() for n, a in asked.items() if a.ok}
        found.map_hosts([h for h in hosts if h.name in names], names)
    found.require(hosts)
    return found


# ---------------------------------------------------------------- the slurm stage

# What a task of the GPU check prints: CUDA_VISIBLE_DEVICES, the device files it can open, and
# nvidia-smi -L's GPU lines (the cgroup hides the others from NVML too).
GPU_PROBE = "; ".join([
    'echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"',
    'for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && ( exec 3<>"$d" ) 2>/dev/null'
    ' && echo "OPEN $d"; done',
    "if command -v nvidia-smi >/dev/null; then echo SMI $(nvidia-smi -L 2>/dev/null"
    " | grep -c '^GPU '); else echo SMI none; fi",
])  # fmt: skip


@dataclass(frozen=True)
class GpuSight:
    """What one job that asked for ``asked`` GPUs saw on its node."""

    asked: int
    visible: list[str]  # CUDA_VISIBLE_DEVICES entries (empty: unset or empty)
    opened: list[str]  # /dev/nvidiaN it could open
    smi: int | None  # nvidia-smi -L's GPUs; None: no nvidia-smi
    cvd_set: bool

    def problems(self) -> list[str]:
        found = []
        if len(self.opened) != self.asked:
            found.append(f"opened {len(self.opened)} GPU device file(s)"
                         f" ({', '.join(self.opened) or 'none'})")  # fmt: skip
        if not self.cvd_set or len(self.visible) != self.asked:
            shown = ",".join(self.visible) if self.cvd_set else "unset"
            found.append(f"CUDA_VISIBLE_DEVICES={shown}")
        if self.smi is not None and self.smi != self.asked:
            found.append(f"nvidia-smi -L lists {self.smi}")
        return found


def parse_gpu_sight(text: str, asked: int) -> GpuSight:
    cvd, opened, smi, cvd_set = "", [], None, False
    for line in text.splitlines():
        if line.startswith("CVD="):
            cvd = line[4:].strip()
            cvd_set = cvd != "unset"
        elif line.startswith("OPEN "):
            opened.append(line[5:].strip())
        elif line.startswith("SMI ") and line[4:].strip().isdigit():
            smi = int(line[4:].strip())
    visible = [v for v in cvd.split(",") if v.strip()] if cvd_set else []
    return GpuSight(asked, visible, opened, smi, cvd_set)


def reach_result(
    answers: Mapping[str, NodeAnswer], names: Mapping[str, str], duration_s: float
) -> Result:
    """``srun -N <all> hostname``: every node's task answered."""
    bad = {n: a.why() for n, a in answers.items() if not a.ok or not a.stdout.strip()}
    details = {"slurm_nodes": dict(names), "hostnames": {
        n: a.stdout.strip() for n, a in answers.items() if a.ok}}  # fmt: skip
    m = [Measurement("nodes", len(answers) - len(bad), "", float(len(answers)), "min")]
    if bad:
        why = "; ".join(f"{n}: {w or 'printed no hostname'}" for n, w in bad.items())
        return Result("slurm-reach", CLUSTER_NODE, Status.FAIL,
                      f"srun -N{len(answers)} hostname did not reach {len(bad)} node(s): {why}",
                      m, duration_s=duration_s, details=details)  # fmt: skip
    return Result("slurm-reach", CLUSTER_NODE, Status.PASS,
                  f"srun -N{len(answers)} hostname reached every node", m,
                  duration_s=duration_s, details=details)  # fmt: skip


def gpu_result(
    answers: Mapping[str, NodeAnswer], asked: int, of: Mapping[str, int], duration_s: float
) -> Result:
    """A job that asked for ``asked`` GPUs on each node (of ``of[node]``) saw exactly that many."""
    bad: dict[str, str] = {}
    seen: dict[str, Any] = {}
    for name, a in answers.items():
        if not a.ok:
            bad[name] = a.why()
            continue
        sight = parse_gpu_sight(a.stdout, asked)
        seen[name] = {"visible": sight.visible, "opened": sight.opened, "smi": sight.smi}
        found = sight.problems()
        if found:
            bad[name] = "; ".join(found)
    m = [Measurement("gpus_seen_ok", len(answers) - len(bad), "nodes", float(len(answers)),
                     "min")]  # fmt: skip
    details = {"asked": asked, "node_gpus": dict(of), "seen": seen}
    if bad:
        why = "; ".join(f"{n}: {w}" for n, w in bad.items())
        return Result("slurm-gpus", CLUSTER_NODE, Status.FAIL,
                      f"a job asking for {asked} GPU(s) per node did not see exactly {asked}:"
                      f" {why}",
                      m, duration_s=duration_s, details=details)  # fmt: skip
    one = " (one GPU per node: confinement cannot be told apart)" if max(of.values()) == 1 else ""
    return Result("slurm-gpus", CLUSTER_NODE, Status.PASS,
                  f"a job asking for {asked} GPU(s) on each of {len(answers)} node(s) saw exactly"
                  f" {asked} (of {min(of.values())}+): CUDA_VISIBLE_DEVICES, device files,"
                  f" nvidia-smi{one}", m, duration_s=duration_s, details=details)  # fmt: skip


def asked_gpus(gpus: Mapping[str, int]) -> int:
    """How many GPUs the check asks for: one less than the node with fewest has (so that a job
    seeing its whole node fails), at least 1."""
    return max(1, min(gpus.values()) - 1)


def stage(
    slurm: Slurm,
    hosts: Sequence[Host],
    gpus: Mapping[str, int],
    deadline_s: float,
    progress: Progress | None = None,
) -> list[Result]:
    """The slurm stage over ``hosts`` (already matched to Slurm nodes in ``slurm.names``)."""
    began_at = time.monotonic()
    reached = slurm.launch(hosts, lambda _h: "hostname", "srun hostname", deadline_s,
                           progress=progress)  # fmt: skip
    results = [reach_result(reached, {h.name: slurm.names[h.name] for h in hosts},
                            time.monotonic() - began_at)]  # fmt: skip
    with_gpus = {h.name: gpus.get(h.name, 0) for h in hosts if gpus.get(h.name, 0) > 0}
    if not with_gpus:
        results.append(_skip("slurm-gpus", "no GPU on the Slurm nodes: gres confinement untested"))
        return results
    off = slurm.device_constraint_off()
    if off:
        results.append(_skip("slurm-gpus", off))
        return results
    no_gres = [h for h in with_gpus if slurm.nodes[slurm.names[h]].gpus == 0]
    if no_gres:
        results.append(Result("slurm-gpus", CLUSTER_NODE, Status.FAIL,
                              f"Slurm offers no gpu gres on {', '.join(no_gres)}, which have GPUs"
                              " (slurm.conf Gres=, gres.conf)"))  # fmt: skip
        return results
    asked = asked_gpus(with_gpus)
    began_at = time.monotonic()
    targets = [h for h in hosts if h.name in with_gpus]
    # Not --exclusive: a job that holds its whole node may be given every GPU of it.
    seen = slurm.launch(targets, lambda _h: GPU_PROBE, "srun gpus", deadline_s, gpus=asked,
                        progress=progress, exclusive=False)  # fmt: skip
    results.append(gpu_result(seen, asked, with_gpus, time.monotonic() - began_at))
    return results


def _skip(check: str, reason: str) -> Result:
    return Result(check, CLUSTER_NODE, Status.SKIP, reason)
