"""The download sources presets (gpuenv/data/sources.yaml) for the roles' defaults.

The table has one home, gpuenv/data/sources.yaml: the Python package reads it for
``gpuenv cloud-init`` and these filters read the same file, from the checkout or from an installed
collection (galaxy.yml's build_ignore keeps that one file of gpuenv/ in the tarball). It is parsed
once per process. A role default reads a preset as
``(gpuenv_sources_preset | default('official') | gpuenv.cluster.sources_preset).debian.mirror``;
an unknown name is an error that lists the valid ones (docs/sources.md).
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from ansible.errors import AnsibleFilterError

PRESET_VAR = "gpuenv_sources_preset"
# plugins/filter/ -> the collection's (or checkout's) root -> gpuenv/data/sources.yaml
TABLE = Path(__file__).parents[2] / "gpuenv" / "data" / "sources.yaml"
# The system CA bundle of Debian and Ubuntu (the site CA joins it through update-ca-certificates).
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_CERT_RE = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


@cache
def _table() -> dict[str, Any]:
    try:
        data: dict[str, Any] = yaml.safe_load(TABLE.read_text())
    except OSError as exc:
        raise AnsibleFilterError(f"the sources presets {TABLE} cannot be read: {exc}") from exc
    return data


@cache
def _presets() -> dict[str, dict[str, Any]]:
    presets: dict[str, dict[str, Any]] = _table()["presets"]
    official_cuda = presets["official"]["cuda"]
    out = {}
    for name, entry in presets.items():
        # A mirror without a copy of NVIDIA's CUDA repository keeps NVIDIA's own.
        cuda = dict(entry.get("cuda") or official_cuda, mirrored=bool(entry.get("cuda")))
        out[name] = {**entry, "name": name, "cuda": cuda}
    return out


def sources_preset_error(name: Any) -> str:
    """Why ``name`` is not a preset ("" when it is one): names the variable and the valid ones."""
    if isinstance(name, str) and name in _presets():
        return ""
    return f"{PRESET_VAR}={name!r} is not a known preset; valid: {', '.join(sorted(_presets()))}"


def sources_preset(name: Any) -> dict[str, Any]:
    """The preset called ``name``: debian/ubuntu {mirror, security}, pypi {index_url},
    cuda {repo_url, mirrored}; an unknown name raises, listing the valid ones."""
    error = sources_preset_error(name)
    if error:
        raise AnsibleFilterError(error)
    return _presets()[name]


def sources_apt_rules(
    preset: Any, family: str, mirror: str = "", security: str = ""
) -> list[dict[str, str]]:
    """The rules that point a node's base apt sources at the chosen archive roots: one
    ``{match, url}`` per row of the table's ``upstream`` for ``family`` (debian, ubuntu), where
    ``url`` is ``mirror`` (``security``) or the preset's. A row whose root is the official one
    is left out, so the official preset with no override gives none (the sources stay as they
    are); so does a family the table does not know."""
    chosen = sources_preset(preset)
    rows = _table().get("upstream", {}).get(family, [])
    if family not in chosen:
        return []
    official = sources_preset("official")[family]
    roots = {
        "mirror": (mirror or chosen[family]["mirror"]).rstrip("/"),
        "security": (security or chosen[family]["security"]).rstrip("/"),
    }
    return [
        {"match": row["url"], "url": roots[row["to"]]}
        for row in rows
        if roots[row["to"]] != official[row["to"]].rstrip("/")
    ]


def sources_urls(value: Any) -> list[str]:
    """A URL or a list of URLs (gpuenv_pip_extra_index_url, gpuenv_pip_find_links) as a list,
    empty entries dropped."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise AnsibleFilterError(f"expected a URL or a list of URLs, got {value!r}")
    return [i.strip() for i in items if i.strip()]


def sources_pip_args(
    preset: Any,
    index_url: str = "",
    extra_index_urls: Any = None,
    find_links: Any = None,
    proxy: str = "",
    cert: str = SYSTEM_CA_BUNDLE,
) -> str:
    """The command-line arguments that make a bare ``pip install`` use these sources:
    ``index_url`` or the PyPI index of the preset, the extra indexes and wheel folders, the proxy
    and the CA bundle. A plain-HTTP index or wheel folder host is trusted explicitly (pip ignores
    it otherwise)."""
    index = index_url or sources_preset(preset)["pypi"]["index_url"]
    extra = sources_urls(extra_index_urls)
    links = sources_urls(find_links)
    argv = ["--index-url", index]
    for url in extra:
        argv += ["--extra-index-url", url]
    for url in links:
        argv += ["--find-links", url]
    for host in sources_plain_http_hosts([index, *extra, *links]):
        argv += ["--trusted-host", host]
    if proxy:
        argv += ["--proxy", proxy]
    if cert:
        argv += ["--cert", cert]
    return shlex.join(argv)


def sources_plain_http_hosts(urls: Any) -> list[str]:
    """The hosts of the plain-HTTP URLs among ``urls``, once each, in order."""
    hosts: list[str] = []
    for url in sources_urls(urls):
        parts = urlsplit(url)
        host = parts.hostname
        if parts.scheme == "http" and host and host not in hosts:
            hosts.append(host)
    return hosts


def sources_pem_certificates(text: Any) -> list[str]:
    """The PEM certificates in ``text`` (a CA bundle), each ending in a newline."""
    return [m.group(0) + "\n" for m in _CERT_RE.finditer(str(text or ""))]


def sources_ca_files(certificates: list[str], folder: str) -> list[dict[str, str]]:
    """One file per certificate (update-ca-certificates links each file by its one certificate's
    hash): ``folder``/site-000.crt, site-001.crt, ... as ``{path, content}`` for gpuenv_files."""
    return [
        {"path": f"{folder}/site-{i:03d}.crt", "content": cert}
        for i, cert in enumerate(certificates)
    ]


class FilterModule:
    """Download sources filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "sources_preset": sources_preset,
            "sources_preset_error": sources_preset_error,
            "sources_apt_rules": sources_apt_rules,
            "sources_urls": sources_urls,
            "sources_pip_args": sources_pip_args,
            "sources_plain_http_hosts": sources_plain_http_hosts,
            "sources_pem_certificates": sources_pem_certificates,
            "sources_ca_files": sources_ca_files,
        }
