"""`gpuenv doctor`: diagnose a node's (or a cluster's) GPU stack faults and name their fixes.

``system`` reads the node (files under a root folder, commands through a runner), one module
per concern holds the readers and analysers of its classes (``driver``, ``fabric``, ``acs``,
``rdma``, ``netif``, ``nccl``, ``envvars``), ``diagnosis`` runs them and compares nodes, ``fleet``
fans out over an inventory, ``render`` writes the console text. docs/doctor.md lists the classes.
"""
