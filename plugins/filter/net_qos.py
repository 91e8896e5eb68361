# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The net_qos role's view of module_utils/net_qos.py: one check of its variables."""

from __future__ import annotations

from typing import Any

from ansible_collections.gpuenv.cluster.plugins.module_utils import net_qos as floor


class FilterModule:
    """``{'net_qos_ports': [...], ...} | gpuenv.cluster.net_qos_error`` -> "" or the reason."""

    def filters(self) -> dict[str, Any]:
        return {"net_qos_error": floor.spec_error}
