"""Noise keys: a fresh secret per run, expanded into independent generators per (purpose, class, chunk).

The key is 32 bytes from ``secrets`` and is never written anywhere (not to outputs, logs or the
manifest). Deriving each generator from (key, purpose, class, chunk) makes a retried Beam bundle draw
exactly the rows it drew the first time. ``from_test_seed`` exists for tests and benchmarks only and
the manifest then says ``reproducible_seed: true``.

Caveat (stated in the manifest): the generators are torch's (Philox on CUDA, Mersenne Twister on CPU)
and numpy's PCG64, seeded with 64/128 bits derived from the key; floating-point Gaussian sampling is
not hardened against precision attacks.
"""
from __future__ import annotations

import hashlib
import secrets

import numpy as np

KEY_BYTES = 32


def fresh_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_from_test_seed(seed: int) -> bytes:
    return hashlib.blake2b(f"dpcda-test-seed:{int(seed)}".encode(), digest_size=KEY_BYTES).digest()


def _derive(key: bytes, path: tuple, nbytes: int) -> int:
    if len(key) != KEY_BYTES:
        raise ValueError(f"noise key must be {KEY_BYTES} bytes")
    label = "/".join(str(p) for p in path).encode()
    return int.from_bytes(hashlib.blake2b(label, key=key, digest_size=nbytes).digest(), "little")


def numpy_generator(key: bytes, *path) -> np.random.Generator:
    """A PCG64 generator for ``path`` (e.g. ``("stats",)``), seeded with 128 derived bits."""
    return np.random.Generator(np.random.PCG64(_derive(key, path, 16)))


def torch_generator(key: bytes, *path, device="cpu"):
    """A torch generator on ``device`` for ``path`` (e.g. ``("mix", k, chunk)``)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(_derive(key, path, 8) & ((1 << 63) - 1))
    return gen
