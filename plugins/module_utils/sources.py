# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Where nodes download from: the mirror presets and the apt and pip rules, in one place.

Everyone who needs a download source asks here: the collection's filter
(``plugins/filter/sources.py``, the roles' view), the module ``sources_node`` (which points a
node's base apt sources at a mirror), the package (``gpuenv.floor.sources``: ``gpuenv cloud-init``
resolves a group's variables with ``resolve``) and the cloud-init bootstrap, whose apt proxy file,
pip settings and ``sed`` script are rendered from these functions when the user data is made.

Standard library only; runs on the controller and on a node (Python 3.10 and newer). A value
that is not what it should be raises ``SourcesError`` naming the variable; callers turn it into
their own error type (AnsibleFilterError, BadInput).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PRESET_VAR = "gpuenv_sources_preset"
DEFAULT_PRESET = "official"
DISTRO_FAMILIES = ("debian", "ubuntu")
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
    "gpuenv_pip_no_index",
    "gpuenv_apt_bundle_url",
    "gpuenv_apt_bundle_key",
    "gpuenv_apt_base_repoint",
)
# The system CA bundle of Debian and Ubuntu (the site CA joins it through update-ca-certificates).
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The one apt settings file of gpuenv on a node (the sources role owns it; the cloud-init bootstrap
# writes the same file before Ansible runs). apt reads apt.conf.d in name order, a later file
# winning: a single file leaves nothing to win over it.
APT_CONF = "/etc/apt/apt.conf.d/90gpuenv-sources"
# The one pip settings file (pip reads /etc/xdg/pip/pip.conf, then /etc/pip.conf).
PIP_CONF = "/etc/xdg/pip/pip.conf"
# Files older releases wrote that the owner removes, so that a converged node has one of each:
# the sources role's earlier apt proxy file and the site_cache role's apt file.
STALE_APT_CONFS = ("/etc/apt/apt.conf.d/90gpuenv-proxy", "/etc/apt/apt.conf.d/80gpuenv-site-cache")
# The keys older releases' site_cache role set in /etc/pip.conf, which pip reads after PIP_CONF
# (they would beat it): the sources role removes them.
STALE_PIP_CONF = "/etc/pip.conf"
STALE_PIP_KEYS = ("find-links", "trusted-host", "no-index")
# The offline bundle as apt's only source (gpuenv_apt_bundle_url).
BUNDLE_LIST = "/etc/apt/gpuenv-bundle.list"
BUNDLE_PARTS = "/etc/apt/gpuenv-bundle.list.d"
BUNDLE_KEYRING = "/etc/apt/keyrings/gpuenv-bundle.asc"

# The upstream archive roots a distribution's own images write in their base apt sources
# (/etc/apt/sources.list, sources.list.d/*.list and *.sources). With a mirror chosen, these
# entries point at the mirror's `to` root (mirror or security), the rest of the line kept. Each
# `url` is a regular expression that Python and POSIX ERE (sed -E) read alike, matched where a
# '/', a blank or the end of the line follows; the security rows come first, since the main
# archive's root is a prefix of the security one.
UPSTREAM: dict[str, tuple[dict[str, str], ...]] = {
    "debian": (
        {"url": r"https?://(deb|security)\.debian\.org/debian-security", "to": "security"},
        {"url": r"https?://deb\.debian\.org/debian", "to": "mirror"},
    ),
    "ubuntu": (
        {"url": r"https?://security\.ubuntu\.com/ubuntu", "to": "security"},
        {"url": r"https?://([a-z]{2}\.)?archive\.ubuntu\.com/ubuntu", "to": "mirror"},
    ),
}

# One preset per mirror family, chosen with gpuenv_sources_preset (docs/sources.md). Each URL is
# the one the mirror's own help page gives; `source` names that page. A preset without a CUDA
# repository mirror (cuda None) keeps NVIDIA's own repository. None of these hosts is reachable
# from the project's CI network, so no download through them was tried there.
PRESETS: dict[str, dict[str, Any]] = {
    "official": {
        "description": "the upstream archives (Debian, Ubuntu, PyPI, NVIDIA)",
        "debian": {
            "mirror": "http://deb.debian.org/debian",
            "security": "http://deb.debian.org/debian-security",
            "source": "https://www.debian.org/mirror/list"
            " (deb.debian.org, the default of Debian's own images)",
        },
        "ubuntu": {
            "mirror": "http://archive.ubuntu.com/ubuntu",
            "security": "http://security.ubuntu.com/ubuntu",
            "source": "https://help.ubuntu.com/community/Repositories/CommandLine",
        },
        "pypi": {
            "index_url": "https://pypi.org/simple",
            "source": "https://pip.pypa.io/en/stable/cli/pip_install/#cmdoption-i"
            " (pip's default index)",
        },
        "cuda": {
            "repo_url": "https://developer.download.nvidia.com/compute/cuda/repos",
            "source": "https://docs.nvidia.com/cuda/cuda-installation-guide-linux/"
            " (network repository)",
        },
    },
    "tuna": {
        "description": "Tsinghua University TUNA mirror (Beijing)",
        "debian": {
            "mirror": "https://mirrors.tuna.tsinghua.edu.cn/debian",
            "security": "https://mirrors.tuna.tsinghua.edu.cn/debian-security",
            "source": "https://mirrors.tuna.tsinghua.edu.cn/help/debian/",
        },
        "ubuntu": {
            "mirror": "https://mirrors.tuna.tsinghua.edu.cn/ubuntu",
            "security": "https://mirrors.tuna.tsinghua.edu.cn/ubuntu",
            "source": "https://mirrors.tuna.tsinghua.edu.cn/help/ubuntu/",
        },
        "pypi": {
            "index_url": "https://pypi.tuna.tsinghua.edu.cn/simple",
            "source": "https://mirrors.tuna.tsinghua.edu.cn/help/pypi/",
        },
        # TUNA's help pages list no NVIDIA CUDA repository mirror.
        "cuda": None,
    },
    "ustc": {
        "description": "University of Science and Technology of China mirror (Hefei)",
        "debian": {
            "mirror": "https://mirrors.ustc.edu.cn/debian",
            "security": "https://mirrors.ustc.edu.cn/debian-security",
            "source": "https://mirrors.ustc.edu.cn/help/debian.html,"
            " https://mirrors.ustc.edu.cn/help/debian-security.html",
        },
        "ubuntu": {
            "mirror": "https://mirrors.ustc.edu.cn/ubuntu",
            "security": "https://mirrors.ustc.edu.cn/ubuntu",
            "source": "https://mirrors.ustc.edu.cn/help/ubuntu.html",
        },
        "pypi": {
            "index_url": "https://mirrors.ustc.edu.cn/pypi/simple",
            "source": "https://mirrors.ustc.edu.cn/help/pypi.html",
        },
        # USTC's help pages list no NVIDIA CUDA repository mirror.
        "cuda": None,
    },
    "aliyun": {
        "description": "Alibaba Cloud public mirror"
        " (also reachable inside Aliyun ECS without internet egress)",
        "debian": {
            "mirror": "https://mirrors.aliyun.com/debian",
            "security": "https://mirrors.aliyun.com/debian-security",
            "source": "https://developer.aliyun.com/mirror/debian",
        },
        "ubuntu": {
            "mirror": "https://mirrors.aliyun.com/ubuntu",
            "security": "https://mirrors.aliyun.com/ubuntu",
            "source": "https://developer.aliyun.com/mirror/ubuntu",
        },
        "pypi": {
            "index_url": "https://mirrors.aliyun.com/pypi/simple/",
            "source": "https://developer.aliyun.com/mirror/pypi",
        },
        "cuda": {
            # Same layout as NVIDIA's: <repo_url>/<dist>/x86_64/ with the signing key 3bf863cc.pub.
            "repo_url": "https://mirrors.aliyun.com/nvidia-cuda",
            "source": "https://mirrors.aliyun.com/nvidia-cuda/"
            " (the mirror's index of NVIDIA's compute/cuda/repos)",
        },
    },
}

# An archive root ends where its URL ends: a '/', a blank or the end of the line follows.
_END = r"(?=[/\s]|$)"
_CERT_RE = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")
# The spellings Ansible's bool filter takes for a YAML string.
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_WEB = ("http", "https")


class SourcesError(ValueError):
    """A value that is not what it should be; the message names the variable."""


def preset_error(name: Any) -> str:
    """Why ``name`` is not a preset ("" when it is one): names the variable and the valid ones."""
    if isinstance(name, str) and name in PRESETS:
        return ""
    return f"{PRESET_VAR}={name!r} is not a known preset; valid: {', '.join(sorted(PRESETS))}"


def preset(name: Any) -> dict[str, Any]:
    """The preset called ``name``: debian/ubuntu {mirror, security}, pypi {index_url}, cuda
    {repo_url, mirrored} (a preset without a CUDA mirror keeps NVIDIA's own), name; an unknown
    name raises, listing the valid ones."""
    error = preset_error(name)
    if error:
        raise SourcesError(error)
    entry = PRESETS[name]
    cuda = dict(entry["cuda"] or PRESETS[DEFAULT_PRESET]["cuda"], mirrored=bool(entry["cuda"]))
    return {**entry, "name": name, "cuda": cuda}


def citations(name: str) -> tuple[str, ...]:
    """The help pages the preset's URLs come from."""
    entry = PRESETS[name]
    parts = ("debian", "ubuntu", "pypi", "cuda")
    return tuple(entry[k]["source"] for k in parts if entry[k])


def apt_rules(
    preset_name: Any, family: str, mirror: str = "", security: str = ""
) -> list[dict[str, str]]:
    """The rules that point a node's base apt sources at the chosen archive roots: one
    ``{match, url}`` per row of ``UPSTREAM[family]``, where ``url`` is ``mirror`` (``security``)
    or the preset's. A row whose root is the official one is left out, so the official preset
    with no override gives none (the sources stay as they are); so does an unknown family."""
    chosen = preset(preset_name)
    if family not in chosen or family not in UPSTREAM:
        return []
    official = PRESETS[DEFAULT_PRESET][family]
    roots = {
        "mirror": (mirror or chosen[family]["mirror"]).rstrip("/"),
        "security": (security or chosen[family]["security"]).rstrip("/"),
    }
    return [
        {"match": row["url"], "url": roots[row["to"]]}
        for row in UPSTREAM[family]
        if roots[row["to"]] != official[row["to"]].rstrip("/")
    ]


def compile_rules(rules: list[dict[str, str]]) -> list[tuple[re.Pattern[str], str]]:
    """The rules as (pattern, root); a match that is not a regular expression raises."""
    out = []
    for rule in rules:
        try:
            pattern = re.compile(f"(?:{rule['match']}){_END}", re.MULTILINE)
        except re.error as exc:
            raise SourcesError(
                f"apt_rules: {rule['match']!r} is not a regular expression: {exc}"
            ) from None
        out.append((pattern, rule["url"].rstrip("/")))
    return out


def repoint(text: str, rules: list[tuple[re.Pattern[str], str]]) -> str:
    """text with every URL a rule matches pointed at that rule's root (the first rule wins)."""
    if not rules:
        return text
    combined = re.compile("|".join(f"({p.pattern})" for p, _ in rules), re.MULTILINE)
    # Each rule's group number in the combined pattern (a rule may hold groups of its own).
    starts, number = [], 1
    for pattern, _ in rules:
        starts.append(number)
        number += 1 + pattern.groups

    def swap(found: re.Match[str]) -> str:
        for start, (_, url) in zip(starts, rules, strict=True):
            if found.group(start) is not None:
                return url
        return found.group(0)

    return combined.sub(swap, text)


def sed_script(rules: list[dict[str, str]]) -> str:
    """The same rules as a ``sed -E`` script, one substitution a line, for a shell that has no
    Python module of ours yet (the cloud-init bootstrap). POSIX ERE has no look-ahead: the
    character after the root is captured and written back, and the end of the line is matched as
    such. A root with the delimiter ``#``, a ``&`` or a ``\\`` in it is refused."""
    lines = []
    for rule in rules:
        url = rule["url"].rstrip("/")
        if re.search(r"[\s#&\\]", url):
            raise SourcesError(f"apt mirror {url!r} must be a plain archive URL")
        groups = re.compile(rule["match"]).groups
        end = groups + 2  # the rule's own groups, then the one around it, then the boundary
        lines.append(f"s#({rule['match']})([/[:space:]]|$)#{url}\\{end}#g")
    return "".join(line + "\n" for line in lines)


def urls(value: Any, name: str = "value") -> list[str]:
    """A URL or a list of URLs (gpuenv_pip_extra_index_url, gpuenv_pip_find_links) as a list,
    empty entries dropped."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if isinstance(items, tuple):
        items = list(items)
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise SourcesError(f"{name} must be a URL or a list of URLs, got {value!r}")
    return [i.strip() for i in items if i.strip()]


def plain_http_hosts(values: Any) -> list[str]:
    """The hosts of the plain-HTTP URLs among ``values``, once each, in order: pip ignores a
    plain-HTTP index or wheel folder unless its host is trusted."""
    hosts: list[str] = []
    for url in urls(values):
        parts = urlsplit(url)
        if parts.scheme == "http" and parts.hostname and parts.hostname not in hosts:
            hosts.append(parts.hostname)
    return hosts


def pip_args(
    preset_name: Any,
    index_url: str = "",
    extra_index_urls: Any = None,
    find_links: Any = None,
    proxy: str = "",
    cert: str = SYSTEM_CA_BUNDLE,
) -> str:
    """The command-line arguments that make a bare ``pip install`` use these sources:
    ``index_url`` or the PyPI index of the preset, the extra indexes and wheel folders, the proxy
    and the CA bundle, plain-HTTP hosts trusted."""
    index = index_url or preset(preset_name)["pypi"]["index_url"]
    extra = urls(extra_index_urls)
    links = urls(find_links)
    argv = ["--index-url", index]
    for url in extra:
        argv += ["--extra-index-url", url]
    for url in links:
        argv += ["--find-links", url]
    for host in plain_http_hosts([index, *extra, *links]):
        argv += ["--trusted-host", host]
    if proxy:
        argv += ["--proxy", proxy]
    if cert:
        argv += ["--cert", cert]
    return shlex.join(argv)


def pip_conf(
    index_url: str = "",
    extra_index_urls: Any = None,
    find_links: Any = None,
    no_index: bool = False,
    proxy: str = "",
    cert: str = SYSTEM_CA_BUNDLE,
) -> str:
    """The body of the one pip configuration (``[global]``): the index when one is given (empty:
    pip's own or the virtual environment's), wheel folders, ``no-index``, trusted plain-HTTP
    hosts, the proxy and the CA bundle."""
    extra = urls(extra_index_urls, "extra index URLs")
    links = urls(find_links, "find-links")
    lines = ["[global]"]
    if index_url:
        lines.append(f"index-url = {index_url}")
    if extra:
        lines.append(f"extra-index-url = {' '.join(extra)}")
    if links:
        lines.append(f"find-links = {' '.join(links)}")
    if no_index:
        lines.append("no-index = true")
    trusted = plain_http_hosts([index_url, *extra, *links] if index_url else [*extra, *links])
    if trusted:
        lines.append(f"trusted-host = {' '.join(trusted)}")
    if proxy:
        lines.append(f"proxy = {proxy}")
    if cert:
        lines.append(f"cert = {cert}")
    return "\n".join(lines) + "\n"


def apt_direct_hosts(no_proxy: str) -> list[str]:
    """The no_proxy entries apt can take (``Acquire::http::Proxy::HOST "DIRECT"``): plain host
    names and addresses; domain suffixes and networks are beyond apt's settings."""
    out: list[str] = []
    for entry in (no_proxy or "").split(","):
        host = entry.strip()
        if re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]*$", host) and host not in out:
            out.append(host)
    return out


