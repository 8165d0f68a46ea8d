"""ChaCha20 in torch: the RFC 8439 block function in vectorised integer operations, and the words of a stream.

The block function runs in int64 tensors holding 32-bit values, masked after every addition, one block per lane,
keyed by the same host-side subkey BLAKE2b-256(run key, path) and with the same (counter, nonce) layout as the OpenSSL
stream that ``NoiseStream`` reads (``privacy.noise.keystream``): block B of a path has counter B and a zero nonce,
word w of the stream is bytes 8w..8w+7 of the keystream (little-endian). A stream ends after 2^32 blocks, where
OpenSSL refuses to go on; so does this one.
"""

from __future__ import annotations

import torch

from dpcda.privacy.noise.constants import MAX_STREAM_WORDS, OVERFLOW
from dpcda.privacy.noise.device.kernels import BATCH_BLOCKS, batch, compile_enabled, const, run

M32 = 0xFFFFFFFF
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
MAX_BLOCKS = 1 << 32  # OpenSSL (through ``cryptography``) refuses to wrap the 32-bit block counter
MAX_WORDS = MAX_STREAM_WORDS  # 8 * MAX_BLOCKS: where the host's stream ends too


def _rotl(x: torch.Tensor, n: int) -> torch.Tensor:
    return ((x << n) & M32) | (x >> (32 - n))


def _quarter(x: list, a: int, b: int, c: int, d: int) -> None:
    x[a] = (x[a] + x[b]) & M32
    x[d] = _rotl(x[d] ^ x[a], 16)
    x[c] = (x[c] + x[d]) & M32
    x[b] = _rotl(x[b] ^ x[c], 12)
    x[a] = (x[a] + x[b]) & M32
    x[d] = _rotl(x[d] ^ x[a], 8)
    x[c] = (x[c] + x[d]) & M32
    x[b] = _rotl(x[b] ^ x[c], 7)


def chacha20_blocks(key_words: torch.Tensor, nonce_words: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """(M, 16) int64 holding the 32-bit output words of the RFC 8439 block function (section 2.3).

    ``key_words`` (8,) and ``nonce_words`` (3,) int64 hold the key and nonce as little-endian 32-bit words,
    ``counters`` (M,) int64 the 32-bit block counters.
    """
    ones = torch.ones_like(counters)
    init = [ones * c for c in _CONSTANTS]
    init += [ones * key_words[i] for i in range(8)]
    init += [counters & M32] + [ones * nonce_words[i] for i in range(3)]
    x = list(init)
    for _ in range(10):  # 20 rounds: column rounds, then diagonal rounds
        _quarter(x, 0, 4, 8, 12)
        _quarter(x, 1, 5, 9, 13)
        _quarter(x, 2, 6, 10, 14)
        _quarter(x, 3, 7, 11, 15)
        _quarter(x, 0, 5, 10, 15)
        _quarter(x, 1, 6, 11, 12)
        _quarter(x, 2, 7, 8, 13)
        _quarter(x, 3, 4, 9, 14)
    return torch.stack([(x[i] + init[i]) & M32 for i in range(16)], dim=1)


def _words32(key: bytes, n: int, base: int = 0) -> list:
    return [int.from_bytes(key[4 * i : 4 * i + 4], "little") + base for i in range(n)]


def stream_halves(subkey: bytes, start: int, n: int, device, *, compiled: bool = True):
    """(lo, hi) int64 tensors (n,): the 32-bit halves of words start..start+n-1 of the stream keyed by ``subkey``."""
    check_range(start, n)
    device = torch.device(device)
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return empty, empty
    first, last = start // 8, (start + n - 1) // 8
    counters = torch.arange(first, last + 1, dtype=torch.int64, device=device)
    words = stream_blocks(subkey, counters, compiled).reshape(-1, 2)[start % 8 : start % 8 + n]
    return words[:, 0].contiguous(), words[:, 1].contiguous()


def check_range(start: int, n: int) -> None:
    if start < 0 or n < 0 or start + n > MAX_WORDS:
        raise ValueError(OVERFLOW)


def stream_blocks(subkey: bytes, counters: torch.Tensor, compiled: bool) -> torch.Tensor:
    """(M, 16) int64: the ChaCha20 blocks of the stream keyed by ``subkey`` at ``counters`` (M,) (each < 2^32), in
    kernel calls of at most ``BATCH_BLOCKS`` blocks."""
    device = counters.device
    key_t = const(_words32(subkey, 8), torch.int64, device)
    nonce_t = torch.zeros(3, dtype=torch.int64, device=device)
    use = compiled and compile_enabled()
    per = batch(BATCH_BLOCKS, device)
    parts = [
        run("chacha", chacha20_blocks, use, key_t, nonce_t, counters[b : b + per]) for b in range(0, len(counters), per)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def stream_words(subkey: bytes, start: int, n: int, device, *, compiled: bool = True) -> torch.Tensor:
    """int64 tensor (n,): words start..start+n-1 of the stream as 64-bit patterns (view as uint64 on the host)."""
    lo, hi = stream_halves(subkey, start, n, device, compiled=compiled)
    signed_hi = hi - ((hi >> 31) << 32)  # the top half as a signed 32-bit value: no int64 overflow below
    return signed_hi * (1 << 32) + lo


def words_at(subkey: bytes, positions):
    """uint64 words of the stream keyed by ``subkey`` at ``positions`` (numpy int64), made on the host's CPU by the
    same torch block function (a few, for the elements the host decides)."""
    import numpy as np

    pos = torch.from_numpy(np.asarray(positions, np.int64))
    blocks = stream_blocks(subkey, pos // 8, compiled=False)
    j = 2 * (pos % 8)
    rows = torch.arange(len(pos))
    lo, hi = (blocks[rows, j + i].numpy().astype(np.uint64) for i in (0, 1))
    return (hi << np.uint64(32)) | lo


class StreamWords:
    """``take(n)``: the next ``n`` words of the stream keyed by ``subkey`` from word ``start`` on, as int64 tensors on
    ``device`` (``stream_words``); ``position`` is the next word. For drawing outside a ``NoiseStream`` (tests)."""

    def __init__(self, subkey: bytes, start: int, device, *, compiled: bool = True):
        self.subkey, self.position, self.device, self.compiled = subkey, int(start), torch.device(device), compiled

    def __call__(self, n: int) -> torch.Tensor:
        words = stream_words(self.subkey, self.position, int(n), self.device, compiled=self.compiled)
        self.position += int(n)
        return words
