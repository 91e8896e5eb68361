"""Whether MPI carries CUDA device buffers: one rule (gpuenv.floor.ompi.decide: a transfer, not
ompi_info's claim), read alike by the mpi role's module and `gpuenv doctor`; the `mpi` check's
plan for its buffers and what its verdict says (FAIL, or a caveat with --mpi-host-staging).

The transfer itself needs a GPU: its answers here are recorded (what the GPU machine printed, see
docs/benchmarks.md), and the program is run for real on a machine without libcuda.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_floor import device

from gpuenv.checks import REGISTRY
from gpuenv.checks import mpi as mpi_check
from gpuenv.checks.base import Context, NodeInfo
from gpuenv.checks.profiles import assess
from gpuenv.doctor import diagnosis
from gpuenv.doctor.system import fixture
from gpuenv.floor import ompi
from gpuenv.floor.node import command_name
from gpuenv.report.console import verdict_line
from gpuenv.results import Result, Status

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))
mpi_probe = importlib.import_module("ansible_collections.gpuenv.cluster.plugins.modules.mpi_info")

LIB = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
PYTHON = sys.executable


def ompi_info(built: str) -> str:
    return (
        f"ompi:version:full:4.1.4\nmca:mpi:base:param:mpi_built_with_cuda_support:value:{built}\n"
    )


def outputs(
    built: str, transfer: tuple[int, str], python: str = PYTHON
) -> dict[str, tuple[int, str]]:
    """The commands decide() runs, by the floor's command names, with recorded answers."""
    return {
        command_name(["ompi_info", "--parsable", "--all"]): (0, ompi_info(built)),
        command_name(["which", "ompi_info"]): (0, "/usr/bin/ompi_info\n"),
        command_name(["ldd", "/usr/bin/ompi_info"]): (0, f"\tlibmpi.so.40 => {LIB} (0x7f)\n"),
        command_name([python, "-c", ompi.TRANSFER_PROGRAM, LIB]): transfer,
    }


def runner(answers: dict[str, tuple[int, str]]):
    def run(argv: list[str], timeout_s: float = 60) -> tuple[int, str]:
        return answers.get(command_name(argv), (127, ""))

    return run


PASSED = (0, "transfer-start\ntransfer-ok\n")
SEGV = (139, "transfer-start\n")  # what Debian's Open MPI 4.1 did on the H100 (docs/benchmarks.md)


@pytest.mark.parametrize(
    ("rc", "out", "aware", "words"),
    [
        (0, "transfer-start\ntransfer-ok\n", True, "intact"),
        (139, "transfer-start\n", False, "killed the process with SIGSEGV"),
        (-11, "transfer-start\n", False, "killed the process with SIGSEGV"),
        (134, "transfer-start\n", False, "SIGABRT"),
        (124, "transfer-start\n", False, "did not return within its deadline"),
        (0, "transfer-start\ntransfer-wrong rc=0\n", False, "returned wrong values"),
        (1, "", False, "failed (exit 1: no output)"),
        (3, "no-gpu cuInit answered CUresult 100\n", None, "cuInit answered CUresult 100"),
    ],
)
def test_the_transfer_decides_and_names_how_it_failed(rc, out, aware, words):
    got = ompi.judge_transfer(rc, out, LIB)
    assert got["cuda_aware"] is aware
    assert words in got["evidence"]


def test_the_transfer_program_runs_and_says_no_gpu_without_libcuda():
    # The real program, on this machine (no NVIDIA driver): it must not crash or claim anything.
    done = subprocess.run(
        [PYTHON, "-c", ompi.TRANSFER_PROGRAM, LIB], capture_output=True, text=True, timeout=60
    )
    if done.returncode == 0:
        pytest.skip("this machine has libcuda.so.1 and a GPU: the GPU machine covers that case")
    assert done.returncode == ompi.NO_GPU_EXIT, done.stderr
    assert ompi.judge_transfer(done.returncode, done.stdout, LIB)["cuda_aware"] is None


@pytest.mark.parametrize(
    ("built", "transfer", "aware"),
    [
        ("true", PASSED, True),
        ("false", SEGV, False),
        # Built with CUDA support and switched off at run time (conda-forge), or a build whose
        # claim is wrong: the transfer crashes, so the answer is no, whatever ompi_info says.
        ("true", SEGV, False),
        # A build that says no but carries device buffers (a UCX-only path): the transfer decides.
        ("false", PASSED, True),
    ],
)
def test_the_answer_is_the_transfers_not_ompi_infos(built, transfer, aware):
    got = ompi.decide(runner(outputs(built, transfer)), PYTHON, True)
    assert got is not None
    assert got["cuda_aware"] is aware and got["cuda_tested"] is True
    assert f"mpi_built_with_cuda_support: {built}" in got["cuda_evidence"]


