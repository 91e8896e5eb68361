"""The slurm role's health-check and prolog scripts, rendered as Ansible renders templates
(trim_blocks), with and without extra arguments: valid sh, one command line each, every argument
in place (the lab found an extra argument glued to the next line once)."""

import shlex
import subprocess
from pathlib import Path

import jinja2
import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "roles" / "slurm" / "templates"
VARS = {
    "ansible_managed": "managed",
    "slurm_gpuenv": "/opt/gpuenv/bin/gpuenv",
    "slurm_health_timeout_s": 120,
    "slurm_health_fail_on": "reset",
    "slurm_prolog_timeout_s": 60,
    "slurm_prolog_cache_s": 300,
    "__slurm_verdict_cache": "/run/gpuenv/health-verdict.json",
}


def render(name, extra_args):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True)
    env.filters["comment"] = lambda text: f"#\n# {text}\n#"
    env.filters["quote"] = shlex.quote
    return env.get_template(name).render(**VARS, slurm_health_extra_args=extra_args)


@pytest.mark.parametrize("name", ["gpuenv-slurm-health.sh.j2", "gpuenv-slurm-prolog.sh.j2"])
@pytest.mark.parametrize("extra", [[], ["--kernel-log", "/etc/a b/kernel.log"]])
def test_the_scripts_are_valid_sh_with_every_argument(tmp_path, name, extra):
    script = tmp_path / "script.sh"
    script.write_text(render(name, extra))
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    text = script.read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "timeout -k" in ln)
    words = shlex.split(line)
    assert words[words.index("--cache") + 1] == "/run/gpuenv/health-verdict.json"
    if extra:
        assert words[words.index("--kernel-log") + 1] == "/etc/a b/kernel.log"
    if "health.sh" in name:
        assert "\nrc=$?\n" in text
