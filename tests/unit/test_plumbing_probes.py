"""The node-reading modules of the collection (plugins/modules/*_info.py, plugins/module_utils/
node.py) and gpu_env's requirement filter.

On a converged node each role skips its work on the strength of one such read; these tests pin
down what the modules report and that the filter proves a requirement met only when it is. The
modules import their helpers as the collection gpuenv.cluster, which the checkout provides through
.ansible/collections (the symlink ansible.cfg's collections_path names).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))

PLUGINS = "ansible_collections.gpuenv.cluster.plugins"
node = importlib.import_module(f"{PLUGINS}.module_utils.node")
ssh_probe = importlib.import_module(f"{PLUGINS}.modules.ssh_mesh_info")
mpi_probe = importlib.import_module(f"{PLUGINS}.modules.mpi_info")
env_probe = importlib.import_module(f"{PLUGINS}.modules.gpu_env_info")
packages_probe = importlib.import_module(f"{PLUGINS}.modules.python_packages_info")
driver_probe = importlib.import_module(f"{PLUGINS}.modules.nvidia_driver_info")
nvcc_probe = importlib.import_module(f"{PLUGINS}.modules.cuda_toolkit_info")
unsatisfied = importlib.import_module(f"{PLUGINS}.filter.gpu_env").gpu_env_unsatisfied


class FakeModule:
    """What command_runner uses of AnsibleModule: the real commands, started as run_command does."""

    def __init__(self) -> None:
        self.argvs: list[list[str]] = []

    def get_bin_path(self, name: str, required: bool = False) -> str:
        return "/usr/bin/" + name

    def run_command(self, argv: list[str], check_rc: bool = False) -> tuple[int, str, str]:
        self.argvs.append(argv)
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr


def no_commands(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
    raise AssertionError(f"ran {argv}")


def nothing_installed(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
    assert argv[0] == "dpkg-query", argv
    return 1, ""


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


RECORDED = {"version": "5.0.7", "cuda_aware": True, "cuda_tested": True, "cuda_evidence": "passed"}


def test_mpi_probe_uses_the_recorded_answer_while_open_mpi_is_unchanged(tmp_path: Path) -> None:
    fact = tmp_path / "gpuenv_mpi.fact"
    fact.write_text(json.dumps({**RECORDED, "ompi_build": "abc"}))
    got = mpi_probe.ompi(no_commands, str(fact), "abc")
    assert got == {**RECORDED, "build": "abc"}


def test_mpi_probe_decides_again_when_the_fact_lacks_part_of_the_answer(tmp_path: Path) -> None:
    # A fact an older role wrote holds ompi_info's claim only: it is not the transfer's answer.
    fact = tmp_path / "gpuenv_mpi.fact"
    fact.write_text(json.dumps({"version": "4.1.4", "cuda_aware": True, "ompi_build": "abc"}))
    out = "ompi:version:full:4.1.4\nmca:mpi:base:param:mpi_built_with_cuda_support:value:true\n"
    got = mpi_probe.ompi(lambda argv, timeout_s=60: (0, out), str(fact), "abc")
    assert got is not None and got["cuda_aware"] is False and got["cuda_tested"] is False


@pytest.mark.parametrize("stamp", ["other", None])
def test_mpi_probe_asks_again_when_the_build_changed_or_is_unknown(
    tmp_path: Path, stamp: str | None
) -> None:
    fact = tmp_path / "gpuenv_mpi.fact"
    fact.write_text(json.dumps({**RECORDED, "ompi_build": "abc"}))
    out = "ompi:version:full:5.0.7\nmca:mpi:base:param:mpi_built_with_cuda_support:value:true\n"
    got = mpi_probe.ompi(lambda argv, timeout_s=60: (0, out), str(fact), stamp)
    # No GPU on the bus: built with CUDA support is a claim, not a tested answer.
    assert got is not None and got["version"] == "5.0.7" and got["build"] == (stamp or "")
    assert got["cuda_aware"] is False and got["cuda_tested"] is False
    assert (
        "no GPU" in got["cuda_evidence"]
        and "mpi_built_with_cuda_support: true" in got["cuda_evidence"]
    )


def test_mpi_probe_reports_no_open_mpi_when_ompi_info_fails(tmp_path: Path) -> None:
    got = mpi_probe.ompi(lambda argv, timeout_s=60: (127, ""), str(tmp_path / "none.fact"), None)
    assert got is None


def test_ssh_probe_reads_host_keys_from_the_first_folder_holding_any(tmp_path: Path) -> None:
    first, second = tmp_path / "ssh", tmp_path / "etc"
    first.mkdir()
    second.mkdir()
    (first / "ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAC3 root@node1\n")
    (first / "ssh_host_rsa_key.pub").write_text("ssh-rsa AAAAB3 root@node1\n")
    (second / "ssh_host_ecdsa_key.pub").write_text("ecdsa-sha2-nistp256 AAAAE2 root@x\n")
    folders = (str(tmp_path / "none"), str(first), str(second))
    assert ssh_probe.host_keys(folders) == ["ssh-ed25519 AAAAC3", "ssh-rsa AAAAB3"]


def test_gpu_env_probe_finds_the_cuda_home_holding_nvcc(tmp_path: Path) -> None:
    empty, cuda = tmp_path / "empty", tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(
        "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"
    )
    (cuda / "bin" / "nvcc").chmod(0o755)
    (cuda / "lib64").mkdir()
    empty.mkdir()
    run = node.command_runner(FakeModule())
    found = env_probe.cuda(run, "", [str(empty), str(cuda)], read_nvcc=True)
    assert found == {"home": str(cuda), "lib64": True, "major": "12"}
    # A given CUDA home is taken as it is; without candidates holding nvcc there is none.
    assert env_probe.cuda(no_commands, str(empty), [str(cuda)], read_nvcc=False)["home"] == str(
        empty
    )
    assert env_probe.cuda(no_commands, "", [str(empty)], read_nvcc=True) == {
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


def test_packages_probe_finds_the_prefix_wheels_by_pip_name(tmp_path: Path) -> None:
    site = tmp_path / "nccl/venv/lib/python3.11/site-packages"
    _dist(site, "nvidia_nccl_cu11", "2.21.5")
    _dist(site, "pip", "25.0")
    params = {
        "names": ["nvidia-nccl-cu11", "nvidia_cuda_runtime_cu11"],
        "prefixes": [str(tmp_path / "nccl/venv"), str(tmp_path / "none")],
        "interpreter": False,
        "packages": ["no-such-deb-gpuenv"],
    }
    assert packages_probe.read(nothing_installed, params) == {
        "prefixes": {
            str(tmp_path / "nccl/venv"): {
                "nvidia-nccl-cu11": {"version": "2.21.5", "site": str(site)}
            },
            str(tmp_path / "none"): {},
        },
        "interpreter": {},
        "debs": [],
    }


def test_packages_probe_looks_in_the_running_python_when_asked() -> None:
    params = {"names": ["PyYAML", "no-such-dist-gpuenv"], "prefixes": [], "interpreter": True}
    found = packages_probe.read(no_commands, {**params, "packages": []})["interpreter"]
    assert list(found) == ["pyyaml"]
    assert Path(found["pyyaml"]["site"], "yaml").is_dir()


def test_dpkg_states_keep_only_installed_packages() -> None:
    out = "openssh-server 1:9.2p1-2 install ok installed\nfoo 1.0 deinstall ok config-files\n"
    seen: list[list[str]] = []

    def run(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        seen.append(argv)
        return 1, out

    assert node.installed(run, ["openssh-server", "foo", "bar"]) == ["openssh-server"]
    assert seen == [
        ["dpkg-query", "-W", "-f=${Package} ${Version} ${Status}\n", "openssh-server", "foo", "bar"]
    ]
    assert node.installed(no_commands, []) == []


def test_node_commands_have_a_deadline() -> None:
    # A hung command (nvidia-smi on a GPU in a bad state) must not hang the module.
    module = FakeModule()
    run = node.command_runner(module)
    assert run(["sleep", "5"], timeout_s=0.2) == (124, "")
    assert run(["no-such-command-gpuenv"]) == (127, "")
    assert run(["echo", "ok"]) == (0, "ok\n")
    assert module.argvs[-1] == ["/usr/bin/timeout", "-k", "5", "60", "echo", "ok"]


def test_driver_probe_prefers_the_loaded_module(tmp_path: Path) -> None:
    version = tmp_path / "version"
    version.write_text("550.163.01\n")
    assert driver_probe.driver(no_commands, 30, str(version)) == {"module": "550.163.01", "smi": ""}


def test_driver_probe_asks_nvidia_smi_without_a_module_under_its_deadline(tmp_path: Path) -> None:
    asked: list[tuple[list[str], float]] = []

    def smi(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        asked.append((argv, timeout_s))
        return 0, "580.159.04\n580.159.04\n"

    missing = str(tmp_path / "none")
    assert driver_probe.driver(smi, 30, missing) == {"module": "", "smi": "580.159.04"}
    assert asked == [(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], 30)]
    # No nvidia-smi (127) or one that hung (124): no driver seen.
    for rc in (127, 124):
        got = driver_probe.driver(lambda argv, timeout_s=60, rc=rc: (rc, ""), 30, missing)
        assert got == {"module": "", "smi": ""}


def test_cuda_probe_reports_each_executable_nvcc_with_its_release(tmp_path: Path) -> None:
    cuda = tmp_path / "cuda-12.4" / "bin"
    cuda.mkdir(parents=True)
    (cuda / "nvcc").write_text(
        "#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"
    )
    (cuda / "nvcc").chmod(0o755)
    (tmp_path / "cuda").symlink_to(tmp_path / "cuda-12.4")
    (tmp_path / "plain").write_text("not executable")
    candidates = [str(tmp_path / "cuda/bin/nvcc"), str(tmp_path / "plain"), str(tmp_path / "none")]
    run = node.command_runner(FakeModule())
    # The link resolves to the real compiler; files that are not executable are not asked.
    assert nvcc_probe.compilers(run, candidates) == [
        {"path": str(cuda / "nvcc"), "release": "12.4"}
    ]


def test_mpi_build_stamp_follows_the_cuda_switch_not_the_roles_own_mca_writes(
    tmp_path, monkeypatch
):
    exe, lib = tmp_path / "ompi_info", tmp_path / "libmpi.so.40"
    exe.write_text("")
    lib.write_text("")
    conf = tmp_path / "openmpi-mca-params.conf"
    conf.write_text("btl_tcp_if_include = eth0\n")
    monkeypatch.setattr(mpi_probe.shutil, "which", lambda name: str(exe))
    monkeypatch.setattr(mpi_probe, "MCA_PARAMS", (str(conf),))

    def ldd(argv, timeout_s=60):
        return 0, f"\tlibmpi.so.40 => {lib} (0x0)\n"

    before = mpi_probe.build_stamp(ldd, "ompi_info", 1)
    # The mpi role rewrites its MCA settings: the stamp (and the recorded answer) stay.
    conf.write_text("btl_tcp_if_include = eth0\nmpi_yield_when_idle = 1\n")
    assert mpi_probe.build_stamp(ldd, "ompi_info", 1) == before
    # A GPU came or went: whether the transfer can run changed, so it is asked again.
    assert mpi_probe.build_stamp(ldd, "ompi_info", 0) != before
    # CUDA support switched off in the file: ompi_info must be asked again.
    conf.write_text("btl_tcp_if_include = eth0\nopal_cuda_support = 0\n")
    assert mpi_probe.build_stamp(ldd, "ompi_info", 1) != before


def test_mpi_build_stamp_follows_the_prefix_builds_own_mca_file(tmp_path):
    prefix = tmp_path / "openmpi"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "etc").mkdir()
    exe, lib = prefix / "bin/ompi_info", prefix / "libmpi.so.40"
    exe.write_text("")
    lib.write_text("")

    def ldd(argv, timeout_s=60):
        return 0, f"\tlibmpi.so.40 => {lib} (0x0)\n"

    before = mpi_probe.build_stamp(ldd, str(exe), 1)
    (prefix / "etc/openmpi-mca-params.conf").write_text("opal_cuda_support = 0\n")
    assert mpi_probe.build_stamp(ldd, str(exe), 1) != before
