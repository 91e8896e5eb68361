"""How the package carries the node floor: by the package-dir mapping in pyproject.toml, never a
symbolic link or a path into another tree (docs/collection.md, "The node floor")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_and_the_floor_is_module_utils():
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "gpuenv").rglob("__init__.py")
    }
    # Folders of data files are listed as packages too, each with its package-data.
    data = {"gpuenv.data", "gpuenv.cloud.templates"}
    assert set(PYPROJECT["packages"]) == folders | {"gpuenv.floor", "gpuenv.examples"} | data
    assert data <= set(PYPROJECT["package-data"])
    assert PYPROJECT["package-dir"] == {
        "gpuenv.floor": "plugins/module_utils",
        "gpuenv.examples": "examples",
    }
    assert (ROOT / "plugins/module_utils/__init__.py").is_file()
    assert (ROOT / "examples/__init__.py").is_file()


def test_no_symbolic_link_outside_the_tests_and_the_collection_view():
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-s"], capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in tracked.splitlines() if line.startswith("120000")]
    # .ansible/collections/.../gpuenv/cluster: the checkout seen as the collection (ansible.cfg).
    allowed = ("tests/", ".ansible/collections/ansible_collections/gpuenv/cluster")
    assert [p for p in links if not p.startswith(allowed)] == []


def test_module_utils_import_each_other_relatively():
    # The same text is gpuenv.cluster's module_utils and the package gpuenv.floor.
    for path in (ROOT / "plugins/module_utils").glob("*.py"):
        assert "ansible_collections" not in path.read_text(), path.name
