"""``gpuenv lab build``: images, the cache container and the molecule network."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv.lab import cache, images, lock
from gpuenv.lab.settings import MIRROR, Names
from gpuenv.progress import Progress

if TYPE_CHECKING:
    import docker


def build(
    client: docker.DockerClient,
    names: Names,
    root: Path,
    distros: list[str],
    ca_bundle: Path,
    progress: Progress,
    mirror: str = MIRROR,
) -> list[images.ImageState]:
    """Everything molecule scenarios and labs need before the first node starts."""
    with lock.exclusive(root, names, progress):
        states = images.ensure_images(client, names, root, distros, ca_bundle, progress, mirror)
        cache.ensure_cache(client, names, root, progress)
        cache.ensure_network(client, names, names.molecule_network, {})
    return states
