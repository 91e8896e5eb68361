"""Why a launched job failed, in the failed rank's own words.

When a rank of torchrun, mpirun or the GPU worker fails, its launcher's output ends with the
launcher's report: torchrun's ``ChildFailedError`` block (``error_file: <N/A>``, ``To enable
traceback see ...``), mpirun's ``Primary job terminated normally, but 1 process returned ...``
box. What the user needs is above it: the exception the rank raised, the message of the library
that failed (gloo, NCCL, Open MPI, UCX, CUDA). ``find`` takes those lines out of the output, the
root cause's rank first where the launcher names it, and the launcher's boilerplate never.

A job started from a login reads what the login files set. Where a variable that the failing
library reads (``GLOO_*``, ``NCCL_*``, ``UCX_*``, ``OMPI_*``/``PMIX_*``, ``CUDA_*``) is set in a
login file (the node floor's ``login_env`` reading: name, value, file), the cause names it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.floor import login_env

# At most this many of the ranks' own lines in a reason; each at most MAX_LINE_CHARS.
MAX_LINES = 3
MAX_LINE_CHARS = 400
# An exception's message may go on over a few lines (NCCL's "Last error:" and the error after).
MAX_MESSAGE_LINES = 4


@dataclass(frozen=True)
class Library:
    """A library a rank can fail in: how its messages name it, and the variables it reads."""

    name: str
    mention: re.Pattern[str]
    prefixes: tuple[str, ...]


LIBRARIES = (
    Library("gloo", re.compile(r"\bgloo\b", re.IGNORECASE), ("GLOO_",)),
    Library("NCCL", re.compile(r"\bnccl", re.IGNORECASE), ("NCCL_",)),
    Library("UCX", re.compile(r"\b(ucx|ucp|uct)\b", re.IGNORECASE), ("UCX_",)),
    Library(
        "Open MPI",
        re.compile(r"\b(MPI_[A-Z]\w*|mpirun|prterun|Open MPI|ompi|orte|prte|pmix|mca)\b", re.I),
        ("OMPI_", "PMIX_", "PRTE_"),
    ),
    Library("CUDA", re.compile(r"\bcuda", re.IGNORECASE), ("CUDA_",)),
)
# What each launcher's ranks always go through, whatever their messages name.
LAUNCHER_LIBRARIES = {"mpirun": ("Open MPI", "UCX"), "mpiexec": ("Open MPI", "UCX")}

# A rank's line as torch (``[rank1]: ...``, ``--tee``'s ``[default1]:``) or mpirun
# (``--tag-output``'s ``[1,0]<stderr>:``) tags it.
_RANK_TAG = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?|^\[\d+,(\d+)\]<std(?:out|err)>:\s?")
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r"^\s+\S|^\s*\^+\s*$")
# torch's C++ stack under an exception's message (TORCH_SHOW_CPP_STACKTRACES).
_CPP_FRAMES = re.compile(r"^(Exception raised from |frame #\d+)")
_CHAINED = re.compile(r"^(The above exception was|During handling of the above exception)")
# torchrun's own report: its agent's log lines, its header, the ChildFailedError block.
_TORCHRUN_LOG = re.compile(r"^[DIWEF]\d{4} [\d:.]+\s+\d+ \S*torch/distributed/elastic/")
# What torchrun's agent itself raises: its SignalException when it is stopped (the ranks' own
# errors, if any, stand above it).
_AGENT_ERROR = re.compile(r"^torch\.distributed\.elastic\.\S+: ")
_RULE = re.compile(r"^\s*(=+|-+|\*+)\s*$")
_TORCHRUN_ROOT = re.compile(r"^Root Cause \(first observed failure\):")
_TORCHRUN_FIELD = re.compile(r"^\s+(rank|time|host|exitcode|error_file|traceback)\s*:\s*(.*)$")
# mpirun's boxes that only say that a rank failed; a box of any other text is the library's.
_MPIRUN_BOILERPLATE = re.compile(
    r"Primary job\s+terminated normally|(mpirun|prterun) (detected|noticed|has exited)"
    r"|MPI_ABORT was invoked|exited on signal|process that caused that situation",
    re.IGNORECASE,
)
# Open MPI's help boxes are ruled with 74 dashes (torchrun's report with 60).
_HELP_RULE = re.compile(r"\s*-{70,}\s*")
_PROCESS_NAME = re.compile(r"Process name:\s*\[(?:prterun-\S+@\d+|\[\d+,\d+\]),(\d+)\]")
_MPI_STARS = re.compile(r"^\[[^\]]*\] \*\*\* (An error occurred in .*)$")
_NCCL_WARN = re.compile(r"\bNCCL WARN\b\s*(.*)$")
_FATAL = re.compile(r"^(Fatal Python error: .*|Segmentation fault.*)$")
_BOX_KEY = re.compile(r"^\s*([A-Z][\w ]{0,30}):\s+(\S.*)$")


@dataclass
class Cause:
    """The ranks' own error lines, root cause first, and the login settings of their libraries."""

    lines: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)  # those that failed (named, launched)
    login: dict[str, dict[str, object]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.lines or self.login)

    @property
    def text(self) -> str:
        """``rank 1: ValueError: ...; login files set what gloo reads: GLOO_...='x' (set in F)``."""
        parts = list(self.lines)
        if self.login:
            parts.append(login_sentence(self.libraries, self.login))
        return "; ".join(parts)

    def details(self) -> dict[str, Any]:
        found: dict[str, Any] = {"rank_errors": self.lines}
        if self.login:
            found["login_env"] = self.login
        return found

    def before(self, text: str) -> str:
        """``text`` with this cause in front of it (unchanged when there is none)."""
        return f"{self.text}; {text}" if self else text