def test_without_a_gpu_nothing_is_claimed():
    answers = outputs("true", PASSED)
    got = ompi.decide(runner(answers), PYTHON, False)
    assert got == {
        "version": "4.1.4",
        "cuda_aware": False,
        "cuda_tested": False,
        "cuda_evidence": "no device transfer: no GPU on this node"
        " (ompi_info: mpi_built_with_cuda_support: true)",
    }


def test_no_open_mpi_is_none():
    assert ompi.decide(runner({}), PYTHON, True) is None


def node_tree(root: Path, built: str, transfer: tuple[int, str]) -> Path:
    """A fixture node: one H100 on the bus, the commands' recorded answers under cmd/."""
    device(root, "0000:01:00.0", 0x10DE, 0x2330, 0x030200)
    cmd = root / "cmd"
    cmd.mkdir()
    for name, (rc, out) in outputs(built, transfer, "python3").items():
        (cmd / f"{name}.out").write_text(out)
        (cmd / f"{name}.rc").write_text(f"{rc}\n")
    return root


@pytest.mark.parametrize(
    ("built", "transfer", "aware"),
    [("false", SEGV, False), ("true", PASSED, True), ("true", SEGV, False)],
)
def test_the_module_and_the_doctor_agree(tmp_path, built, transfer, aware):
    root = node_tree(tmp_path / "node", built, transfer)
    fact = tmp_path / "gpuenv_mpi.fact"
    answers = outputs(built, transfer, "python3")
    module = mpi_probe.ompi(runner(answers), str(fact), None, "ompi_info", 1, python="python3")
    (doctor,) = diagnosis.diagnose(fixture(root), only=[13])
    assert module is not None and module["cuda_aware"] is aware
    assert doctor.facts["cuda_aware"] is aware
    assert doctor.facts["cuda_evidence"] == module["cuda_evidence"]
    assert bool(doctor.findings) is not aware
    if not aware:
        assert "will crash" in doctor.findings[0].cause


def test_the_doctor_skips_a_node_without_gpus(tmp_path):
    (tmp_path / "cmd").mkdir()
    (reading,) = diagnosis.diagnose(fixture(tmp_path), only=[13])
    assert reading.skip.startswith("no NVIDIA GPU on the PCI bus")


NOT_AWARE = {
    "cuda_aware": False,
    "evidence": f"MPI_Allreduce of a device buffer in {LIB} killed the process with SIGSEGV",
    "library": LIB,
    "build": "Open MPI v4.1.6, package: Debian OpenMPI",
}


def test_a_cpu_node_uses_numpy_and_a_transfer_that_passed_uses_device_buffers():
    assert mpi_check.buffer_plan("cpu", {}, False)["path"] == "numpy"
    plan = mpi_check.buffer_plan("cuda", {"cuda_aware": True, "evidence": "intact"}, False)
    assert plan["path"] == "cuda-aware" and not plan["errors"] and not plan["caveat"]


def test_an_mpi_without_device_buffers_fails_naming_the_build_and_the_crash():
    plan = mpi_check.buffer_plan("cuda", NOT_AWARE, False)
    assert plan["path"] == "host-staging" and not plan["caveat"]
    (error,) = plan["errors"]
    assert "Open MPI v4.1.6, package: Debian OpenMPI" in error
    assert "SIGSEGV" in error and "comm.Bcast(cupy_array)" in error and "will crash" in error


def test_host_staging_accepted_passes_with_the_crash_as_a_caveat():
    plan = mpi_check.buffer_plan("cuda", NOT_AWARE, True)
    assert plan["path"] == "host-staging" and not plan["errors"]
    assert "will crash" in plan["caveat"]


def test_an_undecided_transfer_on_a_gpu_node_fails():
    plan = mpi_check.buffer_plan("cuda", {"cuda_aware": None, "evidence": "no-gpu cuInit"}, True)
    assert plan["errors"] and "could not decide" in plan["errors"][0]


