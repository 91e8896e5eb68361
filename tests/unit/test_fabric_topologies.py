"""Issue 21 item 6, end to end on the topology fixtures (tests/fixtures/fabric/<name>/): each
gives the configuration the rdma_fabric role writes (the reader + the derivation) and the
verdict the checks give (``system``'s NVLink and subset rules, the ``fabric`` check's rails,
GPUDirect RDMA and settings rules, and across nodes the socket fallback, idle rails and GDR),
as ``expected.yml`` states them under ``settings``, ``verdict`` and ``fault``.

In process, on the fixture's root, ``nvml.json`` (NVML's NVLink counts) and ``env.json``: the
system check's NVML payload is built from the reader's GPUs and ``nvml.json`` (the NVML name is
the spec row's, by PCI device id), the settings in force are the role's ``/etc/nccl.conf``
(``fault`` changes them), and an NCCL log of ``tests/fixtures/fabric-logs/`` stands for the run
across nodes; its eight devices ``mlx5_0`` .. ``mlx5_7`` are renamed to the fixture's rails in
order (the logs come from a machine that numbers its HCAs differently).

Each of the issue's five holes is a case here that fails on the code before issue 21
(fa24c76): NVLink down (nvlink-down-gpu3), IB not ACTIVE over TCP (ib-init-no-sm), one rail's
worth (hgx-h100-8ib fault), a subset as "GPUs verified" (subset-visible), nothing configuring
the fabric (the settings of every fixture; roce-v2-gid3 and storage-nic faults;
peermem-missing and acs-bridge's GDR).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpuenv.checks import REGISTRY, fabric, nccl_log, system
from gpuenv.checks.base import Context
from gpuenv.checks.profiles import assess
from gpuenv.checks.thresholds import load_specs, load_thresholds, model_links, model_spec
from gpuenv.floor import fabric as floor_fabric
from gpuenv.results import Result, Status

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fabric"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "fabric-logs"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.yml").is_file())
SPECS = load_specs()
CASES = [
    (name, case)
    for name in NAMES
    for case in ("verdict", "fault")
    if case in yaml.safe_load((FIXTURES / name / "expected.yml").read_text())
]


def expected(name: str) -> dict:
    return yaml.safe_load((FIXTURES / name / "expected.yml").read_text(encoding="utf-8"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def recorded(root: Path):
    """The fixture's answers for the one command the reader starts (systemctl is-active)."""

    def run(argv: list[str], timeout_s: float = 10) -> tuple[int, str]:
        out = root / "cmd" / ("-".join(a.strip("-") for a in argv[:3]) + ".out")
        if not out.exists():
            return 127, ""
        text = out.read_text()
        return (0 if text.strip() == "active" else 3), text

    return run


def read(name: str) -> tuple[floor_fabric.Fabric, dict[str, str]]:
    folder = FIXTURES / name
    nvml, env = _json(folder / "nvml.json"), _json(folder / "env.json")
    links = {k: tuple(v) for k, v in nvml.get("nvlink", {}).items()}
    # The model's link count from gpu_specs.yaml (nvlink_links), not the fixture's own table.
    found = floor_fabric.read(
        str(folder / "root"),
        recorded(folder / "root"),
        links,
        model_links(SPECS),
        env.get("CUDA_VISIBLE_DEVICES"),
    )
    return found, env


def nvml_payload(found: floor_fabric.Fabric) -> dict:
    """The system check's rank payload for the fixture: NVML's view of the reader's GPUs."""
    gpus = []
    for index, g in enumerate(found.gpus):
        row = model_spec(SPECS, {"pci_device_id": g.device_id}) or {}
        names = row.get("names") or [f"NVIDIA GPU {g.device_id}"]
        gpus.append(
            {
                "index": index,
                "name": names[0],
                "pci_bus_id": g.bdf,
                "pci_device_id": g.device_id,
                "uuid": f"GPU-{index}",
                "memory_mib": 81559,
                "ecc": True,
                "persistence": True,
                "pcie_gen": 5,
                "pcie_width": 16,
                "pcie_max_gen": 5,
                "pcie_max_width": 16,
                "nvlink_links": g.nvlink_total or 0,
                "nvlink_active": g.nvlink_active or 0,
                "nvlink_down": [],  # nvml.json holds counts only: which links, not said
            }
        )
    return {
        "probe": {"available": True, "driver": "580.159.04", "cuda_driver": "13.0", "gpus": gpus},
        "pci_gpus": [g.bdf for g in found.gpus],
        "rdma_ports": [f"{p.device}/{p.port}" for p in found.ports],
        "versions": {},
        "nvswitch": {"switches": list(found.nvswitches), "fabric_manager": found.fabric_manager},
    }


def in_force(derived: dict[str, str], change: dict[str, str] | None) -> dict[str, str]:
    """The role's /etc/nccl.conf with ``change`` applied (a key set to "" removed)."""
    settings = {**derived, **(change or {})}
    return {k: v for k, v in settings.items() if v != ""}


def nccl_run(name: str, rails: tuple[str, ...]) -> nccl_log.Transports:
    """NCCL's log of a run across nodes, its mlx5_0 .. mlx5_7 renamed to the node's rails."""
    devices = [r.split(":")[0] for r in rails] or ["mlx5_0"]
    text = re.sub(
        r"\bmlx5_(\d+)\b",
        lambda m: devices[int(m.group(1)) % len(devices)],
        (LOGS / name).read_text(encoding="utf-8"),
    )
    return nccl_log.parse(text.splitlines())


