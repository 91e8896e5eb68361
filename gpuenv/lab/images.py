"""Building the lab images: debootstrap → docker import → layered build, cached by recipe hash."""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuenv import proc
from gpuenv.errors import EnvironmentProblem
from gpuenv.lab import recipe
from gpuenv.lab.settings import (
    CACHE_DISTRO,
    LABEL_OWNER,
    LABEL_RECIPE,
    MIRROR,
    Names,
    cache_dir,
)
from gpuenv.progress import Progress

if TYPE_CHECKING:
    import docker

DEBOOTSTRAP_DEADLINE_S = 1200
BUILD_DEADLINE_S = 900
TAR_DEADLINE_S = 600


@dataclass(frozen=True)
class ImageState:
    tag: str
    digest: str
    built: bool  # False: an image with this recipe already existed


def _current_digest(client: docker.DockerClient, tag: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        image = client.images.get(tag)
    except ImageNotFound:
        return None
    return (image.labels or {}).get(LABEL_RECIPE)


def _base_tarball(
    base: recipe.BaseRecipe, names: Names, root: Path, progress: Progress, key: str
) -> Path:
    """The debootstrap'ed root file system as a tar, made once per recipe and kept."""
    out_dir = cache_dir(root)
    tarball = out_dir / f"{names.prefix}-base-{base.distro}-{base.digest()}.tar"
    if tarball.exists():
        return tarball
    if shutil.which("debootstrap") is None:
        raise EnvironmentProblem(
            "debootstrap is not installed: `sudo apt-get install debootstrap` "
            "(or run scripts/host-prereqs.sh)"
        )
    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "building the lab's base image runs debootstrap, which needs root: "
            "run `sudo .venv/bin/gpuenv lab build` once"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"{names.prefix}-debootstrap-{base.distro}.log"
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=f"rootfs-{base.distro}-") as tmp:
        target = Path(tmp) / "rootfs"
        _run_logged(base.debootstrap_argv(target), log_path, progress, key, DEBOOTSTRAP_DEADLINE_S)
        # The downloaded .debs are installed already; they would only make the image bigger.
        for deb in (target / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        partial = tarball.with_suffix(".partial")
        progress.update(key, "packing the root file system")
        _run_logged(
            ["tar", "-C", str(target), "--numeric-owner", "--xattrs", "-cf", str(partial), "."],
            out_dir / f"{names.prefix}-tar-{base.distro}.log",
            progress,
            key,
            TAR_DEADLINE_S,
        )
        partial.rename(tarball)
    for old in out_dir.glob(f"{names.prefix}-base-{base.distro}-*.tar"):
        if old != tarball:
            old.unlink()
    return tarball


def _run_logged(
    argv: list[str], log_path: Path, progress: Progress, key: str, deadline_s: float
) -> None:
    """Run ``argv`` under a deadline that holds even while it hangs with its output open."""

    def line(text: str) -> None:
        if text.startswith("I: "):
            progress.update(key, text[3:].strip()[:70])

    outcome = proc.run(argv, deadline_s, log_path, on_line=line)
    if outcome.timed_out:
        raise EnvironmentProblem(
            f"{argv[0]} did not finish within {deadline_s:g} s and was killed; last lines of"
            f" {log_path}:\n" + _tail(log_path)
        )
    if outcome.returncode != 0:
        raise EnvironmentProblem(
            f"{argv[0]} failed ({proc.describe_exit(outcome.returncode)}); last lines of"
            f" {log_path}:\n" + _tail(log_path)
        )


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return "\n".join(text.rstrip().splitlines()[-lines:])


def ensure_base(
    client: docker.DockerClient,
    names: Names,
    root: Path,
    distro: str,
    progress: Progress,
    mirror: str = MIRROR,
) -> ImageState:
    base = recipe.base_recipe(distro, mirror=mirror)
    tag = names.base_image(distro)
    digest = base.digest()
    if _current_digest(client, tag) == digest:
        return ImageState(tag, digest, built=False)
    key = f"base-{distro}"
    progress.begin(key, f"base {distro}: debootstrap --variant=minbase")
    tarball = _base_tarball(base, names, root, progress, key)
    progress.update(key, "docker import")
    repository, _, version = tag.partition(":")
    client.api.import_image_from_file(
        str(tarball),
        repository=repository,
        tag=version,
        changes=[
            f"LABEL {LABEL_RECIPE}={digest} {LABEL_OWNER}={names.prefix}",
            'CMD ["/lib/systemd/systemd"]',
        ],
    )
    progress.end(key, tag)
    return ImageState(tag, digest, built=True)


def ensure_layer(
    client: docker.DockerClient,
    names: Names,
    tag: str,
    layer: recipe.LayerRecipe,
    progress: Progress,
) -> ImageState:
    digest = layer.digest()
    old = _image_id(client, tag)
    if old is not None and _current_digest(client, tag) == digest:
        return ImageState(tag, digest, built=False)
    key = f"build-{tag}"
    progress.begin(key, f"build {tag}")
    tail: deque[str] = deque(maxlen=15)
    stream = client.api.build(
        fileobj=io.BytesIO(layer.context()),
        custom_context=True,
        tag=tag,
        labels={LABEL_RECIPE: digest, LABEL_OWNER: names.prefix},
        rm=True,
        forcerm=True,
        pull=False,
        decode=True,
        timeout=BUILD_DEADLINE_S,
    )
    for chunk in stream:
        if "error" in chunk:
            raise EnvironmentProblem(
                f"building {tag} failed: {chunk['error'].strip()}\n" + "\n".join(tail)
            )
        line = str(chunk.get("stream", "")).strip()
        if line:
            tail.append(line)
            progress.update(key, line.splitlines()[-1][:70])
    if old is not None and old != _image_id(client, tag):
        _remove_quietly(client, old)
    progress.end(key, tag)
    return ImageState(tag, digest, built=True)


def _image_id(client: docker.DockerClient, tag: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        return str(client.images.get(tag).id)
    except ImageNotFound:
        return None


def _remove_quietly(client: docker.DockerClient, image_id: str) -> None:
    """Drop a replaced image; one still used by a container stays (docker refuses)."""
    from docker.errors import APIError

    try:
        client.images.remove(image_id, noprune=False)
    except APIError as exc:
        if exc.status_code != 409:
            raise


def ensure_images(
    client: docker.DockerClient,
    names: Names,
    root: Path,
    distros: list[str],
    ca_bundle: Path,
    progress: Progress,
    mirror: str = MIRROR,
) -> list[ImageState]:
    """Node images for ``distros`` and the cache image, built only where the recipe changed;
    the bases are debootstrapped from ``mirror`` (a Debian archive root)."""
    certs = recipe.read_ca_bundle(ca_bundle)
    bases = sorted({*distros, CACHE_DISTRO}, key=lambda d: (d != CACHE_DISTRO, d))
    # debootstrap is mostly waiting on the network: both distros at once is faster.
    with ThreadPoolExecutor(max_workers=len(bases)) as pool:
        futures = [
            pool.submit(ensure_base, client, names, root, d, progress, mirror) for d in bases
        ]
        states = [f.result() for f in futures]
    layers = [
        (
            names.node_image(distro),
            recipe.node_recipe(
                names.base_image(distro), recipe.base_recipe(distro, mirror=mirror), certs
            ),
        )
        for distro in distros
    ]
    layers.append(
        (
            names.cache_image,
            recipe.cache_recipe(
                names.base_image(CACHE_DISTRO), recipe.base_recipe(CACHE_DISTRO, mirror=mirror)
            ),
        )
    )
    # The cache's build waits on apt downloads, the nodes' on local work: side by side.
    with ThreadPoolExecutor(max_workers=len(layers)) as pool:
        futures = [
            pool.submit(ensure_layer, client, names, tag, layer, progress) for tag, layer in layers
        ]
        states += [f.result() for f in futures]
    return states


def remove_images(client: docker.DockerClient, names: Names) -> list[str]:
    """Remove every image this prefix built; returns what could not be removed and why."""
    from docker.errors import APIError

    problems: list[str] = []
    for image in client.images.list(filters={"label": f"{LABEL_OWNER}={names.prefix}"}):
        for tag in image.tags or [image.id]:
            try:
                client.images.remove(tag)
            except APIError as exc:
                problems.append(f"{tag}: {json.dumps(exc.explanation)}")
    return problems


def remove_tarballs(names: Names, root: Path) -> None:
    for tarball in cache_dir(root).glob(f"{names.prefix}-base-*.tar"):
        tarball.unlink()
