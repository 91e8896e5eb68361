"""One place for download sources: a mirror preset plus overrides, resolved for the roles.

A site sets ``gpuenv_sources_preset`` (``official``, ``tuna``, ``ustc``, ``aliyun``: see
``gpuenv/data/sources.yaml``) and, where it has its own, any of the overrides in
``OVERRIDES``. ``resolve`` turns those inventory variables into a ``Sources`` record (an unknown
preset or a malformed value is ``BadInput`` naming the variable): ``gpuenv cloud-init`` checks the
group's sources with it and sets up what the bootstrap needs before Ansible runs (apt, pip).

The roles read the same variables themselves: their defaults are expressions over the
``gpuenv_*`` variables, with the preset read from the same table through the collection's filter
``plugins/filter/sources.py`` (docs/sources.md, "How the roles read them"). The two resolvers are
held to the same answers by tests/integration/test_sources_roles.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpuenv.errors import BadInput

PRESET_VAR = "gpuenv_sources_preset"
# The overrides a site may set (inventory variables), each beating the preset's value.
OVERRIDES = (
    "gpuenv_apt_mirror",
    "gpuenv_apt_security_mirror",
    "gpuenv_cuda_repo_url",
    "gpuenv_cuda_repo_key_url",
    "gpuenv_pip_index_url",
    "gpuenv_pip_extra_index_url",
    "gpuenv_http_proxy",
    "gpuenv_https_proxy",
    "gpuenv_no_proxy",
    "gpuenv_ca_bundle",
    "gpuenv_apt_proxy",
    "gpuenv_pip_find_links",
    "gpuenv_apt_base_repoint",
)
DISTRO_FAMILIES = ("debian", "ubuntu")
# Where the system bundle lies once a site CA is installed with update-ca-certificates.
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class AptSource:
    mirror: str  # archive root, e.g. http://deb.debian.org/debian
    security: str  # security archive root


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    apt: Mapping[str, AptSource]  # by distro family: debian, ubuntu
    pip_index_url: str
    cuda_repo_url: str | None  # None: the mirror carries no CUDA repository
    citations: tuple[str, ...]  # the help pages the URLs come from


@dataclass(frozen=True)
class Sources:
    """What the nodes download from, after the preset and the overrides."""

    preset: str
    apt: Mapping[str, AptSource]
    cuda_repo_url: str
    cuda_repo_key_url: str  # empty: <repo>/<dist>/<arch>/3bf863cc.pub (the roles' default)
    pip_index_url: str
    pip_extra_index_urls: tuple[str, ...]
    http_proxy: str
    https_proxy: str
    no_proxy: str
    ca_bundle: str  # controller path of a PEM file with the site's CA certificates; empty: none
    apt_proxy: str  # apt-only HTTP proxy (a site cache such as apt-cacher-ng); empty: none
    pip_find_links: tuple[str, ...]  # wheel folders pip also searches (--find-links)
    apt_base_repoint: bool  # point the node's own base apt sources at a chosen mirror
    notes: tuple[str, ...]  # what the user should know (a preset without a CUDA mirror)


@cache
def presets() -> dict[str, Preset]:
    """The presets shipped in gpuenv/data/sources.yaml, by name."""
    text = resources.files("gpuenv").joinpath("data/sources.yaml").read_text()
    data = yaml.safe_load(text)
    out: dict[str, Preset] = {}
    for name, entry in data["presets"].items():
        cuda = entry.get("cuda")
        citations = [entry[k]["source"] for k in ("debian", "ubuntu", "pypi")]
        if cuda:
            citations.append(cuda["source"])
        out[name] = Preset(
            name=name,
            description=entry["description"],
            apt={
                family: AptSource(entry[family]["mirror"], entry[family]["security"])
                for family in DISTRO_FAMILIES
            },
            pip_index_url=entry["pypi"]["index_url"],
            cuda_repo_url=cuda["repo_url"] if cuda else None,
            citations=tuple(citations),
        )
    return out


def preset(name: str) -> Preset:
    """The named preset; BadInput listing the valid names otherwise."""
    known = presets()
    if name not in known:
        raise BadInput(
            f"{PRESET_VAR}={name!r} is not a known preset; valid: {', '.join(sorted(known))}"
        )
    return known[name]


def _text(variables: Mapping[str, Any], name: str) -> str:
    value = variables.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string, got {type(value).__name__} {value!r}")
    return value.strip()


def _url(variables: Mapping[str, Any], name: str, schemes: tuple[str, ...]) -> str:
    value = _text(variables, name)
    if value and not _is_url(value, schemes):
        raise BadInput(
            f"{name}={value!r} is not a URL; expected {' or '.join(s + '://' for s in schemes)}"
            "host[:port][/path]"
        )
    return value


def _is_url(value: str, schemes: tuple[str, ...]) -> bool:
    try:
        parts = urlsplit(value)
        if parts.scheme == "file" and "file" in schemes:  # a folder on the node: file:///srv/wheels
            return not parts.netloc and parts.path.startswith("/")
        return parts.scheme in schemes and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        return False


# The spellings Ansible's bool filter takes for a YAML string.
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _flag(variables: Mapping[str, Any], name: str, default: bool) -> bool:
    value = variables.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise BadInput(f"{name} must be true or false, got {value!r}")


def _url_list(
    variables: Mapping[str, Any], name: str, schemes: tuple[str, ...] = ("http", "https")
) -> tuple[str, ...]:
    value = variables.get(name)
    if value in (None, ""):
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise BadInput(f"{name} must be a URL or a list of URLs, got {value!r}")
    for item in items:
        if item.strip():
            _url({name: item}, name, schemes)
    return tuple(i.strip() for i in items if i.strip())


def resolve(variables: Mapping[str, Any]) -> Sources:
    """The sources a host (or group) with these inventory variables downloads from."""
    name = _text(variables, PRESET_VAR) or "official"
    chosen = preset(name)
    web = ("http", "https")
    apt_mirror = _url(variables, "gpuenv_apt_mirror", web)
    apt_security = _url(variables, "gpuenv_apt_security_mirror", web)
    apt = {
        family: AptSource(apt_mirror or src.mirror, apt_security or src.security)
        for family, src in chosen.apt.items()
    }
    cuda_override = _url(variables, "gpuenv_cuda_repo_url", web)
    notes: list[str] = []
    if cuda_override:
        cuda_repo = cuda_override
    elif chosen.cuda_repo_url:
        cuda_repo = chosen.cuda_repo_url
    else:
        cuda_repo = preset("official").cuda_repo_url or ""
        notes.append(
            f"preset {name} has no NVIDIA CUDA repository mirror: nodes use {cuda_repo} "
            "(set gpuenv_cuda_repo_url for a site copy)"
        )
    return Sources(
        preset=name,
        apt=apt,
        cuda_repo_url=cuda_repo,
        cuda_repo_key_url=_url(variables, "gpuenv_cuda_repo_key_url", web),
        pip_index_url=_url(variables, "gpuenv_pip_index_url", web) or chosen.pip_index_url,
        pip_extra_index_urls=_url_list(variables, "gpuenv_pip_extra_index_url"),
        http_proxy=_url(variables, "gpuenv_http_proxy", web),
        https_proxy=_url(variables, "gpuenv_https_proxy", web),
        no_proxy=_text(variables, "gpuenv_no_proxy"),
        ca_bundle=_text(variables, "gpuenv_ca_bundle"),
        apt_proxy=_url(variables, "gpuenv_apt_proxy", web),
        pip_find_links=_url_list(variables, "gpuenv_pip_find_links", ("http", "https", "file")),
        apt_base_repoint=_flag(variables, "gpuenv_apt_base_repoint", True),
        notes=tuple(notes),
    )


def plain_http_hosts(sources: Sources) -> tuple[str, ...]:
    """Hosts of the plain-HTTP pip index and wheel folders: pip ignores them unless trusted."""
    urls = (sources.pip_index_url, *sources.pip_extra_index_urls, *sources.pip_find_links)
    hosts: list[str] = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme == "http" and parts.hostname and parts.hostname not in hosts:
            hosts.append(parts.hostname)
    return tuple(hosts)
