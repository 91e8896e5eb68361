"""Preflight refuses every bad value of every role's variables before any change, naming it.

The bad values are generated from the roles' meta/argument_specs.yml themselves: for every option
with choices a value outside them, for every option of a non-string type a value of another type
(a mapping for a list, a word for an int or a bool, a list for a mapping), for every string option a
mapping, for every port 0 and 70000, for every number -1, for every format a role's assert states a
string outside it; then the rules between variables (two services on one port, timeouts against
intervals, profile names). The whole table goes through the judge in-process
(plugins/plugin_utils/preflight.py, the code the action plugin runs); a sample of it goes end to
end through the real playbooks/preflight.yml with ansible-playbook against a local-connection host,
followed by a play that would leave a marker: the run must fail in preflight's first task, name
each variable, change nothing and leave no marker. One ansible-playbook run per generated value
(some 560) would take many minutes on a small machine.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))

from ansible_collections.gpuenv.cluster.plugins.plugin_utils import preflight  # noqa: E402

SPECS = {
    p.parent.parent.name: yaml.safe_load(p.read_text())
    for p in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml"))
}
OPTIONS = preflight.role_options(SPECS)
PROFILES = list(
    yaml.safe_load((ROOT / "gpuenv" / "data" / "thresholds.yaml").read_text())["profiles"]
)
BOUNDS = preflight.role_bounds(
    {
        role: yaml.safe_load((ROOT / "roles" / role / "vars" / "main.yml").read_text())
        for role, _ in preflight.ROLE_MAXIMA.values()
    }
)
FORMATS = preflight.stated_formats(
    {
        str(path.relative_to(ROOT)): yaml.safe_load(path.read_text())
        for name in ("validate.yml", "checks.yml")
        for path in sorted((ROOT / "roles").glob(f"*/tasks/{name}"))
    },
    OPTIONS,
)
NOT_A_FORMAT = "Not valid!"
STALE_S = preflight.stale_after_s(
    yaml.safe_load((ROOT / "roles" / "gpu_monitoring" / "files" / "gpuenv.rules.yml").read_text())
)


def _wrong_type(kind: str) -> Any:
    """A value that is not of ``kind`` and that Ansible's conversions cannot make one."""
    return {
        "int": "not-a-number",
        "float": "not-a-number",
        "bool": "sometimes",
        "list": {"a": "mapping"},
        "dict": ["a", "list"],
        "str": {"a": "mapping"},
        "path": {"a": "mapping"},
    }[kind]


def bad_values() -> Iterator[tuple[str, str, Any]]:
    """(case id, variable, bad value) for every option of every role, from its spec."""
    for name, spec in sorted(OPTIONS.items()):
        kind = spec.get("type", "str")
        if kind != "raw":
            yield f"{name}-wrong-type", name, _wrong_type(kind)
        if "choices" in spec:
            wrong = "not-a-choice"
            yield f"{name}-not-a-choice", name, [wrong] if kind == "list" else wrong
        if kind == "int":
            yield f"{name}-negative", name, -1
        if kind == "int" and name.endswith("_port"):
            yield f"{name}-port-zero", name, 0
            yield f"{name}-port-70000", name, 70000
        if name in BOUNDS and BOUNDS[name][1] is not None:
            yield f"{name}-above-its-role-maximum", name, BOUNDS[name][1] + 1
        if name in FORMATS:
            yield f"{name}-not-its-format", name, NOT_A_FORMAT
        if kind == "list" and name.endswith("_ports"):
            yield f"{name}-port-70000", name, ["70000"]


BAD = {case: (name, value) for case, name, value in bad_values()}


def _literal_defaults() -> dict[str, Any]:
    return {
        name: spec["default"]
        for name, spec in OPTIONS.items()
        if "default" in spec and not (isinstance(spec["default"], str) and "{{" in spec["default"])
    }


def judge(given: dict[str, Any], derived: dict | None = None) -> list[preflight.Problem]:
    return preflight.judge(OPTIONS, given, derived or {}, PROFILES, STALE_S, "", BOUNDS, FORMATS)


