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


@pytest.mark.parametrize(
    ("argv", "statuses", "gpus", "pci", "needle"),
    [
        # GPUs on the bus, no driver: --only leaves out every GPU check, the probe still counts.
        (
            ["--only", "mpi"],
            {"system": Status.FAIL},
            0,
            ("0000:17:00.0", "0000:18:00.0"),
            "system FAIL",
        ),
        (["--only", "ddp"], {"system": Status.FAIL}, 0, ("0000:17:00.0",), "system FAIL"),
        # A healthy GPU node: --only mpi / ddp / system prove nothing about its GPUs.
        (["--only", "mpi"], {}, 2, ("0000:17:00.0", "0000:18:00.0"), "GPUs not verified"),
        (["--only", "ddp"], {}, 2, (), "none of them was selected (--only)"),
        (["--only", "system"], {}, 2, (), "no check that runs on every GPU"),
        # The GPU checks ran and none passed.
        (
            ["--only", "cupy,mpi"],
            {"cupy": Status.SKIP},
            2,
            (),
            "none of them passed",
        ),
        # --expect-gpus 8 on a machine with no GPU at all.
        (["--expect-gpus", "8", "--only", "mpi"], {"system": Status.FAIL}, 0, (), "system FAIL"),
    ],
)
def test_only_never_narrows_what_a_gpu_node_must_prove(
    monkeypatch, capsys, tmp_path, argv, statuses, gpus, pci, needle
):
    asked = []
    fake = _fake_run(statuses, gpus, pci)

    def recording(registry, ctx, names, progress=None):
        asked.extend(names)
        return fake(registry, ctx, names, progress)

    monkeypatch.setattr(gpuenv.checks.session, "run_checks", recording)
    out = tmp_path / "r.json"
    assert main(["check", *argv, "--json", str(out)]) == 1
    assert asked[0] == "system"  # the probe always reports
    data = json.loads(out.read_text())
    assert data["verdict"]["node_kind"] == "gpu"
    assert data["verdict"]["gpu_verified"] is False
    captured = capsys.readouterr()
    assert needle in captured.out + json.dumps(data["verdict"])
    assert "verdict: NOT OK" in captured.out


def test_only_a_gpu_check_on_a_healthy_gpu_node_verifies_its_gpus(monkeypatch, capsys):
    monkeypatch.setattr(gpuenv.checks.session, "run_checks", _fake_run({}, 2))
    assert main(["check", "--only", "cupy"]) == 0
    assert "GPUs verified" in capsys.readouterr().out


def test_a_run_without_the_probe_result_verifies_no_gpu():
    from gpuenv.checks import REGISTRY
    from gpuenv.checks.profiles import assess
    from gpuenv.checks.thresholds import load_thresholds

    results = [Result("mpi", "n1", Status.PASS, "ok"), Result("cupy", "n1", Status.PASS, "ok")]
    verdict = assess(load_thresholds(), "quick", NodeInfo(), results, REGISTRY, expect_gpus=8)
    assert not verdict.ok and not verdict.gpu_verified
    assert any("the probe (system) did not run" in p for p in verdict.problems)


def test_a_report_folder_that_cannot_hold_a_file_is_bad_input(no_run, capsys, tmp_path):
    """Permission bits do not tell as root: /proc and /sys pass them and refuse the file."""
    for option, target in (("--json", "/proc/r.json"), ("--junit", "/sys/r.xml")):
        code, err = _run(["check", option, target], capsys)
        assert code == 2 and "Traceback" not in err
        assert f"{option} {target}: folder" in err
        assert len(err.strip().splitlines()) == 1

    from gpuenv.cli.argtypes import output_target

    output_target("--json", str(tmp_path / "r.json"))  # a writable folder is accepted
    assert list(tmp_path.iterdir()) == []  # and the file made to try it is gone


SMI_L = (
    "GPU 0: NVIDIA H200 (UUID: GPU-1f2e3d4c-0000-1111-2222-333344445555)\n"
    "GPU 1: NVIDIA H200 (UUID: GPU-9a8b7c6d-0000-1111-2222-333344445555)\n"
)


