import re
from pathlib import Path

import pytest

from gpuenv.floor import sources
from gpuenv.floor.sources import SourcesError

ROOT = Path(__file__).resolve().parents[2]


def test_presets_cover_both_distros_pypi_and_cite_their_pages():
    assert {"official", "tuna", "ustc", "aliyun"} <= set(sources.PRESETS)
    for name, entry in sources.PRESETS.items():
        p = sources.preset(name)
        for family in ("debian", "ubuntu"):
            assert p[family]["mirror"].startswith(("http://", "https://"))
            assert p[family]["security"].startswith(("http://", "https://"))
        assert p["pypi"]["index_url"].startswith("https://")
        # Every URL of a preset comes with the page it was taken from.
        cites = sources.citations(name)
        assert len(cites) == (4 if entry["cuda"] else 3)
        assert all(re.match(r"https://", c) for c in cites)


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(SourcesError) as exc:
        sources.resolve({"gpuenv_sources_preset": "tsinghua"})
    message = str(exc.value)
    assert "gpuenv_sources_preset='tsinghua'" in message
    assert "valid: aliyun, official, tuna, ustc" in message


def test_default_is_official():
    resolved = sources.resolve({})
    assert resolved.preset == "official"
    assert resolved.apt["debian"].mirror == "http://deb.debian.org/debian"
    assert resolved.cuda_repo_url == "https://developer.download.nvidia.com/compute/cuda/repos"
    assert resolved.cuda_repo_key_url == ""
    assert resolved.pip_index_url == "https://pypi.org/simple"
    assert (resolved.http_proxy, resolved.apt_proxy, resolved.pip_find_links) == ("", "", ())
    assert (resolved.apt_bundle_url, resolved.pip_no_index, resolved.apt_conf()) == ("", False, "")
    assert resolved.notes == ()


def test_aliyun_preset_carries_nvidias_repository_mirror():
    resolved = sources.resolve({"gpuenv_sources_preset": "aliyun"})
    assert resolved.cuda_repo_url == "https://mirrors.aliyun.com/nvidia-cuda"
    assert resolved.apt["debian"].mirror == "https://mirrors.aliyun.com/debian"
    assert resolved.pip_index_url == "https://mirrors.aliyun.com/pypi/simple/"


def test_a_preset_without_a_cuda_mirror_keeps_nvidias_and_says_so():
    resolved = sources.resolve({"gpuenv_sources_preset": "tuna"})
    assert resolved.cuda_repo_url == "https://developer.download.nvidia.com/compute/cuda/repos"
    assert resolved.apt["ubuntu"].mirror == "https://mirrors.tuna.tsinghua.edu.cn/ubuntu"
    assert any("has no NVIDIA CUDA repository mirror" in n for n in resolved.notes)


def test_overrides_beat_the_preset():
    resolved = sources.resolve(
        {
            "gpuenv_sources_preset": "ustc",
            "gpuenv_apt_mirror": "http://apt.site.example/debian",
            "gpuenv_cuda_repo_url": "http://repo.site.example/cuda",
            "gpuenv_cuda_repo_key_url": "http://repo.site.example/cuda.pub",
            "gpuenv_pip_index_url": "https://pypi.site.example/simple",
            "gpuenv_pip_extra_index_url": ["https://wheels.site.example/simple"],
            "gpuenv_https_proxy": "http://proxy.site.example:3128",
            "gpuenv_ca_bundle": "/etc/site-ca.pem",
            "gpuenv_apt_proxy": "http://cache.site.example:3142",
            "gpuenv_pip_find_links": "http://cache.site.example:8080/",
        }
    )
    assert resolved.apt["debian"].mirror == "http://apt.site.example/debian"
    assert resolved.apt["debian"].security == "https://mirrors.ustc.edu.cn/debian-security"
    assert resolved.cuda_repo_url == "http://repo.site.example/cuda"
    assert resolved.cuda_repo_key_url == "http://repo.site.example/cuda.pub"
    assert resolved.pip_index_url == "https://pypi.site.example/simple"
    assert resolved.pip_extra_index_urls == ("https://wheels.site.example/simple",)
    assert resolved.https_proxy == "http://proxy.site.example:3128"
    assert resolved.apt_proxy == "http://cache.site.example:3142"
    assert resolved.pip_find_links == ("http://cache.site.example:8080/",)
    # pip ignores a plain-HTTP wheel folder unless its host is trusted.
    assert sources.plain_http_hosts(resolved.find_links()) == ["cache.site.example"]
    assert resolved.notes == ()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("gpuenv_apt_mirror", "deb.debian.org/debian", "is not a URL"),
        ("gpuenv_http_proxy", "proxy:3128", "is not a URL"),
        ("gpuenv_pip_index_url", "ftp://pypi.example/simple", "is not a URL"),
        ("gpuenv_pip_extra_index_url", {"a": 1}, "must be a URL or a list of URLs"),
        ("gpuenv_cuda_repo_url", 5, "must be a string"),
        ("gpuenv_apt_proxy", "cache:3142", "is not a URL"),
        ("gpuenv_pip_find_links", ["ftp://cache/wheels"], "is not a URL"),
        ("gpuenv_apt_base_repoint", "maybe", "must be true or false"),
        ("gpuenv_apt_base_repoint", 2, "must be true or false"),
    ],
)
def test_bad_values_name_the_variable(name, value, expected):
    with pytest.raises(SourcesError, match=expected) as exc:
        sources.resolve({name: value})
    assert name in str(exc.value)


@pytest.mark.parametrize(("value", "expected"), [(None, True), (False, False), ("no", False),
                                                 (True, True), ("Yes", True)])  # fmt: skip
def test_the_base_sources_are_repointed_unless_told_not_to(value, expected):
    variables = {} if value is None else {"gpuenv_apt_base_repoint": value}
    assert sources.resolve(variables).apt_base_repoint is expected


def test_a_wheel_folder_on_the_node_is_a_file_url():
    resolved = sources.resolve({"gpuenv_pip_find_links": ["file:///srv/wheels", ""]})
    assert resolved.pip_find_links == ("file:///srv/wheels",)
    with pytest.raises(SourcesError, match="gpuenv_pip_find_links"):
        sources.resolve({"gpuenv_pip_find_links": "file://host/srv/wheels"})


# Names shaped like a source variable (module and fact names such as gpuenv_files are not).
_SOURCE_NAME = (
    r"\bgpuenv_(?:sources_preset|apt_[a-z_]+|cuda_[a-z_]+|pip_[a-z_]+"
    r"|https?_proxy|no_proxy|ca_bundle)\b"
)


def _role_texts():
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        yield path.read_text()


def test_roles_read_exactly_the_documented_source_variables():
    # The roles and gpuenv cloud-init agree on one set of names: every gpuenv_* source variable a
    # role reads is one resolve() knows, and each one resolve() knows is read by some role
    # (gpuenv_ca_bundle by roles/sources, the CUDA repository ones by nvidia_driver, ...).
    known = {sources.PRESET_VAR, *sources.OVERRIDES}
    read = set()
    for text in _role_texts():
        read |= set(re.findall(_SOURCE_NAME, text))
    assert read - known == set(), "roles read source variables resolve() does not know"
    assert known - read == set(), "resolve() knows source variables no role reads"


def test_the_documentation_names_every_source_variable():
    doc = (ROOT / "docs" / "sources.md").read_text()
    for name in (sources.PRESET_VAR, *sources.OVERRIDES):
        assert f"`{name}`" in doc, name
