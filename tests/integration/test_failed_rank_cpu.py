"""A failed rank shows its own cause, end to end (issue 32, item 9): `gpuenv check` runs the real
torchrun (gloo) and mpirun jobs on the CPU in a login whose profile exports a variable that breaks
the library, and the verdict quotes the rank's error and names the variable, its value, the file."""

import json
import os
import shutil
import subprocess
import sys

import pytest

BOILERPLATE = ("error_file", "To enable traceback", "ChildFailedError", "Primary job")


def _check(tmp_path, only, name, value):
    """``gpuenv check --only ONLY`` in a login whose ~/.profile exports ``name=value``."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".profile").write_text(f"export {name}={value}\n")
    out = tmp_path / "report.json"
    env = {**os.environ, "HOME": str(home), name: value}
    done = subprocess.run(
        [sys.executable, "-m", "gpuenv", "check", "--only", only, "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    results = {r["check"]: r for r in json.loads(out.read_text())["results"]}
    return results[only], f"{home}/.profile"


def test_a_stray_gloo_socket_ifname_names_itself_and_gloo_s_error(tmp_path):
    pytest.importorskip("torch")
    ddp, profile = _check(tmp_path, "ddp", "GLOO_SOCKET_IFNAME", "nosuch")
    assert ddp["status"] == "FAIL"
    assert "Unable to find address for: nosuch" in ddp["reason"]
    assert f"GLOO_SOCKET_IFNAME='nosuch' (set in {profile})" in ddp["reason"]
    assert not any(word in ddp["reason"] for word in BOILERPLATE), ddp["reason"]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_a_stray_open_mpi_setting_names_itself(tmp_path):
    pytest.importorskip("mpi4py")
    mpi, profile = _check(tmp_path, "mpi", "OMPI_MCA_pml", "nosuch")
    assert mpi["status"] == "FAIL"
    assert (
        f"login files set what Open MPI reads: OMPI_MCA_pml='nosuch' (set in {profile})"
        in (mpi["reason"])
    )
    assert not any(word in mpi["reason"] for word in BOILERPLATE), mpi["reason"]
