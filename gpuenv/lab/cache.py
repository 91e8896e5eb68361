"""The shared cache container: apt-cacher-ng (3142) and the pip wheelhouse (8080).

It sits on the default bridge (for the internet) and on every lab network and the molecule
network under the alias ``apt-cache``. Its data lives in a volume that outlives ``lab down``.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.errors import EnvironmentProblem
from gpuenv.lab.settings import (
    CACHE_ALIAS,
    LABEL_OWNER,
    LABEL_RECIPE,
    Names,
    link_wheelhouse,
    shared_wheelhouse,
)
from gpuenv.progress import Progress

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container
    from docker.models.networks import Network

CACHE_READY_DEADLINE_S = 60


def _wanted_config(client: docker.DockerClient, names: Names, wheels: Path) -> str:
    image_id = client.images.get(names.cache_image).id
    # The folder's identity, not only its path: a folder removed and made again at the same
    # path leaves the container bound to the deleted folder, which serves no wheel.
    st = wheels.stat()
    text = f"{image_id}\n{wheels}\n{st.st_dev}:{st.st_ino}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_cache(
    client: docker.DockerClient, names: Names, root: Path, progress: Progress
) -> Container:
    """Start (or create, or re-create after an image change) the cache container."""
    from docker.errors import NotFound

    # One folder per machine, not the checkout's: another checkout's `lab up` finds the
    # container as it wants it and leaves it running (it served whichever checkout created it).
    wheels = link_wheelhouse(root, shared_wheelhouse())
    wanted = _wanted_config(client, names, wheels)
    progress.begin("cache", f"cache {names.cache_container}")
    try:
        container = client.containers.get(names.cache_container)
    except NotFound:
        container = None
    if container is not None and container.labels.get(LABEL_RECIPE) != wanted:
        progress.update("cache", "image or wheelhouse changed: re-creating")
        container.remove(force=True)
        container = None
    if container is None:
        _ensure_volume(client, names)
        container = client.containers.run(
            names.cache_image,
            name=names.cache_container,
            hostname=CACHE_ALIAS,
            detach=True,
            init=True,
            restart_policy={"Name": "unless-stopped"},
            labels={LABEL_OWNER: names.prefix, LABEL_RECIPE: wanted},
            volumes={
                names.cache_volume: {"bind": "/var/cache/apt-cacher-ng", "mode": "rw"},
                str(wheels): {"bind": "/srv/wheels", "mode": "ro"},
            },
        )
        # A re-created cache must be back on every lab and molecule network it served.
        for network in client.networks.list(filters={"label": f"{LABEL_OWNER}={names.prefix}"}):
            network.connect(container, aliases=[CACHE_ALIAS])
    elif container.status != "running":
        container.start()
    _wait_ready(container)
    progress.end("cache", f"{names.cache_container} serving apt :3142, wheels :8080")
    return container


def _ensure_volume(client: docker.DockerClient, names: Names) -> None:
    from docker.errors import NotFound

    try:
        client.volumes.get(names.cache_volume)
    except NotFound:
        client.volumes.create(names.cache_volume, labels={LABEL_OWNER: names.prefix})


def _wait_ready(container: Container) -> None:
    """Both services answer on the container's bridge address."""
    deadline = time.monotonic() + CACHE_READY_DEADLINE_S
    pending = {3142, 8080}
    while True:
        container.reload()
        if container.status not in ("created", "running"):
            logs = container.logs(tail=20).decode(errors="replace")
            raise EnvironmentProblem(f"the cache container stopped ({container.status}):\n{logs}")
        ip = container.attrs["NetworkSettings"].get("IPAddress") or ""
        for port in sorted(pending):
            if ip and _answers(ip, port):
                pending.discard(port)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise EnvironmentProblem(
                f"the cache container does not answer on port(s) {sorted(pending)} after "
                f"{CACHE_READY_DEADLINE_S}s; see `docker logs {container.name}`"
            )
        time.sleep(0.3)


def _answers(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1):
            return True
    except OSError:
        return False


def ensure_network(
    client: docker.DockerClient, names: Names, network_name: str, labels: dict[str, str]
) -> Network:
    """A bridge network with the cache attached as ``apt-cache``."""
    from docker.errors import NotFound

    try:
        network = client.networks.get(network_name)
    except NotFound:
        network = client.networks.create(
            network_name, driver="bridge", labels={LABEL_OWNER: names.prefix, **labels}
        )
    cache = client.containers.get(names.cache_container)
    cache.reload()
    if network_name not in cache.attrs["NetworkSettings"]["Networks"]:
        network.connect(cache, aliases=[CACHE_ALIAS])
    return network


def remove_network(client: docker.DockerClient, names: Names, network_name: str) -> None:
    """Detach the cache, then remove the network (NotFound: already gone)."""
    from docker.errors import NotFound

    try:
        network = client.networks.get(network_name)
    except NotFound:
        return
    try:
        cache = client.containers.get(names.cache_container)
    except NotFound:
        cache = None
    if cache is not None and network_name in cache.attrs["NetworkSettings"]["Networks"]:
        network.disconnect(cache, force=True)
    network.remove()


def remove_cache(client: docker.DockerClient, names: Names) -> None:
    from docker.errors import NotFound

    with contextlib.suppress(NotFound):
        client.containers.get(names.cache_container).remove(force=True)
    with contextlib.suppress(NotFound):
        client.volumes.get(names.cache_volume).remove()


def cache_state(client: docker.DockerClient, names: Names) -> str:
    """Docker's state of the cache container, or 'absent'."""
    from docker.errors import NotFound

    try:
        return str(client.containers.get(names.cache_container).status)
    except NotFound:
        return "absent"
