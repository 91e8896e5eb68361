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
  watch:
    description:
      - Files a later gpuenv_files call of the role writes, reported in C(files) (kind, mode,
        owner, group and a digest of the content, or of the managed block with I(marker)), so
        that the filter gpuenv.cluster.files_pending can skip that call on a converged node.
    type: list
    elements: dict
    default: []
    suboptions:
      path: {description: Absolute path., type: path, required: true}
      marker:
        description: The managed block's marker line (C({mark}) for BEGIN or END).
        type: str
notes:
  - Changes nothing, so check mode is the same run.
  - Commands it runs on the node get 60 seconds each (coreutils' C(timeout)).
"""
