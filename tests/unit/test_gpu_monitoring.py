"""The gpu_monitoring role's data: the alert rules name series `gpuenv health --prometheus`
writes and fire on their faults (promtool's own rule tests, where promtool is installed), the
Grafana dashboard is an importable dashboard whose panels query those series, and the scrape
configuration lists every node of the inventory."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml
from healthnode import build

from gpuenv.checks.thresholds import load_thresholds
from gpuenv.health.nvml import FakeNvml
from gpuenv.health.scan import scan
from gpuenv.report.health import parse_exposition, prometheus

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "gpu_monitoring"
RULES = ROLE / "files" / "gpuenv.rules.yml"
DASHBOARD = ROLE / "files" / "grafana-gpuenv.json"
RULE_TESTS = ROOT / "tests" / "fixtures" / "monitoring" / "rules_test.yml"
# What the issue asks alerts for, by the alert that carries it.
REQUIRED_ALERTS = {
    "GpuUncorrectableEcc": "ecc.volatile_uncorrected",
    "GpuRowRemapFailure": "row_remap.failure",
    "GpuXid79FallenOffTheBus": "xid",
    "GpuNvlinkDown": "nvlink.state",
    "GpuThrottlingSustained": "throttle",
    "NodeMissing": "up",
}


def _written(tmp_path: Path, case: str | None = None) -> dict[tuple[str, str], float]:
    """The series a scan of a recorded 8-GPU node (a fixture's, or the clean one) writes."""
    node = build(tmp_path / (case or "clean"), "hgx8", case)
    report = scan(node.root, node.run(), FakeNvml(node.nvml_data), load_thresholds(None))
    return parse_exposition(prometheus(report))


def _metric_names(expr: str) -> set[str]:
    return {m for m in re.findall(r"\b(gpuenv_[a-z_]+|up)\b", expr)}


def test_the_rules_cover_the_issue_and_name_written_series(tmp_path: Path) -> None:
    written = {**_written(tmp_path), **_written(tmp_path, "xid79-fallen-off-bus")}
    names = {name for name, _ in written}
    signals = {re.search(r'signal="([^"]*)"', labels).group(1) for _, labels in written
               if 'signal="' in labels}  # fmt: skip
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    by_name = {r["alert"]: r for r in rules}
    assert set(REQUIRED_ALERTS) <= set(by_name)
    for alert, signal in REQUIRED_ALERTS.items():
        assert signal in by_name[alert]["expr"], alert
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["action"], rule["alert"]
        assert _metric_names(rule["expr"]) - {"up"} <= names, rule["alert"]
        for signal in re.findall(r'signal="([^"]+)"', rule["expr"]):
            assert signal in signals, f"{rule['alert']}: no finding has signal {signal}"


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_checks_the_rules_and_fires_each_alert_on_its_fault() -> None:
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert alerts == rules, "every alert has a promtool test"


def test_the_dashboard_imports_and_queries_written_series(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = {name for name, _ in _written(tmp_path)}
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    assert "id" not in dash or dash["id"] is None  # an import must not carry another site's id
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    queried = set()
    for panel in dash["panels"]:
        assert panel["type"] in ("stat", "table", "timeseries"), panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            found = _metric_names(target["expr"])
            assert found, f"{panel['title']}: no metric"
            assert found - {"up"} <= names, f"{panel['title']}: {found - names}"
            queried |= found
    assert {"gpuenv_health_finding", "gpuenv_health_value", "gpuenv_health_worst_action"} <= queried


def _render(name: str, **variables: object) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"),
                             undefined=jinja2.StrictUndefined)  # fmt: skip
    env.filters["comment"] = lambda text: "#\n# " + text + "\n#"
    env.filters["quote"] = lambda text: text
    env.filters["bool"] = bool
    return env.get_template(name).render(ansible_managed="managed", **variables)


def _role_vars() -> dict:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    internal = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    return {**defaults, "__gpu_monitoring_rules": internal["__gpu_monitoring_rules"]}


@pytest.mark.parametrize("dcgm", [False, True])
def test_the_scrape_configuration_lists_every_node(dcgm: bool) -> None:
    hosts = {"n1": {"ansible_host": "10.0.0.1"}, "n2": {"ansible_host": "10.0.0.2"}, "n3": {}}
    text = _render("prometheus.yml.j2", **{**_role_vars(), "gpu_monitoring_dcgm_exporter": dcgm},
                   groups={"all": list(hosts)}, hostvars=hosts)  # fmt: skip
    config = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == ({"node", "dcgm"} if dcgm else {"node"})
    targets = {c["labels"]["node"]: c["targets"] for c in jobs["node"]["static_configs"]}
    assert targets == {"n1": ["10.0.0.1:9100"], "n2": ["10.0.0.2:9100"], "n3": ["n3:9100"]}
    assert config["rule_files"] == ["/etc/prometheus/gpuenv.rules.yml"]
    assert config["global"]["scrape_interval"] == "15s"


def test_the_timer_runs_the_venv_gpuenv_into_the_textfile_folder() -> None:
    prom_file = "/var/lib/prometheus/node-exporter/gpuenv.prom"
    variables = {**_role_vars(), "gpu_monitoring_gpuenv": "/opt/gpuenv/bin/gpuenv",
                 "__gpu_monitoring_prom_file": prom_file}  # fmt: skip
    service = _render("gpuenv-health.service.j2", **variables)
    assert (
        "ExecStart=/opt/gpuenv/bin/gpuenv health --prometheus"
        " /var/lib/prometheus/node-exporter/gpuenv.prom\n" in service
    )
    assert "SuccessExitStatus=1\n" in service
    timer = _render("gpuenv-health.timer.j2", **variables)
    assert "OnUnitActiveSec=60s\n" in timer


def test_the_dcgm_field_list_adds_the_health_counters_the_default_omits() -> None:
    rows = [line.split(",")[0].strip() for line in
            (ROLE / "files" / "dcgm-exporter-counters.csv").read_text().splitlines()
            if line.strip() and not line.startswith("#")]  # fmt: skip
    assert len(rows) == len(set(rows))
    for field in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                  "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING",
                  "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
                  "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                  "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"):  # fmt: skip
        assert field in rows, field
    for line in (ROLE / "files" / "dcgm-exporter-counters.csv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert len(line.split(",")) >= 3 and line.split(",")[1].strip() in ("gauge", "counter")
