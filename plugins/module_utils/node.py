# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The ground floor of every node reader: commands under a deadline, files under a root, dpkg's
package states and versions, the Python distributions of a prefix.

Every reader of the floor takes a ``root`` (``/`` on a node, a fixture tree in tests) and a
``run(argv, timeout_s=...) -> (rc, stdout)``: in a module the module's run_command under coreutils'
``timeout``; in the gpuenv package a runner over ``gpuenv.proc``; in tests a recorded one
(``command_name`` names its fixture). Runs on the node inside the modules (Python 3.10 and newer:
Ubuntu 22.04 to Debian 13).
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
from collections.abc import Callable
from typing import Any

from .files import file_states

# A command's exit status and standard output; 124 when it ran past its deadline, 127 when it
# could not be started (the exit statuses of coreutils' timeout).
Run = Callable[..., "tuple[int, str]"]

# A command on the node gets this many seconds (nvidia-smi can hang on a GPU in a bad state).
COMMAND_TIMEOUT_S = 60
# After the deadline the command gets this many seconds to stop before it is killed.
KILL_AFTER_S = 5


# The options every reading module has (doc fragment gpuenv.cluster.node).
SHARED_OPTIONS = {
    "packages": {"type": "list", "elements": "str", "default": []},
    "watch": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {"path": {"type": "path", "required": True}, "marker": {"type": "str"}},
    },
}


def exit_with_reading(
    module_class: Any, argument_spec: dict, read: Callable[[Run, dict], dict]
) -> None:
    """Run a reading module: parse its options (plus the shared ones), read, and report the
    watched files (``files``: what gpuenv.cluster.files_pending compares); changed=False."""
    module = module_class(
        argument_spec={**argument_spec, **SHARED_OPTIONS}, supports_check_mode=True
    )
    found = read(command_runner(module), module.params)
    module.exit_json(changed=False, files=file_states(module.params["watch"]), **found)


def command_runner(module: Any) -> Run:
    """A Run that starts commands through the module's run_command, each under a deadline."""
    timeout = module.get_bin_path("timeout", required=True)

    def run(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
        deadline = [timeout, "-k", str(KILL_AFTER_S), str(timeout_s)]
        rc, out, _ = module.run_command(deadline + list(argv), check_rc=False)
        return rc, out

    return run


def read_text(path: str) -> str | None:
    """A text file's content; None when it is missing, unreadable or not UTF-8."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return None


def read_under(root: str, path: str) -> str | None:
    """The text of a node path seen through ``root``; None when missing, unreadable or not UTF-8."""
    return read_text(os.path.join(root, path.lstrip("/")))


def _norm(path: str) -> str:
    # normpath keeps a leading "//" (POSIX leaves its meaning open); a node path has one "/"
    return "/" + os.path.normpath(path).lstrip("/")


def resolve_under(root: str, path: str, hops: int = 16) -> str:
    """A node path with its symbolic links followed inside ``root`` (an absolute target is the
    node's, so it stays inside the root too); the result is a node path."""
    current = _norm(path)
    for _ in range(hops):
        parts = current.rstrip("/").split("/")
        for i in range(2, len(parts) + 1):
            head = "/".join(parts[:i])
            try:
                target = os.readlink(os.path.join(root, head.lstrip("/")))
            except OSError:
                continue
            base = os.path.dirname(head)
            joined = _norm(target if target.startswith("/") else f"{base}/{target}")
            if joined == head:
                continue  # an overlay root's link to the real folder of the same name
            current = _norm("/".join([joined, *parts[i:]]))
            break
        else:
            return current
    return current


def command_name(argv: list[str]) -> str:
    """A command's name for a recorded answer (``cmd/<name>.out`` in a fixture tree):
    ``mokutil --sb-state`` is ``mokutil-sb-state``, ``ompi_info --parsable --all`` is
    ``ompi_info-parsable-all``."""
    words = [os.path.basename(argv[0])] + [re.sub(r"[^A-Za-z0-9_.]+", "-", a) for a in argv[1:]]
    return "-".join(w.strip("-") for w in words if w.strip("-"))[:100]


def installed(run: Run, packages: list[str]) -> list[str]:
    """The packages of the list that dpkg has installed."""
    return list(package_versions(run, packages))


def package_versions(run: Run, packages: list[str]) -> dict[str, str]:
    """The installed packages of the list with their versions (dpkg's, epoch included)."""
    if not packages:
        return {}
    _, out = run(["dpkg-query", "-W", "-f=${Package} ${Version} ${Status}\n", *packages])
    return {
        line.split()[0]: line.split()[1]
        for line in out.splitlines()
        if line.endswith(" ok installed") and len(line.split()) >= 2
    }


def normalize(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(prefix: str) -> dict[str, tuple[str, str]]:
    """The Python distributions of a virtual environment or prefix (its lib/python*/site-packages):
    normalized name -> (version, the site-packages folder holding it)."""
    found = {}
    for site in sorted(glob.glob(prefix + "/lib/python*/site-packages")):
        for dist in importlib.metadata.distributions(path=[site]):
            name = normalize(dist.metadata["Name"] or "")
            if name:
                found[name] = (dist.version, site)
    return found