def payload(plan: dict, device: int) -> dict:
    return {
        "path": plan["path"],
        "why": plan["why"],
        "device": device,
        "errors": plan["errors"],
        "transfer": NOT_AWARE,
        "caveat": plan["caveat"],
        "bytes": 4096,
        "allreduce_s": 0.001,
        "staged_allreduce_s": None,
        "mpi4py": "4.1.2",
        "mpi": NOT_AWARE["build"],
    }


GPU_NODE = NodeInfo(gpus=[{"index": 0, "name": "NVIDIA H100 80GB HBM3"}], pci_gpus=["0000:01:00.0"])


@pytest.mark.parametrize("accepted", [False, True])
def test_the_run_verdict_fails_or_says_the_caveat(accepted):
    from gpuenv.checks.thresholds import load_thresholds

    ctx = Context(node="n1", profile="quick", thresholds=load_thresholds())
    plan = mpi_check.buffer_plan("cuda", NOT_AWARE, accepted)
    result = mpi_check.judge(ctx, GPU_NODE, {0: payload(plan, 0), 1: payload(plan, 0)}, 2)
    system = Result("system", "n1", Status.PASS, "1 GPU")
    cupy = Result("cupy", "n1", Status.PASS, "GEMM and copies verified")
    verdict = assess(ctx.thresholds, "quick", GPU_NODE, [system, cupy, result], REGISTRY)
    if accepted:
        assert result.status is Status.PASS
        assert verdict.caveats and verdict.caveats[0].startswith("mpi: device buffers")
        assert "CAVEAT mpi: device buffers" in verdict_line(verdict).plain
        assert json.loads(json.dumps(verdict.to_dict()))["caveats"] == verdict.caveats
    else:
        assert result.status is Status.FAIL and "will crash" in result.reason
        assert not verdict.ok and not verdict.caveats


def test_the_option_and_the_profile_key_reach_the_ranks():
    from gpuenv.checks.thresholds import load_thresholds

    loaded = load_thresholds()
    plain = Context(node="n1", profile="quick", thresholds=loaded)
    assert "--host-staging-ok" not in mpi_check.command(plain, GPU_NODE, 2)
    flag = Context(node="n1", profile="quick", thresholds=loaded, mpi_host_staging=True)
    assert "--host-staging-ok" in mpi_check.command(flag, GPU_NODE, 2)
    keyed = json.loads(json.dumps(loaded))
    keyed["profiles"]["quick"].setdefault("mpi", {})["host_staging"] = True
    by_profile = Context(node="n1", profile="quick", thresholds=keyed)
    assert "--host-staging-ok" in mpi_check.command(by_profile, GPU_NODE, 2)


RANK_CHILD = r"""
import os, subprocess, sys
from mpi4py import MPI
from gpuenv.checks import mpi as check
from gpuenv.floor import ompi
program = ompi.TRANSFER_PROGRAM.split("mpi = ctypes.CDLL", 1)[1]
# The transfer's MPI half on host buffers: its handles and a singleton of its own.
mpi_lines = program.split("print(\"transfer-start\"")[0]
host = "import ctypes, sys\nN = 4096\nmpi = ctypes.CDLL" + mpi_lines
host += '''
src = (ctypes.c_float * N)(*range(N)); dst = (ctypes.c_float * N)()
rc = mpi.MPI_Allreduce(src, dst, N, handle("ompi_mpi_float"), handle("ompi_mpi_op_sum"),
                       handle("ompi_mpi_comm_self"))
mpi.MPI_Finalize()
print("host-ok" if rc == 0 and list(dst) == [float(i) for i in range(N)] else "bad")
'''
if MPI.COMM_WORLD.Get_rank() == 0:
    env = {k: v for k, v in os.environ.items() if not check.LAUNCH_ENV.match(k)}
    done = subprocess.run([sys.executable, "-c", host, check.loaded_libmpi()], env=env,
                          capture_output=True, text=True, timeout=60)
    print("child", done.returncode, done.stdout.strip())
MPI.COMM_WORLD.Barrier()
"""


def test_a_rank_finds_its_libmpi_and_its_child_is_a_singleton_of_its_own():
    # What the check does in rank 0 (loaded_libmpi, LAUNCH_ENV), with the transfer's own MPI
    # lines on host buffers: the handles resolve in this libmpi and MPI_Init in a child of a
    # launched rank starts a job of its own. Needs mpirun and mpi4py (the CI machine has both).
    mpirun = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed")
    if mpirun is None:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    argv = [mpirun, "--oversubscribe", "-n", "2", PYTHON, "-c", RANK_CHILD]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "child 0 host-ok" in done.stdout, done.stdout + done.stderr[-2000:]
