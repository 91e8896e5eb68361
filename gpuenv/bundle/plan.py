"""What an offline bundle holds, worked out from a pins file and the roles' own package tables.

Pure: no docker, no network. The roles are the one source of package names: a pins file picks
the install methods and versions, and each role's ``vars/<OS>-<major>.yml`` (or ``vars/<OS>.yml``)
names the packages of that method. Entries that depend on the node itself (``linux-headers-`` of
the running kernel) cannot be known here; the plan lists them so the user can add them by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpuenv.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]

# The distributions a bundle is built for: pins file stem -> (OS, major, codename, Python tag).
DISTROS: dict[str, tuple[str, str, str, str]] = {
    "debian-12": ("Debian", "12", "bookworm", "cp311"),
    "debian-13": ("Debian", "13", "trixie", "cp313"),
    "ubuntu-22.04": ("Ubuntu", "22", "jammy", "cp310"),
    "ubuntu-24.04": ("Ubuntu", "24", "noble", "cp312"),
}
DRIVER_MODES = ("userspace", "full", "both")
# The archive a node installs from once the roles ran: for Debian, the distribution's base entry
# plus the one the apt_pin role adds (contrib, non-free); Ubuntu images enable all four components.
ARCHIVES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "Debian": (
        "http://deb.debian.org/debian",
        ("{codename}", "{codename}-updates"),
        ("main", "contrib", "non-free", "non-free-firmware"),
    ),
    "Ubuntu": (
        "http://archive.ubuntu.com/ubuntu",
        ("{codename}", "{codename}-updates", "{codename}-security"),
        ("main", "restricted", "universe", "multiverse"),
    ),
}
# Debian package names; a wrong one would fail deep inside apt, so refuse it here.
_DEB_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")
# pip requirement: a project name, optionally extras and a version specifier.
_REQ_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?([<>=!~]=?[^\s;]+)?$")


@dataclass(frozen=True)
class Plan:
    """Everything a build needs to know, decided before anything runs."""

    pins_name: str
    pins: dict[str, Any]
    os: str
    major: str
    codename: str
    python_tag: str
    debs: tuple[str, ...]
    wheels: tuple[str, ...]
    # Packages a role installs whose name depends on the node (kernel headers), unresolved.
    node_specific: tuple[str, ...] = ()
    # Where each deb entry came from, for the manifest (package -> role).
    origins: dict[str, str] = field(default_factory=dict)
    with_gpuenv: bool = True
    mirror: str = ""

    def build_sources(self) -> str:
        """The deb822 entry the build container downloads from (the nodes' archive)."""
        mirror, suites, components = ARCHIVES[self.os]
        keyring = f"/usr/share/keyrings/{self.os.lower()}-archive-keyring.gpg"
        return (
            f"Types: deb\nURIs: {self.mirror or mirror}\n"
            f"Suites: {' '.join(s.format(codename=self.codename) for s in suites)}\n"
            f"Components: {' '.join(components)}\nSigned-By: {keyring}\n"
        )


def pins_names(root: Path = ROOT) -> list[str]:
    return sorted(p.stem for p in (root / "inventory" / "pins").glob("*.yml"))


def load_pins(name: str, root: Path = ROOT) -> tuple[str, dict[str, Any]]:
    """A pins file by name (``debian-12``) or by path; returns (distro key, its variables)."""
    path = Path(name)
    if path.suffix in (".yml", ".yaml") and path.exists():
        stem = path.stem
    else:
        stem = name
        path = root / "inventory" / "pins" / f"{name}.yml"
    if stem not in DISTROS:
        raise BadInput(
            f"unknown pins {name!r}: choose one of {', '.join(pins_names(root))} "
            "(a pins file's name says its distribution)"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise BadInput(f"cannot read the pins file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise BadInput(f"the pins file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"the pins file {path} must be a mapping of role variables")
    return stem, data


def _role_vars(root: Path, role: str, os_name: str, major: str) -> dict[str, Any]:
    """The role's defaults overlaid with its OS vars file, as the role's first_found picks it."""
    base = root / "roles" / role
    merged: dict[str, Any] = {}
    for part in ("defaults/main.yml", "vars/main.yml"):
        merged.update(yaml.safe_load((base / part).read_text()) or {})
    # Ubuntu falls back on its family's file, as the roles' first_found does.
    for candidate in (f"vars/{os_name}-{major}.yml", f"vars/{os_name}.yml", "vars/Debian.yml"):
        if (base / candidate).exists():
            merged.update(yaml.safe_load((base / candidate).read_text()) or {})
            break
    return merged


class _Renderer:
    """Renders the roles' small Jinja expressions against the pins; node facts stay unknown."""

    def __init__(self, context: dict[str, Any]) -> None:
        self._env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
        self._context = context

    def name(self, value: str) -> str | None:
        """The rendered package name, or None when it needs something only a node knows."""
        if "{{" not in value:
            return value
        try:
            return self._env.from_string(value).render(self._context)
        except jinja2.UndefinedError:
            return None


def _method(pins: dict[str, Any], defaults: dict[str, Any], var: str) -> str:
    return str(pins.get(var, defaults.get(var)))


def plan_bundle(
    pins_name: str,
    *,
    root: Path = ROOT,
    driver_mode: str = "both",
    extra_debs: tuple[str, ...] = (),
    extra_wheels: tuple[str, ...] = (),
    torch: str = "",
    gpu_wheels: bool = True,
    with_gpuenv: bool = True,
) -> Plan:
    """Work out the packages of every stage of site.yml for one pins file.

    Bad input raises BadInput naming what is wrong: an unknown pins name, a method whose packages
    come from a repository other than the distribution's (NVIDIA's: a bundle carries the
    distribution's archive only), an invalid package or requirement name.
    """
    if driver_mode not in DRIVER_MODES:
        raise BadInput(
            f"unknown driver mode {driver_mode!r}: choose one of {', '.join(DRIVER_MODES)}"
        )
    stem, pins = load_pins(pins_name, root)
    os_name, major, codename, python_tag = DISTROS[stem]
    render = _Renderer(dict(pins))
    debs: dict[str, str] = {}
    node_specific: list[str] = []
    wheels: list[str] = []

    def add(names: list[str], role: str) -> None:
        for raw in names:
            name = render.name(str(raw))
            if name is None:
                shown = re.sub(r"\{\{\s*(.*?)\s*\}\}", r"<\1>", str(raw))
                node_specific.append(f"{shown} ({role})")
            else:
                debs.setdefault(name, role)

    drv = _role_vars(root, "nvidia_driver", os_name, major)
    cuda = _role_vars(root, "cuda_toolkit", os_name, major)
    nccl = _role_vars(root, "nccl", os_name, major)
    for role, table, var in (
        ("nvidia_driver", drv["__nvidia_driver_os"], "nvidia_driver_install_method"),
        ("cuda_toolkit", cuda["__cuda_toolkit_os"], "cuda_toolkit_install_method"),
        ("nccl", nccl["__nccl_os"], "nccl_install_method"),
    ):
        defaults = {"nvidia_driver": drv, "cuda_toolkit": cuda, "nccl": nccl}[role]
        method = _method(pins, defaults, var)
        if method == "nvidia_repo":
            raise BadInput(
                f"{stem}: {var}=nvidia_repo takes packages from NVIDIA's CUDA repository, which a "
                "bundle does not carry: use a pins file with the distro or pip method, or serve a "
                "copy of NVIDIA's repository (gpuenv_cuda_repo_url)"
            )
        if method not in table:
            raise BadInput(f"{stem}: {var}={method} is not offered on {os_name} {major}")
        row = table[method]
        if role == "nvidia_driver":
            modes = ("userspace", "full") if driver_mode == "both" else (driver_mode,)
            for mode in modes:
                add(list(row["pinned"][mode]) + list(row["extra"][mode]), role)
        elif method == "pip" and role == "nccl":
            build = nccl["__nccl_pip_builds"][_cuda_major(pins, cuda)]
            version = str(pins.get("nccl_version", nccl.get("nccl_version")))
            spec = f"=={version}" if version.count(".") == 2 else f"=={version}.*"
            wheels.append(f"{build['package']}{spec}")
            add(["python3-venv", "python3-packaging"], role)
        elif method == "pip":
            raise BadInput(
                f"{stem}: {var}=pip installs CUDA from PyPI wheels; bundles of the pip-installed "
                "toolkit are not supported yet: use the distro method"
            )
        else:
            add(list(row.get("packages", [])) + list(row.get("extra", [])), role)

    mpi = _role_vars(root, "mpi", os_name, major)
    add(list(mpi.get("__mpi_distro_packages", [])), "mpi")
    ssh = _role_vars(root, "ssh_mesh", os_name, major)
    add(list(ssh.get("__ssh_mesh_packages", [])), "ssh_mesh")
    env = _role_vars(root, "gpu_env", "Debian", "")
    add(list(env["__gpu_env_os_packages_by_family"]["Debian"]), "gpu_env")
    add(list(env["__gpu_env_build_packages_by_family"]["Debian"]), "gpu_env")
    wheels += [str(p) for p in env["gpu_env_packages"]]
    if gpu_wheels:
        wheels += [str(p) for p in env["gpu_env_gpu_packages"]]
        cupy = str(pins.get("gpu_env_cupy_version", env["gpu_env_cupy_version"]))
        if cupy:
            wheels.append(f"cupy-cuda{_cuda_major(pins, cuda)}x=={cupy}")
    if torch:
        wheels.append(torch)
    for name in extra_debs:
        if not _DEB_NAME_RE.match(name):
            raise BadInput(f"--deb {name!r} is not a Debian package name")
        debs.setdefault(name, "extra")
    for req in extra_wheels + ((torch,) if torch else ()):
        if not _REQ_RE.match(req):
            raise BadInput(f"{req!r} is not a pip requirement (name[extras][==version])")
    wheels += list(extra_wheels)
    return Plan(
        pins_name=stem,
        pins=pins,
        os=os_name,
        major=major,
        codename=codename,
        python_tag=python_tag,
        debs=tuple(sorted(debs)),
        wheels=tuple(dict.fromkeys(wheels)),
        node_specific=tuple(node_specific),
        origins=dict(sorted(debs.items())),
        with_gpuenv=with_gpuenv,
        mirror=str(pins.get("nvidia_driver_debian_mirror", "")) if os_name == "Debian" else "",
    )


def _cuda_major(pins: dict[str, Any], cuda: dict[str, Any]) -> str:
    version = str(pins.get("cuda_toolkit_version", cuda.get("cuda_toolkit_version")))
    return version.split(".")[0]
