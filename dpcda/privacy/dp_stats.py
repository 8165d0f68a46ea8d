"""DP releases of the first-pass statistics: per-feature mean/std for the z-score, and class counts.

Relations: ``fixed`` releases under replace-one within class (class sizes public, so only the
moments are noised); ``poisson`` under add/remove-one (moments and a class histogram are noised).

Moments: raw features are clipped to the declared bounds [lo, hi] and mapped to u = (x - m) / r in
[-1, 1] (m, r the bounds' midpoint and half-width). Each record contributes (u, 2u^2 - 1), each coordinate
rounded to a multiple of 2^-16 (``SUM_QUANTUM``) and still in [-1, 1], and the first pass sums these as exact
integers (``mechanisms.combiners``): the released vector is an exact function of the records, whose
per-record L2 norm is at most sqrt(2d) in the bits, not only in exact arithmetic: add/remove sensitivity
sqrt(2d), replace-one 2 sqrt(2d). Noise comes from ``privacy.noise`` (rounded to its grid); the released
statistics are then rounded to a public grid (post-processing), which keeps reruns bit-identical.
"""

from __future__ import annotations

import math

import numpy as np

from dpcda.privacy.noise import NoiseStream, grid_for

GRID = 2.0**-20
SUM_QUANTUM = 2.0**-16  # per-record contributions are multiples of this; sums stay exact below 2^37 records


def moments_sensitivity(dim: int, mode: str) -> float:
    return math.sqrt(2.0 * dim) * (2.0 if mode == "fixed" else 1.0)


HISTOGRAM_SENSITIVITY = 1.0  # add/remove one record changes one count by one


def _on_grid(x: np.ndarray, scale: float) -> np.ndarray:
    return (np.round(np.asarray(x, np.float64) / (GRID * scale)) * (GRID * scale)).astype(np.float32)


