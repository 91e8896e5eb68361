import json

import pytest

import gpuenv.checks
import gpuenv.checks.session
from gpuenv.checks.base import NodeInfo
from gpuenv.checks.session import NodeRun
from gpuenv.cli import main
from gpuenv.results import Result, Status


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if anything would be run."""

    def boom(*args, **kwargs):
        raise AssertionError("checks ran despite bad input")

    monkeypatch.setattr(gpuenv.checks.session, "run_checks", boom)


def _run(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse reports its own errors this way
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--only", "cupy,gpu-burn"], "unknown check(s) 'gpu-burn'"),
        (["check", "--only", ","], "no check named"),
        (["check", "--deadline", "-5"], "--deadline: expected seconds (a number > 0), got '-5'"),
        (["check", "--deadline", "0"], "--deadline"),
        (["check", "--deadline", "soon"], "--deadline"),
        (
            ["check", "--expect-gpus", "abc"],
            "--expect-gpus: expected a whole number >= 0, got 'abc'",
        ),
        (["check", "--expect-gpus", "-1"], "--expect-gpus"),
        (["check", "--junit", "/no/such/dir/x.xml"], "folder /no/such/dir does not exist"),
        (["check", "--json", "/tmp"], "--json /tmp: is a folder"),
        (["check", "--json", "."], "--json .: is a folder"),
        (["check", "--html", "x"], "unrecognized arguments"),
        (["check", "--junit", "-"], "needs a file"),
        (["check", "--profile", "turbo"], "unknown profile; known: quick, full, cpu"),
    ],
)
def test_bad_input_exits_2_and_runs_nothing(no_run, capsys, argv, message):
    code, err = _run(argv, capsys)
    assert code == 2
    assert message in err


def test_output_targets_are_refused_before_work_and_leave_nothing(no_run, capsys, tmp_path):
    code, err = _run(["check", "--json", str(tmp_path)], capsys)
    assert code == 2 and "is a folder" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_malformed_thresholds_file_exits_2(no_run, capsys, tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("nccl:\n  efficiency: [\n")
    out = tmp_path / "r.json"
    code, err = _run(["check", "--thresholds", str(bad), "--json", str(out)], capsys)
    assert code == 2
    assert str(bad) in err and "not valid YAML" in err
    assert not out.exists()


def test_list_runs_nothing(no_run, capsys):
    assert main(["check", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("system", "cupy", "streams", "nccl", "ddp", "mpi"):
        assert name in out


def _fake_run(statuses, gpus=0, pci=()):
    """A run_checks stand-in: the node has ``gpus`` GPUs; each named check gets its status."""

    def fake(registry, ctx, names, progress=None):
        results = []
        for name in names:
            status = statuses.get(name, Status.PASS)
            r = Result(name, ctx.node, status, reason=f"{name} said so")
            if progress:
                progress.begin(name, "")
                progress.end(name, r.reason, r.status.value)
            results.append(r)
        node = NodeInfo(gpus=[{"index": i} for i in range(gpus)], pci_gpus=list(pci))
        return NodeRun(node, results)

    return fake


@pytest.mark.parametrize(
    ("argv", "statuses", "gpus", "code", "needle"),
    [
        # CPU-only node, CPU profile: the two required checks passed.
        (["--profile", "cpu"], {}, 0, 0, "no GPU verified"),
        # A required check that skipped makes the run not OK.
        (["--profile", "cpu"], {"mpi": Status.SKIP}, 0, 1, "required check mpi did not run"),
        (["--profile", "cpu"], {"ddp": Status.FAIL}, 0, 1, "ddp FAIL"),
        # A GPU profile on a node without GPUs verified nothing it requires.
        (["--profile", "quick"], {}, 0, 1, "profile 'quick' is for GPU nodes"),
        # The CPU profile on a GPU node is refused the same way.
        (["--profile", "cpu"], {}, 2, 1, "profile 'cpu' is for CPU-only nodes"),
        # GPU node, everything passed.
        (["--profile", "quick"], {}, 2, 0, "GPUs verified"),
        (["--profile", "quick"], {"cupy": Status.SKIP}, 2, 1, "required check cupy did not run"),
        # One GPU: nccl cannot apply and is not required.
        (["--profile", "quick"], {"nccl": Status.SKIP}, 1, 0, "GPUs verified"),
        (["--profile", "quick"], {"nccl": Status.SKIP}, 2, 1, "required check nccl"),
    ],
)
def test_verdict_rules(monkeypatch, capsys, tmp_path, argv, statuses, gpus, code, needle):
    monkeypatch.setattr(gpuenv.checks.session, "run_checks", _fake_run(statuses, gpus))
    out = tmp_path / "r.json"
    assert main(["check", *argv, "--node", "n7", "--json", str(out)]) == code
    data = json.loads(out.read_text())
    assert data["exit_code"] == code and data["node"] == "n7"
    assert data["verdict"]["ok"] is (code == 0)
    captured = capsys.readouterr()
    assert needle in captured.out + captured.err + json.dumps(data["verdict"])


def test_nothing_verified_is_never_ok(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(
        gpuenv.checks.session, "run_checks", _fake_run(dict.fromkeys(["system"], Status.SKIP))
    )
    assert main(["check", "--only", "system", "--profile", "cpu"]) == 1
    assert "nothing was verified" in capsys.readouterr().out


def test_skips_are_grouped_by_reason(monkeypatch, capsys):
    statuses = {"cupy": Status.SKIP, "streams": Status.SKIP}
    fake = _fake_run(statuses)

    def same_reason(registry, ctx, names, progress=None):
        run = fake(registry, ctx, names, progress)
        for r in run.results:
            if r.status is Status.SKIP:
                r.reason = "no NVIDIA GPU visible"
        return run

    monkeypatch.setattr(gpuenv.checks.session, "run_checks", same_reason)
    main(["check", "--profile", "cpu"])
    assert "SKIP cupy, streams: no NVIDIA GPU visible" in capsys.readouterr().out


def test_junit_carries_the_verdict(monkeypatch, tmp_path):
    monkeypatch.setattr(gpuenv.checks.session, "run_checks", _fake_run({"mpi": Status.SKIP}))
    out = tmp_path / "r.xml"
    assert main(["check", "--profile", "cpu", "--junit", str(out)]) == 1
    xml = out.read_text()
    assert 'name="verdict"' in xml and "required check mpi did not run" in xml


def test_json_to_stdout_is_one_document(monkeypatch, capsys):
    monkeypatch.setattr(gpuenv.checks.session, "run_checks", _fake_run({}))
    assert main(["check", "--only", "ddp", "--profile", "cpu", "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # nothing but the report on stdout
    assert data["kind"] == "gpuenv-check"
    assert "ddp" in captured.err  # the table went to stderr


def test_duplicate_visible_devices_is_bad_input(no_run, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    code, err = _run(["check"], capsys)
    assert code == 2
    assert "CUDA_VISIBLE_DEVICES=0,0: names 0 more than once" in err


def test_a_registered_fake_check_is_listed_and_selectable(no_run, monkeypatch, capsys):
    """Adding a check is one module and one REGISTRY line: the CLI knows it from there."""
    from types import SimpleNamespace

    from gpuenv.checks.base import Placement, always_needed

    fake = SimpleNamespace(
        NAME="fake",
        DESCRIPTION="a fake check",
        PLACEMENT=Placement.LAUNCHER,
        OPTIONAL=False,
        needed=always_needed,
    )
    monkeypatch.setattr(gpuenv.checks, "REGISTRY", {**gpuenv.checks.REGISTRY, "fake": fake})
    assert main(["check", "--list"]) == 0
    assert "a fake check" in capsys.readouterr().out
    code, err = _run(["check", "--only", "fake,nope"], capsys)
    assert code == 2 and "unknown check(s) 'nope'" in err and "fake" in err


def test_node_side_imports_no_controller_or_gpu_library():
    """`gpuenv check` runs on nodes that have none of the controller extras installed, and every
    command parses its arguments without importing the checks or the cluster runner (their
    defaults come from small modules of constants)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gpuenv.cli import build_parser\n"
        "build_parser()\n"
        "engines = ('gpuenv.checks', 'gpuenv.cluster.pipeline', 'gpuenv.cluster.fanout')\n"
        "print(sorted(set(sys.modules) & set(engines)))\n"
        "import gpuenv.cli.check, gpuenv.checks.session, gpuenv.checks, gpuenv.report.console\n"
        "import gpuenv.report.jsonreport, gpuenv.report.junit\n"
        "heavy = ('docker', 'fabric', 'matplotlib', 'ansible', 'torch', 'cupy', 'mpi4py',"
        " 'pynvml', 'numpy')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]", "[]"]