def _ctx() -> Context:
    return Context(node="n1", thresholds=load_thresholds(), specs=SPECS)


def judge_system(found: floor_fabric.Fabric) -> tuple[Result, object]:
    payload = nvml_payload(found)
    node = system.node_info(payload, None)
    return system.judge(_ctx(), node, {0: payload}, 1), node


def judge_fabric(node: fabric.NodeFabric) -> Result:
    ctx = _ctx()
    info = system.node_info(None, "not read")
    info.rdma_ports = [f"{p.device}/{p.port}" for p in node.ports]
    if why := fabric.unavailable(ctx, info):
        return Result(fabric.NAME, "n1", Status.SKIP, reason=why)
    node.why_no_log = "the node check's one-rank NCCL run is not part of the fixture"
    return fabric.judge(ctx, info, {0: node.to_dict()}, 1)


def across(node: fabric.NodeFabric, t: nccl_log.Transports) -> list[str]:
    """The cluster's fabric rules on a run whose nodes all look like this one."""
    nodes = {"n1": node, "n2": node}
    used = {"n1": t, "n2": t}
    return (
        fabric.fallback_problems(nodes, t)
        + fabric.rail_use_problems(nodes, used)
        + fabric.gdr_problems("n1", node, t, has_gpu=True)
    )


def test_every_topology_states_its_verdict_and_the_issue_holes_are_cases():
    assert len(NAMES) >= 12
    for name in NAMES:
        assert "verdict" in expected(name), name
    failing = {(n, c) for n, c in CASES if "FAIL" in expected(n)[c].values()}
    for hole in [
        ("nvlink-down-gpu3", "verdict"),  # one GPU with every NVLink down
        ("ib-init-no-sm", "verdict"),  # IB present but not ACTIVE, over TCP
        ("hgx-h100-8ib", "fault"),  # eight rails at one rail's worth
        ("roce-v2-gid3", "fault"),  # nothing configured: a GID index that is not RoCE v2
        ("storage-nic", "fault"),  # nothing configured: a storage port as a rail
        ("peermem-missing", "verdict"),  # nothing configured: GDR silently off
    ]:
        assert hole in failing, hole


@pytest.mark.parametrize(("name", "case"), CASES)
def test_topology_gives_the_role_config_and_the_checks_verdict(name, case, monkeypatch):
    want = expected(name)
    found, env = read(name)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if "CUDA_VISIBLE_DEVICES" not in env:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    # The configuration the rdma_fabric role writes.
    derived = floor_fabric.derive(found).conf()
    assert derived == want["settings"]

    # system: the NVLink rules (with NVSwitches and Fabric Manager) and the visible subset.
    verdict = want[case]
    result, _ = judge_system(found)
    assert result.status.name == verdict["system"], result.reason
    assert verdict["system_says"] in result.reason, result.reason

    # The fabric check, on the settings in force.
    facts = fabric.read_node(
        str(FIXTURES / name / "root"), in_force(derived, verdict.get("in_force")), found
    )
    checked = judge_fabric(facts)
    assert checked.status.name == verdict["fabric"], checked.reason
    assert verdict["fabric_says"] in checked.reason, checked.reason

    # Across nodes: NCCL's log of the run.
    if verdict.get("nccl_log"):
        problems = across(facts, nccl_run(verdict["nccl_log"], tuple(facts.derived_rails or ())))
        assert ("FAIL" if problems else "PASS") == verdict["across"], problems
        assert verdict["across_says"] in " ".join(problems), problems


def test_a_subset_of_gpus_is_not_gpus_verified_end_to_end(monkeypatch):
    found, env = read("subset-visible")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env["CUDA_VISIBLE_DEVICES"])
    result, node = judge_system(found)
    ok = [
        result,
        Result("cupy", "n1", Status.PASS, "ok"),
        Result("streams", "n1", Status.PASS, "ok"),
    ]
    run = assess(load_thresholds(), "quick", node, ok, REGISTRY)
    assert not run.gpu_verified and not run.ok


def test_without_nccl_ib_hca_the_storage_port_is_not_a_rail():
    """No /etc/nccl.conf, no NCCL_IB_HCA: the rails are the derivation's, the storage port is
    reported, not judged (before: every IB/RoCE port was a rail, the storage port with them)."""
    found, _ = read("storage-nic")
    facts = fabric.read_node(str(FIXTURES / "storage-nic" / "root"), {}, found)
    assert "mlx5_1" not in [p.device for p in facts.rails]
    assert len(facts.rails) == 8
    problems, notes = fabric.rail_problems(facts)
    assert not problems
    assert any("mlx5_1 port 1" in n and "storage or management" in n for n in notes), notes


def test_fabric_manager_down_is_named_when_nvlinks_are_down():
    found, _ = read("nvlink-down-gpu3")
    result, _ = judge_system(found)
    assert "4 NVSwitch(es) on the bus, Fabric Manager active" in result.reason
    payload = nvml_payload(found)
    payload["nvswitch"]["fabric_manager"] = "inactive"
    node = system.node_info(payload, None)
    result = system.judge(_ctx(), node, {0: payload}, 1)
    assert result.status is Status.FAIL
    assert "4 NVSwitch(es) on the bus, Fabric Manager inactive" in result.reason
    assert "systemctl start nvidia-fabricmanager" in result.reason
