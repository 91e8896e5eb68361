"""Preflight's judge of the variables: every role's argument spec and the rules between variables.

Preflight (playbooks/preflight.yml, through the action plugin ``preflight_variables``) hands this
module the variables a host is given (inventory, group and host vars, extra vars) and the values
the roles' defaults take from them, already templated. It judges each value against its role's
``meta/argument_specs.yml`` with Ansible's own ``ArgumentSpecValidator`` (the same judge a role
entry point uses), whether or not the role's stage runs, then the rules no single spec can say:
ports in range and not shared by two services, timeouts against the intervals they must fit in,
profile names that exist, no negative count or span. Every problem names its variable.

Controller side only: it imports Ansible's validator, never runs a process and reads no node.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ..module_utils.net_qos import QosError, parse_ports

PORT_RANGE = (1, 65535)

# Options whose bounds their roles state (the role's description or its own validate.yml).
BOUNDS: dict[str, tuple[int, int | None]] = {
    "slurm_health_interval_s": (10, None),
    "gpu_monitoring_health_interval_s": (10, None),
    "rolling_upgrade_batch_size": (1, None),
    "rolling_upgrade_pair_port": (1024, 65000),
}
# Upper bounds a role keeps in its vars/main.yml: the option, the role and the variable.
ROLE_MAXIMA = {"slurm_health_timeout_s": ("slurm", "__slurm_health_timeout_max_s")}
# Spans that must be at least one second: a zero interval, timeout, poll or cache means nothing.
SPAN_SUFFIXES = (
    "_interval_s",
    "_timeout_s",
    "_timeout",
    "_poll_s",
    "_deadline_s",
    "_cache_s",
    "_days",
)
# Lists of ports (entries "PORT" or "LOW-HIGH"), judged by the parser their role uses.
PORT_LISTS = ("net_qos_ports",)

# The ports services listen on. Each has its own number across the cluster: any two may share a
# host (a small cluster puts the controller, Prometheus and the site cache on one machine).
LISTENERS = (
    "slurm_ctld_port",
    "slurm_d_port",
    "gpu_monitoring_node_exporter_port",
    "gpu_monitoring_dcgm_exporter_port",
    "gpu_monitoring_prometheus_port",
    "site_cache_apt_port",
    "site_cache_http_port",
)
# The rolling upgrade's pair tests: node i of a batch rendezvouses on pair_port + 16 * i.
PAIR_PORT_STRIDE = 16

# Variables that name one of gpuenv check's profiles.
PROFILE_VARIABLES = ("rolling_upgrade_check_profile", "validate_profile")

STRING_TYPES = ("str", "path")


@dataclass(frozen=True)
class Problem:
    """One bad value: the variable, as given, and why it is refused."""

    variable: str
    reason: str

    def __str__(self) -> str:
        return f"{self.variable}: {self.reason}"


def role_options(specs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every option of every role's argument spec (each entry point's, the first one's first),
    by variable name. ``specs`` maps a role name to its meta/argument_specs.yml document."""
    options: dict[str, dict[str, Any]] = {}
    for role in sorted(specs):
        for entry in (specs[role] or {}).get("argument_specs", {}).values():
            for name, spec in ((entry or {}).get("options") or {}).items():
                options.setdefault(name, dict(spec or {}))
    return options


