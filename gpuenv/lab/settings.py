"""Names, paths and input validation for the lab; no docker access here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpuenv.errors import BadInput
from gpuenv.floor import sources

DISTROS = ("trixie", "bookworm")
# The GPU stack each lab distro converges with: the project's pins file, copied into the lab's
# group_vars: a plain `ansible-playbook site.yml -i inventory/lab/hosts.yml` passes preflight.
PINS_DIR = Path(__file__).resolve().parents[2] / "inventory" / "pins"
DISTRO_PINS = {"trixie": "debian-13.yml", "bookworm": "debian-12.yml"}
DEFAULT_DISTRO = "trixie"
# The cache container runs on this distro's base whatever the nodes run: `make demo`'s (Debian 12),
# so the demo's first run debootstraps one distro, not two.
CACHE_DISTRO = "bookworm"
DEFAULT_LAB = "gpuenv"
MAX_NODES = 32
DEFAULT_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The mirror presets are the sources floor's (plugins/module_utils/sources.py, one table): the lab
# debootstraps from the chosen preset's Debian mirror and hands the preset to the roles
# (gpuenv_sources_preset), which point apt and pip at it. `--mirror` beats the environment.
MIRROR_ENV = "GPUENV_MIRROR"
DEFAULT_MIRROR = sources.DEFAULT_PRESET
MIRROR_PRESETS = tuple(sources.PRESETS)
MIRROR = str(sources.PRESETS[DEFAULT_MIRROR]["debian"]["mirror"])

APT_PROXY_URL = "http://apt-cache:3142"
WHEELHOUSE_URL = "http://apt-cache:8080/"
CACHE_ALIAS = "apt-cache"

# Docker labels that mark every object the lab owns.
LABEL_OWNER = "gpuenv.owner"
LABEL_RECIPE = "gpuenv.recipe"
LABEL_LAB = "gpuenv.lab"
LABEL_NODE = "gpuenv.node"
LABEL_DISTRO = "gpuenv.distro"

_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,19}(-[a-z0-9]{1,19}){0,3}$")


@dataclass(frozen=True)
class Names:
    """Docker object names, derived from one prefix (``gpuenv`` unless ``GPUENV_LAB_PREFIX``).

    A different prefix gives a fully separate set of images, cache and networks, which the
    cold-start benchmark uses so it never disturbs a lab or molecule run in progress.
    """

    prefix: str = "gpuenv"

    @classmethod
    def from_env(cls) -> Names:
        prefix = os.environ.get("GPUENV_LAB_PREFIX", "gpuenv")
        if not _NAME_RE.match(prefix):
            raise BadInput(f"GPUENV_LAB_PREFIX={prefix!r} is not a valid name (lowercase, a-z0-9-)")
        return cls(prefix)

    def base_image(self, distro: str) -> str:
        return f"{self.prefix}/base:{distro}"

    def node_image(self, distro: str) -> str:
        return f"{self.prefix}/node:{distro}"

    @property
    def cache_image(self) -> str:
        return f"{self.prefix}/cache:{CACHE_DISTRO}"

    @property
    def cache_container(self) -> str:
        return f"{self.prefix}-cache"

    @property
    def cache_volume(self) -> str:
        return f"{self.prefix}-apt-cache"

    @property
    def molecule_network(self) -> str:
        return f"{self.prefix}-molecule"


@dataclass(frozen=True)
class LabPaths:
    """Files a lab writes on the controller, relative to the project root."""

    root: Path
    name: str

    @property
    def inventory_dir(self) -> Path:
        sub = "lab" if self.name == DEFAULT_LAB else f"lab-{self.name}"
        return self.root / "inventory" / sub

    @property
    def hosts_file(self) -> Path:
        return self.inventory_dir / "hosts.yml"

    @property
    def pins_file(self) -> Path:
        """The lab distro's pins, as group_vars every lab node reads."""
        return self.inventory_dir / "group_vars" / "all" / "pins.yml"

    @property
    def known_hosts(self) -> Path:
        return self.inventory_dir / "known_hosts"

    @property
    def host_key_record(self) -> Path:
        """Where the ssh_mesh role records this cluster's host keys (named after the inventory
        folder). A lab that is taken down and brought up again has new host keys: the old
        record must go with the old nodes, or the next run reports every node as re-keyed."""
        return self.root / ".gpuenv" / "ssh" / self.inventory_dir.name / "host_keys.yml"

    @property
    def key_dir(self) -> Path:
        return self.root / ".gpuenv" / "lab" / self.name

    @property
    def private_key(self) -> Path:
        return self.key_dir / "id_ed25519"

    @property
    def fact_cache(self) -> Path:
        return self.root / ".cache" / "facts"