@dataclass
class _Line:
    rank: int | None
    text: str


def _untag(line: str) -> tuple[int | None, str]:
    m = _RANK_TAG.match(line)
    if m is None:
        return None, line
    return int(m.group(1) or m.group(2)), line[m.end() :]


def _box_message(body: Sequence[str]) -> str:
    """An Open MPI help box in one line: its first sentence and its ``Key: value`` lines."""
    keys = [f"{m.group(1)}: {m.group(2).strip()}" for ln in body if (m := _BOX_KEY.match(ln))]
    prose = " ".join(ln.strip() for ln in body if ln.strip() and not _BOX_KEY.match(ln))
    first = re.split(r"(?<=[.!])\s", prose, maxsplit=1)[0].rstrip(".")
    return first + (f" ({', '.join(keys)})" if keys else "")


def _scan(lines: Sequence[tuple[int | None, str]]) -> tuple[list[_Line], int | None]:
    """The errors in one output's lines, in order, and the root cause's rank where named."""
    found: list[_Line] = []
    root: int | None = None
    in_root = in_box = False
    report_rules = 0  # the rules of torchrun's report seen (it ends with its second)
    box: list[str] = []
    i = 0
    while i < len(lines):
        rank, line = lines[i]
        i += 1
        # torchrun's report names the root cause's rank (its other lines are boilerplate).
        in_root = in_root or bool(_TORCHRUN_ROOT.match(line))
        field_match = _TORCHRUN_FIELD.match(line)
        if in_root and field_match and field_match.group(1) == "rank" and root is None:
            root = int(field_match.group(2).split()[0])
        if report_rules:  # inside torchrun's report, which its own traceback announced
            if re.fullmatch(r"=+", line.strip()):
                report_rules += 1
                if report_rules > 2:
                    report_rules = 0
            continue
        if _HELP_RULE.fullmatch(line):  # an Open MPI help box opens or closes
            if in_box:
                text = "\n".join(box)
                m = _PROCESS_NAME.search(text)
                if m and root is None:
                    root = int(m.group(1))
                if box and not _MPIRUN_BOILERPLATE.search(text):
                    found.append(_Line(rank, _box_message(box)))
                box = []
            in_box = not in_box
            continue
        if in_box:
            box.append(line)
            continue
        if line.startswith(_TRACEBACK):
            # Skip the frames; the exception and its message follow them.
            while i < len(lines) and _FRAME.match(lines[i][1]):
                i += 1
            if i >= len(lines):
                break
            rank, head = lines[i]
            i += 1
            message = [head.strip()]
            while (
                i < len(lines)
                and len(message) < MAX_MESSAGE_LINES
                and lines[i][0] == rank
                and _continues(lines[i][1])
            ):
                message.append(lines[i][1].strip())
                i += 1
            if "ChildFailedError" in head:  # torchrun's own traceback: its report follows
                report_rules = 1
            elif not _AGENT_ERROR.match(head):
                found.append(_Line(rank, " ".join(m for m in message if m)))
            continue
        warn = _NCCL_WARN.search(line)
        if warn:
            found.append(_Line(rank, f"NCCL WARN {warn.group(1)}"))
        elif m := _MPI_STARS.match(line) or _FATAL.match(line):
            found.append(_Line(rank, m.group(1)))
    return found, root


