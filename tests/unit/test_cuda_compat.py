"""CUDA toolkit <-> driver compatibility by number, on a table of pairs, each answer justified by
NVIDIA's documentation (the URL in the row's reason)."""

import pytest

from gpuenv.floor.cuda_compat import compatible, cuda_version, installed_compat

GUIDE = "https://docs.nvidia.com/deploy/cuda-compatibility/"
MINOR = "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html"
FORWARD = "https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html"
NOTES = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html (table 2)"

# toolkit, driver's CUDA, driver version, cuda-compat, data center GPU, runs, how, source
PAIRS = [
    # Backward compatibility: a driver runs every toolkit not newer than its CUDA.
    ("12.8", "12.9", None, None, True, True, "backward", GUIDE),
    ("12.9", "12.9", None, None, True, True, "backward", GUIDE),
    ("12.0", "13.0", None, None, True, True, "backward", GUIDE),
    ("11.8", "13.0", None, None, True, True, "backward", GUIDE),
    ("11.8", "12.2", None, None, True, True, "backward", GUIDE),
    ("10.2", "12.4", None, None, True, True, "backward", GUIDE),
    ("12.4", "12.10", None, None, True, True, "backward", GUIDE),  # 12.10 > 12.4 as numbers
    ("12.9", "12.10", None, None, True, True, "backward", GUIDE),  # not as strings
    ("13.0", "13.0", "580.65.06", None, True, True, "backward", GUIDE),
    ("13.0", "13.1", None, None, False, True, "backward", GUIDE),
    ("12.4.131", "12.4", None, None, True, True, "backward", GUIDE),  # patch level ignored
    ("V12.8.93", "12.8", None, None, True, True, "backward", GUIDE),  # nvcc's spelling
    # Minor-version compatibility: same major from CUDA 11 on, driver >= the family's minimum.
    ("12.9", "12.8", None, None, True, True, "minor-version", MINOR),
    ("12.9", "12.8", "570.86.10", None, True, True, "minor-version", MINOR),
    ("12.8", "12.0", "525.60.13", None, True, True, "minor-version", MINOR),
    ("12.6", "12.2", "535.104.05", None, False, True, "minor-version", MINOR),  # any GPU
    ("12.10", "12.9", None, None, True, True, "minor-version", MINOR),  # 12.10 is newer
    ("11.8", "11.0", "450.80.02", None, True, True, "minor-version", MINOR),
    ("11.8", "11.4", "470.57.02", None, True, True, "minor-version", MINOR),
    ("13.1", "13.0", "580.159.04", None, True, True, "minor-version", MINOR),
    ("13.2", "13.0", "580.65.06", None, True, True, "minor-version", MINOR),
    ("11.8", "11.0", "450.36.06", None, True, False, "", NOTES),  # 11.0 GA driver < 450.80.02
    ("12.1", "12.0", "525.60.12", None, True, False, "", NOTES),  # below 525.60.13
    # Before CUDA 11 there is no minor-version compatibility.
    ("10.2", "10.1", None, None, True, False, "", MINOR),
    ("10.1", "10.0", "410.48", None, True, False, "", MINOR),
    # Another major needs a newer driver, or cuda-compat on a data center GPU.
    ("13.0", "12.9", None, None, True, False, "", GUIDE),
    ("13.0", "12.8", "570.86.10", None, True, False, "", GUIDE),
    ("12.0", "11.8", "520.61.05", None, True, False, "", GUIDE),
    ("12.8", "11.4", "470.57.02", None, True, False, "", GUIDE),
    ("11.0", "10.2", "440.33.01", None, True, False, "", GUIDE),
    ("13.0", "12.2", "535.104.05", "13.0", True, True, "forward", FORWARD),
    ("12.8", "11.4", "470.57.02", "12.8", True, True, "forward", FORWARD),
    ("12.9", "12.2", "535.104.05", "12.9", True, True, "forward", FORWARD),  # its libcuda runs it
    ("13.1", "12.2", "535.104.05", "13.0", True, True, "forward", FORWARD),  # + minor-version
    ("13.0", "12.2", "535.104.05", "13.0", False, False, "", FORWARD),  # GeForce: no forward
    ("13.0", "12.2", "535.104.05", "12.9", True, False, "", FORWARD),  # compat too old
    ("13.1", "12.8", None, "12.8", True, False, "", FORWARD),  # compat no newer: no effect
    ("12.9", "12.2", None, "12.4", True, True, "forward", FORWARD),
    ("11.8", "11.2", "460.32.03", "11.8", True, True, "forward", FORWARD),  # compat's libcuda
    ("10.2", "10.0", "410.48", "10.2", True, True, "forward", FORWARD),  # forward since CUDA 10.0
    ("10.2", "10.0", "410.48", "10.2", False, False, "", FORWARD),
    ("12.8", "12.9", None, "13.0", True, True, "backward", GUIDE),  # compat not needed
]


@pytest.mark.parametrize(
    ("toolkit", "driver_cuda", "driver", "compat", "datacenter", "runs", "how", "source"), PAIRS
)
def test_toolkit_on_driver(toolkit, driver_cuda, driver, compat, datacenter, runs, how, source):
    answer = compatible(toolkit, driver_cuda, driver, compat, datacenter)
    assert (answer.ok, answer.how) == (runs, how), (answer.why, source)
    assert answer.why


def test_the_table_has_at_least_forty_pairs_with_a_source_each():
    assert len(PAIRS) >= 40
    assert all(row[-1].startswith("https://docs.nvidia.com/") for row in PAIRS)


def test_the_reasons_name_what_to_do():
    no = compatible("13.0", "12.9")
    assert "needs a CUDA 13.x driver" in no.why and "cuda-compat-13-0" in no.why
    minor = compatible("12.9", "12.8")
    assert "PTX" in minor.why
    low = compatible("12.1", "12.0", "525.60.12")
    assert "needs driver >= 525.60.13" in low.why


@pytest.mark.parametrize("text", ["", "12", "twelve"])
def test_what_is_no_cuda_version_is_refused(text):
    with pytest.raises(ValueError, match="is not a CUDA version"):
        cuda_version(text)


def test_the_newest_cuda_compat_package_under_root_is_found(tmp_path):
    assert installed_compat(str(tmp_path)) is None
    for version in ("12.8", "13.0", "12.10"):
        folder = tmp_path / "usr" / "local" / f"cuda-{version}" / "compat"
        folder.mkdir(parents=True)
        (folder / "libcuda.so.580.65.06").write_text("")
    (tmp_path / "usr" / "local" / "cuda-13.1").mkdir()  # a toolkit, no compat package
    assert installed_compat(str(tmp_path)) == "13.0"
