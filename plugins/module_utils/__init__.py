# Copyright: gpuenv contributors
# Apache License 2.0 (see LICENSE)
"""The node floor: the one reader of a node, standard library only.

In the collection these files are ``gpuenv.cluster``'s module_utils, shipped to the node with
the modules; the Python package carries the same files as ``gpuenv.floor`` (a package-dir
mapping in pyproject.toml). Between themselves they import relatively (``from .node import``),
so the same text works under both names.
"""
