"""Cluster-wide validation: inventory, fan-out, consistency, rendezvous, launchers, pair isolation.

Only ``probe`` and ``worker`` run on the nodes (standard library and torch/mpi4py only); the
other modules run on the controller.
"""
