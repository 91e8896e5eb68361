"""The lab's Docker client: connecting to the Docker engine, with errors that say what to run."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from gpuenv.errors import EnvironmentProblem

if TYPE_CHECKING:
    import docker

_START_HINT = (
    "start it with `sudo systemctl start docker` (without systemd: `sudo dockerd &`), "
    "or run scripts/host-prereqs.sh, which installs and starts it on Debian/Ubuntu"
)


def connect() -> docker.DockerClient:
    """A client for the local engine; EnvironmentProblem when there is none to talk to."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise EnvironmentProblem(
            "the docker SDK for Python is not installed: install gpuenv's controller extra "
            "from a checkout (pip install '.[controller]', docs/install.md)"
        ) from None
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except DockerException as exc:
        if shutil.which("docker") is None and shutil.which("dockerd") is None:
            raise EnvironmentProblem(
                "Docker is not installed: install it (`sudo apt-get install docker.io`) or run "
                "scripts/host-prereqs.sh"
            ) from None
        raise EnvironmentProblem(
            f"the Docker engine is not running or not reachable ({_short(exc)}): {_START_HINT}"
        ) from None
    return client


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
