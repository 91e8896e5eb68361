"""Helpers the roles' node probes share (roles/*/files/*_probe.py).

A role runs a probe as `python3 -c <probe_lib.py + the probe>` (tasks put the two texts one after
the other), so the probe finds these names defined; a probe run as a file (tests) imports them.
"""

import glob
import importlib.metadata
import re
import subprocess


def run(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """Exit status and standard output of a command; 127 when it cannot be started, 124 when it
    runs past timeout seconds (nvidia-smi can hang on a GPU in a bad state)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    except OSError:
        return 127, ""
    except subprocess.TimeoutExpired:
        return 124, ""
    return done.returncode, done.stdout


def installed(packages: list[str]) -> list[str]:
    """The packages of the list that dpkg has installed."""
    if not packages:
        return []
    _, out = run(["dpkg-query", "-W", "-f=${Package} ${Status}\n", *packages])
    return [line.split()[0] for line in out.splitlines() if line.endswith(" ok installed")]


def distributions(prefix: str) -> dict[str, tuple[str, str]]:
    """The Python distributions of a virtual environment or prefix (its lib/python*/site-packages):
    normalized name -> (version, the site-packages folder holding it)."""
    found = {}
    for site in sorted(glob.glob(prefix + "/lib/python*/site-packages")):
        for dist in importlib.metadata.distributions(path=[site]):
            name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
            if name:
                found[name] = (dist.version, site)
    return found
