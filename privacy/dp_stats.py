"""DP releases of the first-pass statistics: per-feature mean/std for the z-score, and class counts.

Relations: ``fixed`` releases under replace-one within class (class sizes public, so only the
moments are noised); ``poisson`` under add/remove-one (moments and a class histogram are noised).

Moments: raw features are clipped to the declared bounds [lo, hi] and mapped to u = (x - m) / r in
[-1, 1] (m, r the bounds' midpoint and half-width). The released vector is (sum u, sum (2u^2 - 1)),
whose per-record L2 norm is at most sqrt(2d): add/remove sensitivity sqrt(2d), replace-one 2 sqrt(2d).
Released values are rounded to a public grid (post-processing), which makes reruns bit-identical
across runners despite float summation order.
"""
from __future__ import annotations

import math

import numpy as np

GRID = 2.0 ** -20


def moments_sensitivity(dim: int, mode: str) -> float:
    return math.sqrt(2.0 * dim) * (2.0 if mode == "fixed" else 1.0)


HISTOGRAM_SENSITIVITY = 1.0  # add/remove one record changes one count by one


def _on_grid(x: np.ndarray, scale: float) -> np.ndarray:
    return (np.round(np.asarray(x, np.float64) / (GRID * scale)) * (GRID * scale)).astype(np.float32)


def moments_vector(*, count: int, sum_u: np.ndarray, sum_u2: np.ndarray) -> np.ndarray:
    """The private vector that gets the noise: (sum u, sum (2u^2 - 1)), built with the EXACT row count.

    Each record contributes (u, 2u^2 - 1) in [-1, 1]^2d, which is what ``moments_sensitivity`` bounds. Subtracting a
    public or DP count instead would leave 2u^2 in [0, 2] per record and a larger sensitivity.
    """
    return np.concatenate([np.asarray(sum_u, np.float64), 2.0 * np.asarray(sum_u2, np.float64) - float(count)])


def feature_stats(*, n: float, count: int, sum_u: np.ndarray, sum_u2: np.ndarray, bounds: tuple[float, float],
                  min_std: float, noise_std: float = 0.0, rng: np.random.Generator | None = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of the raw features from sums of u and u^2, with Gaussian noise when noise_std > 0.

    ``count`` is the exact number of rows summed (it enters only the private vector, before the noise); ``n``, the
    divisor afterwards, must be public (fixed mode) or DP (poisson mode). ``min_std`` floors the std in raw units,
    so constant features (std 0) never divide by zero.
    """
    lo, hi = bounds
    mid, half = (lo + hi) / 2.0, (hi - lo) / 2.0
    vec = moments_vector(count=count, sum_u=sum_u, sum_u2=sum_u2)
    if noise_std > 0:
        if rng is None:
            raise ValueError("a generator is required to add noise")
        vec = vec + rng.normal(0.0, noise_std, vec.shape)
    su, sv = np.split(vec, 2)
    n = max(float(n), 1.0)
    mean_u = np.clip(su / n, -1.0, 1.0)
    ex2 = np.clip((sv / n + 1.0) / 2.0, 0.0, 1.0)
    var_u = np.maximum(ex2 - mean_u ** 2, 0.0)
    mean = mid + half * mean_u
    std = np.maximum(half * np.sqrt(var_u), min_std)
    return _on_grid(mean, hi - lo), _on_grid(std, hi - lo)


def class_histogram(counts: np.ndarray, *, noise_std: float, rng: np.random.Generator) -> np.ndarray:
    """DP class counts N_k_hat: Gaussian noise, rounded, floored at 0 (post-processing)."""
    noisy = np.asarray(counts, np.float64) + rng.normal(0.0, noise_std, np.shape(counts))
    return np.maximum(np.rint(noisy), 0).astype(np.int64)
