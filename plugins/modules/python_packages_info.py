#!/usr/bin/python
# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""Ansible module: find Python distributions (wheels) in prefixes and in the node's Python."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: python_packages_info
short_description: Find Python distributions in virtual environments and in the node's own Python
description:
  - One look at the node for the pip methods of the C(cuda_toolkit) and C(nccl) roles, telling which
    of the named distributions a prefix holds, which the node's own Python holds (someone else's
    install), and which Debian packages installing them needs are there.
  - Changes nothing, so check mode is the same run.
options:
  names:
    description: Distributions to look for (compared as pip does, e.g. C(nvidia-nccl-cu12)).
    type: list
    elements: str
    required: true
  prefixes:
    description: Virtual environments or prefixes, searched in their C(lib/python*/site-packages).
    type: list
    elements: path
    default: []
  interpreter:
    description: Also look in the Python that runs the module (the node's own).
    type: bool
    default: false
extends_documentation_fragment: [gpuenv.cluster.node]
author: gpuenv contributors
"""

EXAMPLES = r"""
- name: Look for the NCCL wheel in the prefix and in the node's Python
  gpuenv.cluster.python_packages_info:
    names: [nvidia-nccl-cu12]
    prefixes: [/opt/nccl/venv]
    interpreter: true
    packages: [python3-venv, python3-packaging]
  register: found
"""

RETURN = r"""
prefixes:
  description: For each prefix, the named distributions it holds (version and site-packages folder).
  type: dict
  returned: always
  sample:
    /opt/nccl/venv:
      nvidia-nccl-cu12: {version: 2.22.3, site: /opt/nccl/venv/lib/python3.13/site-packages}
interpreter:
  description: The named distributions of the node's own Python (empty unless I(interpreter)).
  type: dict
  returned: always
debs:
  description: The packages of I(packages) that dpkg has installed.
  type: list
  elements: str
  returned: always
"""

import importlib.metadata

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuenv.cluster.plugins.module_utils.node import (
    Run,
    distributions,
    exit_with_reading,
    installed,
    normalize,
)


def in_prefix(prefix: str, names: list[str]) -> dict[str, dict[str, str]]:
    dists = distributions(prefix)
    wanted = {normalize(name) for name in names}
    return {
        name: {"version": version, "site": site}
        for name, (version, site) in dists.items()
        if name in wanted
    }


def in_interpreter(names: list[str]) -> dict[str, dict[str, str]]:
    found = {}
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[normalize(name)] = {"version": dist.version, "site": str(dist.locate_file(""))}
    return found


def read(run: Run, params: dict) -> dict:
    """The module's answer for its parameters."""
    names = params["names"]
    return {
        "prefixes": {prefix: in_prefix(prefix, names) for prefix in params["prefixes"]},
        "interpreter": in_interpreter(names) if params["interpreter"] else {},
        "debs": installed(run, params["packages"]),
    }


def main() -> None:
    spec = {
        "names": {"type": "list", "elements": "str", "required": True},
        "prefixes": {"type": "list", "elements": "path", "default": []},
        "interpreter": {"type": "bool", "default": False},
    }
    exit_with_reading(AnsibleModule, spec, read)


if __name__ == "__main__":
    main()
