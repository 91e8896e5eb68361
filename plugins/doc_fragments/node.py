# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The option every node-reading module of gpuenv.cluster shares (module_utils/node.py)."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  packages:
    description: Debian packages whose installed state to report (in C(debs)).
    type: list
    elements: str
    default: []
notes:
  - Changes nothing, so check mode is the same run.
  - Commands it runs on the node get 60 seconds each (coreutils' C(timeout)).
"""
