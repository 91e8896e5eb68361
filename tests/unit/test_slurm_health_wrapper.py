"""The slurm role's health-check script as slurmd runs it: rendered from its template with the
role's defaults and vars (Ansible's own `quote` and `comment` filters, trim_blocks), run by
/bin/sh against a fake slurmctld (tests/unit/fakeslurm/scontrol, one node's record) and a gpuenv
with one fault injected (tests/unit/fakeslurm/fake_gpuenv.py: the real CLI on a recorded node).

One table of cases: every way the scan can end (a verdict, a reset-level finding, a crash before
and after the scan, a signal, a deadline, an unwritable cache, bad input, gpuenv missing or
unable to start, slurmctld down) against every owner of the node's drain (none, gpuenv's health
check, the rolling upgrade, an administrator). Each case is then fed to gpuenv.health.slurm's
rule, which must decide what the script did: the script and the Python share one rule.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule
from healthnode import build

from gpuenv.health import slurm

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "slurm"
FAKES = Path(__file__).parent / "fakeslurm"
UPGRADE_VARS = ROOT / "roles" / "rolling_upgrade" / "vars" / "main.yml"

OLD = "gpuenv: pcie.width gpu0 0000:18:00.0: link x8, expected x16"  # an earlier scan's drain
UPGRADE = "gpuenv: upgrade batch 2 to 3f2a9c01d4e5"  # roles/rolling_upgrade's reason
ADMIN = "disk replaced, do not use"
OWNERS = {
    "none": ("IDLE", ""),
    "scan": ("IDLE+DRAIN", OLD),
    "upgrade": ("MIXED+DRAIN", UPGRADE),
    "admin": ("IDLE+DRAIN", ADMIN),
}


def role_vars(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"ansible_managed": "Ansible managed"}
    for path in (ROLE / "defaults" / "main.yml", ROLE / "vars" / "main.yml"):
        data.update(yaml.safe_load(path.read_text(encoding="utf-8")))
    data.update(overrides)
    return data


def render(name: str, **overrides: Any) -> str:
    """The template as the role renders it (Ansible's template module: trim_blocks, its filters)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROLE / "templates"),
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters.update(FilterModule().filters())
    return env.get_template(name).render(**role_vars(**overrides))


@dataclass(frozen=True)
class Case:
    name: str
    owner: str  # whose drain the node has before the check: a key of OWNERS, or "same"
    fault: str  # FAKE_GPUENV_FAULT, or: reset (a reset-level finding), cache (the verdict cache
    # cannot be written), badarg (an extra argument gpuenv refuses), missing (no gpuenv), down
    # (slurmctld does not answer)
    exit: int  # the script's exit status
    verb: str | None  # what Slurm was told: slurm.DRAIN, RESUME, KEEP; None: it could not be told
    cause: str | None  # a failed scan's cause in the reason ({gpuenv}, {cache}: the paths); None:
    # the scan's own verdict decides


SCAN_FAILED_1 = "gpuenv health exited 1 without a verdict: "
CASES = [
    # A verdict the scan wrote: gpuenv drains or resumes, only its own drains.
    Case("healthy, not drained", "none", "none", 0, slurm.KEEP, None),
    Case("healthy resumes its own drain", "scan", "none", 0, slurm.RESUME, None),
    Case("healthy keeps the upgrade's drain", "upgrade", "none", 0, slurm.KEEP, None),
    Case("healthy keeps an administrator's drain", "admin", "none", 0, slurm.KEEP, None),
    Case("reset-level finding drains", "none", "reset", 1, slurm.DRAIN, None),
    Case("reset-level finding replaces its own reason", "scan", "reset", 1, slurm.DRAIN, None),
    Case("reset-level finding keeps the upgrade's drain", "upgrade", "reset", 1, slurm.KEEP, None),
    Case("reset-level finding keeps an administrator's", "admin", "reset", 1, slurm.KEEP, None),
    # Anything else is a failed scan: drained, unless someone else drained the node.
    Case("crash before the scan", "none", "before-scan", 1, slurm.DRAIN,
         SCAN_FAILED_1 + "RuntimeError: injected before the scan"),
    Case("crash after the scan, before its resume", "scan", "after-scan", 1, slurm.DRAIN,
         SCAN_FAILED_1 + "TypeError: injected after the scan"),
    Case("crash after the scan keeps the upgrade's drain", "upgrade", "after-scan", 1, slurm.KEEP,
         SCAN_FAILED_1 + "TypeError: injected after the scan"),
    Case("a signal during the scan", "none", "segfault", 1, slurm.DRAIN,
         "gpuenv health killed by signal 11"),
    Case("a signal keeps an administrator's drain", "admin", "segfault", 1, slurm.KEEP,
         "gpuenv health killed by signal 11"),
    Case("the scan's deadline", "scan", "hang", 1, slurm.DRAIN, "no answer within 1 s"),
    Case("the deadline keeps the upgrade's drain", "upgrade", "hang", 1, slurm.KEEP,
         "no answer within 1 s"),
    Case("an unwritable verdict cache", "none", "cache", 1, slurm.DRAIN,
         "cannot write the verdict cache {cache}: File exists"),
    Case("bad input (exit 2)", "none", "badarg", 1, slurm.DRAIN,
         "gpuenv health exited 2: gpuenv health: error: thresholds file /nonexistent/health.yml:"
         " cannot read: No such file or directory"),
    Case("gpuenv cannot start", "none", "import", 1, slurm.DRAIN,
         SCAN_FAILED_1 + "ModuleNotFoundError: No module named 'gpuenv_injected_missing'"),
    Case("gpuenv cannot start, its own drain", "scan", "import", 1, slurm.DRAIN,
         SCAN_FAILED_1 + "ModuleNotFoundError: No module named 'gpuenv_injected_missing'"),
    Case("gpuenv cannot start keeps the upgrade's drain", "upgrade", "import", 1, slurm.KEEP,
         SCAN_FAILED_1 + "ModuleNotFoundError: No module named 'gpuenv_injected_missing'"),
    Case("gpuenv missing", "none", "missing", 1, slurm.DRAIN, "{gpuenv} not found"),
    Case("gpuenv missing keeps an administrator's drain", "admin", "missing", 1, slurm.KEEP,
         "{gpuenv} not found"),
    Case("gpuenv missing, already drained for it", "same", "missing", 1, slurm.KEEP,
         "{gpuenv} not found"),
    # The verdict stands in the prolog's cache; no one can tell slurmctld: nothing is written.
    Case("slurmctld does not answer", "none", "down", 3, None, None),
]  # fmt: skip


@dataclass
class Run:
    exit: int
    out: str
    state: str
    reason: str
    calls: list[str]
    cache: Path
    gpuenv: Path


def recorded_node(folder: Path, case: str | None) -> list[str]:
    """gpuenv health's arguments that scan the recorded 8-GPU node (with ``case``'s fault)."""
    node = build(folder, "hgx8", case)
    nvml = folder / "nvml.json"
    nvml.write_text(json.dumps(node.nvml_data))
    log = folder / "kernel.log"
    log.write_text(node.kernel_log or "")
    return ["--root", node.root, "--nvml-fixture", str(nvml), "--kernel-log", str(log)]


def run_case(tmp_path: Path, case: Case, node: list[str]) -> Run:
    tmp_path.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gpuenv = bin_dir / "gpuenv"
    if case.fault != "missing":
        fake = FAKES / "fake_gpuenv.py"
        gpuenv.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {fake} "$@"\n')
        gpuenv.chmod(0o755)
    (bin_dir / "scontrol").symlink_to(FAKES / "scontrol")
    cache = tmp_path / "run" / "verdict.json"
    if case.fault == "cache":
        (tmp_path / "run").write_text("a file where the cache's folder should be\n")
    extra = [*node, "--no-state"]
    if case.fault == "badarg":
        extra += ["--thresholds", "/nonexistent/health.yml"]
    overrides: dict[str, Any] = {
        "slurm_gpuenv": str(gpuenv),
        "slurm_health_extra_args": extra,
        "__slurm_verdict_cache": str(cache),
        "__slurm_script_path": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        # Deadlines a loaded test machine cannot overrun (the role's own are held to slurmd's
        # 60 s below); the hang case has a deadline of 1 s.
        "slurm_health_timeout_s": 1 if case.fault == "hang" else 120,
        "__slurm_health_fallback_s": 120,
    }
    script = tmp_path / "gpuenv-slurm-health"
    script.write_text(render("gpuenv-slurm-health.sh.j2", **overrides))
    script.chmod(0o755)

    ctld = tmp_path / "ctld"
    ctld.mkdir()
    state, reason = OWNERS.get(case.owner, ("IDLE+DRAIN", ""))
    if case.owner == "same":
        reason = slurm.scan_failed(expected_cause(case, gpuenv, cache))
    (ctld / "state").write_text(state + "\n")
    (ctld / "reason").write_text(reason + "\n")
    if case.fault == "down":
        (ctld / "down").write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURMD_NODENAME": "n1",
        "FAKE_SCONTROL_DIR": str(ctld),
        "FAKE_GPUENV_FAULT": case.fault if case.fault in FAULTS else "none",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    done = subprocess.run(
        ["/bin/sh", str(script)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    calls = (ctld / "log").read_text().splitlines() if (ctld / "log").exists() else []
    return Run(
        done.returncode,
        done.stdout + done.stderr,
        (ctld / "state").read_text().strip(),
        (ctld / "reason").read_text().strip(),
        calls,
        cache,
        gpuenv,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every case, four at a time (each waits on its own processes)."""
    root = tmp_path_factory.mktemp("wrapper")
    healthy = recorded_node(root / "healthy", None)
    reset = recorded_node(root / "reset", "xid154-recovery-reset")
    with ThreadPoolExecutor(4) as pool:
        futures = {
            case.name: pool.submit(
                run_case, root / f"case{i}", case, reset if case.fault == "reset" else healthy
            )
            for i, case in enumerate(CASES)
        }
    return {name: future.result() for name, future in futures.items()}


FAULTS = ("none", "import", "before-scan", "after-scan", "segfault", "hang")


def expected_cause(case: Case, gpuenv: Path, cache: Path) -> str:
    assert case.cause is not None
    return case.cause.format(gpuenv=gpuenv, cache=cache)


def python_rule(case: Case, run: Run, gpuenv: Path) -> slurm.Decision:
    """What gpuenv.health.slurm decides for the case's node and outcome."""
    state, reason = OWNERS.get(case.owner, ("IDLE+DRAIN", ""))
    if case.owner == "same":
        reason = slurm.scan_failed(expected_cause(case, gpuenv, run.cache))
    if case.cause is not None:
        problem: str | None = slurm.scan_failed(expected_cause(case, gpuenv, run.cache))
    else:  # the scan's own verdict, as it wrote it to the prolog's cache
        problem = json.loads(run.cache.read_text())["problem"]
    return slurm.decide(slurm.NodeState("n1", state, reason), problem)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_health_check_script_and_the_python_rule_agree(runs, case):
    run = runs[case.name]
    gpuenv = run.gpuenv
    assert run.exit == case.exit, run.out
    updates = [c for c in run.calls if c.startswith("update ")]
    if case.verb is None:  # slurmctld does not answer: nothing written blindly, no fallback
        assert run.calls == ["show node -o n1"], run.out
        assert run.state == OWNERS[case.owner][0]
        assert json.loads(run.cache.read_text())["problem"] is None  # the scan's own verdict
        return
    decision = python_rule(case, run, gpuenv)
    assert decision.verb == case.verb, decision
    before = OWNERS.get(case.owner, ("IDLE+DRAIN", ""))
    if case.verb == slurm.KEEP:
        assert updates == [], run.out
        if case.owner != "same":
            assert (run.state, run.reason) == before, run.out
    elif case.verb == slurm.RESUME:
        assert updates == ["update nodename=n1 state=resume"], run.out
        assert (run.state, run.reason) == (before[0].split("+")[0], ""), run.out
    else:
        assert updates == [f"update nodename=n1 state=drain reason={decision.reason}"], run.out
        assert (run.state, run.reason) == (before[0].split("+")[0] + "+DRAIN", decision.reason)
    if case.fault == "reset":
        assert decision.reason.startswith("gpuenv: xid gpu3") or case.verb == slurm.KEEP
    # The prolog never trusts a healthy verdict older than a failed scan: gpuenv recorded the
    # failure, or (where gpuenv could not) the script dropped the cache and the prolog scans.
    if case.fault in ("missing", "import", "after-scan", "cache"):
        assert not run.cache.exists()
    elif case.cause is not None:
        cached = json.loads(run.cache.read_text())["problem"]
        assert cached == slurm.scan_failed(expected_cause(case, gpuenv, run.cache))


def test_the_table_covers_every_exit_and_every_owner():
    for owner in OWNERS:  # each owner meets a verdict and a failed scan
        assert {c.cause is None for c in CASES if c.owner == owner} == {True, False}, owner
    assert {c.exit for c in CASES} == {0, 1, 3}
    assert set(FAULTS) | {"reset", "cache", "badarg", "missing", "down"} == {c.fault for c in CASES}


def test_the_script_and_the_rolling_upgrade_share_the_reason_prefixes():
    role = role_vars()
    upgrade = yaml.safe_load(UPGRADE_VARS.read_text(encoding="utf-8"))
    assert role["__slurm_reason_prefix"] == slurm.PREFIX
    assert role["__slurm_upgrade_prefix"] == slurm.UPGRADE_PREFIX
    assert upgrade["__rolling_upgrade_reason_prefix"] == slurm.UPGRADE_PREFIX
    assert role["__slurm_verdict_mark"] == slurm.VERDICT_MARK


def test_the_script_fits_slurmds_60_s_for_every_accepted_timeout():
    """slurmd kills its HealthCheckProgram after 60 s (slurm.conf(5)); the script's fallback must
    still run after the scan's deadline: the role refuses a longer scan deadline."""
    validate = (ROLE / "tasks" / "validate.yml").read_text(encoding="utf-8")
    assert "slurm_health_timeout_s | int <= __slurm_health_timeout_max_s" in validate
    defaults = role_vars()
    assert defaults["__slurm_health_timeout_max_s"] == slurm.SCAN_DEADLINE_MAX_S
    assert defaults["__slurm_health_fallback_s"] == slurm.FALLBACK_DEADLINE_S
    assert 1 <= defaults["slurm_health_timeout_s"] <= slurm.SCAN_DEADLINE_MAX_S
    text = render("gpuenv-slurm-health.sh.j2", slurm_health_timeout_s=slurm.SCAN_DEADLINE_MAX_S)
    budget = slurm.SCAN_DEADLINE_MAX_S + 2 + slurm.FALLBACK_DEADLINE_S + 1 + 2 * 5
    assert budget < slurm.SLURMD_HEALTH_KILL_S, budget
    assert f"timeout -k 2 {slurm.SCAN_DEADLINE_MAX_S} " in text
    assert f"timeout -k 1 {slurm.FALLBACK_DEADLINE_S:g} " in text
