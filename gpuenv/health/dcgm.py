"""DCGM as an optional backend of `gpuenv health` (``--dcgm LEVEL``): ``dcgmi diag -r LEVEL``
under a deadline, its plain-text result table read into findings.

DCGM is not needed by the scan; where it is asked for and cannot run (no ``dcgmi``, no host
engine answering), the result is a SKIP with the reason, never a pass. A test DCGM reports as
Skip is a SKIP too (a diag that skipped the memory test tested nothing there).

The table's shape (dcgmi 3.x, as printed on real nodes; tests/fixtures/health-dcgm/SOURCES.md):

    |-----  Deployment  --------+------------------------------------------------|
    | Denylist                  | Pass                                           |
    | GPU Memory                | Pass - GPUs: 1, 2, 3, 4, 5, 6, 7               |
    |                           | Fail - GPU: 0                                  |
    | Warning                   | GPU 0 Thermal violations totaling 13.3 second  |
    |                           | s started at 9.7 seconds into the test ...     |

A section row names the category; a row with a name is a test (or an ``Error``/``Warning``/
``Info`` message about the test above it); a row without a name continues the row above (a
second result line, or the message wrapped at the column's width).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuenv.health.findings import Finding

DCGM_DIAG = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html"
LEVELS = (1, 2, 3)
# How long each level may run: NVIDIA's guide gives about a minute for level 1, a few minutes
# for level 2 and about 30 minutes for level 3 on 8 GPUs; each deadline doubles that.
DEADLINE_S = {1: 120.0, 2: 600.0, 3: 3600.0}
# What a failed test asks for: the GPU's jobs stopped and a person to look (drain), except the
# memory-error deployment test, which fails on a pending remap or retirement (a reset applies it,
# NVIDIA's memory error management guide).
FAIL_ACTION = {"page retirement/row remap": "reset"}
FAIL_DEFAULT = "drain"
MESSAGE_ROWS = ("error", "warning", "info")
# What dcgmi prints when no host engine answers (DCGM 2.x and 3.x wordings).
NO_ENGINE = re.compile(
    r"unable to (establish a )?connect|host engine|connection (is )?(invalid|refused)", re.I
)

Run = Callable[..., tuple[int, str]]


@dataclass
class DiagTest:
    category: str
    name: str
    results: list[str] = field(default_factory=list)  # "Pass - All", "Fail - GPU: 0", …
    messages: list[str] = field(default_factory=list)  # Error / Warning / Info rows, unwrapped

    def by_status(self) -> dict[str, list[int] | None]:
        """status (pass, fail, warn, skip) -> the GPUs it names; None: all of them."""
        out: dict[str, list[int] | None] = {}
        for text in self.results:
            status, _, gpus = text.partition(" - ")
            key = status.strip().lower()
            numbers = [int(n) for n in re.findall(r"\d+", gpus)] if "GPU" in gpus else None
            if key in out and out[key] is not None and numbers is not None:
                out[key] = sorted({*(out[key] or []), *numbers})
            else:
                out[key] = numbers
        return out


@dataclass
class Diag:
    metadata: dict[str, str]
    tests: list[DiagTest]


@dataclass
class DcgmResult:
    findings: list[Finding]
    skipped: list[dict[str, str]]  # signal and reason of what was asked and not tested


def parse_diag(text: str) -> Diag:
    """The result table of ``dcgmi diag``; ValueError when the text holds none."""
    metadata: dict[str, str] = {}
    tests: list[DiagTest] = []
    category = ""
    last: tuple[str, list[str]] | None = None  # where a continuation row goes
    last_cut = False  # the row above filled its cell: the next piece continues it as it stands
    seen_table = False
    for line in text.splitlines():
        line = line.rstrip()
        section = re.match(r"^[|+]-+\s+(.+?)\s+-+\+", line)
        if section:
            category, last, seen_table = section.group(1), None, True
            continue
        if not line.startswith("|") or line.startswith("|=") or "|" not in line[1:]:
            continue
        cells = line.strip("|").split("|", 1)
        if len(cells) != 2:
            continue
        name, raw = cells[0].strip(), cells[1]
        # One pad space each side of the cell, and text up to the cell's width less 3: a piece
        # that long was cut where the column ended (mid-word, or before the space that opens
        # the next piece), so the next piece joins it as it stands.
        piece = (raw[1:] if raw.startswith(" ") else raw).rstrip()
        value = piece.strip()
        cut = len(piece) >= len(raw) - 3
        if name == "Diagnostic" and value == "Result":
            seen_table = True
            continue
        if not name:
            if last is not None and value:
                kind, target = last
                if kind == "result" and value.split(":")[0].lower() in MESSAGE_ROWS and tests:
                    tests[-1].messages.append(value)  # a message under the test's result
                    last = ("message", tests[-1].messages)
                elif kind == "result":
                    target.append(value)
                elif target:  # a wrapped message: dcgmi cuts words at the column's edge
                    target[-1] += piece if last_cut else " " + value
                last_cut = cut
            continue
        last_cut = cut
        if category.lower() == "metadata":
            metadata[name] = value
            last = None
        elif name.lower() in MESSAGE_ROWS and tests:
            tests[-1].messages.append(f"{name}: {value}")
            last = ("message", tests[-1].messages)
        elif name.lower() in MESSAGE_ROWS:  # a message before any test (a deployment error)
            test = DiagTest(category or "Deployment", name, ["Fail"], [f"{name}: {value}"])
            tests.append(test)
            last = ("message", test.messages)
        else:
            test = DiagTest(category, name, [value] if value else [])
            tests.append(test)
            last = ("result", test.results)
    if not seen_table:
        raise ValueError("no dcgmi diag result table in the output")
    return Diag(metadata, tests)


def _signal(test: DiagTest) -> str:
    return "dcgm." + re.sub(r"[^a-z0-9]+", "_", test.name.lower()).strip("_")


def findings_of(diag: Diag, level: int) -> DcgmResult:
    found: list[Finding] = []
    skipped: list[dict[str, str]] = []
    version = diag.metadata.get("DCGM Version", "")
    where = f"dcgmi diag -r {level}" + (f" (DCGM {version})" if version else "")
    for test in diag.tests:
        signal = _signal(test)
        statuses = test.by_status()
        note = ("; " + " ".join(test.messages)) if test.messages else ""
        for status, gpus in statuses.items():
            targets: list[int | None] = list(gpus) if gpus else [None]
            for gpu in targets:
                on = "all GPUs" if gpu is None else f"GPU {gpu}"
                evidence = f"{where}: {test.category} / {test.name}: {status} on {on}{note}"
                if status == "pass":
                    found.append(
                        Finding(signal, "none", evidence, DCGM_DIAG, gpu, subject=test.category)
                    )
                elif status == "fail":
                    action = FAIL_ACTION.get(test.name.lower(), FAIL_DEFAULT)
                    found.append(Finding(signal, action, evidence, DCGM_DIAG, gpu,
                                         subject=test.category, new=True))  # fmt: skip
                elif status in ("warn", "warning"):
                    found.append(
                        Finding(signal, "watch", evidence, DCGM_DIAG, gpu, subject=test.category)
                    )
                else:  # skip, not run, and anything this reader does not know
                    skipped.append({"signal": signal, "reason": evidence})
    return DcgmResult(found, skipped)


def diagnose(level: int, run: Run, deadline_s: float | None = None) -> DcgmResult:
    """Run ``dcgmi diag -r LEVEL`` through ``run`` (the floor's contract: 124 past the deadline,
    127 not started) and read its table."""
    if level not in LEVELS:
        raise ValueError(f"DCGM diag level {level}: one of {', '.join(map(str, LEVELS))}")
    deadline_s = DEADLINE_S[level] if deadline_s is None else deadline_s
    rc, out = run(["dcgmi", "diag", "-r", str(level)], deadline_s)
    signal = "dcgm.diag"
    if rc == 127:
        return DcgmResult([], [{"signal": signal, "reason": "dcgmi is not installed"
                                " (NVIDIA's datacenter-gpu-manager package)"}])  # fmt: skip
    if rc == 124:
        evidence = f"dcgmi diag -r {level} did not finish within {deadline_s:.0f} s (killed)"
        return DcgmResult([Finding(signal, "watch", evidence, DCGM_DIAG, new=True)], [])
    try:
        diag = parse_diag(out)
    except ValueError:
        tail = " ".join(out.strip().splitlines()[-2:]) or f"exit status {rc}"
        if NO_ENGINE.search(out):
            reason = f"no DCGM host engine answers (start nv-hostengine / nvidia-dcgm): {tail}"
        else:
            reason = f"dcgmi diag -r {level} gave no result table (exit status {rc}): {tail}"
        return DcgmResult([], [{"signal": signal, "reason": reason}])
    return findings_of(diag, level)
