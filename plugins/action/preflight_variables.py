"""Action gpuenv.cluster.preflight_variables: every role's variables, before any change.

Runs on the controller (run_once in playbooks/preflight.yml) and judges, for every host of the
play, each variable its inventory, group and host vars or extra vars set that is an option of a
role's ``meta/argument_specs.yml`` (every role of the collection, whether or not its stage runs),
and each role default that is computed from such a variable, with the rules between variables
(plugins/plugin_utils/preflight.py). It fails once, naming every bad variable, its reason and
the hosts that have it; it changes nothing and starts nothing on a node.

    - name: Check every role's variables
      gpuenv.cluster.preflight_variables:
      run_once: true

Returns ``problems`` (a list of {variable, reason, hosts}) and ``checked`` (variables judged).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleUndefinedVariable
from ansible.plugins.action import ActionBase
from ansible.template import Templar, trust_as_template

from ..plugin_utils.preflight import (
    PROFILE_VARIABLES,
    ROLE_MAXIMA,
    Problem,
    judge,
    role_bounds,
    role_options,
    stale_after_s,
    stated_formats,
)

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
RULES_FILE = ROLES_DIR / "gpu_monitoring" / "files" / "gpuenv.rules.yml"
_NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_ROLE_OWN = re.compile(r"'(__[A-Za-z0-9_]+|role_path)' is undefined")
# Variables set by users that role defaults read besides the roles' options (docs/variables.md).
PUBLIC_PREFIXES = ("gpuenv_", "validate_")


def _yaml(path: Path) -> dict[str, Any]:
    """A YAML file of the collection as plain data (libyaml where there is one: Ansible's own
    loader takes ten times as long for the thirty files)."""
    if not path.is_file():
        return {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(), Loader=loader) or {}


def _yaml_list(path: Path) -> list[Any]:
    """A task file's tasks (a list; anything else is no task list)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    tasks = yaml.load(path.read_text(), Loader=loader)
    return tasks if isinstance(tasks, list) else []


