"""What must not travel in cloud-init user data: a secret found by a variable's name or its value.

User data can be read back from the instance's metadata service and the cloud's console, so
``gpuenv cloud-init`` refuses every group variable, at any depth, that is named like a secret or
whose value gives one away: a token of a common host, a JSON Web Token, private key material (PEM,
base64 PEM, an OpenSSH key's body), netrc content with a password, credentials in a URL's userinfo
or query. A finding names the variable's path and what gave it away, never the value; the user
may let one named path through (``--allow-secret``), except private key material.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpuenv.errors import BadInput

PRIVATE_KEY_RE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----|PuTTY-User-Key-File-")
# A URL's userinfo: `user:password@` or a bare `token@` (how git hosts and indexes take tokens).
URL_CREDENTIALS_RE = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]+)(?::(?P<password>[^/\s@]*))?@"
)
# Names that hold a secret by convention wherever the word stands in them (registry_password);
# a tokenizer's settings (TOKENIZERS_PARALLELISM, common in gpu_env_extra_env) are no secret.
_SECRET_WORD_RE = re.compile(
    r"password|passwd|passphrase|secret|token(?!iz)|api[_-]?key|access[_-]?key|private[_-]?key|"
    r"credential",
    re.IGNORECASE,
)
# Words that end a secret's name (OPENAI_KEY, DB_PASS, GITLAB_PAT): after `_` or `-`, or the
# whole name; MONKEY or keyring are no secret.
SECRET_NAME_ENDINGS = (
    "KEY",
    "PASS",
    "PAT",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PWD",
    "CREDENTIALS",
)
_SECRET_END_RE = re.compile(rf"(?:^|[_-])({'|'.join(SECRET_NAME_ENDINGS)})$", re.IGNORECASE)
# Public role variables, by path, whose names end like a secret's but which hold none (the value
# rules still apply to them). tests/unit/test_cloud_userdata.py gives every option of every
# role's argument spec an ordinary value: a new variable named like a secret fails there until it
# is judged and named here.
NOT_SECRETS = frozenset(
    {
        "gpuenv_apt_bundle_key",  # controller path of the offline bundle's public signing key
        "sources_apt_bundle_key",  # the sources role's own name for it
        "site_cache_bundle_key",  # its deprecated name
        "nvidia_driver_signing_key",  # path on the node of the DKMS key, which stays there
        "apt_pin_request.version_key",  # a package name
    }
)

# A token starts and ends a word: no letter, digit, `_` or `-` on either side.
_BEFORE = r"(?<![A-Za-z0-9_-])"
_AFTER = r"(?![A-Za-z0-9_-])"


@dataclass(frozen=True)
class TokenShape:
    """The form of one host's tokens: ``prefix`` then a body of ``body`` (a regular expression of
    the alphabet and the least length), which holds a digit or a capital (random, not a word)."""

    host: str
    prefix: str
    body: str

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(f"{_BEFORE}{re.escape(self.prefix)}(?P<body>{self.body}){_AFTER}")


# The tokens of the common hosts, by their documented prefixes; a longer prefix before a shorter
# one that begins it (sk-ant- before sk-).
TOKENS = (
    TokenShape("a Hugging Face token", "hf_", r"[A-Za-z0-9]{30,}"),
    *(TokenShape("a GitHub token", f"gh{kind}_", r"[A-Za-z0-9]{36,}") for kind in "pousr"),
    TokenShape("a GitHub token", "github_pat_", r"[A-Za-z0-9_]{50,}"),
    TokenShape("a GitLab token", "glpat-", r"[A-Za-z0-9_.-]{20,}"),
    TokenShape("an Anthropic API key", "sk-ant-", r"[A-Za-z0-9_-]{32,}"),
    TokenShape("an OpenAI-style API key", "sk-", r"[A-Za-z0-9_-]{32,}"),
    *(TokenShape("a Slack token", f"xox{kind}-", r"[0-9]+-[A-Za-z0-9-]{20,}") for kind in "abprs"),
    TokenShape("an AWS access key id", "AKIA", r"[A-Z0-9]{16}"),
    TokenShape("an AWS access key id", "ASIA", r"[A-Z0-9]{16}"),
    TokenShape("a Google API key", "AIza", r"[A-Za-z0-9_-]{35}"),
)
_TOKEN_PATTERNS = tuple((shape, shape.pattern) for shape in TOKENS)
_RANDOM_RE = re.compile(r"[0-9A-Z]")
# Where a JWT may start (each word start is tried: its parts hold no `.`); the first part must
# decode to a JSON header with "alg", which hostnames and version numbers never do.
_JWT_RE = re.compile(r"(?<![A-Za-z0-9_-])(?=(?P<header>[A-Za-z0-9_-]{10,})\.[A-Za-z0-9_-]{4,}\.)")
# base64 of "-----BEGIN", and of "openssh-key-v1" (an OpenSSH private key's body, armour gone).
_B64_PEM_RE = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/=\s]*")
_OPENSSH_BODY = "b3BlbnNzaC1rZXktdjE"
# Enough base64 to hold the longest "-----BEGIN … PRIVATE KEY-----" line.
_B64_PEM_HEAD = 96
_NETRC_RE = re.compile(
    r"(?:^|\n)[ \t]*(?:machine\s+\S+|default)(?:\s+(?:login|account|port)\s+\S+)*\s+password\s+\S",
)
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")
# Query (and fragment) keys that carry a credential besides the secret name endings: API keys,
# signed-URL signatures (Azure SAS sig=, S3 and GCS X-Amz-/X-Goog-Signature and -Credential).
QUERY_KEYS = frozenset(
    {
        "access_token",
        "token",
        "api_key",
        "apikey",
        "key",
        "password",
        "secret",
        "sig",
        "signature",
        "auth",
        "x-amz-signature",
        "x-amz-credential",
        "x-goog-signature",
        "x-goog-credential",
    }
)
_QUERY_PARAM_RE = re.compile(r"(?<=[?&#;])(?P<key>[^=&#;\s]+)=(?P<value>[^&#;\s]+)")

KEEP_OUT = (
    "user data is readable from the instance's metadata service; pass secrets in a secrets "
    "file on the instance (--secrets-command, docs/cloud.md), or, for a value that is no "
    "secret, name its path with --allow-secret PATH"
)
_NO_KEY = (
    "user data never carries a private key, whatever --allow-secret says (the node joins the "
    "SSH mesh on the next site.yml run from the controller)"
)


@dataclass(frozen=True)
class Finding:
    """A variable that gives a secret away: its path (``gpu_env_extra_env.HF_TOKEN``, ``urls[0]``)
    and what gave it away, in words that never hold the value."""

    path: str
    what: str
    key_material: bool = False  # --allow-secret never lets private key material through

    def __str__(self) -> str:
        return f"variable {self.path} {self.what}"


def secret_name(name: str) -> str:
    """Why ``name`` is a secret's name ("" when it is not): a secret word in it, or at its end."""
    if found := _SECRET_END_RE.search(name):
        return f"its name ends in {found[1].upper()}"
    if found := _SECRET_WORD_RE.search(name):
        return f"its name holds {found[0].lower()!r}"
    return ""


