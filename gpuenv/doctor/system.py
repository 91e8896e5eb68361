"""Everything `gpuenv doctor` reads from a node goes through one ``System``.

A ``System`` has a root folder (``/`` on a real node, a fixture tree in tests) under which
every absolute path is read, and a command runner. The real runner runs the command under a
deadline; the recorded runner answers from ``<folder>/<name>.out`` files (first line of an
optional ``<name>.rc`` holds the exit status), so every probe is tested from fixtures on
machines without GPUs. ``env`` is the process environment the node's jobs would inherit.

Standard library only: this module runs on nodes where the controller's packages are missing.
"""

from __future__ import annotations

import glob
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv import proc
from gpuenv.floor.node import command_name, resolve_under

COMMAND_DEADLINE_S = 60.0


@dataclass(frozen=True)
class CmdOut:
    """What one command did: ``rc`` None means it could not run (not installed, no fixture)."""

    rc: int | None
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def why(self, what: str) -> str:
        if self.rc is None:
            return f"{what}: {self.stderr or 'not available'}"
        tail = " ".join(self.stderr.strip().splitlines()[-2:])
        return f"{what}: exit status {self.rc}" + (f" ({tail})" if tail else "")


# name (a fixture file's stem) and argv -> output
Runner = Callable[[str, Sequence[str]], CmdOut]


def _which(command: str) -> str:
    """The command on PATH, else in the sbin folders a non-root PATH lacks (ldconfig, lspci)."""
    found = shutil.which(command)
    if found is None:
        found = shutil.which(command, path="/usr/sbin:/sbin:/usr/local/sbin")
    return found or command


def real_runner(deadline_s: float = COMMAND_DEADLINE_S) -> Runner:
    """Runs the command in a session of its own; at the deadline the whole group is killed."""

    def run(_name: str, argv: Sequence[str]) -> CmdOut:
        try:
            done = proc.capture(
                [_which(argv[0]), *argv[1:]], deadline_s, {**os.environ, "LC_ALL": "C"}
            )
        except FileNotFoundError:
            return CmdOut(None, stderr=f"{argv[0]} not installed")
        except OSError as exc:
            return CmdOut(None, stderr=f"{argv[0]}: {exc}")
        if done.returncode is None:
            return CmdOut(None, stderr=f"{argv[0]} did not finish within {deadline_s:g} s")
        return CmdOut(done.returncode, done.stdout, done.stderr)

    return run


def recorded_runner(folder: str | Path) -> Runner:
    """Answers from ``folder/<name>.out`` (and ``<name>.rc``, ``<name>.err``); no file: not run."""
    base = Path(folder)

    def run(name: str, argv: Sequence[str]) -> CmdOut:
        out = base / f"{name}.out"
        if not out.is_file():
            return CmdOut(None, stderr=f"{argv[0]} not installed")
        rc_file, err_file = base / f"{name}.rc", base / f"{name}.err"
        rc = int(rc_file.read_text().split()[0]) if rc_file.is_file() else 0
        err = err_file.read_text() if err_file.is_file() else ""
        return CmdOut(rc, out.read_text(), err)

    return run


@dataclass
class System:
    """A node's files and commands, seen through ``root``."""

    root: Path = Path("/")
    runner: Runner = field(default_factory=real_runner)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # site-packages folders of the interpreter doctor runs in (real node only; fixtures glob).
    python_paths: Sequence[str] = ()

    def path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        """The text of a file, None when it is missing or unreadable."""
        try:
            return self.path(path).read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            return None

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return self.path(path).read_bytes()
        except OSError:
            return None

    def exists(self, path: str) -> bool:
        return os.path.lexists(self.path(path))

    def is_dir(self, path: str) -> bool:
        return self.path(path).is_dir()

    def glob(self, pattern: str) -> list[str]:
        """Absolute node paths (as the node names them) matching ``pattern``, sorted."""
        root = str(self.root).rstrip("/")
        hits = glob.glob(root + "/" + pattern.lstrip("/"))
        return sorted("/" + os.path.relpath(h, root or "/") for h in hits)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(path)))
        except OSError:
            return []

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(self.path(path))
        except OSError:
            return None

    def resolve(self, path: str) -> str:
        """Follow symbolic links inside the root (absolute targets stay inside it)."""
        return resolve_under(str(self.root), path)

    def walk_files(self, path: str, limit: int = 50000) -> list[str]:
        """Every file below ``path`` (node paths), at most ``limit``."""
        found: list[str] = []
        base = self.path(path)
        root = str(self.root).rstrip("/")
        for folder, _dirs, files in os.walk(base):
            for name in files:
                found.append("/" + os.path.relpath(os.path.join(folder, name), root or "/"))
                if len(found) >= limit:
                    return found
        return sorted(found)

    def run(self, name: str, argv: Sequence[str]) -> CmdOut:
        return self.runner(name, argv)

    def floor_run(self, argv: list[str], timeout_s: float = COMMAND_DEADLINE_S) -> tuple[int, str]:
        """The node floor's ``run`` over this System's runner; a fixture answers from
        ``cmd/<command_name(argv)>.out``. 127: the command could not run. The runner's own
        deadline applies (``real_runner``'s), not ``timeout_s``."""
        del timeout_s
        out = self.runner(command_name(argv), argv)
        return (127 if out.rc is None else out.rc), out.stdout


def fixture(folder: str | Path, env: Mapping[str, str] | None = None) -> System:
    """A System over a fixture tree: files under it, command outputs from its ``cmd/``."""
    base = Path(folder)
    env_file = base / "cmd" / "environ.env"
    environ: dict[str, str] = {}
    if env is not None:
        environ = dict(env)
    elif env_file.is_file():
        for line in env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip():
                environ[key.strip()] = value
    return System(root=base, runner=recorded_runner(base / "cmd"), env=environ)
