"""The parsing in benchmarks/demo_first_run.py (no docker, no Ansible run)."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "demo_first_run.py"
_spec = importlib.util.spec_from_file_location("demo_first_run", BENCH)
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
sys.modules["demo_first_run"] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)

OUTPUT = """
PLAY [Preflight checks] ********************************************************

TASK [Measure free disk space where packages land] *****************************
Tuesday 01 December 2026  21:23:01 +0000 (0:00:00.018)       0:00:00.018 ******
ok: [lab-node1]

TASK [Check the variables] *****************************************************
Tuesday 01 December 2026  21:23:02 +0000 (0:00:01.500)       0:00:01.518 ******
ok: [lab-node1]

PLAY [Stage cuda (cuda_toolkit)] ***********************************************

TASK [gpuenv.cluster.apt_pin : Install the packages] ***************************
Tuesday 01 December 2026  21:23:05 +0000 (0:00:02.250)       0:00:03.768 ******
changed: [lab-node1]

RUNNING HANDLER [gpuenv.cluster.gpu_env : Reload systemd] **********************
Tuesday 01 December 2026  21:26:55 +0000 (0:03:50.000)       0:03:53.768 ******
ok: [lab-node1]

PLAY RECAP *********************************************************************
lab-node1                  : ok=4    changed=1    unreachable=0    failed=0    skipped=0

TASKS RECAP ********************************************************************
Tuesday 01 December 2026  21:26:56 +0000 (0:00:01.000)       0:03:54.768 ******
===============================================================================
gpuenv.cluster.apt_pin : Install the packages ------------------------ 230.00s
"""


def test_each_stamp_is_booked_to_the_task_before_it_and_that_tasks_play():
    profile = bench.parse_profile(OUTPUT)
    assert profile.tasks == [
        ("Preflight checks", "Measure free disk space where packages land", 1.5),
        ("Preflight checks", "Check the variables", 2.25),
        ("Stage cuda (cuda_toolkit)", "gpuenv.cluster.apt_pin : Install the packages", 230.0),
        ("Stage cuda (cuda_toolkit)", "gpuenv.cluster.gpu_env : Reload systemd", 1.0),
    ]
    assert profile.plays == {"Preflight checks": 3.75, "Stage cuda (cuda_toolkit)": 231.0}
    assert profile.slowest(1) == [profile.tasks[2]]


def test_hours_count_and_output_without_stamps_gives_nothing():
    line = "TASK [x] ***\nMon (0:00:01.0)  0:00:01 *\nTASK [y] ***\nMon (1:02:03.5)  1:02:04 *"
    assert bench.parse_profile(line).tasks == [("", "x", 3723.5)]
    assert bench.parse_profile("no profile here\n").tasks == []


def test_recap_and_spread():
    assert bench.recap(OUTPUT) == {
        "lab-node1": {"ok": 4, "changed": 1, "unreachable": 0, "failed": 0}
    }
    assert bench.spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}


def test_the_floor_installs_the_same_packages_and_venv():
    script = bench.floor_script(["nvidia-cuda-toolkit", "make"], "cat > /etc/apt/x <<'E'\nE")
    assert script.startswith("cat > /etc/apt/x")
    assert "apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit make" in script
    assert "--find-links http://apt-cache:8080/" in script
    assert script.rstrip().endswith(" ".join(bench.VENV_PACKAGES))
