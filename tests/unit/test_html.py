import base64
import re

from gpuenv.report import html, plots
from gpuenv.results import (
    CLUSTER_NODE,
    ClusterReport,
    Measurement,
    Result,
    RunReport,
    RunVerdict,
    Status,
)

MIB = 1 << 20


def sample_run():
    sweep = [{"bytes": s * MIB, "busbw_gbps": bw} for s, bw in ((1, 1.0), (8, 3.0), (64, 3.8))]
    run = ClusterReport(hosts=["n1", "n2", "n3"], duration_s=12.5)
    run.results = [
        Result("reach", "n1", Status.PASS, "answered"),
        Result(
            "nccl",
            "n1",
            Status.PASS,
            "busbw ok",
            [Measurement("busbw_max", 331.2, "GB/s", threshold=270.0, bound="min")],
            details={"sweep": [{"bytes": 64 * MIB, "busbw_gbps": 265.0}]},
        ),
        Result(
            "consistency",
            CLUSTER_NODE,
            Status.FAIL,
            "nodes disagree: pkg.torch: 2.13.0 on n1, n2; 2.12.0 on n3",
            details={
                "disagreements": [
                    {"key": "pkg.torch", "values": {"2.13.0": ["n1", "n2"], "2.12.0": ["n3"]}}
                ],
                "odd_nodes": ["n3"],
            },
        ),
        Result("isolation", CLUSTER_NODE, Status.FAIL, "bad node(s): n3 <script>"),
        Result("cupy", "n2", Status.SKIP, "no NVIDIA GPU visible"),
        Result("cupy", "n3", Status.SKIP, "no NVIDIA GPU visible"),
    ]
    run.verdict = RunVerdict(
        False,
        "quick",
        "gpu",
        ["consistency"],
        ["cluster consistency FAIL: nodes disagree", "cluster isolation FAIL: n3"],
    )
    run.node_reports = {
        n: RunReport(
            n,
            "quick",
            RunVerdict(n != "n3", "quick", "gpu", [], [] if n != "n3" else ["cupy SKIP"]),
            [r for r in run.results if r.node == n],
        )
        for n in run.hosts
    }
    run.thresholds = {"busbw_floor_gbps": 2.5, "pair_floor_gbps": 2.5}
    run.facts = {n: {"pkg.torch": "2.13.0"} for n in ("n1", "n2")} | {"n3": {"pkg.torch": "2.12.0"}}
    run.sweeps = {"n1": sweep, "n2": sweep, "n3": sweep[:2]}
    run.matrix = {("n1", "n2"): 3.8, ("n1", "n3"): 0.4, ("n2", "n3"): None}
    run.isolation = {
        "bad_nodes": ["n3"],
        "bad_links": [],
        "unresolved": [],
        "rounds": [[{"a": "n1", "b": "n2", "busbw_gbps": 3.8}]],
        "threshold_gbps": 1.9,
    }
    return run


def test_report_is_self_contained_with_embedded_plots(tmp_path):
    path = tmp_path / "report.html"
    html.write(sample_run(), path)
    text = path.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 3  # node sweeps, cross-node sweeps, pair matrix
    for img in images:
        assert base64.b64decode(img).startswith(b"\x89PNG\r\n\x1a\n")
    # Nothing fetched from elsewhere: no external src/href, no script.
    assert not re.search(r'(src|href)="(?!data:)', text)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "NOT OK: profile quick, gpu cluster, no GPU verified" in text
    assert "<b>cupy@n2, cupy@n3</b>: no NVIDIA GPU visible" in text  # SKIPs grouped by reason
    assert "<th>node</th><th>reach</th><th>nccl</th>" in text  # nodes x checks
    assert "Bad nodes: <b>n3</b>" in text
    assert "2.12.0" in text and 'class="odd"' in text


def test_the_banner_says_what_the_console_says():
    run = ClusterReport(
        hosts=["a"],
        results=[
            Result("reach", "a", Status.PASS, "answered"),
            Result("cupy", "a", Status.SKIP, "no GPU"),
        ],
    )
    run.verdict = RunVerdict(True, "cpu", "cpu", ["mpi"])
    text = html.render(run)
    assert "OK: profile cpu, cpu cluster, no GPU verified" in text and "data:image/png" not in text
    run.verdict = None
    assert "NOT OK: no verdict" in html.render(run)


def test_a_report_survives_its_json():
    run = sample_run()
    again = ClusterReport.from_dict(run.to_dict())
    assert again.verdict == run.verdict and again.matrix == run.matrix
    # Each node's verdict comes back with its node's results (node_verdicts in the JSON).
    assert {n: r.verdict for n, r in again.node_reports.items()} == {
        n: r.verdict for n, r in run.node_reports.items()
    }
    assert [r.check for r in again.node_reports["n1"].results] == ["reach", "nccl"]
    assert again.to_dict() == run.to_dict()
    assert html.render(again).count("data:image/png") == 3


def test_plots_are_png():
    png = plots.pair_matrix(["a", "b"], {("a", "b"): None})
    assert png.startswith(b"\x89PNG")
    assert plots.busbw_vs_size({"a": [{"bytes": 4, "busbw_gbps": 1.0}]}, "t").startswith(b"\x89PNG")
    judged = plots.busbw_vs_size({"a": [{"bytes": 4, "busbw_gbps": 1.0}]}, "t", threshold=2.0)
    assert judged.startswith(b"\x89PNG") and judged != plots.busbw_vs_size(
        {"a": [{"bytes": 4, "busbw_gbps": 1.0}]}, "t"
    )
