"""The gpu_env role ships gpuenv's wheel again exactly when what goes into it changed
(roles/gpu_env/files/source_digest.py): the node floor, mapped into the package by pyproject.toml,
counts as much as gpuenv/ itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIGEST = ROOT / "roles" / "gpu_env" / "files" / "source_digest.py"


def digest(root: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(DIGEST), str(root)], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)["digest"]


def test_a_change_of_the_node_floor_changes_the_digest(tmp_path):
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "gpuenv").mkdir()
    shutil.copy(ROOT / "gpuenv" / "__init__.py", tmp_path / "gpuenv" / "__init__.py")
    floor = tmp_path / "plugins" / "module_utils"
    floor.mkdir(parents=True)
    (floor / "pci.py").write_text("GPU_CLASSES = (0x0300, 0x0302)\n")
    before = digest(tmp_path)
    assert digest(tmp_path) == before
    (floor / "pci.py").write_text("GPU_CLASSES = (0x0300,)\n")
    assert digest(tmp_path) != before
