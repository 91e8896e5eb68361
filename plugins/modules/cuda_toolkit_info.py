#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: find the CUDA compilers (nvcc) of a node and their releases, in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cuda_toolkit_info
short_description: Find nvcc in the usual places and the CUDA release each one reports
description:
  - One look at the node for the C(cuda_toolkit) role, which leaves a matching toolkit alone,
    including one installed outside the role (a runfile, an image).
options:
  nvcc:
    description: Paths where an nvcc may be; each executable one is asked C(nvcc --version).
    type: list
    elements: path
    required: true
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Look for nvcc and the toolkit package
  gpuenv.cluster.cuda_toolkit_info:
    nvcc: [/usr/local/cuda-12.4/bin/nvcc, /usr/local/cuda/bin/nvcc, /usr/bin/nvcc]
    packages: [nvidia-cuda-toolkit]
  register: found
"""

RETURN = r"""
nvcc:
  description: Each executable nvcc of I(nvcc), with its resolved path and the release it reports.
  type: list
  elements: dict
  returned: always
  sample: [{path: /usr/local/cuda-12.4/bin/nvcc, release: "12.4"}]
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    exit_with_reading,
    installed,
)


def compilers(run: Run, candidates: list[str]) -> list[dict]:
    found = []
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            _, out = run([path, "--version"])
            release = re.search(r"release ([0-9][0-9.]*),", out)
            found.append(
                {"path": os.path.realpath(path), "release": release.group(1) if release else ""}
            )
    return found


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    return {"nvcc": compilers(run, params["nvcc"]), "debs": installed(run, params["packages"])}


def main() -> None:
    spec = {"nvcc": {"type": "list", "elements": "path", "required": True}}
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
