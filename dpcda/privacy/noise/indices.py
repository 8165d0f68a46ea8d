"""Uniform indices, exactly: the pieces of ``NoiseStream.uniform_int`` and ``NoiseStream.distinct`` that the host and
the device share.

``uniform_int`` rejects 64-bit words at or above the largest multiple of the bound (no modulo bias); ``distinct``
draws rows of independent indices and rejects a row with a repeat (``sparse_distinct``), or, where repeats would be
common, takes the l smallest of n random 64-bit keys and redraws a row with a tie at the cut (no tie-breaking bias).
The device (``privacy.noise.device.indices``) makes the same choice and the same rejections.
"""

from __future__ import annotations

import numpy as np

DENSE_KEYS = 1 << 22  # random keys per batch in the dense distinct-index sampler


def sparse_distinct(n: int, l: int) -> bool:
    """``distinct``'s choice of sampler (the host's and the device's): rows of independent uniform indices, rejected
    on a repeat, where a repeat has probability below 0.4; else the l smallest of n random keys."""
    return l * (l - 1) / (2.0 * n) <= 0.5


def residues(w: np.ndarray, bound: int) -> np.ndarray:
    """int64 ``w mod bound`` of uint64 words (``bound`` <= 2^62, so every residue fits): a mask for a power of two."""
    if bound & (bound - 1) == 0:
        return (w & np.uint64(bound - 1)).view(np.int64)
    return (w % np.uint64(bound)).view(np.int64)


def has_repeat(idx: np.ndarray) -> np.ndarray:
    if idx.shape[1] < 2:
        return np.zeros(idx.shape[0], bool)
    s = np.sort(idx, axis=1)
    return (s[:, 1:] == s[:, :-1]).any(axis=1)