def quantized_contributions(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 (u, 2u^2 - 1) in units of SUM_QUANTUM, each in [-2^16, 2^16]: what one record adds to the sums."""
    u = np.clip(np.asarray(u, np.float64), -1.0, 1.0)
    qu = np.rint(u / SUM_QUANTUM).astype(np.int64)
    qv = np.rint((2.0 * u * u - 1.0) / SUM_QUANTUM).astype(np.int64)
    return qu, qv


def moments_vector(sum_qu: np.ndarray, sum_qv: np.ndarray) -> np.ndarray:
    """The private vector that gets the noise: (sum u, sum (2u^2 - 1)) from the exact integer sums.

    Each record contributes (u, 2u^2 - 1) in [-1, 1]^2d, which is what ``moments_sensitivity`` bounds. Building
    the second half from a sum of u^2 and a public or DP count instead would leave 2u^2 in [0, 2] per record and a
    larger sensitivity.
    """
    return np.concatenate([np.asarray(sum_qu, np.int64), np.asarray(sum_qv, np.int64)]).astype(np.float64) * SUM_QUANTUM


def feature_stats(
    *,
    n: float,
    sum_qu: np.ndarray,
    sum_qv: np.ndarray,
    bounds: tuple[float, float],
    min_std: float,
    noise_std: float = 0.0,
    stream: NoiseStream | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of the raw features from the quantized sums, with Gaussian noise when noise_std > 0.

    ``n``, the divisor after the noise, must be public (fixed mode) or DP (poisson mode). ``min_std`` floors the
    std in raw units, so constant features (std 0) never divide by zero.
    """
    lo, hi = bounds
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    vec = moments_vector(sum_qu, sum_qv)
    if noise_std > 0:
        if stream is None:
            raise ValueError("a noise stream is required to add noise")
        vec = stream.gaussian(vec, noise_std)
    su, sv = np.split(vec, 2)
    n = max(float(n), 1.0)
    mean_u = np.clip(su / n, -1.0, 1.0)
    ex2 = np.clip((sv / n + 1.0) / 2.0, 0.0, 1.0)
    var_u = np.maximum(ex2 - mean_u**2, 0.0)
    mean = mid + half * mean_u
    std = np.maximum(half * np.sqrt(var_u), min_std)
    return _on_grid(mean, hi - lo), _on_grid(std, hi - lo)


def class_histogram(counts: np.ndarray, *, noise_std: float, stream: NoiseStream) -> np.ndarray:
    """DP class counts N_k_hat: Gaussian noise, rounded, floored at 0 (post-processing)."""
    noisy = stream.gaussian(np.asarray(counts, np.float64), noise_std)
    return np.maximum(np.rint(noisy), 0).astype(np.int64)


# ---------------------------------------------------------------- DP-PCA: the covariance of clipped rows

COV_QUANTUM_BITS = 16  # a clipped row's coordinates are rounded to multiples of clip / 2^16


def covariance_quantize(x: np.ndarray, clip: float) -> np.ndarray:
    """Rows of L2 norm <= ``clip`` as integers (float64 holding exact ints): round(x 2^16 / clip), |q_i| <= 2^16."""
    return np.rint(np.asarray(x, np.float64) * (2.0**COV_QUANTUM_BITS / clip))


def covariance_sensitivity(dim: int, mode: str) -> float:
    """L2 sensitivity of the upper triangle (diagonal included) of sum_i q_i q_i^T, in quantized units.

    A quantized row has norm at most 2^16 + sqrt(d)/2 (rounding moves each coordinate by at most 1/2); its outer
    product's upper triangle has L2 norm at most ||q q^T||_F = ||q||^2. Add/remove changes the sum by one outer
    product; replace-one by the difference of two, at most twice that. The sums are exact integers
    (``mechanisms.dppca``), so this holds in the bits.
    """
    one = (2.0**COV_QUANTUM_BITS + math.sqrt(dim) / 2.0) ** 2
    return one * (2.0 if mode == "fixed" else 1.0)


COV_MAX_SUM = 2**62  # |sum of q_i q_j| stays below this in int64 (checked on the public row count by the plan)


def dp_covariance(sum_qq: np.ndarray, clip: float, *, noise_std: float, stream: NoiseStream) -> np.ndarray:
    """The symmetric DP release of sum_i x_i x_i^T (x units): exact quantized sums plus Gaussian noise of std
    ``noise_std`` (quantized units) on each entry of the upper triangle, mirrored below the diagonal.

    The int64 sums can pass 2^53, where float64 stops being exact. Each is split on the noise grid g (a power of two):
    S = g a + r with 0 <= r < g, so r is exact in float64; the sampler releases g round((r + sigma Z) / g) (exact, on
    the grid), and g a is added back: the same distribution as g round((S + sigma Z) / g), computed without rounding
    S. Turning the noisy sum into float64 afterwards is post-processing."""
    d = sum_qq.shape[0]
    iu = np.triu_indices(d)
    exact = np.asarray(sum_qq, np.int64)[iu]
    if noise_std > 0:
        g = grid_for(noise_std)
        if g >= 1:
            step = int(g)
            cells = exact // step  # floor: r = exact - step * cells in [0, step)
            rest = (exact - cells * step).astype(np.float64)
            noisy = stream.gaussian(rest, noise_std)  # multiples of g
            upper = cells.astype(np.float64) * g + noisy
        else:  # a grid finer than 1: the integer sums lie on it; only float64's range matters
            if np.abs(exact).max(initial=0) >= 2**53:
                from dpcda.privacy.accounting import AccountingError

                raise AccountingError("projection: covariance sums this large need a larger noise std; lower epsilon")
            upper = stream.gaussian(exact.astype(np.float64), noise_std)
    else:
        upper = exact.astype(np.float64)
    out = np.zeros((d, d), np.float64)
    out[iu] = upper
    out.T[iu] = upper
    return out * (clip / 2.0**COV_QUANTUM_BITS) ** 2