def cache_dir(root: Path) -> Path:
    """Where debootstrap tarballs and the wheelhouse live (git-ignored)."""
    return root / ".cache" / "lab"


def wheelhouse_dir(root: Path) -> Path:
    """Wheels put here are served to lab nodes at ``WHEELHOUSE_URL``: the checkout's link to
    the machine's one wheel folder (``shared_wheelhouse``, see ``link_wheelhouse``)."""
    return cache_dir(root) / "wheels"


WHEELHOUSE_ENV = "GPUENV_LAB_WHEELHOUSE"


def shared_wheelhouse() -> Path:
    """The wheel folder the cache container serves, one per machine whatever the checkout:
    ``$GPUENV_LAB_WHEELHOUSE``, else ``$XDG_CACHE_HOME/gpuenv/lab-wheels`` (``~/.cache``)."""
    given = os.environ.get(WHEELHOUSE_ENV)
    if given:
        return Path(given).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return (Path(base) / "gpuenv" / "lab-wheels").resolve()


def link_wheelhouse(root: Path, shared: Path) -> Path:
    """Make the checkout's ``.cache/lab/wheels`` a link to ``shared`` and return ``shared``.

    The cache container is shared by every checkout on the machine, so it serves one folder;
    a checkout's wheels (a folder from before, or from `pip download -d .cache/lab/wheels`
    run before the first `lab up`) move into it, where a wheel of the same name already
    present is kept. Writes through the old path keep working and are served at once.
    """
    shared.mkdir(parents=True, exist_ok=True)
    local = wheelhouse_dir(root)
    if local.is_symlink():
        if local.resolve() == shared:
            return shared
        local.unlink()
    elif local.is_dir():
        _merge_into(local, shared)
        local.rmdir()
    elif local.exists():
        raise BadInput(f"{local} is a file; the lab's wheel folder link goes there: remove it")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.symlink_to(shared, target_is_directory=True)
    return shared


def _merge_into(source: Path, target: Path) -> None:
    """Move the tree ``source`` into ``target``; names already in ``target`` win."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.iterdir()):
        dest = target / entry.name
        if entry.is_dir() and not entry.is_symlink():
            _merge_into(entry, dest)
            entry.rmdir()
        elif dest.exists():
            entry.unlink()
        else:
            os.replace(entry, dest)


def validate_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise BadInput(
            f"lab name {name!r} is not valid: use lowercase letters, digits and single dashes, "
            "starting with a letter (e.g. 'gpuenv', 'lab2')"
        )
    return name


def validate_nodes(value: str | int) -> int:
    try:
        nodes = int(value)
    except (TypeError, ValueError):
        raise BadInput(
            f"--nodes must be a whole number from 1 to {MAX_NODES}, got {value!r}"
        ) from None
    if not 1 <= nodes <= MAX_NODES:
        raise BadInput(f"--nodes must be from 1 to {MAX_NODES}, got {nodes}")
    return nodes


def validate_distro(distro: str) -> str:
    if distro not in DISTROS:
        raise BadInput(f"unknown distro {distro!r}: choose one of {', '.join(DISTROS)}")
    return distro


def validate_mirror(name: str | None) -> str:
    """The mirror preset to use: ``name`` (the option) or $GPUENV_MIRROR, else the default."""
    chosen = name if name is not None else os.environ.get(MIRROR_ENV) or DEFAULT_MIRROR
    if chosen not in sources.PRESETS:
        origin = "--mirror" if name is not None else MIRROR_ENV
        raise BadInput(
            f"{origin}={chosen!r} is not a known mirror preset;"
            f" valid: {', '.join(sorted(sources.PRESETS))}"
        )
    return chosen


def debian_mirror(preset: str) -> str:
    """The Debian archive root of a mirror preset (debootstrap's MIRROR argument)."""
    return str(sources.PRESETS[preset]["debian"]["mirror"])


def node_name(lab: str, index: int) -> str:
    """Container name, hostname and inventory name of a lab node: ``<lab>-node<i>``."""
    return f"{lab}-node{index}"


def resolve_node(lab: str, node: str) -> str:
    """Accept ``node2`` or ``<lab>-node2``; return the full node name."""
    short = re.fullmatch(r"node([1-9][0-9]*)", node)
    if short:
        return node_name(lab, int(short.group(1)))
    if re.fullmatch(rf"{re.escape(lab)}-node[1-9][0-9]*", node):
        return node
    raise BadInput(f"no node {node!r} in lab {lab!r}: use node<N> or {lab}-node<N>")
