"""What an offline bundle holds: a pins file's choices, and the roles' own package lists.

The roles are the one source of package names, and Ansible the one reader of the roles: the
collection's playbook ``playbooks/bundle_packages.yml`` runs each stage role's checks and per-OS
data on localhost against facts pinned to the pins file's distribution, and prints one fact, the
package lists per stage; ``ask_ansible`` reads it from ansible-playbook's JSON output, under a
deadline. Entries that depend on the node itself (``linux-headers-`` of the running kernel)
cannot be known here; the plan lists them so the user can add them by name. The engine takes the
asking function as an argument, so the unit tests hand it a recorded answer.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuenv import proc, tools
from gpuenv.errors import BadInput, GpuenvError

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
    # Packages built from source into the bundle's repository (StagePackages.builds).
    builds: tuple[dict[str, Any], ...] = ()

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


# The stages whose packages a bundle carries, in site.yml's order (the first to name a package is
# its origin in the manifest).
STAGES = ("nvidia_driver", "cuda_toolkit", "nccl", "mpi", "ssh_mesh", "gpu_env")
# The collection's playbook that asks the roles themselves (their defaults, per-OS files, checks).
PLAYBOOK = "playbooks/bundle_packages.yml"
# ansible-playbook on localhost takes about 9 s here; past this its session is killed.
ASK_DEADLINE_S = 180
# What pip needs on a node to build mpi4py from its source (the CUDA-aware Open MPI's mpicc).
SOURCE_BUILD_WHEELS = ("cython", "setuptools", "build")
# A fact only the node knows stands in the package names as this placeholder (never guessed).
NODE_FACT = "<ansible_facts['kernel']>"


@dataclass(frozen=True)
class StagePackages:
    """What one stage role installs on the target, as the role says it."""

    debs: tuple[str, ...]
    wheels: tuple[str, ...]
    method: str = ""  # the install method, for the stages that have one
    # Packages the bundle builds from source (the mpi role's CUDA-aware Open MPI): package,
    # version, file, url, sha256, prefix, configure_args, role.
    builds: tuple[dict[str, Any], ...] = ()


# Asks Ansible for the packages of each stage: (pins file, pinned facts, driver modes, GPU wheels).
Ask = Callable[[Path, dict[str, str], tuple[str, ...], bool], dict[str, StagePackages]]


def target_facts(stem: str) -> dict[str, str]:
    """The facts the roles read, pinned to a pins file's distribution (amd64)."""
    os_name, major, codename, _ = DISTROS[stem]
    version = stem.split("-", 1)[1]
    return {
        "distribution": os_name,
        "distribution_major_version": major,
        "distribution_version": version,
        "distribution_release": codename,
        "os_family": "Debian",
        "architecture": "x86_64",
        "kernel": NODE_FACT,
    }


def ask_ansible(
    pins: Path,
    facts: dict[str, str],
    driver_modes: tuple[str, ...],
    gpu_wheels: bool,
    *,
    root: Path = ROOT,
) -> dict[str, StagePackages]:
    """Run the collection's bundle_packages playbook on localhost against the pinned facts and
    read its one fact from ansible-playbook's JSON output; a role's check that fails is BadInput
    with the role's message."""
    extra = {
        "ansible_facts": facts,
        "bundle_driver_modes": list(driver_modes),
        "bundle_gpu_wheels": gpu_wheels,
        "ansible_python_interpreter": sys.executable,
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
    }
    playbook = tools.find("ansible-playbook") or "ansible-playbook"
    argv = [playbook, "-i", "localhost,", str(root / PLAYBOOK)]
    argv += ["-e", f"@{pins}", "-e", json.dumps(extra)]
    with tempfile.TemporaryDirectory(prefix="gpuenv-bundle-plan-") as work:
        log = Path(work) / "ansible.json"
        done = proc.run(argv, ASK_DEADLINE_S, log, env=env)
        text = log.read_text(errors="replace")
    if done.timed_out:
        raise GpuenvError(f"ansible-playbook {PLAYBOOK} did not finish within {ASK_DEADLINE_S} s")
    return parse_answer(text, done.returncode)