def _secret_query_key(key: str) -> bool:
    return key.lower() in QUERY_KEYS or bool(_SECRET_END_RE.search(key))


def mask_url(text: str) -> str:
    """``text`` with each URL's secrets replaced by ``***`` and nothing else touched:
    ``https://u:***@example.com/simple``, ``https://***@github.com/o/r`` for a bare token,
    ``https://example.com/simple?access_token=***``."""

    def masked_userinfo(found: re.Match[str]) -> str:
        if found["password"] is not None:
            return f"{found['scheme']}{found['user']}:***@"
        return f"{found['scheme']}***@"

    def masked_param(found: re.Match[str]) -> str:
        return f"{found['key']}=***" if _secret_query_key(found["key"]) else found[0]

    def masked_url(found: re.Match[str]) -> str:
        return _QUERY_PARAM_RE.sub(masked_param, found[0])

    return _URL_RE.sub(masked_url, URL_CREDENTIALS_RE.sub(masked_userinfo, text))


def query_credentials(url: str) -> bool:
    """Whether an http(s) URL carries a credential in its query or fragment (non-empty)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    if parts.scheme.lower() not in ("http", "https"):
        return False
    params = parse_qsl(parts.query, keep_blank_values=True)
    params += parse_qsl(parts.fragment, keep_blank_values=True)
    return any(value and _secret_query_key(key) for key, value in params)


def _is_jwt_header(part: str) -> bool:
    try:
        header = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    except ValueError:  # binascii.Error, UnicodeDecodeError and JSONDecodeError among them
        return False
    return isinstance(header, dict) and "alg" in header


def _is_base64_private_key(text: str) -> bool:
    head = re.sub(r"\s", "", text)[:_B64_PEM_HEAD]
    head = head[: len(head) - len(head) % 4]
    try:
        decoded = base64.b64decode(head).decode("latin-1")
    except binascii.Error:
        return False
    return bool(PRIVATE_KEY_RE.search(decoded))


def _key_material(text: str) -> str:
    if PRIVATE_KEY_RE.search(text):
        return "holds private key material"
    if any(_is_base64_private_key(m[0]) for m in _B64_PEM_RE.finditer(text)):
        return "holds a base64-encoded private key (LS0tLS1CRUdJTi…)"
    if re.search(f"{_BEFORE}{_OPENSSH_BODY}", text):
        return f"holds an OpenSSH private key's body ({_OPENSSH_BODY}…)"
    return ""


def value_secret(text: str) -> str:
    """What in ``text`` gives a secret away ("" when nothing does), in words without the secret;
    private key material is ``key_material``'s."""
    for shape, pattern in _TOKEN_PATTERNS:
        if any(_RANDOM_RE.search(m["body"]) for m in pattern.finditer(text)):
            return f"holds what looks like {shape.host} ({shape.prefix}…)"
    if any(_is_jwt_header(m["header"]) for m in _JWT_RE.finditer(text)):
        return "holds what looks like a JSON Web Token (header.payload.signature)"
    if _NETRC_RE.search(text):
        return "holds netrc content with a password (machine … password ***)"
    for url in _URL_RE.findall(text):
        if URL_CREDENTIALS_RE.match(url):
            return f"has credentials in a URL ({mask_url(url)})"
        if query_credentials(url):
            return f"has credentials in a URL's query ({mask_url(url)})"
    return ""


