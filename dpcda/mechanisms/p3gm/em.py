"""DP-EM of P3GM's mixture prior (``mechanisms.p3gm``, step 2): the public start, the exact quantized
statistics, the noisy releases and the M-step."""

from __future__ import annotations

import functools
import math

import numpy as np

from dpcda.mechanisms import rowwise
from dpcda.mechanisms.p3gm.spec import (
    EM_BLOCK_ROWS,
    EM_QUANTUM_BITS,
    MAX_EM_ROWS,
    VAR_FLOOR,
    WEIGHT_FLOOR,
    MogPrior,
    P3gmSpec,
)
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream, public_key

# ---------------------------------------------------------------- DP-EM


def public_start(components: int, dim: int) -> MogPrior:
    """Equal weights, means N(0, 1/(4 d')) per coordinate from a public stream, variances 1/d': no data in it."""
    means = NoiseStream(public_key("p3gm-em-init", 0), "means").gaussian(
        np.zeros((components, dim)), 0.5 / math.sqrt(dim)
    )
    return MogPrior(
        weights=np.full(components, 1.0 / components),
        means=_into_ball(means),
        variances=np.full((components, dim), 1.0 / dim),
    )


def _into_ball(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m * np.minimum(1.0, 1.0 / np.maximum(norms, 1e-300))


def _log_responsibilities(xhat: np.ndarray, prior: MogPrior) -> np.ndarray:
    """float64 (n, K) log r_ik under ``prior`` (log-sum-exp normalised)."""
    diff = xhat[:, None, :] - prior.means[None, :, :]
    logp = -0.5 * (np.log(2.0 * np.pi * prior.variances).sum(axis=1)[None, :] + (diff**2 / prior.variances).sum(axis=2))
    logp += np.log(prior.weights)[None, :]
    top = logp.max(axis=1, keepdims=True)
    return logp - (top + np.log(np.exp(logp - top).sum(axis=1, keepdims=True)))


def em_statistics(xhat: np.ndarray, prior: MogPrior) -> np.ndarray:
    """The exact statistics one DP-EM iteration releases, float64 (K + 2 K d'): S0, then S1 and S2 row-major.

    Each record's contribution is truncated toward zero onto the 2^-EM_QUANTUM_BITS grid and summed as int64. The
    contributions are computed on zero-padded blocks of exactly EM_BLOCK_ROWS rows (``mechanisms.rowwise``; the
    padding is dropped before the sums), so a record's contribution has the same bits whatever the other rows."""
    n, dim = xhat.shape
    if n >= MAX_EM_ROWS:
        raise ValueError(f"p3gm: DP-EM sums more than {MAX_EM_ROWS} rows; its exact sums would overflow float64")
    K = len(prior.weights)
    _check_em(K, dim)
    total = np.zeros(K + 2 * K * dim, np.int64)
    for start, stop in rowwise.blocks(n, EM_BLOCK_ROWS):
        q = _em_contributions(rowwise.pad_rows(xhat[start:stop], EM_BLOCK_ROWS), prior)[0]
        total += q[: stop - start].sum(axis=0)
    return total.astype(np.float64) / float(1 << EM_QUANTUM_BITS)


def _em_contributions(xb: np.ndarray, prior: MogPrior) -> tuple[np.ndarray, np.ndarray]:
    """(int64 per-record contributions in quanta, the float64 values they truncate), both (rows, K + 2 K d'):
    (r', r' xhat, r' xhat^2), r' = r (1 - CLIP_MARGIN)."""
    scale = float(1 << EM_QUANTUM_BITS)
    r = np.exp(_log_responsibilities(xb, prior)) * (1.0 - CLIP_MARGIN)  # sum_k r_ik < 1 in the bits
    rx = r[:, :, None] * xb[:, None, :]
    values = np.concatenate([r, rx.reshape(len(xb), -1), (rx * xb[:, None, :]).reshape(len(xb), -1)], axis=1)
    return np.trunc(values * scale).astype(np.int64), values


@functools.lru_cache(maxsize=None)
def _check_em(components: int, dim: int) -> None:
    """Position invariance of ``_em_contributions`` at this shape (the floats before truncation too, where a
    difference would hide): public rows in the unit ball, a public prior, ``rowwise.TRIALS`` rolled blocks."""
    stream = NoiseStream(public_key("rowwise-check", 0), "em", components, dim)
    u = stream.uniform(EM_BLOCK_ROWS * dim) - 0.5
    trials = rowwise.rolled_trials([_into_ball(u.reshape(EM_BLOCK_ROWS, dim) * (2.0 / math.sqrt(dim)))])
    prior = public_start(components, dim)
    rowwise.check_position_invariance(lambda a: _em_contributions(a, prior), trials, what="p3gm DP-EM")


def m_step(stats: np.ndarray, *, components: int, dim: int, noise_std: float) -> MogPrior:
    """Post-processing of the noisy statistics into a valid mixture (floors and caps, see the module docstring).

    Counts below max(1, 3 sigma_e) are mostly noise: means and variances divide by at least that."""
    K, d = components, dim
    s0, s1, s2 = stats[:K], stats[K : K + K * d].reshape(K, d), stats[K + K * d :].reshape(K, d)
    count = np.maximum(s0, max(1.0, 3.0 * noise_std))
    w = np.maximum(s0, 0.0)
    w = w / w.sum() if w.sum() > 0 else np.full(K, 1.0 / K)
    w = np.maximum(w, WEIGHT_FLOOR)
    means = _into_ball(s1 / count[:, None])
    var = np.clip(s2 / count[:, None] - means**2, VAR_FLOOR, 1.0)
    return MogPrior(weights=w / w.sum(), means=means, variances=var)


def fit_prior(xhat: np.ndarray, spec: P3gmSpec, key: bytes) -> MogPrior:
    """DP-EM on ``xhat`` (float64 (N, d'), rows in the unit ball): ``spec.em_iterations`` noisy releases."""
    xhat = np.asarray(xhat, np.float64)
    prior = public_start(spec.components, xhat.shape[1])
    for it in range(spec.em_iterations):
        stats = em_statistics(xhat, prior)
        noisy = NoiseStream(key, "p3gm-em", it).gaussian(stats, float(spec.em_noise_std))
        prior = m_step(noisy, components=spec.components, dim=xhat.shape[1], noise_std=float(spec.em_noise_std))
    return prior
