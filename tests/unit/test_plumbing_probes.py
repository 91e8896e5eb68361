"""The node probes of roles/ssh_mesh, mpi and gpu_env, and gpu_env's requirement filter.

On a converged node each role skips its work on the strength of one probe; these tests pin down
what the probes report and that the filter proves a requirement met only when it is.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ssh_probe = _load("ssh_mesh_probe", "roles/ssh_mesh/files/ssh_mesh_probe.py")
mpi_probe = _load("mpi_probe", "roles/mpi/files/mpi_probe.py")
env_probe = _load("gpu_env_probe", "roles/gpu_env/files/gpu_env_probe.py")
nccl_probe = _load("nccl_pip_probe", "roles/nccl/files/nccl_pip_probe.py")
cuda_probe = _load("cuda_pip_probe", "roles/cuda_toolkit/files/cuda_pip_probe.py")
env_filters = _load("gpu_env_filters", "roles/gpu_env/filter_plugins/gpu_env.py")
unsatisfied = env_filters.gpu_env_unsatisfied


@pytest.mark.parametrize(
    ("requirement", "installed"),
    [
        ("numpy", {"numpy": "2.3.1"}),
        ("mpi4py==4.1.2", {"mpi4py": "4.1.2"}),
        # A local build label (the CPU wheel) satisfies a pin without one, as pip decides too.
        ("torch==2.13.0", {"torch": "2.13.0+cpu"}),
        ("Foo_Bar.baz>=1,<2", {"foo-bar-baz": "1.5"}),
        ("cupy-cuda12x==14.2.0", {"cupy_cuda12x": "14.2.0"}),
    ],
)
def test_requirement_met_in_the_venv_is_left_out(requirement: str, installed: dict) -> None:
    assert unsatisfied([requirement], installed) == []


@pytest.mark.parametrize(
    ("requirement", "installed"),
    [
        ("numpy", {}),
        ("mpi4py==4.1.2", {"mpi4py": "4.1.1"}),
        ("torch==2.13.0+cu126", {"torch": "2.13.0+cpu"}),
        ("numpy>=3", {"numpy": "2.3.1"}),
        # What the probe cannot judge is left to pip.
        ("numpy[dev]", {"numpy": "2.3.1"}),
        ('numpy; python_version > "3"', {"numpy": "2.3.1"}),
        ("gpuenv @ file:///tmp/gpuenv.whl", {"gpuenv": "0.1.0"}),
        ("not a requirement!", {}),
        ("numpy>=1", {"numpy": "not-a-version"}),
    ],
)
def test_requirement_not_proven_met_goes_to_pip(requirement: str, installed: dict) -> None:
    assert unsatisfied([requirement], installed) == [requirement]


def test_only_the_unmet_requirements_are_returned() -> None:
    got = unsatisfied(["numpy", "mpi4py==4.1.2", "nvidia-ml-py"], {"numpy": "2", "mpi4py": "4.0"})
    assert got == ["mpi4py==4.1.2", "nvidia-ml-py"]


def test_mpi_probe_uses_the_recorded_answer_while_open_mpi_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fact = tmp_path / "gpuenv_mpi.fact"
    fact.write_text(json.dumps({"version": "5.0.7", "cuda_aware": True, "ompi_build": "abc"}))
    calls: list[list[str]] = []
    monkeypatch.setattr(mpi_probe, "build_stamp", lambda: "abc")
    monkeypatch.setattr(mpi_probe, "run", lambda argv: calls.append(argv) or (0, ""))
    assert mpi_probe.ompi(str(fact)) == {"version": "5.0.7", "cuda_aware": True, "build": "abc"}
    assert calls == [], "ompi_info ran although the recorded build is the installed one"


@pytest.mark.parametrize("stamp", ["other", None])
def test_mpi_probe_asks_ompi_info_when_the_build_changed_or_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stamp: str | None
) -> None:
    fact = tmp_path / "gpuenv_mpi.fact"
    fact.write_text(json.dumps({"version": "4.1.4", "cuda_aware": False, "ompi_build": "abc"}))
    out = "ompi:version:full:5.0.7\nmca:mpi:base:param:mpi_built_with_cuda_support:value:true\n"
    monkeypatch.setattr(mpi_probe, "build_stamp", lambda: stamp)
    monkeypatch.setattr(mpi_probe, "run", lambda argv: (0, out))
    got = mpi_probe.ompi(str(fact))
    assert got == {"version": "5.0.7", "cuda_aware": True, "build": stamp or ""}


def test_mpi_probe_reports_no_open_mpi_when_ompi_info_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mpi_probe, "build_stamp", lambda: None)
    monkeypatch.setattr(mpi_probe, "run", lambda argv: (127, ""))
    assert mpi_probe.ompi(str(tmp_path / "missing.fact")) is None


def test_ssh_probe_reads_host_keys_from_the_first_folder_holding_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "ssh", tmp_path / "etc"
    first.mkdir()
    second.mkdir()
    (first / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAC3 root@node1\n")
    (first / "ssh_host_rsa_key.pub").write_text("ssh-rsa AAAAB3 root@node1\n")
    (second / "ssh_host_ecdsa_key.pub").write_text("ecdsa-sha2-nistp256 AAAAE2 root@x\n")
    monkeypatch.setattr(
        ssh_probe, "HOST_KEY_DIRS", (str(tmp_path / "none"), str(first), str(second))
    )
    assert ssh_probe.host_keys() == ["ssh-ed25519 AAAAC3", "ssh-rsa AAAAB3"]


def test_gpu_env_probe_finds_the_cuda_home_holding_nvcc(tmp_path: Path) -> None:
    empty, cuda = tmp_path / "empty", tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(
        "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"
    )
    (cuda / "bin" / "nvcc").chmod(0o755)
    (cuda / "lib64").mkdir()
    empty.mkdir()
    found = env_probe.cuda("", [str(empty), str(cuda)], read_nvcc=True)
    assert found == {"home": str(cuda), "lib64": True, "major": "12"}
    # A given CUDA home is taken as it is; without candidates holding nvcc there is none.
    assert env_probe.cuda(str(empty), [str(cuda)], read_nvcc=False)["home"] == str(empty)
    assert env_probe.cuda("", [str(empty)], read_nvcc=True) == {
        "home": "",
        "lib64": False,
        "major": "",
    }


def test_gpu_env_probe_lists_the_venv_distributions(tmp_path: Path) -> None:
    site = tmp_path / "venv/lib/python3.11/site-packages"
    info = site / "Foo_Bar-1.2.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Foo_Bar\nVersion: 1.2\n")
    (tmp_path / "venv/bin").mkdir()
    (tmp_path / "venv/bin/python").symlink_to("/usr/bin/python3")
    assert env_probe.venv(str(tmp_path / "venv")) == {"python": True, "dists": {"foo-bar": "1.2"}}
    assert env_probe.venv(str(tmp_path / "none")) == {"python": False, "dists": {}}


def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_nccl_pip_probe_finds_the_prefix_wheel(tmp_path: Path, capsys) -> None:
    site = tmp_path / "nccl/venv/lib/python3.11/site-packages"
    _dist(site, "nvidia_nccl_cu11", "2.21.5")
    nccl_probe.main("nvidia-nccl-cu11", str(tmp_path / "nccl"), "no-such-deb-gpuenv")
    found = json.loads(capsys.readouterr().out)
    assert found["prefix"] == {"version": "2.21.5", "dir": f"{site}/nvidia/nccl"}
    assert "system" not in found and found["debs"] == []


def test_cuda_pip_probe_reports_only_the_wanted_wheels(tmp_path: Path, capsys) -> None:
    site = tmp_path / "12.4/lib/python3.13/site-packages"
    _dist(site, "nvidia_cuda_nvcc_cu12", "12.4.131")
    _dist(site, "pip", "25.0")
    cuda_probe.main(str(tmp_path / "12.4"), "nvidia-cuda-nvcc-cu12,nvidia-cuda-runtime-cu12")
    assert json.loads(capsys.readouterr().out) == {
        "wheels": {"nvidia-cuda-nvcc-cu12": "12.4.131"},
        "debs": [],
    }


def test_probe_commands_have_a_deadline() -> None:
    # A hung command (nvidia-smi on a GPU in a bad state) must not hang the probe.
    lib = _load("probe_lib", "roles/gpuenv_common/files/probe_lib.py")
    assert lib.run(["sleep", "5"], timeout=0.2) == (124, "")
    assert lib.run(["no-such-command-gpuenv"]) == (127, "")
    assert lib.run(["echo", "ok"]) == (0, "ok\n")
