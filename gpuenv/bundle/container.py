"""The build container: an image of the target distribution running commands for the engine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.errors import BadInput, EnvironmentProblem, GpuenvError

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

_ENV = {"DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
# Each step in the build container gets this long (the longest, pip building the GPU wheels and
# downloading the packages, took minutes here: 3.2 GB of debs in 21 s). coreutils' timeout runs
# the step in a process group of its own and signals that whole group at the deadline, then
# SIGKILL after STEP_KILL_AFTER_S: nothing of a stalled step lives on in the container.
STEP_DEADLINE_S = 3600
STEP_KILL_AFTER_S = 10
# timeout's exit status when it stopped the step (124: TERM sufficed; 137: it needed KILL).
_TIMED_OUT = (124, 137)


def deadline_argv(argv: Sequence[str], deadline_s: int = STEP_DEADLINE_S) -> list[str]:
    """argv under coreutils' timeout: killed with its process group at the deadline."""
    return ["timeout", f"--kill-after={STEP_KILL_AFTER_S}", str(deadline_s), *argv]


class DockerExecutor:
    """Runs commands with ``docker exec`` in a long-lived container; the output folder mounted."""

    def __init__(self, container: Container) -> None:
        self._container = container

    def run(self, argv: Sequence[str], *, cwd: str = "/") -> str:
        result = self._container.exec_run(
            deadline_argv(argv), workdir=cwd, environment=_ENV, demux=True
        )
        stdout, stderr = result.output
        out = (stdout or b"").decode(errors="replace")
        shown = f"`{' '.join(argv[:6])}{' …' if len(argv) > 6 else ''}`"
        if result.exit_code in _TIMED_OUT:
            raise GpuenvError(
                f"{shown} did not finish within {STEP_DEADLINE_S} s in the build container; "
                "it was killed with its process group"
            )
        if result.exit_code != 0:
            err = (stderr or b"").decode(errors="replace")
            raise GpuenvError(
                f"{shown} failed in the build container (exit {result.exit_code}):\n"
                f"{(err or out)[-3000:]}"
            )
        return out


def docker_client() -> docker.DockerClient:
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        raise EnvironmentProblem(
            f"cannot reach the Docker engine ({exc}); start it (e.g. `dockerd &`) and retry"
        ) from None
    return client


def check_image(client: docker.DockerClient, image: str) -> None:
    from docker.errors import ImageNotFound

    try:
        client.images.get(image)
    except ImageNotFound:
        raise BadInput(
            f"no image {image!r}: build it with `gpuenv lab build` or give --image"
        ) from None


@contextlib.contextmanager
def build_container(
    client: docker.DockerClient,
    image: str,
    output: Path,
    network: str | None,
    find_links: Path | None = None,
) -> Iterator[DockerExecutor]:
    """A container of ``image`` with ``output`` at /bundle, removed on the way out."""
    from gpuenv.bundle.build import FIND_LINKS_MOUNT, MOUNT

    volumes = {str(output): {"bind": MOUNT, "mode": "rw"}}
    if find_links is not None:
        volumes[str(find_links)] = {"bind": FIND_LINKS_MOUNT, "mode": "ro"}
    container = client.containers.run(
        image,
        command=["sleep", "infinity"],
        detach=True,
        init=True,
        network=network,
        volumes=volumes,
        labels={"gpuenv.owner": "bundle"},
    )
    try:
        yield DockerExecutor(container)
    finally:
        container.remove(force=True)