def test_nvidia_smi_list_gives_each_index_its_uuid():
    from gpuenv.cli.argtypes import nvidia_smi_uuids

    assert nvidia_smi_uuids(lambda argv: SMI_L) == {
        "0": "GPU-1f2e3d4c-0000-1111-2222-333344445555",
        "1": "GPU-9a8b7c6d-0000-1111-2222-333344445555",
    }
    assert nvidia_smi_uuids(lambda argv: None) is None  # no nvidia-smi, no driver


@pytest.mark.parametrize(
    ("spec", "bad"),
    [
        ("0,GPU-1f2e3d4c-0000-1111-2222-333344445555", "0 and GPU-1f2e3d4c"),
        ("0,GPU-1f2e3d4c", "0 and GPU-1f2e3d4c name the same GPU"),  # a UUID prefix, as CUDA takes
        ("GPU-9a8b7c6d,1", "GPU-9a8b7c6d and 1 name the same GPU"),
        ("1,GPU-1f2e3d4c", None),
        ("0,1", None),
    ],
)
def test_a_gpu_named_by_index_and_by_uuid_is_bad_input(no_run, monkeypatch, capsys, spec, bad):
    import gpuenv.cli.argtypes as argtypes

    asked = []

    def fake_smi(argv):
        asked.append(argv)
        return SMI_L

    monkeypatch.setattr(argtypes, "_run_text", fake_smi)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    if bad is None:
        argtypes.visible_devices(spec)  # accepted
        return
    code, err = _run(["check", "--json", "-"], capsys)
    assert code == 2 and bad in err and "Traceback" not in err
    assert asked == [["nvidia-smi", "-L"]]


@pytest.mark.parametrize(
    "spec",
    [
        "GPU-1d5e2a7c-40b1-4c3e-9e6f-000000000002,GPU-1d5e2a7c",
        "GPU-1d5e2a7c,GPU-1D5E2A7C-40b1-4c3e-9e6f-000000000002",
    ],
)
def test_one_gpu_by_its_uuid_and_by_a_prefix_is_bad_input(monkeypatch, spec):
    import gpuenv.cli.argtypes as argtypes
    from gpuenv.errors import BadInput

    monkeypatch.setattr(argtypes, "_run_text", lambda argv: None)  # no nvidia-smi to ask
    with pytest.raises(BadInput, match="name the same GPU"):
        argtypes.visible_devices(spec)
    # Two different GPUs by UUID prefixes are fine.
    argtypes.visible_devices("GPU-1d5e2a7c,GPU-2a7c1d5e")


def test_plain_indices_never_ask_nvidia_smi(monkeypatch):
    import gpuenv.cli.argtypes as argtypes

    def boom(argv):
        raise AssertionError("nvidia-smi asked for a list of indices only")

    monkeypatch.setattr(argtypes, "_run_text", boom)
    argtypes.visible_devices("0,1,2")


@pytest.mark.parametrize(
    ("check_args", "message"),
    [
        ("--only nosuch", "--check-args '--only nosuch': --only: unknown check(s) 'nosuch'"),
        ("--only mpi,,bogus", "unknown check(s) 'bogus'"),
        ("--expect-gpus eight", "--expect-gpus: expected a whole number >= 0, got 'eight'"),
        ("--deadline 0", "--deadline: expected seconds"),
        ("--frobnicate", "unrecognized arguments: --frobnicate"),
        ("--list", "--list lists the checks and runs none"),
    ],
)
def test_cluster_check_args_are_checked_before_any_launch(monkeypatch, capsys, check_args, message):
    from gpuenv.cluster import inventory, pipeline

    def boom(*_a, **_k):
        raise AssertionError("nothing may be read or launched on bad input")

    monkeypatch.setattr(inventory, "load", boom)
    monkeypatch.setattr(pipeline, "validate", boom)
    code, err = _run(["cluster", "-i", "hosts.yml", f"--check-args={check_args}"], capsys)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_cluster_check_args_that_gpuenv_check_takes_pass(monkeypatch):
    from gpuenv.cli.check import validate_node_args

    validate_node_args("--check-args", ["--only", "mpi,ddp", "--expect-gpus", "8", "--strict"])