def apt_conf(
    http_proxy: str = "",
    https_proxy: str = "",
    apt_proxy: str = "",
    no_proxy: str = "",
    bundle: bool = False,
) -> str:
    """The body of gpuenv's one apt settings file (APT_CONF): "" when there is nothing to say.

    - An offline bundle (``bundle``) is apt's only source and is reached directly: DIRECT for
      both schemes, whatever proxy is set (a proxy could not reach a site's own bundle host).
    - Otherwise plain HTTP goes through ``apt_proxy`` (a site cache) when set, else
      ``http_proxy``; HTTPS through ``https_proxy``; no_proxy's plain hosts go DIRECT.
    Proxy auto-detection is turned off whenever a proxy is set: an image's detect script would
    otherwise win over the setting, host by host."""
    lines = []
    if bundle:
        lines += [
            "// The offline bundle is apt's only source (the distribution's lists stay unread).",
            f'Dir::Etc::SourceList "{BUNDLE_LIST}";',
            f'Dir::Etc::SourceParts "{BUNDLE_PARTS}";',
            'Acquire::http::Proxy "DIRECT";',
            'Acquire::https::Proxy "DIRECT";',
        ]
    else:
        http = apt_proxy or http_proxy
        if http:
            lines.append(f'Acquire::http::Proxy "{http}";')
        if https_proxy:
            lines.append(f'Acquire::https::Proxy "{https_proxy}";')
        for host in apt_direct_hosts(no_proxy) if lines else []:
            if http:
                lines.append(f'Acquire::http::Proxy::{host} "DIRECT";')
            if https_proxy:
                lines.append(f'Acquire::https::Proxy::{host} "DIRECT";')
    if lines:
        lines.append('Acquire::http::Proxy-Auto-Detect "";')
    return "".join(line + "\n" for line in lines)


def bundle_list(bundle_url: str) -> str:
    """The bundle's one apt source line, trusted through the bundle's own key only."""
    return f"deb [signed-by={BUNDLE_KEYRING}] {bundle_url.rstrip('/')}/apt ./\n"


def bundle_wheels(bundle_url: str) -> str:
    """The bundle's wheel folder."""
    return bundle_url.rstrip("/") + "/wheels/"


def without_keys(text: str, section: str, keys: list[str]) -> str:
    """``text`` (an INI file such as pip.conf) without the lines that set ``keys`` in
    ``section``, continuation lines included; everything else stays as written."""
    out: list[str] = []
    current = ""
    dropping = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        header = re.match(r"^\[([^\]]+)\]", stripped)
        if header:
            current, dropping = header.group(1).strip(), False
        elif dropping and line[:1] in (" ", "\t") and stripped:
            continue  # a continuation of the value being dropped
        else:
            name = re.split(r"\s*[=:]", stripped, maxsplit=1)[0].strip().lower()
            dropping = current == section and bool(stripped) and name in keys
            if dropping:
                continue
        out.append(line)
    return "".join(out)


def pem_certificates(text: Any) -> list[str]:
    """The PEM certificates in ``text`` (a CA bundle), each ending in a newline."""
    return [m.group(0) + "\n" for m in _CERT_RE.finditer(str(text or ""))]


def ca_files(certificates: list[str], folder: str) -> list[dict[str, str]]:
    """One file per certificate (update-ca-certificates links each file by its one certificate's
    hash): ``folder``/site-000.crt, site-001.crt, ... as ``{path, content}``."""
    return [
        {"path": f"{folder}/site-{i:03d}.crt", "content": cert}
        for i, cert in enumerate(certificates)
    ]


# The deprecated variables and what replaces each (docs/sources.md, "Deprecated variables").
DEPRECATED = {
    "site_cache_apt_proxy_url": "gpuenv_apt_proxy",
    "site_cache_wheels_url": "gpuenv_pip_find_links",
    "site_cache_bundle_url": "gpuenv_apt_bundle_url",
    "site_cache_bundle_key": "gpuenv_apt_bundle_key",
    "site_cache_pip_no_index": "gpuenv_pip_no_index",
}


def _same(old: Any, new: Any) -> bool:
    if isinstance(new, list) or isinstance(old, list):
        return urls(old) == urls(new)
    return str(old).strip().lower() == str(new).strip().lower()


def deprecated(variables: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The replacements' values with the deprecated variables taken in, and one message each.

    A deprecated variable set alone gives its value to its replacement, with a warning naming
    the replacement; set beside a replacement that says the same, only the warning; set beside
    one that says something else, SourcesError naming both (which one was meant is the user's
    call)."""
    values: dict[str, Any] = {}
    warnings: list[str] = []
    for old, new in DEPRECATED.items():
        value = variables.get(old)
        if value in (None, "", []):
            continue
        current = variables.get(new)
        if current not in (None, "", []) and not _same(value, current):
            raise SourcesError(
                f"{old}={value!r} is deprecated and says something else than its replacement "
                f"{new}={current!r}: remove {old} (docs/sources.md)"
            )
        values[new] = value
        warnings.append(f"{old} is deprecated: set {new} instead (docs/sources.md)")
    return values, warnings


@dataclass(frozen=True)
class AptSource:
    mirror: str  # archive root, e.g. http://deb.debian.org/debian
    security: str  # security archive root


@dataclass(frozen=True)
class Sources:
    """What the nodes download from, after the preset and the overrides."""

    preset: str
    apt: Mapping[str, AptSource]  # by distro family: debian, ubuntu
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
    pip_no_index: bool  # pip uses the wheel folders only
    apt_bundle_url: str  # a served `gpuenv bundle` folder, apt's only source; empty: none
    apt_base_repoint: bool  # point the node's own base apt sources at a chosen mirror
    notes: tuple[str, ...]  # what the user should know (a preset without a CUDA mirror)

    def apt_conf(self) -> str:
        """The body of APT_CONF for these sources."""
        bundle = bool(self.apt_bundle_url)
        return apt_conf(self.http_proxy, self.https_proxy, self.apt_proxy, self.no_proxy, bundle)

    def find_links(self) -> tuple[str, ...]:
        """The wheel folders pip searches: the site's and the bundle's."""
        bundle = (bundle_wheels(self.apt_bundle_url),) if self.apt_bundle_url else ()
        return tuple(dict.fromkeys(self.pip_find_links + bundle))

    def apt_rules(self, family: str) -> list[dict[str, str]]:
        """The base-sources rules for ``family``: none when repointing is off or with a bundle
        (the bundle replaces the lists rather than editing them)."""
        if not self.apt_base_repoint or self.apt_bundle_url or family not in self.apt:
            return []
        chosen = self.apt[family]
        return apt_rules(self.preset, family, chosen.mirror, chosen.security)


def _text(variables: Mapping[str, Any], name: str) -> str:
    value = variables.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SourcesError(f"{name} must be a string, got {type(value).__name__} {value!r}")
    return value.strip()


def is_url(value: str, schemes: tuple[str, ...] = _WEB) -> bool:
    """``value`` is scheme://host[:port][/path] with one of ``schemes`` (file: an absolute path)."""
    try:
        parts = urlsplit(value)
        if parts.scheme == "file" and "file" in schemes:  # a folder on the node: file:///srv/wheels
            return not parts.netloc and parts.path.startswith("/")
        return parts.scheme in schemes and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        return False


def _url(variables: Mapping[str, Any], name: str, schemes: tuple[str, ...] = _WEB) -> str:
    value = _text(variables, name)
    if value and not is_url(value, schemes):
        raise SourcesError(
            f"{name}={value!r} is not a URL; expected {' or '.join(s + '://' for s in schemes)}"
            "host[:port][/path]"
        )
    return value


def _url_list(
    variables: Mapping[str, Any], name: str, schemes: tuple[str, ...] = _WEB
) -> tuple[str, ...]:
    value = variables.get(name)
    if value in (None, ""):
        return ()
    items = urls(value, name)
    for item in items:
        _url({name: item}, name, schemes)
    return tuple(items)


def flag(variables: Mapping[str, Any], name: str, default: bool) -> bool:
    value = variables.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise SourcesError(f"{name} must be true or false, got {value!r}")


def resolve(variables: Mapping[str, Any]) -> Sources:
    """The sources a host (or group) with these inventory variables downloads from; the
    deprecated variables are taken in as ``deprecated`` says (their warnings are the caller's)."""
    taken, _ = deprecated(variables)
    variables = {**variables, **taken}
    name = _text(variables, PRESET_VAR) or DEFAULT_PRESET
    chosen = preset(name)
    apt_mirror = _url(variables, "gpuenv_apt_mirror")
    apt_security = _url(variables, "gpuenv_apt_security_mirror")
    apt = {
        family: AptSource(
            apt_mirror or chosen[family]["mirror"], apt_security or chosen[family]["security"]
        )
        for family in DISTRO_FAMILIES
    }
    bundle = _url(variables, "gpuenv_apt_bundle_url")
    notes: list[str] = []
    cuda_repo = _url(variables, "gpuenv_cuda_repo_url") or chosen["cuda"]["repo_url"]
    if not variables.get("gpuenv_cuda_repo_url") and not chosen["cuda"]["mirrored"]:
        notes.append(
            f"preset {name} has no NVIDIA CUDA repository mirror: nodes use {cuda_repo} "
            "(set gpuenv_cuda_repo_url for a site copy)"
        )
    return Sources(
        preset=name,
        apt=apt,
        cuda_repo_url=cuda_repo,
        cuda_repo_key_url=_url(variables, "gpuenv_cuda_repo_key_url"),
        pip_index_url=_url(variables, "gpuenv_pip_index_url") or chosen["pypi"]["index_url"],
        pip_extra_index_urls=_url_list(variables, "gpuenv_pip_extra_index_url"),
        http_proxy=_url(variables, "gpuenv_http_proxy"),
        https_proxy=_url(variables, "gpuenv_https_proxy"),
        no_proxy=_text(variables, "gpuenv_no_proxy"),
        ca_bundle=_text(variables, "gpuenv_ca_bundle"),
        apt_proxy=_url(variables, "gpuenv_apt_proxy"),
        pip_find_links=_url_list(variables, "gpuenv_pip_find_links", ("http", "https", "file")),
        # A bundle carries its wheels: pip looks nowhere else unless told so.
        pip_no_index=flag(variables, "gpuenv_pip_no_index", bool(bundle)),
        apt_bundle_url=bundle,
        apt_base_repoint=flag(variables, "gpuenv_apt_base_repoint", True),
        notes=tuple(notes),
    )
