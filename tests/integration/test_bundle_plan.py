"""gpuenv bundle asks Ansible: playbooks/bundle_packages.yml runs the stage roles' own checks and
per-OS data against facts pinned to each target, and its answer is the one the unit tests replay
(tests/unit/bundle/answers.json). Runs ansible-playbook on localhost; nothing on this machine
changes. About 10 s a target.

To record again after a role's package table changed:
    python tests/integration/test_bundle_plan.py
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import pytest

from gpuenv.bundle import plan
from gpuenv.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "unit" / "bundle" / "answers.json"


def _answer(key: str) -> dict[str, dict[str, object]]:
    stem, modes, gpu = key.split()
    pins = ROOT / "inventory" / "pins" / f"{stem}.yml"
    stages = plan.ask_ansible(pins, plan.target_facts(stem), tuple(modes.split("+")), gpu == "gpu")
    return {stage: asdict(packages) for stage, packages in stages.items()}


def _answers() -> dict[str, dict[str, dict[str, object]]]:
    keys = sorted(json.loads(RECORDING.read_text()))
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(keys, pool.map(_answer, keys), strict=True))


def test_the_unit_tests_replay_what_the_roles_say_now() -> None:
    now = _answers()
    recorded = json.loads(RECORDING.read_text())
    # JSON has lists where the answer has tuples.
    assert json.loads(json.dumps(now)) == recorded, (
        "record again: python tests/integration/test_bundle_plan.py"
    )
    debian13 = now["debian-13 userspace+full gpu"]
    assert set(debian13) == set(plan.STAGES)
    assert "libnccl2" in debian13["nccl"]["debs"]
    assert f"linux-headers-{plan.NODE_FACT}" in debian13["nvidia_driver"]["debs"]


def test_a_roles_own_check_stops_the_plan_naming_the_variable(tmp_path: Path) -> None:
    pins = tmp_path / "debian-13.yml"
    pins.write_text("nvidia_driver_install_method: tarball\n")
    with pytest.raises(
        BadInput,
        match="nvidia_driver_install_method must be one of: distro, nvidia_repo, got: tarball",
    ):
        plan.plan_bundle(str(pins))


if __name__ == "__main__":
    RECORDING.write_text(json.dumps(_answers(), indent=1, sort_keys=True) + "\n")
