"""The collection's sources filters (plugins/filter/sources.py): the roles' view of the presets."""

import importlib.util
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from gpuenv.cloud import sources
from gpuenv.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location(
    "gpuenv_sources_filter", ROOT / "plugins" / "filter" / "sources.py"
)
assert _SPEC and _SPEC.loader
flt = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(flt)

CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\nabc+/=\n-----END CERTIFICATE-----"


def test_the_filter_reads_the_one_table_the_cli_reads():
    assert flt.TABLE == ROOT / "gpuenv" / "data" / "sources.yaml"
    for name, preset in sources.presets().items():
        mine = flt.sources_preset(name)
        assert mine["debian"]["mirror"] == preset.apt["debian"].mirror
        assert mine["ubuntu"]["security"] == preset.apt["ubuntu"].security
        assert mine["pypi"]["index_url"] == preset.pip_index_url
        # A preset without a CUDA mirror keeps NVIDIA's own, as resolve() does.
        assert mine["cuda"]["repo_url"] == sources.resolve({sources.PRESET_VAR: name}).cuda_repo_url
        assert mine["cuda"]["mirrored"] == (preset.cuda_repo_url is not None)


def test_an_unknown_preset_gets_the_clis_message():
    with pytest.raises(BadInput) as cli:
        sources.resolve({sources.PRESET_VAR: "tsinghua"})
    assert flt.sources_preset_error("tsinghua") == str(cli.value)
    assert "valid: aliyun, official, tuna, ustc" in str(cli.value)
    with pytest.raises(AnsibleFilterError, match="valid: aliyun, official, tuna, ustc"):
        flt.sources_preset("tsinghua")
    assert flt.sources_preset_error("ustc") == ""
    assert flt.sources_preset_error(None) != ""


def test_pip_arguments_trust_a_plain_http_wheel_folder_and_carry_the_proxy():
    args = flt.sources_pip_args(
        "tuna", "", "https://extra.example/simple", "http://cache.example:8080/", "http://px:3128"
    )
    assert args == (
        "--index-url https://pypi.tuna.tsinghua.edu.cn/simple "
        "--extra-index-url https://extra.example/simple --find-links http://cache.example:8080/ "
        "--trusted-host cache.example --proxy http://px:3128 "
        "--cert /etc/ssl/certs/ca-certificates.crt"
    )
    assert flt.sources_pip_args("official", "http://devpi.site:3141/root/pypi/+simple/") == (
        "--index-url http://devpi.site:3141/root/pypi/+simple/ --trusted-host devpi.site "
        "--cert /etc/ssl/certs/ca-certificates.crt"
    )


def test_url_lists_take_a_string_or_a_list():
    assert flt.sources_urls("http://a/") == ["http://a/"]
    assert flt.sources_urls(["http://a/", " ", "http://b/"]) == ["http://a/", "http://b/"]
    assert flt.sources_urls(None) == []
    with pytest.raises(AnsibleFilterError, match="a URL or a list of URLs"):
        flt.sources_urls({"a": 1})


def test_a_ca_bundle_becomes_one_file_per_certificate():
    bundle = f"# site CAs\n{CERT}\n\n{CERT.replace('abc', 'xyz')}\ntrailing text\n"
    certs = flt.sources_pem_certificates(bundle)
    assert len(certs) == 2 and all(c.endswith("-----END CERTIFICATE-----\n") for c in certs)
    files = flt.sources_ca_files(certs, "/usr/local/share/ca-certificates/gpuenv-site")
    assert [f["path"] for f in files] == [
        "/usr/local/share/ca-certificates/gpuenv-site/site-000.crt",
        "/usr/local/share/ca-certificates/gpuenv-site/site-001.crt",
    ]
    assert flt.sources_pem_certificates("no certificate here") == []