def _trusted(value: Any) -> Any:
    """The roles' defaults, trusted as templates as Ansible trusts a role's defaults file."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, Mapping):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(
        self, tmp: str | None = None, task_vars: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        specs: dict[str, Any] = {}
        defaults: dict[str, Any] = {}
        for role in sorted(ROLES_DIR.iterdir()):
            if (role / "meta" / "argument_specs.yml").is_file():
                specs[role.name] = _yaml(role / "meta" / "argument_specs.yml")
                defaults.update(_trusted(_yaml(role / "defaults" / "main.yml")))
        options = role_options(specs)
        formats = stated_formats(
            {
                str(path.relative_to(ROLES_DIR.parent)): _yaml_list(path)
                for name in ("validate.yml", "checks.yml")
                for path in sorted(ROLES_DIR.glob(f"*/tasks/{name}"))
            },
            options,
        )
        bounds = role_bounds(
            {r: _yaml(ROLES_DIR / r / "vars" / "main.yml") for r, _ in ROLE_MAXIMA.values()}
        )
        hostvars = task_vars["hostvars"]
        found: dict[tuple[str, str], list[str]] = {}
        checked: set[str] = set()
        hosts = list(task_vars.get("ansible_play_hosts_all", []))
        for host in hosts:
            raw = hostvars.raw_get(host)
            templar = Templar(
                loader=self._loader, variables={**defaults, **raw, "hostvars": hostvars}
            )
            public = {n for n in raw if n in options or n.startswith(PUBLIC_PREFIXES)}
            given, problems = self._given(templar, raw, options, public)
            derived, bad_defaults = self._derived(
                templar, defaults, options, public, given, problems
            )
            checked.update(given, derived)
            profiles, why = self._profiles(given, derived)
            stale_s = self._stale_s(given, derived)
            problems += bad_defaults + judge(
                options, given, derived, profiles, stale_s, why, bounds, formats
            )
            for problem in problems:
                found.setdefault((problem.variable, problem.reason), []).append(host)
        result["checked"] = sorted(checked)
        result["problems"] = [
            {"variable": v, "reason": r, "hosts": h} for (v, r), h in sorted(found.items())
        ]
        result["changed"] = False
        if found:
            result["failed"] = True
            result["msg"] = "bad variables, refused before any change: " + "; ".join(
                f"{v}: {r} [{', '.join(h)}]" for (v, r), h in sorted(found.items())
            )
        else:
            result["msg"] = f"{len(checked)} variables of {len(hosts)} hosts checked"
        return result

    @staticmethod
    def _given(
        templar: Templar, raw: Mapping[str, Any], options: Mapping[str, Any], public: set[str]
    ) -> tuple[dict[str, Any], list[Problem]]:
        """The role options (and profile variables) this host is given, templated."""
        given: dict[str, Any] = {}
        problems: list[Problem] = []
        for name in sorted(public):
            if name not in options and name not in PROFILE_VARIABLES:
                continue
            try:
                given[name] = templar.template(raw[name])
            except AnsibleUndefinedVariable as exc:
                if _ROLE_OWN.search(str(exc)):
                    continue  # it reads what only a role defines (__ data, role_path): judged there
                problems.append(Problem(name, f"cannot be templated: {exc}"))
            except Exception as exc:  # any templating error of a given value is its problem
                problems.append(Problem(name, f"cannot be templated: {exc}"))
        return given, problems

    @staticmethod
    def _derived(
        templar: Templar,
        defaults: Mapping[str, Any],
        options: Mapping[str, Any],
        public: set[str],
        given: Mapping[str, Any],
        problems: list[Problem],
    ) -> tuple[dict[str, tuple[Any, list[str]]], list[Problem]]:
        """Each role default that reads a given public variable (directly or through another
        default), templated, with the names of those variables."""
        sources: dict[str, set[str]] = {}

        def reads(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
            if name in sources:
                return sources[name]
            value = defaults.get(name)
            found: set[str] = set()
            if isinstance(value, str) and "{{" in value:
                for ref in set(_NAME.findall(value)) - seen - {name}:
                    if ref in public:
                        found.add(ref)
                    elif ref in defaults and ref not in public:
                        found |= reads(ref, seen | {name})
            sources[name] = found
            return found

        bad = {p.variable for p in problems}
        derived: dict[str, tuple[Any, list[str]]] = {}
        # One problem per cause: the given variables and the error, with every default it breaks.
        failures: dict[tuple[str, str], list[str]] = {}
        for name in sorted(options):
            if name in given or name not in defaults:
                continue
            names = sorted(reads(name))
            if not names or bad & set(names):
                continue
            try:
                derived[name] = (templar.template(defaults[name]), names)
            except AnsibleUndefinedVariable:
                continue  # it reads what only its role defines (per-OS data, later facts)
            except Exception as exc:  # the default cannot be computed from the given values
                failures.setdefault((", ".join(names), str(exc)), []).append(name)
        return derived, [
            Problem(
                given_names,
                f"{error} (so the role defaults {', '.join(breaks)} cannot be computed from it)",
            )
            for (given_names, error), breaks in failures.items()
        ]

    def _profiles(
        self, given: Mapping[str, Any], derived: Mapping[str, Any]
    ) -> tuple[list[str] | None, str]:
        """gpuenv check's profile names (gpuenv/data/thresholds.yaml, whose profiles a user's
        thresholds file cannot add to), read only when a profile variable is set."""
        if not any(n in given or n in derived for n in PROFILE_VARIABLES):
            return [], ""
        found = importlib.util.find_spec("gpuenv")
        if found is None or found.origin is None:
            return None, (
                "gpuenv is not installed in the controller's Python (the validate stage and the"
                " upgrade's pair tests need it there too)"
            )
        thresholds = _yaml(Path(found.origin).parent / "data" / "thresholds.yaml")
        return [str(name) for name in thresholds.get("profiles", {})], ""

    def _stale_s(self, given: Mapping[str, Any], derived: Mapping[str, Any]) -> int | None:
        if not any(n.startswith("gpu_monitoring_health_") for n in (*given, *derived)):
            return None
        return stale_after_s(_yaml(RULES_FILE))