def test_the_table_covers_every_role_and_kind() -> None:
    roles = {name.split("_")[0] for name, _ in BAD.values()}
    assert len(SPECS) >= 15 and len(BAD) > 250, (len(SPECS), len(BAD))
    assert {"slurm", "rolling", "gpu", "site", "nvidia", "nccl", "cuda", "mpi", "ssh"} <= roles
    assert "gpu_env_pip_extra_index_urls-wrong-type" in BAD
    assert "rolling_upgrade_pair_port-port-70000" in BAD
    assert set(BOUNDS) == set(preflight.ROLE_MAXIMA)
    # The formats of the roles whose own checks run only in their stage (slurm) are among them.
    assert {"slurm_version", "slurm_cluster_name", "slurm_partition_name", "slurm_gpuenv"} <= set(
        FORMATS
    )
    assert all(not re.match(form.pattern, NOT_A_FORMAT) for form in FORMATS.values())


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_value_is_refused_naming_its_variable(case: str) -> None:
    name, value = BAD[case]
    problems = judge({name: value})
    assert [p.variable for p in problems] == [name], (case, [str(p) for p in problems])


@pytest.mark.parametrize("name", sorted(_literal_defaults()))
def test_every_default_passes(name: str) -> None:
    """The roles' own values are never refused: each literal default, as if the inventory set it."""
    assert judge({name: _literal_defaults()[name]}) == []


def test_the_example_inventory_passes() -> None:
    given: dict[str, Any] = {}
    for path in sorted((ROOT / "inventory" / "example" / "group_vars" / "all").glob("*.yml")):
        given.update(yaml.safe_load(path.read_text()) or {})
    given = {k: v for k, v in given.items() if k in OPTIONS and "{{" not in str(v)}
    assert given
    assert judge(given) == []


def _default(name: str) -> int:
    return int(OPTIONS[name]["default"])


@pytest.mark.parametrize(
    ("first", "second"),
    [(a, b) for a in preflight.LISTENERS for b in preflight.LISTENERS if a != b],
)
def test_two_services_on_one_port_are_refused(first: str, second: str) -> None:
    problems = judge({first: _default(second)})
    assert [p.variable for p in problems] == [first]
    assert second in problems[0].reason


def test_the_pair_tests_ports_of_a_batch_are_taken() -> None:
    # A batch of 4 from 29500 takes 29500-29563: a port inside is refused, one past it is not.
    inside = judge({"rolling_upgrade_batch_size": 4, "gpu_monitoring_prometheus_port": 29550})
    assert [p.variable for p in inside] == ["gpu_monitoring_prometheus_port"]
    assert "29500-29563" in inside[0].reason
    assert judge({"rolling_upgrade_batch_size": 4, "gpu_monitoring_prometheus_port": 29564}) == []


def _timing_cases() -> list[tuple[dict[str, int], str]]:
    """Each rule broken by one variable against the other's default, and by both."""
    assert STALE_S is not None
    return [
        ({"slurm_health_timeout_s": _default("slurm_health_interval_s")}, "slurm_health_timeout_s"),
        (
            {"slurm_health_interval_s": max(10, _default("slurm_health_timeout_s"))},
            "slurm_health_interval_s",
        ),
        ({"slurm_health_interval_s": 20, "slurm_health_timeout_s": 20}, "slurm_health_timeout_s"),
        (
            {"rolling_upgrade_drain_poll_s": _default("rolling_upgrade_drain_timeout_s")},
            "rolling_upgrade_drain_poll_s",
        ),
        (
            {
                "gpu_monitoring_health_interval_s": STALE_S
                - _default("gpu_monitoring_health_timeout_s")
                + 1
            },
            "gpu_monitoring_health_interval_s",
        ),
        (
            {
                "gpu_monitoring_health_timeout_s": STALE_S
                - _default("gpu_monitoring_health_interval_s")
                + 1
            },
            "gpu_monitoring_health_timeout_s",
        ),
    ]


@pytest.mark.parametrize(("given", "named"), _timing_cases())
def test_timeouts_against_intervals(given: dict[str, int], named: str) -> None:
    problems = judge(given)
    assert [p.variable for p in problems] == [named], [str(p) for p in problems]


def test_the_stale_alert_is_read_from_the_rules_file() -> None:
    assert STALE_S == 900


@pytest.mark.parametrize("name", preflight.PROFILE_VARIABLES)
def test_a_profile_that_does_not_exist_is_refused(name: str) -> None:
    problems = judge({name: "nightly"})
    assert [p.variable for p in problems] == [name]
    assert "quick" in problems[0].reason
    assert judge({name: "full"}) == []


