"""Keys: the run key, the test and public keys, and the per-path subkey every stream is keyed by.

A fresh 256-bit run key (``secrets``) is never written anywhere. Each (purpose, class, chunk) path gets its own
ChaCha20 keystream under the subkey BLAKE2b-256(key = run key, message = path), so streams are deterministic in
(key, path) and independent as long as ChaCha20 is a PRF (the package's docstring).
"""

from __future__ import annotations

import hashlib
import secrets

from dpcda.privacy.noise.constants import KEY_BYTES


def fresh_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_from_test_seed(seed: int) -> bytes:
    """TEST ONLY: a fixed key (the manifest then says ``reproducible_seed: true``)."""
    return hashlib.blake2b(f"dpcda-test-seed:{int(seed)}".encode(), digest_size=KEY_BYTES).digest()


def public_key(purpose: str, seed: int) -> bytes:
    """A key anyone can rebuild, for PUBLIC draws only (e.g. randproj's projection matrix from its public seed)."""
    return hashlib.blake2b(f"dpcda-public:{purpose}:{int(seed)}".encode(), digest_size=KEY_BYTES).digest()


def subkey(key: bytes, path: tuple) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"noise key must be {KEY_BYTES} bytes")
    label = "/".join(str(p) for p in path).encode()
    return hashlib.blake2b(label, key=bytes(key), digest_size=32, person=b"dpcda-stream").digest()
