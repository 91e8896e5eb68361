import re
from pathlib import Path

import pytest
import yaml

from gpuenv.cloud import sources
from gpuenv.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def test_presets_cover_both_distros_pypi_and_cite_their_pages():
    presets = sources.presets()
    assert {"official", "tuna", "ustc", "aliyun"} <= set(presets)
    for p in presets.values():
        assert set(p.apt) == {"debian", "ubuntu"}
        for apt in p.apt.values():
            assert apt.mirror.startswith(("http://", "https://"))
            assert apt.security.startswith(("http://", "https://"))
        assert p.pip_index_url.startswith("https://")
        # Every URL of a preset comes with the page it was taken from.
        assert len(p.citations) == (4 if p.cuda_repo_url else 3)
        assert all(re.match(r"https://", c) for c in p.citations)


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(BadInput) as exc:
        sources.resolve({"gpuenv_sources_preset": "tsinghua"})
    message = str(exc.value)
    assert "gpuenv_sources_preset='tsinghua'" in message
    assert "valid: aliyun, official, tuna, ustc" in message


def test_default_is_official_and_maps_onto_the_role_variables():
    resolved = sources.resolve({})
    assert resolved.preset == "official"
    out = sources.role_vars(resolved)
    assert out["nvidia_driver_debian_mirror"] == "http://deb.debian.org/debian"
    assert (
        out["nvidia_driver_repo_url"] == "https://developer.download.nvidia.com/compute/cuda/repos"
    )
    assert out["nvidia_driver_repo_key_url"] == ""
    assert out["gpu_env_pip_index_url"] == "https://pypi.org/simple"
    assert out["gpu_env_pip_proxy"] == ""
    assert out["nccl_pip_extra_args"] == "--index-url https://pypi.org/simple"


def test_aliyun_preset_carries_nvidias_repository_mirror():
    out = sources.role_vars(sources.resolve({"gpuenv_sources_preset": "aliyun"}))
    assert out["nvidia_driver_repo_url"] == "https://mirrors.aliyun.com/nvidia-cuda"
    assert out["nvidia_driver_debian_mirror"] == "https://mirrors.aliyun.com/debian"
    assert out["gpu_env_pip_index_url"] == "https://mirrors.aliyun.com/pypi/simple/"


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
        }
    )
    out = sources.role_vars(resolved)
    assert out["nvidia_driver_debian_mirror"] == "http://apt.site.example/debian"
    assert resolved.apt["debian"].security == "https://mirrors.ustc.edu.cn/debian-security"
    assert out["nvidia_driver_repo_url"] == "http://repo.site.example/cuda"
    assert out["nvidia_driver_repo_key_url"] == "http://repo.site.example/cuda.pub"
    assert out["gpu_env_pip_extra_index_urls"] == ["https://wheels.site.example/simple"]
    assert out["gpu_env_pip_proxy"] == "http://proxy.site.example:3128"
    assert out["cuda_toolkit_pip_extra_args"] == (
        "--index-url https://pypi.site.example/simple --extra-index-url "
        "https://wheels.site.example/simple --proxy http://proxy.site.example:3128 "
        "--cert /etc/ssl/certs/ca-certificates.crt"
    )
    assert resolved.notes == ()


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("gpuenv_apt_mirror", "deb.debian.org/debian", "is not a URL"),
        ("gpuenv_http_proxy", "proxy:3128", "is not a URL"),
        ("gpuenv_pip_index_url", "ftp://pypi.example/simple", "is not a URL"),
        ("gpuenv_pip_extra_index_url", {"a": 1}, "must be a URL or a list of URLs"),
        ("gpuenv_cuda_repo_url", 5, "must be a string"),
    ],
)
def test_bad_values_name_the_variable(name, value, expected):
    with pytest.raises(BadInput, match=expected) as exc:
        sources.resolve({name: value})
    assert name in str(exc.value)


def _role_defaults():
    names = set()
    for path in ROOT.glob("**/roles/*/defaults/main.yml"):
        if ".venv" not in path.parts:
            names |= set(yaml.safe_load(path.read_text()) or {})
    return names


def test_every_mapped_variable_is_a_real_role_variable():
    defaults = _role_defaults()
    assert defaults, "no role defaults found"
    mapped = set(sources.role_vars(sources.resolve({})))
    assert mapped <= defaults, mapped - defaults
