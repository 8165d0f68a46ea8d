"""The host's Gaussian draw over a span of blocks: the words from OpenSSL, the sampler compiled (``native_sampler``)
or in numpy (``gaussian.rounded_gaussian``), the same output either way.

A draw's layout is fixed (``constants.BLOCK``): block j of BLOCK elements reads its n top, n middle and n low words
from word 3 j BLOCK of the draw on, so a span of blocks reads its own span of the stream and threads may draw spans
in any order (``NoiseStream.gaussian``).
"""

from __future__ import annotations

import numpy as np

import dpcda.privacy.noise.keystream as keystream
import dpcda.privacy.noise.native_sampler as native_sampler
from dpcda.privacy.noise.constants import BLOCK, SLACK_WORDS, STATS_PER_BLOCK, UNIFORM_WORDS
from dpcda.privacy.noise.gaussian import rounded_gaussian

_NATIVE_GROUP = 4  # blocks per call of the compiled sampler (privacy.noise.native)
_SKIP_LOW_WORDS = False  # True: each block opens an OpenSSL stream to skip its low words (openings serialise threads)
_NATIVE_MIN = 2 * BLOCK  # smaller spans: the numpy sampler (no build for a few draws)


def gaussian_span(subkey, first, enc, flat, out, start, stop, sigma: float, g: float):
    """out[start:stop] (``start`` a multiple of BLOCK) for the draw whose words start at stream word ``first``.

    The layout is fixed: block j of BLOCK elements (the last one shorter) reads words first + 3 j BLOCK on: n top,
    n middle and n low words of its n 192-bit uniforms. The compiled kernel (``privacy.noise.native``) reads only the
    top and middle words of each block (the low words where an exact decision needs them); without it the numpy
    sampler reads all three, from ``enc`` if given (an OpenSSL stream at the span's first word). Returns the OpenSSL
    stream at word first + 3 stop if one ended there, else None."""
    fn = native_sampler.native_kernel() if stop - start >= _NATIVE_MIN else None
    if fn is not None:
        return _native_span(fn, subkey, first, enc, flat, out, start, stop, sigma, g)
    enc = enc if enc is not None else keystream.encryptor(subkey, first + 3 * start)
    buf = np.empty(3 * BLOCK + SLACK_WORDS, np.uint64)
    for s in range(start, stop, BLOCK):
        e = min(stop, s + BLOCK)
        n = e - s
        keystream.fill_from(enc, buf, 0, 3 * n)
        out[s:e] = rounded_gaussian(flat[s:e], float(sigma), g, buf[: 3 * n].reshape(UNIFORM_WORDS, n))
    return enc


def _native_span(fn, subkey, first, enc, flat, out, start, stop, sigma: float, g: float):
    """``gaussian_span`` with the compiled kernel: _NATIVE_GROUP blocks per call (the GIL released inside), then
    per block, in order, the numpy sampler's error bound, refusals and exact decisions
    (``native_sampler.finish_block``).

    With _SKIP_LOW_WORDS each block reads its top and middle words from an OpenSSL stream opened at them, and a low
    word only where an exact decision needs it; else one stream reads every word in order (``enc``, if given, is
    at the span's first word), and is returned at word first + 3 stop."""
    sigma = float(sigma)  # a numpy float32 sigma: the numpy sampler's float64 value (and Fraction takes it)
    skip = _SKIP_LOW_WORDS
    group = _NATIVE_GROUP * BLOCK
    stride = (2 if skip else 3) * BLOCK  # words per block in the buffer
    words = np.empty(stride * _NATIVE_GROUP + SLACK_WORDS, np.uint64)
    dist = np.empty(group, np.float64)
    stats = np.empty((_NATIVE_GROUP, STATS_PER_BLOCK), np.float64)
    if not skip and enc is None:
        enc = keystream.encryptor(subkey, first + 3 * start)
    for s in range(start, stop, group):
        e = min(stop, s + group)
        full, rest = divmod(e - s, BLOCK)
        if skip:
            for j in range(full + (1 if rest else 0)):  # top and middle words of each block
                n = min(BLOCK, e - s - j * BLOCK)
                keystream.fill_from(keystream.encryptor(subkey, first + 3 * (s + j * BLOCK)), words, stride * j, 2 * n)
        else:
            keystream.fill_from(enc, words, 0, 3 * (e - s))
        if full:
            native_sampler.call_kernel(
                fn, full, BLOCK, words, 0, stride, flat[s : s + full * BLOCK], out[s:], dist, stats, sigma, g
            )
        if rest:
            at = full * BLOCK
            native_sampler.call_kernel(
                fn,
                1,
                rest,
                words,
                stride * full,
                stride,
                flat[s + at : e],
                out[s + at :],
                dist[at:],
                stats[full:],
                sigma,
                g,
            )
        for j in range(full + (1 if rest else 0)):
            b0 = s + j * BLOCK
            n = min(BLOCK, e - b0)
            top = words[stride * j : stride * j + 3 * n]  # n top, n middle (and n low) words

            def low(i: int, base=first + 3 * b0 + 2 * n, top=top, n=n) -> int:  # element i's low word
                if not skip:
                    return int(top[2 * n + i])
                w = np.empty(1 + SLACK_WORDS, np.uint64)
                keystream.fill_from(keystream.encryptor(subkey, base + i), w, 0, 1)
                return int(w[0])

            if not native_sampler.finish_block(
                stats[j], dist[j * BLOCK : j * BLOCK + n], flat[b0 : b0 + n], out[b0 : b0 + n], top, low, sigma, g
            ):
                u = np.empty(3 * n + SLACK_WORDS, np.uint64)  # p's rare low-precision case: numpy, all words
                keystream.fill_from(keystream.encryptor(subkey, first + 3 * b0), u, 0, 3 * n)
                out[b0 : b0 + n] = rounded_gaussian(flat[b0 : b0 + n], float(sigma), g, u[: 3 * n].reshape(3, n))
    return None if skip else enc  # skipping, ``enc`` (if any) was never read: it is not at the span's end
