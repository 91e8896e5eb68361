import os
import signal
import sys
import time
import uuid

from gpuenv import proc


def test_hanging_process_tree_is_killed_at_the_deadline(tmp_path):
    key, value = "GPUENV_TEST_TAG", str(uuid.uuid4())
    # A child that starts a grandchild in its own process group, then both hang.
    script = (
        "import os, subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
        " preexec_fn=os.setpgrp)\n"
        "time.sleep(600)\n"
    )
    t0 = time.monotonic()
    outcome = proc.run(
        [sys.executable, "-c", script], 1.5, tmp_path / "log", env={**os.environ, key: value}
    )
    elapsed = time.monotonic() - t0
    assert outcome.timed_out
    assert elapsed < 1.5 + 4  # SIGTERM, grace, SIGKILL: well inside deadline + 10 s
    time.sleep(0.2)
    assert proc.processes_with_env(key, value) == []


def test_process_that_is_killed_reports_the_signal(tmp_path):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    outcome = proc.run([sys.executable, "-c", script], 10, tmp_path / "log")
    assert not outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL
    assert proc.describe_exit(outcome.returncode) == "signal SIGKILL"
    assert outcome.elapsed_s < 5


def test_process_that_ignores_sigterm_is_killed(tmp_path):
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    t0 = time.monotonic()
    outcome = proc.run([sys.executable, "-c", script], 1.0, tmp_path / "log")
    assert outcome.timed_out
    assert outcome.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 1.0 + 4


def test_finished_process_passes_and_output_is_logged(tmp_path):
    outcome = proc.run([sys.executable, "-c", "print('hello')"], 10, tmp_path / "log")
    assert (outcome.returncode, outcome.timed_out) == (0, False)
    assert (tmp_path / "log").read_text().strip() == "hello"


def test_lines_arrive_while_it_runs_and_a_hang_with_output_open_is_killed(tmp_path):
    """The debootstrap defect: a command that prints, then hangs with its output open."""
    script = (
        "import time\nprint('I: one', flush=True)\nprint('I: two', flush=True)\ntime.sleep(600)"
    )
    seen = []
    t0 = time.monotonic()
    outcome = proc.run([sys.executable, "-c", script], 1.5, tmp_path / "log", on_line=seen.append)
    assert outcome.timed_out
    assert time.monotonic() - t0 < 1.5 + 4
    assert seen == ["I: one", "I: two"]


def test_line_follower_keeps_a_partial_line_until_it_ends(tmp_path):
    path = tmp_path / "log"
    seen = []
    follower = proc.LineFollower(path, seen.append)
    assert follower.read() is False  # no file yet
    path.write_bytes(b"first\nsec")
    assert follower.read() is True and seen == ["first"]
    with path.open("ab") as fh:
        fh.write(b"ond\n")
    follower.read()
    assert seen == ["first", "second"]


def test_describe_exit():
    assert proc.describe_exit(None) == "no exit status"
    assert proc.describe_exit(3) == "exit code 3"


def test_capture_keeps_the_streams_apart_and_kills_at_the_deadline():
    done = proc.capture(
        [sys.executable, "-c", "import sys; print('o'); print('e', file=sys.stderr)"], 10
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "o\n", "e\n")
    t0 = time.monotonic()
    hung = proc.capture(
        [sys.executable, "-c", "import time; print('x', flush=True); time.sleep(600)"], 1
    )
    assert hung.returncode is None and time.monotonic() - t0 < 5


def test_every_process_of_the_engines_goes_through_proc():
    """gpuenv.proc is the one process engine: no other module of the checks, the cluster runner,
    the lab, the reports or the CLI starts or signals a process by itself (where a child's
    deadline and its process group would be forgotten). The bundle's and the cloud's commands
    have their own test; ranklog's fault points signal their own process on purpose."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "gpuenv"
    allowed = {("checks", "ranklog.py"): {"os.kill"}}
    found = []
    for area in ("checks", "cluster", "lab", "report", "cli"):
        for path in sorted((root / area).glob("*.py")):
            if area == "cli" and path.name in ("bundle.py", "cloud_init.py"):
                continue
            tree = ast.parse(path.read_text())
            used = set()
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                    used |= {n for n in names if n.split(".")[0] == "subprocess"}
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    name = f"{node.value.id}.{node.attr}"
                    if name in ("os.kill", "os.killpg", "os.system", "os.popen", "os.fork"):
                        used.add(name)
            used -= allowed.get((area, path.name), set())
            found += [f"{area}/{path.name}: {n}" for n in sorted(used)]
    assert found == []
