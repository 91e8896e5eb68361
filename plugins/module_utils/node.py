# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""What the gpuenv modules read on a node: commands under a deadline, dpkg's package states, the
Python distributions of a prefix, the NVIDIA GPUs on the PCI bus.

Runs on the node inside the modules (Python 3.10 and newer: Ubuntu 22.04 to Debian 13).
"""

from __future__ import annotations

import glob
import importlib.metadata
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

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"


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


def installed(run: Run, packages: list[str]) -> list[str]:
    """The packages of the list that dpkg has installed."""
    if not packages:
        return []
    _, out = run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *packages])
    return [line.split()[0] for line in out.splitlines() if line.endswith(" ok installed")]


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


def pci_gpus(devices: str = PCI_DEVICES) -> int:
    """NVIDIA (vendor 0x10de) display/3D controllers (class 0x03xx) on the PCI bus."""
    count = 0
    for device in glob.glob(devices + "/*"):
        vendor = (read_text(device + "/vendor") or "").strip()
        klass = read_text(device + "/class") or ""
        count += vendor == NVIDIA_VENDOR and klass.startswith("0x03")
    return count
