import json

import pytest

import gpuenv.runner
from gpuenv.cli import main
from gpuenv.results import Result, Status


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if anything would be run."""

    def boom(*args, **kwargs):
        raise AssertionError("checks ran despite bad input")

    monkeypatch.setattr(gpuenv.runner, "run_checks", boom)


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
        (["check", "--profile", "slow"], "--profile"),
        (["check", "--junit", "/no/such/dir/x.xml"], "folder /no/such/dir does not exist"),
    ],
)
def test_bad_input_exits_2_and_runs_nothing(no_run, capsys, argv, message):
    code, err = _run(argv, capsys)
    assert code == 2
    assert message in err


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


def _fake_results(status):
    def fake(ctx, names, progress=None):
        results = []
        for name in names:
            r = Result(
                name, ctx.node, status, reason="because" if status is not Status.PASS else ""
            )
            if progress:
                progress(name, "running")
                progress(name, r)
            results.append(r)
        return results

    return fake


@pytest.mark.parametrize(
    ("status", "code"), [(Status.PASS, 0), (Status.SKIP, 0), (Status.FAIL, 1), (Status.ERROR, 1)]
)
def test_exit_code_follows_the_results(monkeypatch, capsys, tmp_path, status, code):
    monkeypatch.setattr(gpuenv.runner, "run_checks", _fake_results(status))
    out = tmp_path / "r.json"
    assert main(["check", "--only", "mpi,system", "--node", "n7", "--json", str(out)]) == code
    data = json.loads(out.read_text())
    assert data["exit_code"] == code and data["node"] == "n7"
    assert [r["check"] for r in data["results"]] == ["system", "mpi"]


def test_json_to_stdout_is_one_document(monkeypatch, capsys):
    monkeypatch.setattr(gpuenv.runner, "run_checks", _fake_results(Status.PASS))
    assert main(["check", "--only", "ddp", "--json", "-"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # nothing but the report on stdout
    assert data["kind"] == "gpuenv-check"
    assert "ddp" in captured.err  # the table went to stderr


def test_node_side_imports_no_controller_or_gpu_library():
    """`gpuenv check` runs on nodes that have none of the controller extras installed."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gpuenv.cli import build_parser\n"
        "build_parser()\n"
        "import gpuenv.cli.check, gpuenv.runner, gpuenv.checks, gpuenv.report.console\n"
        "import gpuenv.report.jsonreport, gpuenv.report.junit\n"
        "heavy = ('docker', 'fabric', 'matplotlib', 'ansible', 'torch', 'cupy', 'mpi4py',"
        " 'pynvml', 'numpy')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
