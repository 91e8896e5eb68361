"""Tell which pip requirements a virtual environment provably satisfies already.

The role's probe lists the distributions installed in the venv (normalized name: version). A
requirement counts as satisfied only when it names a distribution that is installed at a version
its specifier allows; one with extras, a marker, a URL, or one that does not parse is left to pip.
"""

from __future__ import annotations

import re
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _satisfied(requirement: str, installed: dict[str, str]) -> bool:
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return False
    if req.extras or req.marker is not None or req.url:
        return False
    version = installed.get(_normalize(req.name))
    if version is None:
        return False
    try:
        return req.specifier.contains(version, prereleases=True)
    except InvalidVersion:
        return False


def gpu_env_unsatisfied(requirements: list[str], installed: dict[str, Any]) -> list[str]:
    """The requirements not proven satisfied by installed (normalized name: version)."""
    versions = {_normalize(str(name)): str(version) for name, version in (installed or {}).items()}
    return [req for req in requirements if not _satisfied(str(req), versions)]


class FilterModule:
    """gpu_env filters."""

    def filters(self) -> dict[str, Any]:
        return {"gpu_env_unsatisfied": gpu_env_unsatisfied}
