"""The compiled sampler's glue: the kernel's calls, each block finished as the numpy sampler finishes it, and the
check the kernel passes at load.

The kernel (``privacy.noise.native``) makes each block's float values and statistics; ``finish_block`` then applies
the numpy sampler's error bound, its refusals and its exact decision (``exact.exact_cell``) to the same elements, so
the output is ``gaussian.rounded_gaussian``'s, bit for bit. ``check_native`` compares the two on fixed uniforms
before a process uses the kernel; ``native_kernel`` hands the kernel out only where it passed.

Benchmarks and tests call ``call_kernel`` and ``finish_block`` on words already drawn, to time or check the kernel
alone (``benchmarks/perf/bench_noise.py``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

import dpcda.privacy.noise.exact as exact_arithmetic
import dpcda.privacy.noise.keystream as keystream
import dpcda.privacy.noise.native as native
from dpcda.privacy.noise.constants import BLOCK, SLACK_WORDS, STATS_PER_BLOCK
from dpcda.privacy.noise.gaussian import LOW63, error_bound, grid_for, rounded_gaussian, tail_p
from dpcda.privacy.noise.inverse_normal import A, B, C, D, E, F, upper_quantile
from dpcda.privacy.noise.keys import public_key, subkey


def call_kernel(fn, nblocks, n, words, offset, stride, center, out, dist, stats, sigma: float, g: float) -> None:
    """The kernel on ``nblocks`` blocks of ``n`` elements (n top then n middle words of block j at
    words[offset + stride j:])."""
    c = np.ascontiguousarray(center, np.float64)
    if not (out.flags.c_contiguous and out.dtype == np.float64 and out.size >= nblocks * n and c.size == nblocks * n):
        raise ValueError("noise sampler: kernel buffers of the wrong shape")  # never expected: memory safety first
    fn(
        nblocks,
        n,
        words.ctypes.data + 8 * offset,
        stride,
        c.ctypes.data,
        out.ctypes.data,
        dist.ctypes.data,
        _coefficients().ctypes.data,
        sigma / g,
        g,
        stats.ctypes.data,
    )


def finish_block(st, dist, center, out, top, low, sigma: float, g: float) -> bool:
    """After the kernel, one block as ``rounded_gaussian`` finishes it: its error bound from its largest t and |c|,
    the same refusals, and the exact decision for every element within (twice) the bound of a cell boundary.
    ``top``: the block's n top then n middle words; ``low(i)``: element i's low word. False (nothing done) where an
    element has w0 < 2^11: the caller runs the numpy sampler on the block."""
    tmax, cmax, finite, dmax, small = (float(x) for x in st)
    if small:
        return False
    err = error_bound(sigma, g, tmax, cmax)
    if not (finite and math.isfinite(err)):
        raise ArithmeticError(f"noise sampler: values overflow at sigma={sigma:g} (too large for the grid)")
    if err > 0.125:
        raise ArithmeticError(f"noise sampler: sigma={sigma:g} is too small for the values' size")
    if dmax >= 0.5 - 2.0 * err:
        n = center.size
        for i in np.flatnonzero(dist >= 0.5 - 2.0 * err):
            u_int = (int(top[i]) << 128) | (int(top[n + i]) << 64) | low(int(i))
            k = exact_arithmetic.exact_cell(float(center[i]), sigma, g, u_int, int(out[i] / g))
            out[i] = (k + 0.0) * g
    return True


def native_kernel():
    """The compiled sampler (``privacy.noise.native``), built and checked against numpy once per process, or None
    (no C compiler, a failed build or check, ``DPCDA_NOISE_NATIVE=0``): then numpy runs the sampler."""
    return native.kernel(check_native)


@lru_cache(maxsize=1)
def _coefficients() -> np.ndarray:
    return np.array([A, B, C, D, E, F], np.float64).reshape(-1)


def check_words() -> tuple:
    """The load check's fixed uniforms, in the draws' layout (per block of n: n top, n middle, n low words), and for
    each block its elements: three full blocks and a short one. Block 0 holds random uniforms; block 1 the far tail
    (p < 1.4e-11, r > 5: top words from 2^11 to 2^28, both signs), p beside the tail's edge 0.075 and r = 5, U beside
    1/2; block 2 random uniforms again; the short block 3 the extremes with w0 < 2^11 (U = 0, 2^192 - 1, ...)."""
    rng = np.random.default_rng(20261126)
    mask = (1 << 64) - 1
    # the words of the stream NoiseStream(public_key("native-check", 0), "words") from its start (tests check that)
    raw = np.empty(3 * 3 * BLOCK + SLACK_WORDS, np.uint64)
    key = subkey(public_key("native-check", 0), ("words",))
    keystream.fill_from(keystream.encryptor(key, 0), raw, 0, 3 * 3 * BLOCK)
    words = raw[: 3 * 3 * BLOCK].reshape(3, 3, BLOCK).copy()
    far = np.exp2(rng.uniform(11.0, 28.0, BLOCK)).astype(np.uint64)  # w0 (and so p 2^-64 w0) in the far tail
    far[:8] = [1 << 11, (1 << 11) + 1, (1 << 11) + 2, 3 << 10, 1 << 20, (1 << 27) + 12345, 1 << 27, (1 << 28) - 1]
    for j, p_edge in enumerate((0.075, math.exp(-25.0))):  # p on either side of the tail's edge and of r = 5
        at = 16 + 64 * j
        far[at : at + 64] = int(p_edge * 2.0**64) + rng.integers(-(1 << 30), 1 << 30, 64)
    far[200:264] = ((1 << 63) - 1) - rng.integers(0, 1 << 20, 64).astype(np.uint64)  # p beside 1/2
    flip = rng.integers(0, 2, BLOCK).astype(bool)  # U >= 2^191 (w0 = ~u0): the other tail
    words[1, 0] = np.where(flip, ~far, far)
    extremes = [0, 1, 5 << 64, (1 << 192) - 1, (1 << 192) - 2, 12345 << 140, (1 << 191) - 1, 1 << 191]
    ext = np.array([[(u >> s) & mask for s in (128, 64, 0)] for u in extremes], np.uint64).T
    flat = np.concatenate([words.reshape(-1), ext.reshape(-1), np.zeros(SLACK_WORDS, np.uint64)])
    return flat, [BLOCK, BLOCK, BLOCK, len(extremes)]


def check_native(fn) -> str:
    """'' if the kernel gives the numpy sampler's output, bit for bit, on fixed uniforms (``check_words``: random
    ones, the far tail and the tail's edges, U beside 1/2 and the extremes), called on several blocks at once in the
    draws' layout as a draw calls it; else what differs. At each sigma the centres put some elements right beside a
    cell boundary (so the check makes exact decisions, and fails if it made none) and some at scaled values in
    (-1/2, 0), where rint gives -0.0 and the output must be +0.0 (a build that ignores signed zeros fails here).
    The block with w0 < 2^11 must be handed back to the numpy sampler, with the right count."""
    words, sizes = check_words()
    starts = [3 * sum(sizes[:j]) for j in range(len(sizes))]
    rng = np.random.default_rng(7)
    for sigma in (0.7, 1e-3, 2.5):
        g = grid_for(sigma)
        z = np.zeros(sum(sizes))
        blocks = []
        for j, n in enumerate(sizes):
            u = words[starts[j] : starts[j] + 3 * n].reshape(3, n)
            flip, p = tail_p(u)
            t = upper_quantile(p)
            z[j * BLOCK : j * BLOCK + n] = np.where(flip, t, -t)
            blocks.append(u)
        center = rng.normal(size=z.size) * 3.0
        idx = rng.permutation(z.size)
        near, negzero = idx[:24], idx[24 : z.size // 4]
        center[near] = (rng.integers(-40, 40, near.size) + 0.5) * g - sigma * z[near]  # beside a boundary
        center[negzero] = -sigma * z[negzero] - rng.uniform(0.05, 0.45, negzero.size) * g  # rint(scaled) = -0.0
        out, dist = np.empty(z.size), np.empty(z.size)
        st = np.empty((len(sizes), STATS_PER_BLOCK))
        full = len(sizes) - 1
        call_kernel(fn, full, BLOCK, words, 0, 3 * BLOCK, center[: full * BLOCK], out, dist, st, sigma, g)
        at = full * BLOCK
        call_kernel(
            fn, 1, sizes[-1], words, starts[-1], 3 * BLOCK, center[at:], out[at:], dist[at:], st[full:], sigma, g
        )
        decided = []
        for j, (n, u) in enumerate(zip(sizes, blocks)):
            sl = slice(j * BLOCK, j * BLOCK + n)
            top = np.ascontiguousarray(u[:2]).reshape(-1)
            small = int(((u[0] ^ (np.uint64(0) - (u[0] >> np.uint64(63)))) & LOW63 < np.uint64(1 << 11)).sum())
            if int(st[j, 4]) != small:
                return f"sigma {sigma}, block {j}: {int(st[j, 4])} elements with w0 < 2^11, not {small}"

            def low(i: int, u=u) -> int:
                decided.append(i)
                return int(u[2, i])

            if not finish_block(st[j], dist[sl], center[sl], out[sl], top, low, sigma, g):
                if small:
                    continue  # the numpy sampler decides that block
                return f"sigma {sigma}, block {j}: not finished"
            want = rounded_gaussian(center[sl], sigma, g, u)
            differ = int((out[sl].view(np.uint64) != want.view(np.uint64)).sum())
            if differ:
                return f"sigma {sigma}, block {j}: {differ} of {n} values"
            if small:
                return f"sigma {sigma}, block {j}: finished with w0 < 2^11"
        if not decided:
            return f"sigma {sigma}: no exact decision made"
    return ""
