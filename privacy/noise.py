"""Noise keys: a fresh secret per run, expanded into independent generators per (purpose, class, chunk).

The key is 32 bytes from ``secrets`` and is never written anywhere (not to outputs, logs or the
manifest). Deriving each generator from (key, purpose, class, chunk) makes a retried Beam bundle draw
exactly the rows it drew the first time. ``from_test_seed`` exists for tests and benchmarks only and
the manifest then says ``reproducible_seed: true``.

Seeding. numpy's PCG64 takes 128 derived bits. torch's CUDA generator (Philox) takes a 64-bit seed. torch's CPU
generator is a Mersenne Twister whose ``manual_seed`` keeps only 32 bits of the seed (seeds that differ above bit
32 give the same stream), which would let anyone search all 2^32 seeds of a chunk and strip its noise; so its whole
624-word state is filled from the key instead (``get_state``/``set_state``; the layout is checked against numpy's
MT19937 in the tests). Each (purpose, class, chunk) has its own stream, and labels draw from a stream apart from the
feature noise. Caveat (stated in the manifest): none of these generators is cryptographic, and floating-point
Gaussian sampling is not hardened against precision attacks.
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


# torch's CPU generator state (aten CPUGeneratorImplState, 5056 bytes): uint64 the_initial_seed, int32 left,
# int32 seeded, uint64 next, then uint64 state[624] holding the Mersenne Twister's 32-bit words.
MT_WORDS = 624
_MT_STATE_BYTES = 5056
_MT_WORDS_OFFSET = 24


def mt_state_words(key: bytes, path: tuple) -> np.ndarray:
    """624 key-derived 32-bit words: the whole Mersenne Twister state of the CPU stream for ``path``."""
    subkey = _derive(key, ("torch-cpu-mt19937", *path), 64).to_bytes(64, "little")
    return np.frombuffer(hashlib.shake_256(subkey).digest(4 * MT_WORDS), dtype="<u4").copy()


def torch_generator(key: bytes, *path, device="cpu"):
    """A torch generator on ``device`` for ``path`` (e.g. ``("mix", k, chunk)``)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(_derive(key, path, 8) & ((1 << 63) - 1))
    if gen.device.type == "cpu":
        state = gen.get_state().numpy().copy()  # after manual_seed: left = 1, so the next draw twists this state
        if state.size != _MT_STATE_BYTES:
            raise RuntimeError(f"torch {torch.__version__}: CPU generator state is {state.size} bytes, expected "
                               f"{_MT_STATE_BYTES}; the full-state seeding in privacy/noise.py needs updating")
        words = mt_state_words(key, path).astype("<u8")
        state[_MT_WORDS_OFFSET:_MT_WORDS_OFFSET + 8 * MT_WORDS] = words.view(np.uint8)
        gen.set_state(torch.from_numpy(state))
    return gen
