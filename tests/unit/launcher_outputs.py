"""Recorded launcher outputs of failed jobs (tests/fixtures/launchers, whose README says how
each was made) and a node whose login files set a variable, for the tests of issue 32's item 9."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "launchers"
BOILERPLATE = (
    "error_file", "To enable traceback", "ChildFailedError", "Failures:", "Root Cause",
    "Primary job", "mpirun detected", "Process name", "ORTE_ERROR_LOG", "OMP_NUM_THREADS",
    "Sending process", "FAILED",
)  # fmt: skip
GLOO_NOSUCH = "Unable to find address for: nosuch"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def no_boilerplate(lines: list[str]) -> None:
    for line in lines:
        for word in BOILERPLATE:
            assert word not in line, line


def node_tree(tmp_path: Path, name: str, value: str) -> tuple[Path, dict[str, str]]:
    """A node whose site profile script exports ``name=value`` (and a harmless NCCL_DEBUG), and
    the environment a login on it has."""
    root = tmp_path / "node"
    (root / "etc/profile.d").mkdir(parents=True)
    (root / "home/u").mkdir(parents=True)
    (root / "etc/profile.d/zz-site.sh").write_text(
        f"# the site's tuning\nexport {name}={value}\nexport NCCL_DEBUG=WARN\n"
    )
    environ = {name: value, "NCCL_DEBUG": "WARN", "HOME": "/home/u", "PATH": "/usr/bin"}
    return root, environ