def _findings_at(path: str, name: str | None, value: Any) -> Iterator[Finding]:
    """What gives a secret away at ``path`` itself (its name, its form, its text), not below."""
    filled = value not in (None, "", [], {})
    why = secret_name(name) if name is not None and filled else ""
    if why and path not in NOT_SECRETS:
        yield Finding(path, f"looks like a secret: {why}")
    if isinstance(value, Mapping) and "__ansible_vault" in value:
        yield Finding(path, "is vault-encrypted")
    if isinstance(value, str):
        if what := _key_material(value):
            yield Finding(path, what, key_material=True)
        elif what := value_secret(value):
            yield Finding(path, what)


def _walk(path: str, name: str | None, value: Any) -> Iterator[tuple[str, Finding | None]]:
    """Each path under ``path`` with its findings (None for a path with none)."""
    found = list(_findings_at(path, name, value))
    for finding in found or [None]:
        yield path, finding
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk(f"{path}.{key}", str(key), item)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _walk(f"{path}[{i}]", None, item)


def refuse(variables: Mapping[str, Any], allow: Collection[str] = ()) -> tuple[str, ...]:
    """BadInput naming every secret in ``variables`` at a path ``allow`` does not name (private
    key material at any path), and every path in ``allow`` that is not in ``variables``.
    Returns the allowed paths that held something refused, in order."""
    paths: set[str] = set()
    refused: list[Finding] = []
    allowed: list[str] = []
    for name, value in variables.items():
        for path, finding in _walk(name, name, value):
            paths.add(path)
            if finding is None:
                continue
            if path in allow and not finding.key_material:
                allowed += [] if path in allowed else [path]
            else:
                refused.append(finding)
    unknown = [p for p in allow if p not in paths]
    if unknown:
        raise BadInput(
            f"--allow-secret {', '.join(unknown)}: no such variable in the group's user data "
            "(give the path as the error names it: gpu_env_extra_env.NAME, a_list[0])"
        )
    if refused:
        why = [_NO_KEY] if any(f.key_material for f in refused) else []
        why += [KEEP_OUT] if not all(f.key_material for f in refused) else []
        raise BadInput("; ".join(map(str, refused)) + ": " + "; ".join(why))
    return tuple(allowed)
