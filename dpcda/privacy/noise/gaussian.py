"""The host's Gaussian sampler in numpy: the ideal rounded Gaussian ``g * round((c + sigma Z) / g)`` at 192-bit
uniforms, by inversion (the package's docstring states the mechanism and why the output is exact).

``rounded_gaussian`` is the reference every other sampler is checked against, bit for bit: the compiled loop
(``privacy.noise.native``, glued in ``native_sampler``) and the device's torch sampler
(``privacy.noise.device.gaussian``) take their floats from the same operations and hand the same elements to the
same exact decision (``exact.exact_cell``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

import dpcda.privacy.noise.exact as exact_arithmetic
from dpcda.privacy.noise.constants import GRID_BITS, Z_ERROR
from dpcda.privacy.noise.inverse_normal import upper_quantile


def grid_for(sigma: float) -> float:
    """The public output grid of Gaussian noise of std ``sigma``: 2^(floor(log2 sigma) - GRID_BITS)."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be positive and finite, got {sigma}")
    _, e = math.frexp(sigma)  # sigma = m 2^e, m in [0.5, 1)
    return math.ldexp(1.0, e - 1 - GRID_BITS)


def error_bound(sigma: float, g: float, tmax: float, cmax: float) -> float:
    """Float error of a block's scaled values, in grid units: AS 241 and p's rounding (Z_ERROR (1 + |z|)) and three
    roundings, from the block's largest t and |c|."""
    return (sigma * Z_ERROR * (1.0 + tmax) + 2.0**-50 * (cmax + sigma * tmax)) / g


LOW63 = np.uint64((1 << 63) - 1)
_SHIFT11 = np.uint64(11)


def tail_p(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the 192-bit uniforms ``u`` (3, n): which are above 1/2 (z = +t, else z = -t), and the float64 tail
    probability p = min(u, 1 - u) whose upper quantile is t = |z|."""
    flip = u[0] >> np.uint64(63)  # 1 where U >= 2^191: u > 1/2 and z = +t; else z = -t
    mask = np.uint64(0) - flip  # all ones where flipped: U' = 2^192 - 1 - U, so p = 1 - u
    w0 = (u[0] ^ mask) & LOW63
    w1 = ((u[1] ^ mask) >> _SHIFT11).view(np.int64)
    # p = (U' + 1/2) / 2^192 from its top 116 bits; exact to a relative 2^-51 when w0 >= 2^11 (int64 -> float64
    # conversions are fast; the unsigned ones are not). Where w0 < 2^11 (probability 2^-52) p is recomputed.
    p = w0.view(np.int64).astype(np.float64)
    p *= 2.0**-64
    p += w1.astype(np.float64) * 2.0**-117
    small = np.flatnonzero(w0 < np.uint64(1 << 11))
    for i in small:
        exact = (int(w0[i]) << 128) | (int(u[1, i] ^ mask[i]) << 64) | int(u[2, i] ^ mask[i])
        p[i] = float(Fraction(2 * exact + 1, 2**193))
    return flip.astype(bool), p


def rounded_gaussian(center: np.ndarray, sigma: float, g: float, u: np.ndarray) -> np.ndarray:
    """The ideal rounded Gaussian at the 192-bit uniforms ``u`` (3, n); see the package's docstring."""
    flip, p = tail_p(u)
    t = upper_quantile(p)
    scaled = np.where(flip, t, -t)
    scaled *= sigma / g
    scaled += center / g  # (center + sigma z) / g: g is a power of two, so the divisions are exact
    k = np.rint(scaled)
    tmax = float(t.max()) if t.size else 0.0
    cmax = float(np.abs(center).max()) if center.size else 0.0
    err = error_bound(sigma, g, tmax, cmax)
    if not (np.isfinite(scaled).all() and math.isfinite(err)):
        raise ArithmeticError(f"noise sampler: values overflow at sigma={sigma:g} (too large for the grid)")
    if err > 0.125:
        raise ArithmeticError(f"noise sampler: sigma={sigma:g} is too small for the values' size")
    ambiguous = np.flatnonzero(np.abs(scaled - k) >= 0.5 - 2.0 * err)
    for i in ambiguous:
        u_int = (int(u[0, i]) << 128) | (int(u[1, i]) << 64) | int(u[2, i])
        k[i] = exact_arithmetic.exact_cell(float(center[i]), sigma, g, u_int, int(k[i]))
    k += 0.0  # every zero +0.0: rint gives -0.0 for scaled in (-1/2, 0), the exact path +0.0 (x + 0.0 is x otherwise)
    k *= g
    return k
