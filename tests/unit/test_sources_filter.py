"""The collection's sources filters (plugins/filter/sources.py): the roles' view of the presets."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleFilterError

from gpuenv.floor import sources

ROOT = Path(__file__).resolve().parents[2]
# The filter imports the floor as the collection gpuenv.cluster.
sys.path.insert(0, str(ROOT / ".ansible" / "collections"))
_SPEC = importlib.util.spec_from_file_location(
    "gpuenv_sources_filter", ROOT / "plugins" / "filter" / "sources.py"
)
assert _SPEC and _SPEC.loader
_module = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_module)
# The filters as Ansible calls them (the floor's errors become AnsibleFilterError).
flt = SimpleNamespace(**_module.FilterModule().filters())

CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\nabc+/=\n-----END CERTIFICATE-----"


def test_the_filter_reads_the_one_table_the_cli_reads():
    assert not (ROOT / "gpuenv" / "data" / "sources.yaml").exists()
    for name, entry in sources.PRESETS.items():
        mine = flt.sources_preset(name)
        resolved = sources.resolve({sources.PRESET_VAR: name})
        assert mine["debian"]["mirror"] == resolved.apt["debian"].mirror
        assert mine["ubuntu"]["security"] == resolved.apt["ubuntu"].security
        assert mine["pypi"]["index_url"] == resolved.pip_index_url
        # A preset without a CUDA mirror keeps NVIDIA's own, as resolve() does.
        assert mine["cuda"]["repo_url"] == resolved.cuda_repo_url
        assert mine["cuda"]["mirrored"] == (entry["cuda"] is not None)


def test_an_unknown_preset_gets_the_clis_message():
    with pytest.raises(sources.SourcesError) as cli:
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


def test_a_deprecated_variable_gives_its_value_and_a_warning_or_fails_when_it_disagrees():
    said = flt.sources_deprecated({"site_cache_apt_proxy_url": "http://cache:3142"})
    assert said["values"] == {"gpuenv_apt_proxy": "http://cache:3142"}
    assert said["warnings"] == [
        "site_cache_apt_proxy_url is deprecated: set gpuenv_apt_proxy instead (docs/sources.md)"
    ]
    same = {"site_cache_wheels_url": "http://c/w/", "gpuenv_pip_find_links": ["http://c/w/"]}
    assert flt.sources_deprecated(same)["values"] == {"gpuenv_pip_find_links": "http://c/w/"}
    with pytest.raises(AnsibleFilterError, match="remove site_cache_apt_proxy_url"):
        flt.sources_deprecated(
            {"site_cache_apt_proxy_url": "http://a:3142", "gpuenv_apt_proxy": "http://b:3142"}
        )
    assert flt.sources_deprecated({"site_cache_bundle_url": ""}) == {"values": {}, "warnings": []}


def test_one_apt_file_the_cache_beats_the_proxy_and_a_bundle_goes_direct():
    both = flt.sources_apt_conf("http://px:3128", "http://px:3128", "http://cache:3142", "cache")
    assert both.splitlines() == [
        'Acquire::http::Proxy "http://cache:3142";',
        'Acquire::https::Proxy "http://px:3128";',
        'Acquire::http::Proxy::cache "DIRECT";',
        'Acquire::https::Proxy::cache "DIRECT";',
        'Acquire::http::Proxy-Auto-Detect "";',
    ]
    bundle = flt.sources_apt_conf("http://px:3128", "http://px:3128", "http://cache:3142", "", True)
    assert 'Acquire::http::Proxy "DIRECT";' in bundle and "cache:3142" not in bundle
    assert 'Dir::Etc::SourceList "/etc/apt/gpuenv-bundle.list";' in bundle
    assert flt.sources_apt_conf() == ""
