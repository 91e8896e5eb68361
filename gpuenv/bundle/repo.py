"""The bundle's apt repository: the dependency closure, the Release file, the signing commands.

Pure functions: the build engine runs the commands they return and hands their output back.
The repository is flat (``deb [signed-by=KEY] URL/apt ./``): one Packages index next to the
.deb files, a Release file with its hashes, signed by a key generated for this bundle only.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

ORIGIN = "gpuenv-bundle"
KEY_UID = "gpuenv offline bundle <bundle@gpuenv.invalid>"
KEY_FILE = "gpuenv-bundle.asc"
GNUPGHOME = "/tmp/gpuenv-bundle-gnupg"
# The closure is taken without recommends, as the roles install (install_recommends: false) and
# without the relations apt never installs for.
CLOSURE_FLAGS = (
    "--recurse",
    "--no-recommends",
    "--no-suggests",
    "--no-conflicts",
    "--no-breaks",
    "--no-replaces",
    "--no-enhances",
)


def closure_argv(debs: Sequence[str]) -> list[str]:
    """`apt-cache depends` listing every package the roles' packages can pull in."""
    return ["apt-cache", "depends", *CLOSURE_FLAGS, *debs]


def parse_closure(output: str) -> list[str]:
    """Package names from `apt-cache depends --recurse` output.

    Names stand alone at the start of a line; relation lines are indented, and virtual packages
    (``<debconf-2.0>``) have no file of their own: their providers appear as names too.
    """
    names = {
        line.strip()
        for line in output.splitlines()
        if line and not line[0].isspace() and not line.startswith("<")
    }
    return sorted(n for n in names if n)


def download_argv(names: Sequence[str]) -> list[str]:
    return ["apt-get", "download", "--quiet", *names]


def packages_argv() -> list[str]:
    """Run in the repository folder: the index of every .deb in it."""
    return ["apt-ftparchive", "packages", "."]


@dataclass(frozen=True)
class Suite:
    codename: str
    architectures: tuple[str, ...] = ("amd64", "all")


def release_text(
    files: Mapping[str, bytes], suite: Suite, date: datetime, label: str = ORIGIN
) -> str:
    """A Release file (Debian repository format) over the index files given, name -> content."""
    lines = [
        f"Origin: {ORIGIN}",
        f"Label: {label}",
        f"Suite: {suite.codename}",
        f"Codename: {suite.codename}",
        f"Date: {date.strftime('%a, %d %b %Y %H:%M:%S %z').replace('+0000', 'UTC')}",
        f"Architectures: {' '.join(suite.architectures)}",
        "Description: gpuenv offline bundle (packages of site.yml for one pins file)",
    ]
    for field, algo in (("MD5Sum", "md5"), ("SHA256", "sha256"), ("SHA512", "sha512")):
        lines.append(f"{field}:")
        for name in sorted(files):
            content = files[name]
            digest = hashlib.new(algo, content).hexdigest()
            lines.append(f" {digest} {len(content):>16} {name}")
    return "\n".join(lines) + "\n"


def gzip_bytes(content: bytes) -> bytes:
    """Reproducible gzip (no name, no time), as apt-ftparchive writes Packages.gz."""
    return gzip.compress(content, compresslevel=9, mtime=0)


def write_argv(path: str, content: str) -> list[str]:
    """Write a file in the container (the content passed as an argument, never parsed by sh)."""
    return ["sh", "-c", 'printf "%s" "$1" > "$0"', path, content]


def keygen_argv() -> list[str]:
    """A signing-only key with no passphrase, in a throwaway GNUPGHOME (made 0700 first)."""
    return [
        "gpg",
        "--batch",
        "--homedir",
        GNUPGHOME,
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
        "--quick-gen-key",
        KEY_UID,
        "ed25519",
        "sign",
        "never",
    ]


def export_key_argv(dest: str) -> list[str]:
    return ["gpg", "--batch", "--homedir", GNUPGHOME, "--armor", "--output", dest, "--export"]


def fingerprint_argv() -> list[str]:
    return ["gpg", "--batch", "--homedir", GNUPGHOME, "--with-colons", "--list-secret-keys"]


def parse_fingerprint(colons: str) -> str:
    """The primary key's fingerprint from `gpg --with-colons` output."""
    seen_sec = False
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            seen_sec = True
        elif fields[0] == "fpr" and seen_sec:
            return fields[9]
    raise ValueError("no secret key fingerprint in gpg's output")


def sign_argvs(release: str) -> list[list[str]]:
    """InRelease (clear-signed) and Release.gpg (detached), both from the Release file."""
    base = ["gpg", "--batch", "--yes", "--homedir", GNUPGHOME, "--digest-algo", "SHA512"]
    return [
        [*base, "--clearsign", "--output", f"{_dir(release)}InRelease", release],
        [*base, "--armor", "--detach-sign", "--output", f"{release}.gpg", release],
    ]


def _dir(path: str) -> str:
    return path[: path.rfind("/") + 1]