H20_FILE = (
    "gpu_specs:\n  H20:\n    fp16_dense_tflops: 148\n    nvlink_gbps: 450\n"
    "    source: our supplier's sheet\n"
)


def test_check_judges_with_the_rows_a_thresholds_file_fills(monkeypatch, tmp_path):
    from gpuenv.checks.thresholds import model_spec

    seen = {}
    fake = _fake_run({}, 2)

    def recording(registry, ctx, names, progress=None):
        seen["row"] = model_spec(ctx.specs, {"name": "NVIDIA H20"})
        return fake(registry, ctx, names, progress)

    monkeypatch.setattr(gpuenv.checks.session, "run_checks", recording)
    path = tmp_path / "t.yaml"
    path.write_text(H20_FILE)
    assert main(["check", "--thresholds", str(path)]) == 0
    assert seen["row"]["fp16_dense_tflops"] == 148
    assert main(["check", "--thresholds-text", H20_FILE]) == 0
    assert seen["row"]["nvlink_gbps"] == 450


def test_a_bad_thresholds_file_stops_check_and_cluster_before_anything(
    no_run, monkeypatch, capsys, tmp_path
):
    from gpuenv.cluster import inventory, pipeline

    def boom(*_a, **_k):
        raise AssertionError("nothing may be read or launched on bad input")

    monkeypatch.setattr(inventory, "load", boom)
    monkeypatch.setattr(pipeline, "validate", boom)
    path = tmp_path / "t.yaml"
    path.write_text("gpu_specs:\n  h20: {fp16_dense_tflops: 148, source: s}\n")
    for argv in (["check"], ["cluster", "-i", "hosts.yml"]):
        code, err = _run([*argv, "--thresholds", str(path)], capsys)
        assert code == 2 and "GPU key 'h20' is not a row key" in err
        assert len(err.strip().splitlines()) == 1


def test_cluster_hands_its_thresholds_file_to_every_node(monkeypatch, tmp_path, capsys):
    from gpuenv.cli import cluster as cluster_cli
    from gpuenv.cluster import inventory

    got = {}

    def fake_run(opts, hosts, profile, thresholds, out, live):
        got["opts"], got["thresholds"] = opts, thresholds
        raise SystemExit(0)

    monkeypatch.setattr(inventory, "load", lambda *_a, **_k: [])
    monkeypatch.setattr(cluster_cli, "_run", fake_run)
    path = tmp_path / "t.yaml"
    path.write_text(H20_FILE)
    _run(["cluster", "-i", "hosts.yml", "--thresholds", str(path), "--no-progress"], capsys)
    args = got["opts"].check_args
    assert args[args.index("--thresholds-text") + 1] == H20_FILE
    assert got["thresholds"]["gpu_specs"]["H20"]["fp16_dense_tflops"] == 148
    code, err = _run(["cluster", "-i", "h", "--check-args=--thresholds-text x"], capsys)
    assert code == 2 and "set by gpuenv cluster" in err


def test_checks_left_to_the_cluster_are_not_run_nor_required(monkeypatch, capsys, tmp_path):
    ran = []

    def fake(registry, ctx, names, progress=None):
        ran.extend(names)
        return _fake_run({})(registry, ctx, names, progress)

    monkeypatch.setattr(gpuenv.checks.session, "run_checks", fake)
    out = tmp_path / "r.json"
    argv = ["check", "--profile", "cpu", "--left-to-cluster", "ddp,mpi", "--json", str(out)]
    # By hand, no cluster result stands for them in this report: not OK (issue 32, item 10).
    assert main(argv) == 1
    assert "ddp" not in ran and "mpi" not in ran and "system" in ran
    verdict = json.loads(out.read_text())["verdict"]
    assert verdict["ok"] is False and verdict["left_to_cluster"] == ["mpi", "ddp"]
    assert verdict["problems"] == [
        "left to gpuenv cluster's launches: mpi, ddp (--left-to-cluster): this run did not verify"
        " them; only a gpuenv cluster report whose launches ran them makes it OK"
    ]
    assert "mpi, ddp left to gpuenv cluster's launches" in " ".join(capsys.readouterr().out.split())


