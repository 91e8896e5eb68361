"""One place for download sources: a mirror preset plus overrides, resolved for the roles.

A site sets ``gpuenv_sources_preset`` (``official``, ``tuna``, ``ustc``, ``aliyun``: see
``gpuenv/data/sources.yaml``) and, where it has its own, any of the overrides in
``OVERRIDES``. ``resolve`` turns those inventory variables into a ``Sources`` record (an unknown
preset or a malformed value is ``BadInput`` naming the variable); ``role_vars`` maps it onto the
variables the roles read today (``nvidia_driver_debian_mirror``, ``gpu_env_pip_index_url``, ...),
which is what docs/sources.md tabulates.
"""

from __future__ import annotations

import shlex
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
        return parts.scheme in schemes and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        return False


def _url_list(variables: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = variables.get(name)
    if value in (None, ""):
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise BadInput(f"{name} must be a URL or a list of URLs, got {value!r}")
    for item in items:
        _url({name: item}, name, ("http", "https"))
    return tuple(i.strip() for i in items)


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
        notes=tuple(notes),
    )


def pip_args(sources: Sources) -> str:
    """Command-line arguments that make a bare ``pip install`` use these sources."""
    argv = ["--index-url", sources.pip_index_url]
    for url in sources.pip_extra_index_urls:
        argv += ["--extra-index-url", url]
    proxy = sources.https_proxy or sources.http_proxy
    if proxy:
        argv += ["--proxy", proxy]
    if sources.ca_bundle:
        argv += ["--cert", SYSTEM_CA_BUNDLE]
    return shlex.join(argv)


def role_vars(sources: Sources) -> dict[str, Any]:
    """The roles' own variables that carry these sources (docs/sources.md, "Mapping").

    cuda_toolkit_* and nccl_* mirror and repository variables default to the nvidia_driver_*
    ones, so setting those covers all three roles.
    """
    proxy = sources.https_proxy or sources.http_proxy
    return {
        "nvidia_driver_debian_mirror": sources.apt["debian"].mirror,
        "nvidia_driver_repo_url": sources.cuda_repo_url,
        "nvidia_driver_repo_key_url": sources.cuda_repo_key_url,
        "cuda_toolkit_pip_extra_args": pip_args(sources),
        "nccl_pip_extra_args": pip_args(sources),
        "gpu_env_pip_index_url": sources.pip_index_url,
        "gpu_env_pip_extra_index_urls": list(sources.pip_extra_index_urls),
        "gpu_env_pip_proxy": proxy,
        "gpu_env_pip_cert": SYSTEM_CA_BUNDLE,
    }
