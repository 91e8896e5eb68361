# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The download sources filters: the roles' view of module_utils/sources.py.

The presets table and the apt and pip rules live in the collection's module_utils (the package
reads the same file as ``gpuenv.floor.sources``); these filters only call it and turn its
errors into Ansible's. A role default reads a preset as
``(gpuenv_sources_preset | default('official') | gpuenv.cluster.sources_preset).debian.mirror``;
an unknown name is an error that lists the valid ones (docs/sources.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuenv.cluster.plugins.module_utils import sources as floor


def _ansible(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with the floor's SourcesError raised as AnsibleFilterError."""

    @wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except floor.SourcesError as exc:
            raise AnsibleFilterError(str(exc)) from None

    return call


def sources_deprecated(variables: Any) -> dict[str, Any]:
    """``{values, warnings}``: the replacements' values taken from the deprecated variables set
    in ``variables`` (a mapping of name: value), and a warning for each; a deprecated variable
    that disagrees with its replacement raises, naming both."""
    if not isinstance(variables, dict):
        raise AnsibleFilterError(f"sources_deprecated: expected a mapping, got {variables!r}")
    values, warnings = floor.deprecated(variables)
    return {"values": values, "warnings": warnings}


class FilterModule:
    """Download sources filters."""

    def filters(self) -> dict[str, Any]:
        calls = {
            "sources_preset": floor.preset,
            "sources_preset_error": floor.preset_error,
            "sources_apt_rules": floor.apt_rules,
            "sources_urls": floor.urls,
            "sources_pip_args": floor.pip_args,
            "sources_pip_conf": floor.pip_conf,
            "sources_apt_conf": floor.apt_conf,
            "sources_bundle_list": floor.bundle_list,
            "sources_bundle_wheels": floor.bundle_wheels,
            "sources_plain_http_hosts": floor.plain_http_hosts,
            "sources_pem_certificates": floor.pem_certificates,
            "sources_ca_files": floor.ca_files,
            "sources_deprecated": sources_deprecated,
        }
        return {name: _ansible(function) for name, function in calls.items()}
