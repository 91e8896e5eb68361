"""A recorded node for `gpuenv health` tests: a base (tests/fixtures/health/_base/NAME: nvml.json,
kernel.log, root/) with a fixture's changes over it (its nvml.json patch, kernel.log, root/,
``remove`` paths), and the fake NVML and recorded kernel-log runner that answer from it."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from test_doctor import overlay  # the doctor's recorded nodes are layered the same way

from gpuenv.health.nvml import FakeNvml, _deep_merge, patch_gpus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"
BASES = FIXTURES / "_base"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def recorded_run(text: str | None) -> Any:
    """A floor ``run`` answering journalctl with ``text``; None: no kernel log can be read."""

    def run(argv: list[str], timeout_s: float = 0.0) -> tuple[int, str]:
        if text is None:
            return (127, "") if argv[0] == "journalctl" else (1, "")
        return (0, text) if argv[0] == "journalctl" else (127, "")

    return run


@dataclass
class Node:
    root: str
    nvml_data: dict[str, Any]
    kernel_log: str | None
    spec: dict[str, Any]
    state: dict[str, Any] | None

    def nvml(self, gpus: dict[str, dict[str, Any]] | None = None) -> FakeNvml:
        return FakeNvml(patch_gpus(self.nvml_data, gpus) if gpus else self.nvml_data)

    def run(self, text: str | None = "") -> Any:
        return recorded_run(self.kernel_log if text == "" else text)


def nvml_patch(data: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    patch = dict(patch)
    gpus = patch.pop("gpus", {})
    return patch_gpus(_deep_merge(data, patch), gpus)


def build(tmp_path: Path, base: str, case: str | None = None) -> Node:
    """The node of fixture ``case`` (or the bare base) as a root under ``tmp_path``."""
    spec: dict[str, Any] = {"base": base}
    folder = FIXTURES / case if case else None
    if folder is not None:
        spec = yaml.safe_load((folder / "expected.yml").read_text(encoding="utf-8"))
        base = spec["base"]
    root = tmp_path / "root"
    shutil.copytree(BASES / base / "root", root, symlinks=True)
    data = json.loads((BASES / base / "nvml.json").read_text(encoding="utf-8"))
    log: str | None = (BASES / base / "kernel.log").read_text(encoding="utf-8")
    state = None
    if folder is not None:
        if (folder / "root").is_dir():
            overlay(folder / "root", root)
        for rel in spec.get("remove", []):
            target = root / rel
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink()
        if (folder / "nvml.json").is_file():
            data = nvml_patch(data, json.loads((folder / "nvml.json").read_text(encoding="utf-8")))
        if (folder / "kernel.log").is_file():
            log += (folder / "kernel.log").read_text(encoding="utf-8")
        if spec.get("kernel_log") == "unreadable":
            log = None
        if (folder / "state.json").is_file():
            state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    return Node(str(root), data, log, spec, state)
