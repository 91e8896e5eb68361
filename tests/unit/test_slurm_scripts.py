"""The slurm role's health-check and prolog scripts, rendered as the role renders them (its
defaults and vars, Ansible's filters, trim_blocks), with and without extra arguments: valid sh,
shellcheck clean, one command line each, every argument in place (the lab found an extra argument
glued to the next line once). What the health-check script does is
tests/unit/test_slurm_health_wrapper.py's table."""

import shlex
import shutil
import subprocess

import pytest
from test_slurm_health_wrapper import render

CACHE = "/run/gpuenv/health-verdict.json"
SCRIPTS = ["gpuenv-slurm-health.sh.j2", "gpuenv-slurm-prolog.sh.j2"]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("extra", [[], ["--kernel-log", "/etc/a b/kernel.log"]])
def test_the_scripts_are_valid_sh_with_every_argument(tmp_path, name, extra):
    script = tmp_path / "script.sh"
    script.write_text(render(name, slurm_health_extra_args=extra))
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    text = script.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "timeout -k" in ln)
    words = shlex.split(line)
    cache = words[words.index("--cache") + 1]
    assert cache == CACHE or (cache == "$cache" and f"\ncache={CACHE}\n" in text)
    if extra:
        at = words.index("--kernel-log")
        assert words[at + 1] == "/etc/a b/kernel.log"
        assert words[at + 2].startswith(("--", "2>"))  # nothing glued onto the last argument


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_scripts_are_shellcheck_clean(tmp_path, name):
    if shutil.which("shellcheck") is None:
        pytest.skip("apt-get install -y shellcheck")
    script = tmp_path / "script.sh"
    script.write_text(render(name, slurm_health_extra_args=["--thresholds", "/etc/gpuenv/h.yml"]))
    done = subprocess.run(
        ["shellcheck", "-s", "sh", str(script)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout
