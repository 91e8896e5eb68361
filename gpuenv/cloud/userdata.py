"""cloud-init user data that makes a new instance provision and validate itself (pull mode).

``render`` reads the group's variables from the inventory (``ansible-inventory --export``: a
group's own variables and its parents', so a group with no hosts yet works), resolves the
download sources, and renders ``templates/user-data.yaml.j2``: the group's variables as the
node's ``group_vars``, a pip.conf, the settings file and ``templates/bootstrap.sh``, which
cloud-init's runcmd starts. Everything in user data can be read back from the instance's
metadata service, so nothing secret goes in: connection settings (``ansible_*``) are dropped,
and a variable named like a secret or whose value gives one away is refused (``secrets``).
"""

from __future__ import annotations

import functools
import re
import shlex
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jinja2
import yaml

from gpuenv import proc
from gpuenv.checks.profiles import profile_names
from gpuenv.checks.thresholds import load_thresholds
from gpuenv.cloud import secrets
from gpuenv.cloud.secrets import mask_url
from gpuenv.cluster import inventory
from gpuenv.errors import BadInput
from gpuenv.floor import sources as src

# What the node installs to run Ansible: the version constraints.txt pins, and for Python 3.10
# (Ubuntu 22.04) the last ansible whose core runs there (ansible-core 2.17).
ANSIBLE_REQUIREMENT = "ansible==12.3.0"
ANSIBLE_PY310_REQUIREMENT = "ansible==10.7.0"
# The gpu_env role builds the gpuenv wheel with the node's venv, without build isolation: that venv
# needs the setuptools pyproject.toml's [build-system] asks for (a test holds the two equal).
SETUPTOOLS_REQUIREMENT = "setuptools>=77"
DEFAULT_PLAYBOOK = "site.yml"
# The pull run is one node alone: the mesh needs the controller (it holds the cluster key), and
# the cluster validation needs every node.
SKIP_TAGS = ("ssh", "validate")
DEFAULT_NODE_VENV = "/opt/gpuenv"  # roles/gpu_env's gpu_env_venv
# The node checks itself by the profile the cluster's validate stage uses (playbooks/validate.yml).
PROFILE_VAR = "validate_profile"
DEFAULT_PROFILE = "quick"
# Reading the checkout's origin and HEAD with git (instant here); past this git's session is killed.
GIT_DEADLINE_S = 30
# AWS EC2 refuses user data over 16 KiB (before base64); Aliyun ECS allows 32 KiB.
USER_DATA_LIMIT = 16384

_GROUP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REF_RE = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._/+-]*$")
_COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_TARBALL_SUFFIXES = (".tar.gz", ".tgz", ".tar")
_CERT_RE = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
# Where the instance keeps --ca-bundle's certificates, which only the fetch of the source trusts.
SOURCE_CA_FILE = "/etc/gpuenv/source-ca.pem"
# Controller-side settings that mean nothing on the node (paths on the controller).
_DROPPED = ("ssh_mesh_private_key_file", "ssh_mesh_key_dir", "gpuenv_ca_bundle")


@dataclass(frozen=True)
class Request:
    """What ``gpuenv cloud-init`` was asked for."""

    inventory: str
    group: str
    source: str  # git URL, or tarball URL ({ref} in it is replaced by the ref)
    ref: str
    playbook: str = DEFAULT_PLAYBOOK
    sha256: str = ""  # a tarball's SHA-256, checked on the node before anything runs
    secrets_command: str = ""  # run on the node at boot; its output is the secrets file
    ca_bundle: str = ""  # a controller PEM file: the CAs the node trusts for fetching the source
    # Variable paths (gpu_env_extra_env.NAME) let through although they look like secrets.
    allow_secrets: tuple[str, ...] = ()
    ansible: str = ANSIBLE_REQUIREMENT
    ansible_py310: str = ANSIBLE_PY310_REQUIREMENT


@dataclass(frozen=True)
class UserData:
    text: str
    node_vars: dict[str, Any]  # what the node's group_vars file holds
    sources: src.Sources
    notes: tuple[str, ...]


def check_ref(ref: str) -> str:
    if not _REF_RE.match(ref):
        raise BadInput(
            f"--ref {ref!r} is not a branch, tag or commit name "
            "(letters, digits and ._/+-, not starting with '-', no '..')"
        )
    return ref


def is_tarball(url: str) -> bool:
    return urlsplit(url).path.endswith(_TARBALL_SUFFIXES)


def check_source(url: str) -> str:
    """A URL the instance can fetch without credentials of the controller's, with authenticity:
    https only (a git repository over https, or a tarball)."""
    if re.match(r"^[\w.-]+@[\w.-]+:", url) or url.startswith(("ssh://", "git+ssh://")):
        raise BadInput(
            f"--source {url!r} is an SSH URL: the instance would need a private key, and user "
            "data must hold none; use an https:// git URL or a tarball URL"
        )
    if secrets.URL_CREDENTIALS_RE.search(url) or secrets.query_credentials(url):
        raise BadInput(
            f"--source {mask_url(url)} carries credentials; user data is readable from the "
            "instance's metadata service"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise BadInput(f"--source {url!r} is not a URL ({exc})") from None
    if parts.scheme in ("http", "git", "file"):
        raise BadInput(
            f"--source {url}: {parts.scheme}:// is refused: the bootstrap runs what it fetches "
            "as root at first boot, so it fetches over https:// only (a git repository, or a "
            "tarball with --sha256)"
        )
    if parts.scheme != "https" or not parts.hostname:
        raise BadInput(f"--source {url!r} is not an https:// git or tarball URL")
    return url


def check_sha256(source: str, sha256: str) -> str:
    """``--sha256`` goes with a tarball source: 64 hex digits, lower case."""
    if not sha256:
        return ""
    if not is_tarball(source):
        raise BadInput(
            f"--sha256 is for a tarball source; {source} is a git repository, which the "
            "bootstrap fetches at a pinned commit"
        )
    value = sha256.lower()
    if not _SHA256_RE.match(value):
        raise BadInput(f"--sha256 {sha256!r} is not a SHA-256 (64 hex digits)")
    return value


def ls_remote(source: str, ref: str, ca_file: str = "") -> str:
    """``git ls-remote SOURCE REF``'s listing; BadInput when git cannot answer in time. With
    ``ca_file`` the controller trusts the CAs the instance will trust for the same fetch."""
    try:
        # An annotated tag's commit is listed as REF^{} only when asked for by that name.
        trust = ["-c", f"http.sslCAInfo={ca_file}"] if ca_file else []
        argv = ["git", *trust, "ls-remote", "--", source, ref, f"{ref}^{{}}"]
        done = proc.capture(argv, GIT_DEADLINE_S)
    except OSError as exc:
        raise BadInput(f"--ref {ref}: cannot run git to resolve it ({exc})") from None
    if done.returncode is None:
        raise BadInput(
            f"--ref {ref}: git ls-remote {mask_url(source)} did not answer in {GIT_DEADLINE_S} s"
        )
    if done.returncode != 0:
        said = (done.stderr or "").strip().splitlines()
        raise BadInput(
            f"--ref {ref}: git ls-remote {mask_url(source)} failed (exit {done.returncode})"
            + (f": {mask_url(said[-1])}" if said else "")
        )
    return done.stdout


def resolve_ref(source: str, ref: str, listing: Callable[[str, str], str] | None = None) -> str:
    """The commit a branch or tag names at ``source`` now (a full commit is kept as it is), so
    that every instance booted from this user data runs the same code."""
    if _COMMIT_RE.match(ref):
        return ref
    found: dict[str, str] = {}
    for line in (listing or ls_remote)(source, ref).splitlines():
        commit, _, name = line.partition("\t")
        found[name.strip()] = commit.strip()
    # git's own order for a short name: a tag (peeled to its commit) before a branch.
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in found and _COMMIT_RE.match(found[name]):
            return found[name]
    if re.match(r"^[0-9a-f]{4,39}$", ref):
        raise BadInput(f"--ref {ref} looks like a short commit: give the full 40-digit commit")
    raise BadInput(f"--ref {ref} is neither a branch nor a tag of {mask_url(source)}")


def checkout_defaults(root: Path) -> tuple[str | None, str | None]:
    """The origin URL and HEAD commit of the gpuenv checkout at ``root`` (None where unknown)."""

    def git(*args: str) -> str | None:
        try:
            done = proc.capture(["git", "-C", str(root), *args], GIT_DEADLINE_S)
        except OSError:
            return None
        return done.stdout.strip() or None if done.returncode == 0 else None

    return git("remote", "get-url", "origin"), git("rev-parse", "HEAD")


def _ancestors(data: Mapping[str, Any], group: str) -> list[str]:
    """``group`` and the groups above it, parents first (Ansible applies group vars by depth)."""
    parents: dict[str, set[str]] = {}
    for name, node in data.items():
        if name != "_meta" and isinstance(node, Mapping):
            for child in node.get("children", []):
                parents.setdefault(child, set()).add(name)
    depth: dict[str, int] = {}

    def visit(name: str, seen: frozenset[str]) -> int:
        if name not in depth:
            ups = parents.get(name, set()) - seen
            depth[name] = 1 + max((visit(p, seen | {name}) for p in ups), default=-1)
        return depth[name]

    above: set[str] = set()
    todo = [group]
    while todo:
        name = todo.pop()
        if name not in above:
            above.add(name)
            todo += parents.get(name, set())
    for name in above:
        visit(name, frozenset())
    return sorted(above, key=lambda n: (depth[n], n))


def group_vars(data: Mapping[str, Any], groups: list[str], group: str, where: str) -> dict:
    """The variables a new host in ``group`` gets from the inventory's groups."""
    if not _GROUP_RE.match(group):
        raise BadInput(f"--group {group!r} is not a valid Ansible group name")
    if group not in groups or group == "all":
        raise BadInput(
            f"group {group!r} is not in inventory {where}; groups: "
            f"{', '.join(g for g in groups if g not in ('all', 'ungrouped'))}"
        )
    merged: dict[str, Any] = {}
    for name in _ancestors(data, group):
        merged.update(data.get(name, {}).get("vars", {}) or {})
    return merged


def node_variables(
    variables: Mapping[str, Any], allow_secrets: tuple[str, ...] = ()
) -> tuple[dict[str, Any], list[str]]:
    """The node's group_vars: the group's own values, the gpuenv_* sources among them (the roles
    read those themselves, as in push mode), minus controller settings; BadInput for anything
    secret but the paths ``allow_secrets`` names. With a note for each path let through."""
    out = {
        name: value
        for name, value in variables.items()
        if not name.startswith("ansible_") and name not in _DROPPED
    }
    allowed = secrets.refuse(out, allow_secrets)
    unused = [path for path in allow_secrets if path not in allowed]
    notes = [
        f"--allow-secret {path}: written to user data as set, where anyone who can read the "
        "instance's metadata can read it"
        for path in allowed
    ]
    notes += [f"--allow-secret {path}: nothing there looks like a secret" for path in unused]
    return out, notes


def ca_certificates(path: str, what: str = "gpuenv_ca_bundle") -> list[str]:
    """The PEM certificates of a CA bundle (a controller path, ``what`` names where it was
    given); never a private key, and each one a certificate OpenSSL can read."""
    if not path:
        return []
    file = Path(path).expanduser()
    if not file.is_file():
        raise BadInput(f"{what} {path} does not exist on this controller")
    text = file.read_text(errors="replace")
    if secrets.PRIVATE_KEY_RE.search(text):
        raise BadInput(
            f"{what} {path} holds a private key; give CA certificates only (user data is "
            "readable from the instance's metadata service)"
        )
    certs = [c.strip() + "\n" for c in _CERT_RE.findall(text)]
    if not certs:
        raise BadInput(f"{what} {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    for number, cert in enumerate(certs, 1):
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=cert)
        except (ssl.SSLError, ValueError) as exc:
            raise BadInput(
                f"{what} {path}: certificate {number} is not a readable PEM certificate ({exc})"
            ) from None
    return certs


def check_profile(variables: Mapping[str, Any]) -> str:
    """The group's ``validate_profile`` (quick, full, cpu: CPU-only nodes such as the lab's)."""
    profile = variables.get(PROFILE_VAR) or DEFAULT_PROFILE
    known = profile_names(load_thresholds())
    if profile not in known:
        raise BadInput(
            f"{PROFILE_VAR}={profile!r} is not a check profile; valid: {', '.join(known)}"
        )
    return str(profile)


def _env_file(
    req: Request,
    sources: src.Sources,
    node_venv: str,
    profile: str,
    commit: str,
    sha256: str,
    source_ca: str,
) -> str:
    values = {
        "GPUENV_GROUP": req.group,
        "GPUENV_SOURCE": req.source,
        "GPUENV_REF": req.ref,
        # A git source's ref as the commit it named when the user data was rendered.
        "GPUENV_COMMIT": commit,
        "GPUENV_SHA256": sha256,
        # --ca-bundle's file: the CAs curl and git trust for the fetch (empty: the system's).
        "GPUENV_SOURCE_CA": source_ca,
        "GPUENV_SECRETS_COMMAND": req.secrets_command,
        "GPUENV_PLAYBOOK": req.playbook,
        "GPUENV_SKIP_TAGS": ",".join(SKIP_TAGS),
        "GPUENV_ANSIBLE": req.ansible,
        "GPUENV_ANSIBLE_PY310": req.ansible_py310,
        "GPUENV_SETUPTOOLS": SETUPTOOLS_REQUIREMENT,
        "GPUENV_NODE_VENV": node_venv,
        "GPUENV_CHECK_PROFILE": profile,
        "GPUENV_HTTP_PROXY": sources.http_proxy,
        "GPUENV_HTTPS_PROXY": sources.https_proxy,
        "GPUENV_NO_PROXY": sources.no_proxy,
        # The sources role's own apt settings file, with the body the role writes there.
        "GPUENV_APT_CONF_FILE": src.APT_CONF,
        "GPUENV_APT_CONF": sources.apt_conf(),
    }
    # The floor's rules for the base apt sources as sed scripts (the image has no gpuenv yet);
    # empty: the image's own sources stay as they are.
    for family in src.DISTRO_FAMILIES:
        try:
            values[f"GPUENV_APT_SED_{family.upper()}"] = src.sed_script(sources.apt_rules(family))
        except src.SourcesError as exc:
            raise BadInput(f"{exc} ({family})") from None
    lines = ["# Settings of /usr/local/sbin/gpuenv-bootstrap (gpuenv cloud-init)."]
    lines += [f"{k}={shlex.quote(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _pip_conf(sources: src.Sources) -> str:
    return src.pip_conf(
        sources.pip_index_url,
        sources.pip_extra_index_urls,
        sources.find_links(),
        sources.pip_no_index,
        sources.https_proxy or sources.http_proxy,
    )


def resolve_sources(variables: Mapping[str, Any]) -> tuple[src.Sources, list[str]]:
    """The group's sources by the floor's resolver, and its warnings (deprecated variables)."""
    try:
        _, warnings = src.deprecated(variables)
        sources = src.resolve(variables)
    except src.SourcesError as exc:
        raise BadInput(str(exc)) from None
    if sources.apt_bundle_url:
        raise BadInput(
            "gpuenv_apt_bundle_url: an offline bundle is set up by the sources role at converge; "
            "the cloud-init bootstrap needs an archive (or a site cache, gpuenv_apt_proxy) to "
            "install git and Python first"
        )
    if sources.pip_no_index and not sources.find_links():
        raise BadInput("gpuenv_pip_no_index is true but gpuenv_pip_find_links is empty")
    return sources, warnings


def render(req: Request) -> UserData:
    """The user data for a new instance of ``req.group``; BadInput before anything is written."""
    check_source(req.source)
    check_ref(req.ref)
    sha256 = check_sha256(req.source, req.sha256)
    source_certs = ca_certificates(req.ca_bundle, "--ca-bundle")
    data, groups = inventory.export(req.inventory)
    variables = group_vars(data, groups, req.group, req.inventory)
    # Secrets are refused before anything else reads the variables.
    node_vars, allow_notes = node_variables(variables, req.allow_secrets)
    sources, warnings = resolve_sources(variables)
    certs = ca_certificates(sources.ca_bundle)
    notes = [*allow_notes, *warnings, *sources.notes]
    if is_tarball(req.source):
        commit = ""
        if not sha256:
            notes.append(
                "no --sha256: the bootstrap runs the tarball unchecked; give its SHA-256 "
                "(sha256sum FILE) to pin what every instance runs"
            )
    else:
        listing = functools.partial(ls_remote, ca_file=req.ca_bundle) if req.ca_bundle else None
        commit = resolve_ref(req.source, req.ref, listing)
    node_venv = str(variables.get("gpu_env_venv") or DEFAULT_NODE_VENV)
    script = resources.files("gpuenv.cloud").joinpath("templates/bootstrap.sh").read_text()
    env = jinja2.Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # YAML, not HTML: values are quoted by yaml.safe_dump and shlex
    )
    template = env.from_string(
        resources.files("gpuenv.cloud").joinpath("templates/user-data.yaml.j2").read_text()
    )
    header = f"# The variables of inventory group {req.group}, as `gpuenv cloud-init` read them.\n"
    source_ca = SOURCE_CA_FILE if source_certs else ""
    env_file = _env_file(
        req, sources, node_venv, check_profile(variables), commit, sha256, source_ca
    )
    text = template.render(
        group=req.group,
        source=req.source,
        ref=req.ref,
        commit=commit,
        playbook=req.playbook,
        ca_certs=certs,
        source_ca_file=SOURCE_CA_FILE,
        source_certs="".join(source_certs).rstrip("\n"),
        # Each file's content is a YAML block scalar, which gives back its final newline.
        env_file=env_file.rstrip("\n"),
        pip_conf=_pip_conf(sources).rstrip("\n"),
        group_vars=(header + yaml.safe_dump(node_vars, sort_keys=True)).rstrip("\n"),
        script=script.rstrip("\n"),
    )
    if secrets.PRIVATE_KEY_RE.search(text):  # the last guard: nothing above may let one through
        raise BadInput("the rendered user data would hold a private key; refusing")
    size = len(text.encode())
    if size > USER_DATA_LIMIT:
        notes.append(
            f"user data is {size} bytes: AWS EC2 takes at most {USER_DATA_LIMIT} "
            "(gzip it, or use Aliyun ECS's 32 KiB)"
        )
    return UserData(text=text, node_vars=node_vars, sources=sources, notes=tuple(notes))
