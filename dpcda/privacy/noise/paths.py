"""One Gaussian draw from each of many streams, vectorised: element i is, bit for bit,
``NoiseStream(key, *paths[i]).gaussian(np.array([centers[i]]), sigma)[0]``, the first (and only) draw of its own
stream.

A stream's first draw of one element reads the stream's words 0, 1 and 2 as its 192-bit uniform (the layout of
``host_draw.gaussian_span``: a block of one element reads its top, middle and low word). Here those three words are
read for every path (its own subkey, ``keys.subkey``, and its own OpenSSL ChaCha20 stream), and the numpy sampler
(``gaussian.rounded_gaussian``, the reference every sampler is checked against) turns all of them at once: it makes
the ideal rounded Gaussian at each uniform (its exact decisions settle every cell the floats cannot), so one call on
many elements gives each element the value a call on it alone gives. A block whose float error bound is refused
(values too large for sigma's grid) is drawn element by element, so an element is refused exactly where its own
stream's draw is.

The caller uses each path once: a stream drawn here must not be drawn from again (its words would repeat).
"""

from __future__ import annotations

import numpy as np

import dpcda.privacy.noise.keystream as keystream
from dpcda.privacy.noise.constants import BLOCK, UNIFORM_WORDS
from dpcda.privacy.noise.gaussian import grid_for, rounded_gaussian
from dpcda.privacy.noise.keys import subkey

_FIRST_DRAW = bytes(8 * UNIFORM_WORDS)  # the plaintext of a stream's first three words


def gaussian_per_path(key: bytes, paths, centers, sigma: float) -> np.ndarray:
    """float64: ``g * round((centers[i] + sigma * Z_i) / g)``, Z_i the first standard normal of the stream at
    ``paths[i]`` (module doc); ``sigma`` = 0 returns the centers unchanged (no noise, no privacy). Refuses two paths
    with one subkey (their draws would be the same)."""
    c = np.asarray(centers, np.float64).reshape(-1)
    paths = list(paths)
    if len(paths) != c.size:
        raise ValueError(f"gaussian_per_path: {len(paths)} paths for {c.size} centers")
    if sigma == 0:
        return c.copy()
    g = grid_for(sigma)
    keys = [subkey(key, tuple(p)) for p in paths]
    if len(set(keys)) != len(keys):
        raise ValueError("gaussian_per_path: a stream is named twice (its noise would be drawn twice)")
    raw = b"".join(keystream.encryptor(k, 0).update(_FIRST_DRAW) for k in keys)
    u = np.frombuffer(raw, dtype="<u8").astype(np.uint64).reshape(-1, UNIFORM_WORDS).T  # (3, n): top, middle, low
    out = np.empty(c.size, np.float64)
    for s in range(0, c.size, BLOCK):
        e = min(c.size, s + BLOCK)
        try:
            out[s:e] = rounded_gaussian(c[s:e], float(sigma), g, np.ascontiguousarray(u[:, s:e]))
        except ArithmeticError:  # the block's bound, from its largest values: each element on its own bound
            for i in range(s, e):
                out[i] = rounded_gaussian(c[i : i + 1], float(sigma), g, np.ascontiguousarray(u[:, i : i + 1]))[0]
    return out
