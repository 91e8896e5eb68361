"""Every public default of the GPU stack roles is documented three times over: a one-line comment
in defaults/main.yml, an entry in meta/argument_specs.yml (type, description, the same choices the
role accepts), and a row in docs/roles/<role>.md. Internals never leak into defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = [
    "nvidia_driver",
    "cuda_toolkit",
    "nccl",
    "site_cache",
    "rdma_fabric",
    "gpu_monitoring",
    "pinned_packages",
    "rolling_upgrade",
]
# A role whose user page is not docs/roles/<role>.md.
DOCS = {"gpu_monitoring": "docs/monitoring.md", "rolling_upgrade": "docs/upgrade.md"}


def _spec(role: str) -> dict:
    text = (ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text()
    return yaml.safe_load(text)["argument_specs"]["main"]["options"]


def _defaults(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text())


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_match(role: str) -> None:
    spec, defaults = _spec(role), _defaults(role)
    assert set(spec) == set(defaults)
    for name, entry in spec.items():
        assert name.startswith(role + "_"), name
        assert entry.get("type") and entry.get("description"), name
        if "choices" in entry:
            assert defaults[name] in entry["choices"], name


@pytest.mark.parametrize("role", ROLES)
def test_every_default_has_a_comment_line(role: str) -> None:
    lines = (ROOT / "roles" / role / "defaults" / "main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith(("#", "-", " ")):
            assert lines[i - 1].startswith("# "), f"{role}: no comment above {line!r}"


@pytest.mark.parametrize("role", ROLES)
def test_every_variable_is_in_the_docs(role: str) -> None:
    page = DOCS.get(role, f"docs/roles/{role}.md")
    doc = (ROOT / page).read_text()
    missing = [name for name in _spec(role) if f"`{name}`" not in doc]
    assert not missing, f"{page} lacks {missing}"


def test_compatibility_rows_name_their_source() -> None:
    cuda = yaml.safe_load((ROOT / "roles/cuda_toolkit/vars/main.yml").read_text())
    for version, row in cuda["__cuda_toolkit_min_driver"].items():
        assert row["source"] and row["driver"].split(".")[0].isdigit(), version
    nccl = yaml.safe_load((ROOT / "roles/nccl/vars/main.yml").read_text())
    for major, row in nccl["__nccl_pip_builds"].items():
        assert row["source"] and row["package"].endswith(f"cu{major}"), major
