"""What goes into the lab images, as data: package lists, files, Dockerfiles, recipe hashes.

Pure functions, no docker: the hash of a recipe is stored as an image label, and an image is
rebuilt only when the hash of what would be built differs from the label.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv.errors import BadInput
from gpuenv.lab.settings import APT_PROXY_URL, CACHE_ALIAS, MIRROR

# Bump when the way images are built changes in a way the data below does not show.
RECIPE_VERSION = 1

# What a node needs to be a quick Ansible target that behaves like a machine.
NODE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "libpam-systemd",
    "openssh-server",
    "openssh-client",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "iputils-ping",
    "ca-certificates",
    "procps",
    "netbase",
    "less",
)
CACHE_PACKAGES = ("apt-cacher-ng",)
ADMIN_USER = "admin"
ADMIN_UID = 1000
LOCAL_CA_DIR = "/usr/local/share/ca-certificates/gpuenv"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"

# Lab nodes are throwaway containers: dpkg skips the fsync after each unpacked file and the
# manuals and documentation (copyright files stay), apt fetches no translated descriptions.
# Image settings only: the roles and what a real node gets are unchanged (docs/lab.md).
LAB_DPKG_CFG = """# gpuenv lab node (a throwaway container), not for real machines.
force-unsafe-io
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
"""
LAB_APT_CONF = 'Acquire::Languages "none";\n'

_PEM_RE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?-----END CERTIFICATE-----", re.DOTALL)


@dataclass(frozen=True)
class File:
    path: str  # inside the image, relative to /
    content: bytes
    mode: int = 0o644


@dataclass(frozen=True)
class BaseRecipe:
    """A debootstrap'ed root file system."""

    distro: str
    packages: tuple[str, ...]
    mirror: str = MIRROR
    variant: str = "minbase"

    def digest(self) -> str:
        return _digest(
            {
                "v": RECIPE_VERSION,
                "distro": self.distro,
                "mirror": self.mirror,
                "variant": self.variant,
                "packages": sorted(self.packages),
            }
        )

    def debootstrap_argv(self, target: Path) -> list[str]:
        return [
            "debootstrap",
            f"--variant={self.variant}",
            f"--include={','.join(sorted(self.packages))}",
            self.distro,
            str(target),
            self.mirror,
        ]


@dataclass(frozen=True)
class LayerRecipe:
    """A Dockerfile plus the files it copies, layered on a base image."""

    base_image: str
    base_digest: str
    dockerfile: str
    files: tuple[File, ...] = field(default_factory=tuple)

    def digest(self) -> str:
        return _digest(
            {
                "v": RECIPE_VERSION,
                "base": self.base_digest,
                "dockerfile": self.dockerfile,
                "files": {
                    f.path: [hashlib.sha256(f.content).hexdigest(), f.mode] for f in self.files
                },
            }
        )

    def context(self) -> bytes:
        """The docker build context, as an uncompressed tar."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            _add(tar, "Dockerfile", self.dockerfile.encode(), 0o644)
            for f in self.files:
                _add(tar, f"rootfs/{f.path}", f.content, f.mode)
        return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, content: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = mode
    info.mtime = 0  # a stable context, so docker's build cache can be reused
    tar.addfile(info, io.BytesIO(content))


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def split_ca_bundle(bundle: bytes, source: str) -> list[bytes]:
    """Split a PEM bundle into single certificates (update-ca-certificates wants one a file)."""
    certs = [m.group(0).replace(b"\r\n", b"\n") + b"\n" for m in _PEM_RE.finditer(bundle)]
    if not certs:
        raise BadInput(f"CA bundle {source} holds no PEM certificate")
    return certs


def read_ca_bundle(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read the CA bundle {path}: {exc.strerror}") from None
    return split_ca_bundle(data, str(path))


def base_recipe(distro: str, *, cache: bool = False, mirror: str = MIRROR) -> BaseRecipe:
    """The base of ``distro``, debootstrapped from ``mirror`` (a Debian archive root). The
    mirror is part of the recipe: the image's apt sources name it."""
    return BaseRecipe(distro, NODE_PACKAGES, mirror)


_APT_PROXY_DETECT = f"""#!/bin/bash
# Print the lab's apt cache when this node can reach it, else DIRECT, so the same image
# works inside a lab (cache reachable as '{CACHE_ALIAS}') and anywhere else.
if getent hosts {CACHE_ALIAS} >/dev/null 2>&1 \\
    && timeout 2 bash -c 'exec 3<>/dev/tcp/{CACHE_ALIAS}/3142' 2>/dev/null; then
  echo {APT_PROXY_URL}
else
  echo DIRECT
fi
"""

_HOSTKEYS_UNIT = """[Unit]
Description=Generate this node's SSH host keys (never baked into the image)
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target ssh.service
"""

