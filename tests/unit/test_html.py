import base64
import re

from gpuenv.cluster.pairs import Isolation
from gpuenv.cluster.runner import ClusterRun
from gpuenv.report import html, plots
from gpuenv.results import Measurement, Result, Status

MIB = 1 << 20


def sample_run():
    sweep = [{"bytes": s * MIB, "busbw_gbps": bw} for s, bw in ((1, 1.0), (8, 3.0), (64, 3.8))]
    run = ClusterRun(hosts=["n1", "n2", "n3"], duration_s=12.5)
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
            "cluster",
            Status.FAIL,
            "nodes disagree: pkg.torch: 2.13.0 on n1, n2; 2.12.0 on n3",
            details={
                "disagreements": [
                    {"key": "pkg.torch", "values": {"2.13.0": ["n1", "n2"], "2.12.0": ["n3"]}}
                ],
                "odd_nodes": ["n3"],
            },
        ),
        Result("isolation", "cluster", Status.FAIL, "bad node(s): n3 <script>"),
    ]
    run.facts = {n: {"pkg.torch": "2.13.0"} for n in ("n1", "n2")} | {"n3": {"pkg.torch": "2.12.0"}}
    run.sweeps = {"n1": sweep, "n2": sweep, "n3": sweep[:2]}
    run.matrix = {("n1", "n2"): 3.8, ("n1", "n3"): 0.4, ("n2", "n3"): None}
    run.isolation = Isolation(
        bad_nodes=["n3"], bad_links=[], unresolved=[], rounds=[{("n1", "n2"): 3.8}], threshold=1.9
    )
    return run


def test_report_is_self_contained_with_embedded_plots(tmp_path):
    path = tmp_path / "report.html"
    html.write(sample_run().to_dict(), path)
    text = path.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 3  # node sweeps, cross-node sweeps, pair matrix
    for img in images:
        assert base64.b64decode(img).startswith(b"\x89PNG\r\n\x1a\n")
    # Nothing fetched from elsewhere: no external src/href, no script.
    assert not re.search(r'(src|href)="(?!data:)', text)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert "FAIL: 2 problem(s)" in text
    assert "Bad nodes: <b>n3</b>" in text
    assert "2.12.0" in text and 'class="odd"' in text


def test_passing_run_without_multi_node_data():
    run = ClusterRun(hosts=["a"], results=[Result("reach", "a", Status.PASS, "answered")])
    data = run.to_dict()
    text = html.render(data)
    assert "PASS: the cluster validated" in text and "data:image/png" not in text


def test_plots_are_png():
    png = plots.pair_matrix(["a", "b"], {("a", "b"): None})
    assert png.startswith(b"\x89PNG")
    assert plots.busbw_vs_size({"a": [{"bytes": 4, "busbw_gbps": 1.0}]}, "t").startswith(b"\x89PNG")