def _continues(line: str) -> bool:
    """A line that goes on an exception's message (not the start of something else)."""
    return bool(
        line.strip()
        and not line.startswith(_TRACEBACK)
        and not _CHAINED.match(line)
        and not _TORCHRUN_LOG.match(line)
        and not _RULE.match(line)
        and not _CPP_FRAMES.match(line)
        and not re.match(r"^\[[^\]]*\] ", line)
    )


def own_lines(
    outputs: Mapping[int | None, str] | str,
    posted: Mapping[int, Mapping[str, Any]] | None = None,
    limit: int = MAX_LINES,
) -> list[str]:
    """The ranks' own error lines: what they posted (``error`` in their results) and what their
    launcher's output shows, the root cause's rank first, each distinct message once.

    ``outputs`` is one launcher's output, or each rank's own output by rank (the GPU worker's
    processes); lines that torch or mpirun tagged with a rank keep it.
    """
    by_rank = {None: outputs} if isinstance(outputs, str) else dict(outputs)
    found: list[_Line] = [
        _Line(r, str(p["error"])) for r, p in sorted((posted or {}).items()) if p.get("error")
    ]
    root: int | None = None
    for owner, text in by_rank.items():
        lines = []
        for raw in text.splitlines():
            tag, line = _untag(raw)
            if _TORCHRUN_LOG.match(line) or line.startswith("GPUENV_RESULT "):
                continue
            lines.append((tag if tag is not None else owner, line))
        scanned, named = _scan(lines)
        found += scanned
        root = root if root is not None else named
    # The root cause's own lines first; a peer's "connection closed by peer" follows it.
    ordered = [x for x in found if x.rank == root] + [x for x in found if x.rank != root]
    ranks: dict[str, list[int]] = {}
    for item in ordered:
        text = _clip(item.text)
        known = ranks.setdefault(text, [])
        if item.rank is not None and item.rank not in known:
            known.append(item.rank)
    out = []
    for text, who in list(ranks.items())[:limit]:
        if who:
            label = "rank" if len(who) == 1 else "ranks"
            text = f"{label} {', '.join(str(r) for r in who)}: {text}"
        out.append(text)
    return out


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_LINE_CHARS else text[: MAX_LINE_CHARS - 3] + "..."


def libraries_named(lines: Sequence[str], launcher: Sequence[str] = ()) -> list[str]:
    """The libraries the error lines name, and those the launcher's ranks always go through."""
    text = "\n".join(lines)
    program = os.path.basename(launcher[0]) if launcher else ""
    always = LAUNCHER_LIBRARIES.get(program, ())
    return [lib.name for lib in LIBRARIES if lib.name in always or lib.mention.search(text)]


def read_by(library: str) -> tuple[str, ...]:
    """The prefixes of the variables ``library`` reads."""
    return next((lib.prefixes for lib in LIBRARIES if lib.name == library), ())


def login_settings_of(
    libraries: Sequence[str], login: Mapping[str, Mapping[str, object]]
) -> dict[str, dict[str, object]]:
    """The login files' settings that ``libraries`` read (``{NAME: {"value": ...,
    "set_in": [...]}}``, as the floor's login_env reads them)."""
    prefixes = tuple(p for lib in libraries for p in read_by(lib))
    return {n: dict(e) for n, e in sorted(login.items()) if prefixes and n.startswith(prefixes)}


def find(
    outputs: Mapping[int | None, str] | str,
    posted: Mapping[int, Mapping[str, Any]] | None = None,
    login: Mapping[str, Mapping[str, object]] | None = None,
    launcher: Sequence[str] = (),
) -> Cause:
    """The cause of a failed launch: the ranks' own lines (``own_lines``), the libraries they
    name or the ``launcher`` argv implies, and the ``login`` settings of those libraries."""
    lines = own_lines(outputs, posted)
    libraries = libraries_named(lines, launcher)
    return Cause(lines, libraries, login_settings_of(libraries, login or {}))


def login_sentence(
    libraries: Sequence[str], found: Mapping[str, Mapping[str, object]], where: str = ""
) -> str:
    """``login files set what gloo reads: GLOO_SOCKET_IFNAME='x' (set in /etc/profile.d/y.sh)``
    (``where``: `` on NODE``), naming only the libraries whose variables are set."""
    setting = [lib for lib in libraries if any(n.startswith(read_by(lib)) for n in found)]
    which = " and ".join(setting) or "the job"
    return f"login files{where} set what {which} reads: {login_env.describe(found)}"


def login_here(root: str = "/") -> dict[str, dict[str, object]]:
    """This node's login settings of job variables (the floor's reading, for this process's
    environment and home): what a job started from here inherited from its login files."""
    return login_env.job_variables(root, os.path.expanduser("~"), os.environ)