def _judged_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The option's spec without what only applies when the role runs: required (preflight
    judges what is given) and default (the role's defaults file is the one that applies)."""
    return {k: v for k, v in spec.items() if k not in ("required", "default", "description")}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def native(value: Any) -> Any:
    """A plain copy of a templated value (Ansible's tagged containers and strings become dict,
    list, str), so that messages name the type as the user wrote it."""
    if isinstance(value, Mapping):
        return {native(k): native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [native(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def spec_problems(
    options: Mapping[str, Mapping[str, Any]], values: Mapping[str, Any]
) -> tuple[list[Problem], dict[str, Any]]:
    """Each value of ``values`` that is an option of ``options`` against its spec; returns the
    problems and the values as the spec converts them (``"6817"`` for an int is 6817)."""
    problems: list[Problem] = []
    converted: dict[str, Any] = {}
    for name in sorted(values):
        if name not in options:
            continue
        spec = _judged_spec(options[name])
        value = native(values[name])
        if spec.get("type", "str") in STRING_TYPES and isinstance(value, (Mapping, list, tuple)):
            kind = "a mapping" if isinstance(value, Mapping) else "a list"
            problems.append(
                Problem(name, f"must be a {spec.get('type', 'str')}, got {kind}: {_shown(value)}")
            )
            continue
        result = ArgumentSpecValidator({name: spec}).validate({name: value})
        if result.error_messages:
            # The validator may say one thing several ways: its first.
            problems.append(Problem(name, result.error_messages[0]))
            continue
        converted[name] = result.validated_parameters.get(name, value)
    return problems, converted


def role_bounds(role_vars: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[int, int | None]]:
    """The bounds of ROLE_MAXIMA, from each role's vars/main.yml (``role_vars`` by role name)."""
    bounds: dict[str, tuple[int, int | None]] = {}
    for name, (role, variable) in ROLE_MAXIMA.items():
        high = role_vars.get(role, {}).get(variable)
        if isinstance(high, int) and not isinstance(high, bool):
            bounds[name] = (1, high)
    return bounds


def _limits(
    name: str, spec: Mapping[str, Any], bounds: Mapping[str, tuple[int, int | None]]
) -> tuple[int, int | None] | None:
    """The (lowest, highest) an int option may be; None: not a number preflight bounds."""
    if name in bounds:
        return bounds[name]
    if name in BOUNDS:
        return BOUNDS[name]
    if spec.get("type") != "int":
        return None
    if name.endswith("_port"):
        return PORT_RANGE
    if name.endswith(SPAN_SUFFIXES):
        return (1, None)
    return (0, None)


def range_problems(
    options: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, Any],
    bounds: Mapping[str, tuple[int, int | None]] | None = None,
) -> list[Problem]:
    """Ports within 1-65535 (or their role's range), no negative number, spans of 1 s or more."""
    problems: list[Problem] = []
    for name in sorted(values):
        value = values[name]
        if name in PORT_LISTS:
            try:
                parse_ports([str(v) for v in value], name)
            except (QosError, TypeError) as exc:
                problems.append(Problem(name, str(exc).removeprefix(f"{name}: ")))
            continue
        limits = _limits(name, options.get(name, {}), bounds or {})
        if limits is None or not isinstance(value, int) or isinstance(value, bool):
            continue
        low, high = limits
        if value < low or (high is not None and value > high):
            what = (
                f"must be a TCP port {low}-{high}"
                if name.endswith("_port")
                else f"must be {low}-{high}"
                if high is not None
                else f"must be {low} or more"
            )
            problems.append(Problem(name, f"{what} (got {value})"))
    return problems


# Formats in roles' asserts: "NAME is match('RE')", "NAME | length == 0 or NAME is match('RE')".
_STATED = re.compile(
    r"^\s*(?:(?P<empty>[a-z_][a-z0-9_]*) \| length == 0 or )?(?P<name>[a-z_][a-z0-9_]*)"
    r" is match\('(?P<re>[^']*)'\)\s*$"
)


@dataclass(frozen=True)
class Format:
    """A format an option's value must match (Ansible's ``match`` test: from the start)."""

    pattern: str
    empty_ok: bool
    where: str  # the task file that states it


def stated_formats(task_files: Mapping[str, Any], options: Iterable[str]) -> dict[str, Format]:
    """The formats the roles' own asserts state for their options (``task_files``: a path to the
    file's task list), so that preflight applies them to every role, whether its stage runs or
    not; an assert with ``when`` is left to its role (its condition may need what it knows)."""
    options = set(options)
    formats: dict[str, Format] = {}

    def walk(tasks: Any, where: str) -> None:
        for task in tasks if isinstance(tasks, list) else []:
            if not isinstance(task, Mapping):
                continue
            for key in ("block", "rescue", "always"):
                walk(task.get(key), where)
            body = task.get("ansible.builtin.assert") or task.get("assert")
            if not isinstance(body, Mapping) or "when" in task:
                continue
            that = body.get("that")
            for item in [that] if isinstance(that, str) else that or []:
                found = _STATED.match(str(item))
                if not found or found["name"] not in options:
                    continue
                if found["empty"] not in (None, found["name"]):
                    continue
                formats[found["name"]] = Format(found["re"], found["empty"] is not None, where)

    for where, tasks in sorted(task_files.items()):
        walk(tasks, where)
    return formats


def format_problems(values: Mapping[str, Any], formats: Mapping[str, Format]) -> list[Problem]:
    """Each given string against the format its role states."""
    problems: list[Problem] = []
    for name in sorted(values):
        form, value = formats.get(name), values[name]
        if form is None or not isinstance(value, str) or (form.empty_ok and value == ""):
            continue
        if not re.match(form.pattern, value):
            problems.append(
                Problem(
                    name,
                    f"{value!r} does not match {form.pattern} (the format {form.where} checks)",
                )
            )
    return problems


def _ports(values: Mapping[str, Any]) -> dict[str, range]:
    """The ports each listening variable takes, as given or defaulted (ints only)."""
    taken = {
        name: range(values[name], values[name] + 1)
        for name in LISTENERS
        if isinstance(values.get(name), int) and not isinstance(values.get(name), bool)
    }
    pair = values.get("rolling_upgrade_pair_port")
    batch = values.get("rolling_upgrade_batch_size", 1)
    if isinstance(pair, int) and isinstance(batch, int) and batch >= 1:
        taken["rolling_upgrade_pair_port"] = range(pair, pair + PAIR_PORT_STRIDE * batch)
    return taken


def collision_problems(values: Mapping[str, Any], given: Iterable[str]) -> list[Problem]:
    """Two services on one port. Named by the variable the inventory set (both when both were)."""
    given = set(given)
    taken = _ports(values)
    names = sorted(taken)
    problems: list[Problem] = []
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            a, b = taken[first], taken[second]
            if a.start >= b.stop or b.start >= a.stop:
                continue
            if not ({first, second} & given):
                continue  # two defaults: the roles' own plan, which a test holds apart
            culprit, other = (first, second) if first in given else (second, first)
            span = (
                f"{taken[other].start}"
                if len(taken[other]) == 1
                else f"{taken[other].start}-{taken[other].stop - 1} (the pair tests' ports for"
                f" a batch of {values.get('rolling_upgrade_batch_size', 1)})"
            )
            problems.append(
                Problem(
                    culprit,
                    f"port {values[culprit]} collides with {other}={span}: each service needs its"
                    " own port",
                )
            )
    return problems


# Timeouts against the intervals they must fit in: (timeout, interval, why); timeout < interval.
SPAN_PAIRS = (
    (
        "slurm_health_timeout_s",
        "slurm_health_interval_s",
        "the next scan would start before this one is killed",
    ),
    (
        "rolling_upgrade_drain_poll_s",
        "rolling_upgrade_drain_timeout_s",
        "the first look at the jobs would come after the deadline",
    ),
)


def timing_problems(
    values: Mapping[str, Any], given: Iterable[str], stale_after_s: int | None
) -> list[Problem]:
    """Timeouts against the intervals they must fit in, named by the variable given (the first of
    the pair when both or neither were)."""
    given = set(given)
    problems: list[Problem] = []

    def ints(*names: str) -> list[int] | None:
        got = [values.get(n) for n in names]
        return (
            [int(v) for v in got]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in got)
            else None
        )

    def culprit(first: str, second: str) -> str:
        return second if second in given and first not in given else first

    for short, long, why in SPAN_PAIRS:
        pair = ints(short, long)
        if pair and pair[0] >= pair[1]:
            problems.append(
                Problem(
                    culprit(short, long),
                    f"{short} ({pair[0]} s) must be less than {long} ({pair[1]} s): {why}",
                )
            )
    interval, timeout = "gpu_monitoring_health_interval_s", "gpu_monitoring_health_timeout_s"
    pair = ints(interval, timeout)
    if pair and stale_after_s is not None and pair[0] + pair[1] > stale_after_s:
        problems.append(
            Problem(
                culprit(interval, timeout),
                f"{interval} ({pair[0]} s) plus {timeout} ({pair[1]} s) exceeds {stale_after_s} s,"
                " after which the alert GpuHealthScanStale fires on a node whose scans are on time",
            )
        )
    return problems


def profile_problems(
    values: Mapping[str, Any], profiles: Sequence[str] | None, why_unknown: str = ""
) -> list[Problem]:
    """A profile variable names one of gpuenv check's profiles."""
    problems: list[Problem] = []
    for name in PROFILE_VARIABLES:
        if name not in values:
            continue
        value = values[name]
        if profiles is None:
            problems.append(Problem(name, f"{_shown(value)} cannot be checked: {why_unknown}"))
        elif value not in profiles:
            problems.append(
                Problem(
                    name,
                    f"{_shown(value)} is not a profile of gpuenv check;"
                    f" known: {', '.join(profiles)}",
                )
            )
    return problems


def stale_after_s(rules: Mapping[str, Any]) -> int | None:
    """The age past which the alert GpuHealthScanStale fires (files/gpuenv.rules.yml)."""
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            if rule.get("alert") == "GpuHealthScanStale":
                found = re.search(r">\s*([0-9]+)\s*$", str(rule.get("expr", "")))
                return int(found.group(1)) if found else None
    return None


def judge(
    options: Mapping[str, Mapping[str, Any]],
    given: Mapping[str, Any],
    derived: Mapping[str, tuple[Any, Sequence[str]]],
    profiles: Sequence[str] | None,
    stale_s: int | None,
    why_no_profiles: str = "",
    bounds: Mapping[str, tuple[int, int | None]] | None = None,
    formats: Mapping[str, Format] | None = None,
) -> list[Problem]:
    """Every problem of one host's variables. ``given``: the values its inventory and extra vars
    set, templated. ``derived``: each role default that reads given variables, templated, with
    the names of those variables; judged the same way (a bad value that reaches a role through
    its default is as bad) and named with the variables it comes from."""
    values = {**{n: v for n, (v, _) in derived.items()}, **given}
    problems, converted = spec_problems(options, values)
    problems += range_problems(options, converted, bounds)
    problems += format_problems(converted, formats or {})
    # The rules between variables judge only values that passed on their own: one problem, one name.
    sound = {n: v for n, v in converted.items() if n not in {p.variable for p in problems}}
    effective = {**_spec_defaults(options), **sound}
    setters = set(given) | set(derived)
    problems += collision_problems(effective, setters)
    problems += timing_problems(effective, setters, stale_s)
    named = {
        n: sound.get(n, values[n])
        for n in PROFILE_VARIABLES
        if n in values and n not in {p.variable for p in problems}
    }
    problems += profile_problems(named, profiles, why_no_profiles)
    # A role default made bad by the variables it reads is named by them, the ones to fix; once
    # only where one of them is bad on its own already.
    named_bad = {p.variable for p in problems if p.variable not in derived}
    return [
        Problem(
            ", ".join(derived[p.variable][1]),
            f"through {p.variable}, the role default computed from it: {p.reason}",
        )
        if p.variable in derived and p.variable not in given
        else p
        for p in problems
        if not (
            p.variable in derived
            and p.variable not in given
            and named_bad & set(derived[p.variable][1])
        )
    ]


def _spec_defaults(options: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The specs' literal defaults (not the templated ones), for the rules between variables."""
    return {
        name: spec["default"]
        for name, spec in options.items()
        if "default" in spec and not (isinstance(spec["default"], str) and "{{" in spec["default"])
    }
