"""Build an offline bundle: run the plan's steps in a container of the target distribution.

The engine only sees an ``Executor`` (run a command in the build container, get its output) and
the output folder, so the unit tests hand it a fake; gpuenv.bundle.container runs it in docker.

Layout of the output folder (serve it as is over HTTP; docs/sources.md, "Offline bundle"):

    apt/pool/*.deb            every package of the closure, and the packages built from source
                              (the mpi role's CUDA-aware Open MPI: Plan.builds)
    src/                      the sources those were built from (checked against their SHA-256)
    apt/Packages(.gz)         the index
    apt/Release, InRelease, Release.gpg
    wheels/*.whl              the Python packages, built for the distribution's Python
    gpuenv-bundle.asc         the public key nodes trust for this repository (signed-by)
    bundle.json               what was asked, what is inside, the key's fingerprint
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpuenv import proc
from gpuenv.bundle import repo
from gpuenv.bundle.plan import ROOT, Plan
from gpuenv.errors import BadInput, GpuenvError
from gpuenv.progress import Progress

# Where the output folder is mounted in the build container.
MOUNT = "/bundle"
# Where a controller folder of wheels (--find-links) is mounted, read-only.
FIND_LINKS_MOUNT = "/find-links"
# What the build container needs besides the packages themselves: the repository tools, gpg, and
# what building the wheels needs (mpi4py compiles against the distribution's Open MPI).
BUILD_TOOLS = ("apt-utils", "gnupg", "python3-venv", "python3-dev", "gcc", "libopenmpi-dev")
MANIFEST_VERSION = 1
# Building gpuenv's own wheel on the controller (seconds here); past this its session is killed.
WHEEL_DEADLINE_S = 600


class Executor(Protocol):
    def run(self, argv: Sequence[str], *, cwd: str = "/") -> str:
        """Run argv in the build container; return stdout, raise GpuenvError on failure."""


@dataclass(frozen=True)
class Manifest:
    kind: str
    schema_version: int
    pins: str
    pins_vars: dict[str, object]
    distribution: str
    codename: str
    requested_debs: list[str]
    node_specific: list[str]
    debs: list[str]
    deb_bytes: int
    wheels_requested: list[str]
    wheels: list[str]
    wheel_bytes: int
    key_fingerprint: str
    created_at: str
    built: list[str] = field(default_factory=list)  # apt/pool files built from source


def validate_output(output: Path) -> Path:
    """The output folder: its parent exists, and it is new or empty (nothing is overwritten)."""
    output = output.expanduser()
    parent = output.resolve().parent
    if not parent.is_dir():
        raise BadInput(f"the output folder's parent {parent} does not exist")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise BadInput(f"the output {output} exists and is not an empty folder")
    return output.resolve()


def build_bundle(
    plan: Plan,
    output: Path,
    executor: Executor,
    progress: Progress,
    *,
    now: datetime | None = None,
    root: Path = ROOT,
    find_links: bool = False,
) -> Manifest:
    """Fill ``output`` (mounted at MOUNT in the executor's container) with the bundle."""
    apt_dir = output / "apt"
    (apt_dir / "pool").mkdir(parents=True, exist_ok=True)
    (output / "wheels").mkdir(exist_ok=True)

    progress.begin("tools", f"apt tools, gpg and build tools in the {plan.codename} container")
    executor.run(
        repo.write_argv("/etc/apt/sources.list.d/gpuenv-bundle-build.sources", plan.build_sources())
    )
    executor.run(["apt-get", "update", "--quiet"])
    executor.run(
        ["apt-get", "install", "--quiet", "--yes", "--no-install-recommends", *BUILD_TOOLS]
    )
    progress.end("tools")

    built = [_build(executor, output, build, progress) for build in plan.builds]
    wanted_debs = list(plan.debs) + [d for b in built for d in b.depends]

    progress.begin("debs", f"dependency closure of {len(wanted_debs)} packages")
    names = repo.parse_closure(executor.run(repo.closure_argv(wanted_debs)))
    missing = sorted(set(wanted_debs) - set(names))
    if missing:
        raise GpuenvError(
            f"not in the {plan.codename} archive the build container reads: {', '.join(missing)}"
            f"\n(its source:\n{plan.build_sources()})"
        )
    progress.update("debs", f"{len(names)} packages to download")
    executor.run(repo.download_argv(names), cwd=f"{MOUNT}/apt/pool")
    progress.end("debs", f"{len(names)} packages")

    progress.begin("index", "Packages, Release, key and signatures")
    when = now or datetime.now(UTC)
    fingerprint = write_signed_index(executor, output, plan.codename, when)
    progress.end("index", f"signed by {fingerprint}")

    progress.begin("verify", "apt reads the bundle alone and resolves every package")
    _verify_apt(executor, plan, [str(b["package"]) for b in plan.builds])
    progress.end("verify")

    progress.begin("wheels", f"wheels for {plan.python_tag}: {', '.join(plan.wheels)}")
    wanted = list(plan.wheels)
    if plan.builds:
        # mpi4py's source: GPU nodes build it against the CUDA-aware Open MPI (pip --no-binary).
        executor.run(
            ["python3", "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             "--dest", f"{MOUNT}/wheels", _mpi4py_requirement(plan)]
        )  # fmt: skip
    if plan.with_gpuenv:
        wanted.append(f"{MOUNT}/wheels/{_gpuenv_wheel(root, output / 'wheels')}")
    executor.run(["python3", "-m", "venv", "/tmp/gpuenv-wheels"])
    executor.run(
        [
            "/tmp/gpuenv-wheels/bin/pip",
            "wheel",
            "--quiet",
            "--disable-pip-version-check",
            "--wheel-dir",
            f"{MOUNT}/wheels",
            *(["--find-links", FIND_LINKS_MOUNT] if find_links else []),
            *wanted,
        ]
    )
    wheels = sorted(
        p.name for p in (output / "wheels").iterdir() if p.name.endswith((".whl", ".tar.gz"))
    )
    progress.end("wheels", f"{len(wheels)} wheels")

    debs = sorted(p.name for p in (apt_dir / "pool").glob("*.deb"))
    manifest = Manifest(
        kind="gpuenv.bundle",
        schema_version=MANIFEST_VERSION,
        pins=plan.pins_name,
        pins_vars=plan.pins,
        distribution=f"{plan.os} {plan.major}",
        codename=plan.codename,
        requested_debs=list(plan.debs),
        node_specific=list(plan.node_specific),
        debs=debs,
        deb_bytes=sum((apt_dir / "pool" / d).stat().st_size for d in debs),
        wheels_requested=list(plan.wheels),
        wheels=wheels,
        wheel_bytes=sum((output / "wheels" / w).stat().st_size for w in wheels),
        key_fingerprint=fingerprint,
        created_at=when.isoformat(timespec="seconds"),
        built=[b.file for b in built],
    )
    (output / "bundle.json").write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    return manifest


def write_signed_index(executor: Executor, output: Path, codename: str, when: datetime) -> str:
    """Index the .deb files of ``output``/apt/pool (mounted at MOUNT in the executor's container)
    as a flat repository, sign it with a key made for it alone, export the public key as
    ``output``/gpuenv-bundle.asc; return the key's fingerprint. Nodes trust that key for this
    repository only (the sources role's signed-by entry)."""
    apt_dir = output / "apt"
    packages = executor.run(["apt-ftparchive", "packages", "pool"], cwd=f"{MOUNT}/apt").encode()
    index = {"Packages": packages, "Packages.gz": repo.gzip_bytes(packages)}
    for name, content in index.items():
        (apt_dir / name).write_bytes(content)
    (apt_dir / "Release").write_text(repo.release_text(index, repo.Suite(codename), when))
    executor.run(["install", "-d", "-m", "0700", repo.GNUPGHOME])
    executor.run(repo.keygen_argv())
    fingerprint = repo.parse_fingerprint(executor.run(repo.fingerprint_argv()))
    executor.run(repo.export_key_argv(f"{MOUNT}/{repo.KEY_FILE}"))
    for argv in repo.sign_argvs(f"{MOUNT}/apt/Release"):
        executor.run(argv)
    return fingerprint


def verify_sources(key: str) -> str:
    return f"deb [signed-by={key}] file:{MOUNT}/apt ./\n"


def _verify_apt(executor: Executor, plan: Plan, built: Sequence[str] = ()) -> None:
    """apt with the bundle as its only source: the signature checks and every package resolves."""
    work = "/tmp/gpuenv-bundle-verify"
    executor.run(["mkdir", "-p", f"{work}/lists/partial", f"{work}/parts"])
    executor.run(repo.write_argv(f"{work}/list", verify_sources(f"{MOUNT}/{repo.KEY_FILE}")))
    opts = [
        "-o",
        f"Dir::Etc::SourceList={work}/list",
        "-o",
        f"Dir::Etc::SourceParts={work}/parts",
        "-o",
        f"Dir::State::Lists={work}/lists",
        "-o",
        "APT::Get::List-Cleanup=0",
    ]
    out = executor.run(["apt-get", "update", "--quiet", "--error-on=any", *opts])
    if "InRelease" not in out:
        raise GpuenvError(f"apt did not read the bundle's InRelease:\n{out}")
    # --simulate with no installed state to lean on: every package and its dependencies resolve.
    executor.run(
        [
            "apt-get",
            "install",
            "--simulate",
            "--quiet",
            "--no-install-recommends",
            *opts,
            "-o",
            "Dir::State::status=/dev/null",
            *plan.debs,
            *built,
        ]
    )


def _gpuenv_wheel(root: Path, dest: Path) -> str:
    """gpuenv's own wheel from the checkout, built on the controller as the gpu_env role does."""
    before = set(dest.glob("gpuenv-*.whl"))
    done = proc.capture(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(dest),
            str(root),
        ],
        WHEEL_DEADLINE_S,
    )
    if done.returncode is None:
        raise GpuenvError(
            f"building gpuenv's wheel from {root} did not finish within {WHEEL_DEADLINE_S} s "
            "(killed with its process group)"
        )
    if done.returncode != 0:
        raise GpuenvError(f"building gpuenv's wheel from {root} failed:\n{done.stderr[-2000:]}")
    built = sorted(set(dest.glob("gpuenv-*.whl")) - before) or sorted(dest.glob("gpuenv-*.whl"))
    if not built:
        raise GpuenvError(f"pip wheel {root} left no gpuenv wheel in {dest}")
    return built[-1].name


# The mpi role's build script, run in the build container as on the role's build node.
BUILD_SCRIPT = ROOT / "roles" / "mpi" / "files" / "build-openmpi-cuda.sh"
# What the build needs in the container: compilers and the CUDA headers (Debian's toolkit
# headers, /usr/include/cuda.h; Open MPI loads the driver's libcuda at run time).
SOURCE_BUILD_DEBS = ("gcc", "g++", "make", "xz-utils", "nvidia-cuda-dev")
# Fetching a source tarball on the controller; past this it stops.
SOURCE_DEADLINE_S = 600


@dataclass(frozen=True)
class Built:
    file: str
    depends: tuple[str, ...]


def fetch_source(url: str, sha256: str, dest: Path) -> Path:
    """The tarball at ``url`` in ``dest``, checked against ``sha256`` (a mismatch is an error
    naming both digests; nothing unchecked is kept)."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / url.rsplit("/", 1)[-1]
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
        return target
    partial = target.with_name(target.name + ".part")
    try:
        with (
            urllib.request.urlopen(url, timeout=SOURCE_DEADLINE_S) as answer,
            partial.open("wb") as out,
        ):
            shutil.copyfileobj(answer, out)
    except OSError as exc:
        raise GpuenvError(f"cannot fetch {url}: {exc}") from exc
    got = hashlib.sha256(partial.read_bytes()).hexdigest()
    if got != sha256:
        partial.unlink()
        raise GpuenvError(f"{url}: sha256 {got}, expected {sha256}: not used")
    partial.replace(target)
    return target


def depends_names(field_text: str) -> tuple[str, ...]:
    """Package names of a Depends field (alternatives and versions dropped)."""
    names = []
    for part in field_text.split(","):
        first = part.split("|")[0].strip()
        if first:
            names.append(first.split()[0].split(":")[0])
    return tuple(names)


def _build(executor: Executor, output: Path, build: dict, progress: Progress) -> Built:
    """Build one of the plan's packages in the container into apt/pool."""
    name = f"build {build['package']}"
    progress.begin(name, f"{build['file']} from {build['url']} (minutes)")
    tarball = fetch_source(str(build["url"]), str(build["sha256"]), output / "src")
    shutil.copy2(BUILD_SCRIPT, output / "src" / BUILD_SCRIPT.name)
    executor.run(
        ["apt-get", "install", "--quiet", "--yes", "--no-install-recommends", *SOURCE_BUILD_DEBS]
    )
    executor.run(
        ["sh", f"{MOUNT}/src/{BUILD_SCRIPT.name}", f"{MOUNT}/src/{tarball.name}",
         str(build["sha256"]), "/usr:/usr/local/cuda", str(build["prefix"]),
         str(build["package"]), str(build["version"]), f"{MOUNT}/apt/pool",
         *[str(a) for a in build.get("configure_args", [])]]
    )  # fmt: skip
    deb = f"{MOUNT}/apt/pool/{build['file']}"
    depends = depends_names(executor.run(["dpkg-deb", "-f", deb, "Depends"]))
    progress.end(name, build["file"])
    return Built(str(build["file"]), depends)


def _mpi4py_requirement(plan: Plan) -> str:
    found = [w for w in plan.wheels if w.split("=")[0].split("<")[0].split(">")[0] == "mpi4py"]
    return found[0] if found else "mpi4py"
