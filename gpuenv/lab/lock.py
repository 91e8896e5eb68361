"""One image build or cache change at a time on this controller.

Several engineers and CI jobs call `gpuenv lab build` / `lab up` in the same tree at once;
without the lock two of them would race to create the same cache container or image tag.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpuenv.lab.settings import Names, cache_dir
from gpuenv.progress import Progress


@contextmanager
def exclusive(root: Path, names: Names, progress: Progress) -> Iterator[None]:
    path = cache_dir(root) / f".{names.prefix}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress.begin("lock", "waiting for another gpuenv lab build on this machine")
            fcntl.flock(fd, fcntl.LOCK_EX)
            progress.end("lock", "done waiting")
        yield
    finally:
        os.close(fd)
