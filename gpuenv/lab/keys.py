"""The lab's SSH client key: generated once per lab, private half 0600, never logged."""

from __future__ import annotations

import os
from pathlib import Path


def ensure_key(private_key: Path) -> str:
    """Create the key pair if missing; return the public key line."""
    public_key = private_key.with_name(private_key.name + ".pub")
    if private_key.exists() and public_key.exists():
        os.chmod(private_key, 0o600)
        return public_key.read_text().strip()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public_line = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        + " gpuenv-lab"
    )
    private_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(private_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(private_bytes)
    os.chmod(private_key, 0o600)  # in case it existed with looser bits
    public_key.write_text(public_line + "\n")
    return public_line