def test_a_default_computed_from_a_bad_variable_names_it() -> None:
    # rolling_upgrade_check_profile defaults to validate_profile: the bad profile is named once.
    problems = judge(
        {"validate_profile": "nightly"},
        {"rolling_upgrade_check_profile": ("nightly", ["validate_profile"])},
    )
    assert [p.variable for p in problems] == ["validate_profile"]
    # A default made bad by what it reads is named by the variable read, the one to fix.
    derived = judge({}, {"slurm_d_port": (70000, ["slurm_base_port"])})
    assert [p.variable for p in derived] == ["slurm_base_port"]
    assert derived[0].reason.startswith("through slurm_d_port, the role default computed from it")


# End to end: the real preflight playbook on a local-connection host with a fake Debian 13's facts
# and a marker play after it: the harness of tests/integration/test_preflight_gpu_stack.py.
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from test_preflight_gpu_stack import FACT_MODULE, GOOD_TRIXIE, TRIXIE, Case, Run, _run_case  # noqa: E402

# Each case: the extra vars; a failure must name each. Alone, the two the issue names first;
# together, one of each kind (one run names them all).
END_TO_END: dict[str, dict[str, Any]] = {
    # Templated values: one reading a role's own data, a number given as text, a known profile.
    "good": {
        "gpu_env_os_packages": "{{ __gpu_env_os_packages }}",
        "slurm_d_port": "{{ 6818 + 2 }}",
        "validate_profile": "full",
    },
    "unknown-upgrade-profile": {"rolling_upgrade_check_profile": "nightly"},
    "mapping-for-a-list": {"gpu_env_pip_extra_index_urls": {"url": "https://pypi.example/simple"}},
    "one-of-each-kind": {
        "slurm_d_port": 70000,
        "gpu_monitoring_prometheus_port": _default("slurm_ctld_port"),
        "gpu_monitoring_health_interval_s": -60,
        "slurm_health_fail_on": "never",
        "rolling_upgrade_batch_size": "all",
        "net_qos_ports": ["29500", "70000"],
        "ssh_mesh_user_create": "sometimes",
        "slurm_cluster_name": "My Cluster",
        # Read by role defaults only (gpu_env_pip_extra_index_urls, the pip arguments): named.
        "gpuenv_pip_extra_index_url": {"url": "https://pypi.example/simple"},
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    base = tmp_path_factory.mktemp("preflight-variables")
    (base / "library").mkdir()
    (base / "library" / "gs_fake_facts.py").write_text(FACT_MODULE)
    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(len(END_TO_END)) as pool:
        # The harness finds ansible-playbook on PATH: this interpreter's.
        patch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        cases = {
            name: Case(TRIXIE, {**GOOD_TRIXIE, **extra}, ()) for name, extra in END_TO_END.items()
        }
        futures = {name: pool.submit(_run_case, name, case, base) for name, case in cases.items()}
        yield {name: f.result() for name, f in futures.items()}


def test_good_input_passes_preflight(runs: dict[str, Run]) -> None:
    assert runs["good"].rc == 0, runs["good"].output[-3000:]
    assert runs["good"].marker_written


@pytest.mark.parametrize("case", sorted(c for c in END_TO_END if c != "good"))
def test_preflight_stops_the_bad_value_before_any_change(runs: dict[str, Run], case: str) -> None:
    run = runs[case]
    assert run.rc != 0, f"{case}: preflight passed\n{run.output[-3000:]}"
    assert not run.marker_written, f"{case}: a later stage ran after preflight failed"
    recap = re.search(r"^gs-node\s+:.*$", run.output, re.M)
    assert recap and " changed=0 " in recap.group(0), run.output[-3000:]
    # Refused by preflight's variable check, each variable named, before any role's own check ran.
    found = re.search(r"^fatal: \[gs-node\]: FAILED! => (\{.*\})$", run.output, re.M)
    assert found, run.output[-3000:]
    result = json.loads(found.group(1))
    assert result["msg"].startswith("bad variables, refused before any change: "), result["msg"]
    assert {p["variable"] for p in result["problems"]} == set(END_TO_END[case]), result["msg"]
    assert all(p["hosts"] == ["gs-node"] for p in result["problems"])
    assert "TASK [gpuenv.cluster." not in run.output, f"{case}: a role's check ran first"