_SSHD_CONFIG = """# gpuenv lab: key-only logins; the admin user's key is placed by `gpuenv lab up`.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UseDNS no
"""

_NODE_DOCKERFILE = """FROM {base}
ENV container=docker LANG=C.UTF-8
COPY rootfs/ /
RUN set -eux; \\
    useradd --uid {uid} --create-home --shell /bin/bash {user}; \\
    usermod -p '*' {user}; \\
    install -d -m 0700 -o {user} -g {user} /home/{user}/.ssh; \\
    chmod 0440 /etc/sudoers.d/{user}; \\
    update-ca-certificates >/dev/null; \\
    rm -f /etc/ssh/ssh_host_*; \\
    : > /etc/machine-id; rm -f /var/lib/dbus/machine-id; \\
    systemctl enable gpuenv-ssh-hostkeys.service ssh.service; \\
    systemctl mask getty@tty1.service console-getty.service systemd-firstboot.service \\
        systemd-udevd.service systemd-modules-load.service sys-kernel-config.mount \\
        sys-kernel-debug.mount sys-kernel-tracing.mount sshd-keygen.service \\
        apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer fstrim.timer; \\
    apt-get clean
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
"""

_CACHE_ENTRYPOINT = """#!/bin/sh
# apt-cacher-ng on 3142 and the wheelhouse (bind-mounted at /srv/wheels) on 8080.
set -eu
install -d -o apt-cacher-ng -g apt-cacher-ng /var/cache/apt-cacher-ng /var/log/apt-cacher-ng \\
    /run/apt-cacher-ng
# The cache volume outlives the image: one built on another distribution gave apt-cacher-ng
# another uid, and its files would be unwritable ("Cannot create cache files").
find /var/cache/apt-cacher-ng ! -user apt-cacher-ng -exec chown -h apt-cacher-ng:apt-cacher-ng {} +
mkdir -p /srv/wheels
python3 -m http.server 8080 --bind 0.0.0.0 --directory /srv/wheels &
exec setpriv --reuid apt-cacher-ng --regid apt-cacher-ng --init-groups \\
    /usr/sbin/apt-cacher-ng -c /etc/apt-cacher-ng ForeGround=1
"""

_CACHE_DOCKERFILE = """FROM {base}
ENV LANG=C.UTF-8
RUN set -eux; \\
    apt-get update -o Acquire::Languages=none; \\
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
        -o Dpkg::Options::=--force-unsafe-io {packages}; \\
    apt-get clean; rm -rf /var/lib/apt/lists/*
COPY rootfs/ /
EXPOSE 3142 8080
CMD ["/usr/local/bin/gpuenv-cache"]
"""


def node_recipe(base_image: str, base: BaseRecipe, ca_certs: list[bytes]) -> LayerRecipe:
    files = [
        File("usr/local/lib/gpuenv/apt-proxy-detect", _APT_PROXY_DETECT.encode(), 0o755),
        File(
            "etc/apt/apt.conf.d/01gpuenv-proxy",
            b'Acquire::http::Proxy-Auto-Detect "/usr/local/lib/gpuenv/apt-proxy-detect";\n',
        ),
        File("etc/systemd/system/gpuenv-ssh-hostkeys.service", _HOSTKEYS_UNIT.encode()),
        File("etc/ssh/sshd_config.d/gpuenv.conf", _SSHD_CONFIG.encode()),
        File(
            f"etc/sudoers.d/{ADMIN_USER}",
            f"{ADMIN_USER} ALL=(ALL) NOPASSWD:ALL\n".encode(),
            0o440,
        ),
        File("etc/pip.conf", f"[global]\ncert = {SYSTEM_BUNDLE}\n".encode()),
        File("etc/dpkg/dpkg.cfg.d/gpuenv-lab", LAB_DPKG_CFG.encode()),
        File("etc/apt/apt.conf.d/02gpuenv-lab", LAB_APT_CONF.encode()),
    ]
    files += [
        File(f"{LOCAL_CA_DIR.lstrip('/')}/controller-{i:03d}.crt", cert)
        for i, cert in enumerate(ca_certs)
    ]
    dockerfile = _NODE_DOCKERFILE.format(base=base_image, uid=ADMIN_UID, user=ADMIN_USER)
    return LayerRecipe(base_image, base.digest(), dockerfile, tuple(files))


def cache_recipe(base_image: str, base: BaseRecipe) -> LayerRecipe:
    files = (File("usr/local/bin/gpuenv-cache", _CACHE_ENTRYPOINT.encode(), 0o755),)
    dockerfile = _CACHE_DOCKERFILE.format(base=base_image, packages=" ".join(CACHE_PACKAGES))
    return LayerRecipe(base_image, base.digest(), dockerfile, files)
