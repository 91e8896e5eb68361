"""The local lab: systemd containers built from Debian's archive that behave like nodes.

``images`` builds the node and cache images, ``cache`` runs the shared apt/wheel cache,
``cluster`` brings labs up and down, ``inventory`` writes what Ansible needs to reach them.
Nothing here prints: progress goes through :class:`gpuenv.progress.Progress`.
"""