def parse_answer(text: str, returncode: int | None) -> dict[str, StagePackages]:
    """The stages' packages from the playbook's JSON output (ansible.posix.json)."""
    start = text.find("{")
    try:
        doc = json.loads(text[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        doc = {}
    results = [
        (task["task"]["name"], result)
        for play in doc.get("plays", [])
        for task in play.get("tasks", [])
        for result in task.get("hosts", {}).values()
    ]
    for name, result in results:
        if result.get("failed"):
            raise BadInput(f"{name}: {result.get('msg', 'failed')}")
    answer = [r["gpuenv_bundle_packages"] for _, r in results if "gpuenv_bundle_packages" in r]
    if returncode != 0 or not answer:
        raise GpuenvError(
            f"ansible-playbook {PLAYBOOK} gave no package lists (exit {returncode}):\n"
            f"{text[-2000:]}"
        )
    return {
        stage: StagePackages(
            debs=tuple(str(d) for d in entry["debs"]),
            wheels=tuple(str(w) for w in entry["wheels"]),
            method=str(entry.get("method", "")),
            builds=tuple(dict(b) for b in entry.get("builds", [])),
        )
        for stage, entry in answer[-1].items()
    }


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
    ask: Ask | None = None,
) -> Plan:
    """Work out the packages of every stage of site.yml for one pins file, as the roles say.

    Bad input raises BadInput naming what is wrong: an unknown pins name, a role's own check
    (a method its OS does not offer), a method whose packages come from a repository other than
    the distribution's (NVIDIA's: a bundle carries the distribution's archive only), an invalid
    package or requirement name.
    """
    if driver_mode not in DRIVER_MODES:
        raise BadInput(
            f"unknown driver mode {driver_mode!r}: choose one of {', '.join(DRIVER_MODES)}"
        )
    for name in extra_debs:
        if not _DEB_NAME_RE.match(name):
            raise BadInput(f"--deb {name!r} is not a Debian package name")
    for req in extra_wheels + ((torch,) if torch else ()):
        if not _REQ_RE.match(req):
            raise BadInput(f"{req!r} is not a pip requirement (name[extras][==version])")
    stem, pins, pins_path = _pins(pins_name, root)
    os_name, major, codename, python_tag = DISTROS[stem]
    modes = ("userspace", "full") if driver_mode == "both" else (driver_mode,)
    stages = (ask or ask_ansible)(pins_path, target_facts(stem), modes, gpu_wheels)
    missing = [s for s in STAGES if s not in stages]
    if missing:
        raise GpuenvError(f"the roles gave no package list for {', '.join(missing)}")
    for stage, var in (
        ("nvidia_driver", "nvidia_driver_install_method"),
        ("cuda_toolkit", "cuda_toolkit_install_method"),
        ("nccl", "nccl_install_method"),
    ):
        method = stages[stage].method
        if method == "nvidia_repo":
            raise BadInput(
                f"{stem}: {var}=nvidia_repo takes packages from NVIDIA's CUDA repository, which a "
                "bundle does not carry: use a pins file with the distro or pip method, or serve a "
                "copy of NVIDIA's repository (gpuenv_cuda_repo_url)"
            )
        if method == "pip" and stage == "cuda_toolkit":
            raise BadInput(
                f"{stem}: {var}=pip installs CUDA from PyPI wheels; bundles of the pip-installed "
                "toolkit are not supported yet: use the distro method"
            )
    debs: dict[str, str] = {}
    node_specific: list[str] = []
    wheels: list[str] = []
    builds: list[dict[str, Any]] = []
    for stage in STAGES:
        for name in stages[stage].debs:
            if NODE_FACT in name:
                node_specific.append(f"{name} ({stage})")
            elif not _DEB_NAME_RE.match(name):
                raise GpuenvError(f"the {stage} role named {name!r}, which is not a Debian package")
            else:
                debs.setdefault(name, stage)
        wheels += stages[stage].wheels
        builds += stages[stage].builds
    if builds:
        # mpi4py is built on the node against the CUDA-aware Open MPI: its source and what
        # building it needs (gpu_env's packages.yml).
        wheels += list(SOURCE_BUILD_WHEELS)
    if torch:
        wheels.append(torch)
    for name in extra_debs:
        debs.setdefault(name, "extra")
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
        node_specific=tuple(dict.fromkeys(node_specific)),
        origins=dict(sorted(debs.items())),
        with_gpuenv=with_gpuenv,
        mirror=str(pins.get("nvidia_driver_debian_mirror", "")) if os_name == "Debian" else "",
        builds=tuple(builds),
    )


def _pins(name: str, root: Path) -> tuple[str, dict[str, Any], Path]:
    """load_pins, and the file the playbook reads."""
    stem, pins = load_pins(name, root)
    path = Path(name)
    if not (path.suffix in (".yml", ".yaml") and path.exists()):
        path = root / "inventory" / "pins" / f"{name}.yml"
    return stem, pins, path.resolve()
