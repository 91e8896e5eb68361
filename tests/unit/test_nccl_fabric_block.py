"""The nccl role's block of /etc/nccl.conf with the settings the rdma_fabric role hands it
(nccl_fabric_settings): the fabric's keys are written, the nccl role's own variables win."""

from __future__ import annotations

from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "roles/nccl/templates/nccl.conf.j2"
FABRIC = {
    "NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_IB_TC": "106",
    "NCCL_IB_SL": "0",
    "NCCL_SOCKET_IFNAME": "eno1",
}


def block(**variables: object) -> dict[str, str]:
    # Ansible renders templates with trim_blocks on
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    given = {"__nccl_ifname": "eth0", "nccl_ib_hca": "", "nccl_debug": "", "nccl_config_extra": {},
             "nccl_fabric_settings": FABRIC, **variables}  # fmt: skip
    text = env.from_string(TEMPLATE.read_text()).render(**given)
    lines = [ln for ln in text.splitlines() if "=" in ln and not ln.startswith("#")]
    assert len(lines) == len({ln.split("=")[0] for ln in lines}), text  # each key once
    return dict(ln.split("=", 1) for ln in lines)


def test_the_fabric_settings_enter_the_nccl_block():
    found = block()
    assert found["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_3:1"
    assert (found["NCCL_IB_GID_INDEX"], found["NCCL_IB_TC"], found["NCCL_IB_SL"]) == (
        "3",
        "106",
        "0",
    )
    # configure.yml resolved NCCL_SOCKET_IFNAME (the fabric's beats the inventory address's)
    assert found["NCCL_SOCKET_IFNAME"] == "eth0"


def test_the_nccl_role_variables_win_over_the_fabric():
    found = block(nccl_ib_hca="mlx5_0", nccl_config_extra={"NCCL_IB_TC": "41"})
    assert found["NCCL_IB_HCA"] == "mlx5_0" and found["NCCL_IB_TC"] == "41"


def test_without_fabric_settings_the_block_is_as_before():
    assert block(nccl_fabric_settings={}) == {"NCCL_SOCKET_IFNAME": "eth0"}
