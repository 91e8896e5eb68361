# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""files_pending: what a gpuenv_files call would change, from the files a reading module watched.

    when: >-
      {'files': [...], 'blocks': [...]} | gpuenv.cluster.files_pending(__probe.files) | length > 0

The rules are gpuenv_files' own (module_utils/files.py); a path the probe did not watch is always
pending, so a forgotten watch costs a module run, never a skipped change.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuenv.cluster.plugins.module_utils.files import pending

_KINDS = ("directories", "files", "blocks", "links")


def files_pending(request: Any, states: Any) -> list[str]:
    """The paths of request (gpuenv_files' options) that states (a probe's ``files``) show as
    not yet what the request asks."""
    if not isinstance(request, dict) or set(request) - set(_KINDS):
        raise AnsibleFilterError(
            f"files_pending: the request is gpuenv_files' options ({', '.join(_KINDS)}),"
            f" got {request!r}"
        )
    if not isinstance(states, dict):
        raise AnsibleFilterError(f"files_pending: the states are a probe's files, got {states!r}")
    return pending(request, states)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"files_pending": files_pending}
