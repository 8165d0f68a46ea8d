"""The host's keystream: OpenSSL's ChaCha20 (RFC 8439, through the ``cryptography`` package) at any word position.

Word w of a stream is bytes 8w..8w+7 of the keystream under the stream's subkey, block counter w // 8 and a zero
nonce; the device's torch ChaCha20 (``privacy.noise.device.chacha``) makes the same words. OpenSSL refuses to wrap
the 32-bit block counter, so a stream ends after 2^32 blocks (``MAX_STREAM_WORDS`` words).
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from dpcda.privacy.noise.constants import OVERFLOW

_ZEROS = memoryview(bytes(1 << 20))  # plaintext for the keystream, 1 MiB at a time (sliced without a copy)


def encryptor(key: bytes, word: int):
    """The OpenSSL ChaCha20 stream of subkey ``key`` positioned at 64-bit word ``word`` (block counter word // 8)."""
    block, skip = divmod(int(word), 8)
    if not 0 <= block < 1 << 32:
        raise ValueError(OVERFLOW)
    enc = Cipher(algorithms.ChaCha20(key, block.to_bytes(4, "little") + bytes(12)), mode=None).encryptor()
    if skip:
        enc.update(bytes(8 * skip))
    return enc


def fill_from(enc, out: np.ndarray, first: int, n: int) -> None:
    """Words first..first+n-1 of ``out`` (a uint64 buffer with room beyond them) from ``enc``, in order."""
    view = memoryview(out).cast("B")[8 * first :]
    for start in range(0, 8 * n, len(_ZEROS)):
        size = min(len(_ZEROS), 8 * n - start)
        enc.update_into(_ZEROS[:size], view[start:])
