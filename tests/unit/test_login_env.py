"""A node's failed checks name the login file that set a job variable (the floor's login_env)."""

from __future__ import annotations

from pathlib import Path

from gpuenv.cluster import pipeline
from gpuenv.floor import login_env
from gpuenv.results import Result, Status


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    (root / "etc/profile.d").mkdir(parents=True)
    (root / "etc/security").mkdir(parents=True)
    (root / "home/gpuenv").mkdir(parents=True)
    (root / "etc/environment").write_text(
        'PATH="/usr/bin"\nCUDA_VISIBLE_DEVICES=\n'
        "# BEGIN gpuenv gpu_env role\nNCCL_DEBUG=WARN\n# END gpuenv gpu_env role\n"
    )
    (root / "etc/security/pam_env.conf").write_text("NCCL_SOCKET_IFNAME DEFAULT=eth9\n")
    (root / "etc/profile").write_text("export PATH=/usr/bin\n")
    (root / "etc/profile.d/zz-broken.sh").write_text(
        "# site\n[ -d /opt/x ] && export LD_LIBRARY_PATH=/opt/x:$LD_LIBRARY_PATH\n"
    )
    (root / "etc/profile.d/gpuenv.sh").write_text(
        "# Ansible managed\nexport LD_LIBRARY_PATH=/opt/venv/lib\n"
    )
    (root / "home/gpuenv/.profile").write_text("# NCCL_DEBUG=INFO (commented)\n")
    return root


def test_the_files_that_set_job_variables_are_named_and_gpuenvs_own_are_not(tmp_path):
    root = _tree(tmp_path)
    environ = {
        "LD_LIBRARY_PATH": "/opt/x:",
        "CUDA_VISIBLE_DEVICES": "",
        "NCCL_DEBUG": "WARN",
        "NCCL_SOCKET_IFNAME": "eth9",
        "PATH": "/usr/bin",
        "HOME": "/home/gpuenv",
    }
    found = login_env.job_variables(str(root), "/home/gpuenv", environ)
    assert found == {
        "LD_LIBRARY_PATH": {"value": "/opt/x:", "set_in": ["/etc/profile.d/zz-broken.sh"]},
        "CUDA_VISIBLE_DEVICES": {"value": "", "set_in": ["/etc/environment"]},
        "NCCL_SOCKET_IFNAME": {"value": "eth9", "set_in": ["/etc/security/pam_env.conf"]},
    }
    # The role's block (NCCL_DEBUG), its managed file, a comment and PATH are not named.
    line = login_env.describe(found)
    assert "CUDA_VISIBLE_DEVICES='' (set in /etc/environment)" in line
    assert "LD_LIBRARY_PATH='/opt/x:' (set in /etc/profile.d/zz-broken.sh)" in line


class _Report:
    def __init__(self, results: list[Result]) -> None:
        self.results = results


def test_a_failed_check_names_the_login_setting_and_a_pass_is_left_alone():
    report = _Report(
        [
            Result("mpi", "n2", Status.FAIL, "mpi4py did not import: libmpi.so.40: too short"),
            Result("python", "n2", Status.PASS, "python 3.11"),
        ]
    )
    probe = {"login_env": {"LD_LIBRARY_PATH": {"value": "/opt/b", "set_in": ["/etc/environment"]}}}
    pipeline._name_login_settings(report, probe)  # type: ignore[arg-type]
    assert report.results[0].reason.endswith(
        "[login environment: LD_LIBRARY_PATH='/opt/b' (set in /etc/environment)]"
    )
    assert report.results[1].reason == "python 3.11"
    pipeline._name_login_settings(report, {})  # type: ignore[arg-type]  # an older probe
    assert report.results[0].reason.count("login environment") == 1
