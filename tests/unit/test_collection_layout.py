"""The repository as the collection gpuenv.cluster: one version, one role skeleton, roles that keep
to their own variables, modules instead of pasted probes."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").is_file())
MODULES = sorted((ROOT / "plugins" / "modules").glob("*.py"))


def _package_version() -> str:
    tree = ast.parse((ROOT / "gpuenv" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__version__":
            return ast.literal_eval(node.value)
    raise AssertionError("gpuenv/__init__.py has no __version__")


def test_galaxy_version_is_the_package_version() -> None:
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("gpuenv", "cluster")
    assert galaxy["version"] == _package_version()


def test_pyproject_reads_the_version_and_asks_for_a_setuptools_that_knows_spdx() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "gpuenv.__version__"}
    # license = "Apache-2.0" (an SPDX string) needs setuptools 77 (PEP 639).
    assert isinstance(project["license"], str)
    assert "setuptools>=77" in pyproject["build-system"]["requires"]
    assert "setuptools>=77" in project["optional-dependencies"]["controller"]


def test_the_checkout_is_visible_as_the_collection() -> None:
    link = ROOT / ".ansible" / "collections" / "ansible_collections" / "gpuenv" / "cluster"
    assert link.is_symlink() and link.resolve() == ROOT
    cfg = (ROOT / "ansible.cfg").read_text()
    assert re.search(r"^collections_path = \.ansible/collections:", cfg, re.MULTILINE)


def _yaml_files(role: str) -> Iterator[Path]:
    for folder in ("tasks", "handlers", "vars", "defaults"):
        yield from sorted((ROOT / "roles" / role / folder).glob("*.yml"))


def _defined_names(node: object) -> Iterator[str]:
    """Variable names a task list or vars file defines: vars:, set_fact:, register:, top keys."""
    if isinstance(node, list):
        for item in node:
            yield from _defined_names(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("vars", "ansible.builtin.set_fact", "set_fact") and isinstance(value, dict):
                yield from value
            if key == "register" and isinstance(value, str):
                yield value
            if key in ("block", "rescue", "always"):
                yield from _defined_names(value)


@pytest.mark.parametrize("role", ROLES)
def test_a_role_defines_only_its_own_private_variables(role: str) -> None:
    wrong = []
    for path in _yaml_files(role):
        data = yaml.safe_load(path.read_text())
        names = list(data) if path.parent.name in ("vars", "defaults") else []
        names += list(_defined_names(data))
        wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.startswith("__")]
        wrong = [w for w in wrong if not w.split(": ")[1].startswith(f"__{role}_")]
    assert not wrong, f"{role} sets private variables of another role: {wrong}"


def test_no_probe_is_pasted_into_python_c() -> None:
    pasted = []
    for path in (ROOT / "roles").rglob("*.yml"):
        text = path.read_text()
        if re.search(r"^\s*- -c\s*$", text, re.MULTILINE) or re.search(r"python3? -c", text):
            pasted.append(str(path.relative_to(ROOT)))
    assert not pasted
    assert not list((ROOT / "roles").glob("*/files/*_probe.py"))


@pytest.mark.parametrize("role", ROLES)
def test_every_role_has_the_one_skeleton(role: str) -> None:
    tasks = ROOT / "roles" / role / "tasks"
    main = yaml.safe_load((tasks / "main.yml").read_text())
    # Imported (static, no task of its own at run time) or included (dynamic, behind a condition).
    verbs = ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks")
    included = [next((t[v] for v in verbs if v in t), None) for t in main]
    assert included == ["validate.yml", "install.yml", "configure.yml"], included
    # Per-OS data: first_found ending on a default that exists.
    # validate.yml loads them, or the checks.yml it includes (skipped when preflight loaded them).
    files = [tasks / "validate.yml", tasks / "checks.yml"]
    validate = "".join(path.read_text() for path in files if path.is_file())
    found = re.search(r"first_found.*?files:\n(.*?)\n\s+paths:", validate, re.DOTALL)
    assert found, f"{role}: validate.yml loads no per-OS vars by first_found"
    assert found.group(1).strip().splitlines()[-1].strip() == "- default.yml"
    assert (ROOT / "roles" / role / "vars" / "default.yml").is_file()


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_every_module_is_documented_and_supports_check_mode(module: Path) -> None:
    tree = ast.parse(module.read_text())
    docs = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN")
    }
    documentation = yaml.safe_load(docs["DOCUMENTATION"])
    assert documentation["module"] == module.stem
    assert yaml.safe_load(docs["RETURN"])
    # A reading module declares it through module_utils/node.py's exit_with_reading.
    text = module.read_text()
    helper = (ROOT / "plugins" / "module_utils" / "node.py").read_text()
    assert "supports_check_mode=True" in text or (
        "exit_with_reading(AnsibleModule" in text and "supports_check_mode=True" in helper
    )