def test_a_cpu_node_whose_passing_checks_were_left_to_the_cluster_is_not_nothing_verified(
    monkeypatch, capsys, tmp_path
):
    # On a CPU node every check but ddp and mpi SKIPs: left to the cluster, the node run has no
    # PASS of its own, and only the cluster's ddp and mpi (which its verdict requires) verify.
    skips = {n: Status.SKIP for n in ("system", "cupy", "streams", "nccl", "fabric")}
    monkeypatch.setattr(gpuenv.checks.session, "run_checks", _fake_run(skips))
    out = tmp_path / "r.json"
    assert main(["check", "--profile", "cpu", "--json", str(out), "--only", "system"]) == 1
    assert "nothing was verified" in json.dumps(json.loads(out.read_text())["verdict"])
    argv = ["check", "--profile", "cpu", "--left-to-cluster", "ddp,mpi", "--json", str(out)]
    assert main(argv) == 1
    problems = json.loads(out.read_text())["verdict"]["problems"]
    assert not any("nothing was verified" in p for p in problems)
    assert problems[0].startswith("left to gpuenv cluster's launches: mpi, ddp")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nosuch", "--left-to-cluster: unknown check(s) 'nosuch'"),
        ("system", "--left-to-cluster: system is the probe; every node run needs it"),
    ],
)
def test_left_to_cluster_refuses_unknown_checks_and_the_probe(no_run, capsys, value, message):
    code, err = _run(["check", "--left-to-cluster", value], capsys)
    assert code == 2 and message in err


def _cluster_options(monkeypatch, capsys, argv):
    """The pipeline Options `gpuenv cluster ARGV` would run with (nothing is run)."""
    from gpuenv.cli import cluster as cluster_cli
    from gpuenv.cluster import inventory

    got = {}

    def fake_run(opts, hosts, profile, thresholds, out, live):
        got["opts"] = opts
        raise SystemExit(0)

    monkeypatch.setattr(inventory, "load", lambda *_a, **_k: [])
    monkeypatch.setattr(cluster_cli, "_run", fake_run)
    _run(["cluster", "-i", "hosts.yml", "--no-progress", *argv], capsys)
    return got["opts"]


def test_cluster_sets_the_checks_left_to_it_and_refuses_them_in_check_args(monkeypatch, capsys):
    opts = _cluster_options(monkeypatch, capsys, ["--profile", "cpu"])
    assert opts.cluster_requires == {
        "gpu": (), "cpu": ("consistency", "rendezvous", "allreduce", "ddp", "mpi")
    }  # fmt: skip
    code, err = _run(["cluster", "-i", "h", "--check-args=--left-to-cluster=ddp"], capsys)
    assert code == 2 and "set by gpuenv cluster" in err


@pytest.mark.parametrize(
    ("argv", "sizes", "pair"),
    [
        (["--profile", "cpu"], [1 << 20, 8 << 20], 8 << 20),
        (["--profile", "quick"], [1 << 20, 8 << 20, 64 << 20], 64 << 20),
        (["--profile", "cpu", "--sizes", "2M,1M"], [1 << 20, 2 << 20], 8 << 20),
        (["--profile", "cpu", "--pair-size", "64M"], [1 << 20, 8 << 20], 64 << 20),
    ],
)
def test_cluster_sizes_come_from_the_options_then_the_profile(
    monkeypatch, capsys, argv, sizes, pair
):
    opts = _cluster_options(monkeypatch, capsys, argv)
    assert opts.sizes == sizes and opts.pair_bytes == pair
