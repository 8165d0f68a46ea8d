"""The audit's statistics: a threshold chosen on half the trials, the other half's error rates, their one-sided
Clopper-Pearson upper bounds, and the epsilon lower bound any (epsilon, delta)-DP mechanism must meet (Kairouz et al.
2015; seed 003 eq. 2-6); the likelihood ratio of a mixing row. Shared by the canary games (``evaluation.audit``) and
the release-level membership audit (``evaluation.membership``)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dpcda.privacy.errors import DpcdaError

CONFIDENCE = 0.95


class AuditError(DpcdaError, ValueError):
    """An audit configuration that cannot be played (bad sizes, options that do not go together)."""


MAX_CANDIDATES = 20000  # thresholds tried on the selection half


def clopper_pearson_upper(k, n: int, alpha: float):
    """One-sided upper confidence bound at level 1 - alpha for a binomial rate with k successes in n."""
    k = np.asarray(k, dtype=float)
    upper = stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, upper)


def max_detectable_epsilon(n_d: int, n_dprime: int, delta: float, alpha: float) -> float:
    """The largest bound this many evaluation trials can give (no error at all): about ln(trials / 3.7).

    A bound of 0 from a game that could not have shown more than this is no evidence of privacy beyond it.
    """
    return float(
        epsilon_lower_bound(clopper_pearson_upper(0, n_dprime, alpha), clopper_pearson_upper(0, n_d, alpha), delta)
    )


def epsilon_lower_bound(fp, fn, delta: float):
    """max(ln((1-delta-FP)/FN), ln((1-delta-FN)/FP)), floored at 0 (arrays broadcast)."""
    fp = np.asarray(fp, dtype=float)
    fn = np.asarray(fn, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fp, 0.0) / fn)
        b = np.log(np.maximum(1.0 - delta - fn, 0.0) / fp)
    out = np.fmax(a, b)
    return np.maximum(np.nan_to_num(out, nan=0.0, posinf=np.inf, neginf=0.0), 0.0)


def _error_counts(s_d: np.ndarray, s_dprime: np.ndarray, thresholds: np.ndarray, direction: int):
    """(FP counts, FN counts) of 'guess D iff direction * s > direction * threshold'."""
    if direction > 0:
        fn = np.searchsorted(np.sort(s_d), thresholds, side="right")
        fp = len(s_dprime) - np.searchsorted(np.sort(s_dprime), thresholds, side="right")
    else:
        fn = len(s_d) - np.searchsorted(np.sort(s_d), thresholds, side="left")
        fp = np.searchsorted(np.sort(s_dprime), thresholds, side="left")
    return fp, fn


def choose_threshold(s_d: np.ndarray, s_dprime: np.ndarray, delta: float, alpha: float):
    """(threshold, direction) maximising the confidence-adjusted bound on these (selection) runs."""
    values = np.unique(np.concatenate([s_d, s_dprime]))
    values = values[np.isfinite(values)]
    if len(values) > MAX_CANDIDATES:  # every rank near the tails (where the bound lives), sparser inside
        ranks = np.geomspace(1, len(values), MAX_CANDIDATES // 2).astype(np.int64) - 1
        values = values[np.unique(np.concatenate([ranks, len(values) - 1 - ranks]))]
    candidates = np.concatenate([[-np.inf], values, [np.inf]])
    best = (-1.0, 0.0, 1)
    for direction in (1, -1):
        fp, fn = _error_counts(s_d, s_dprime, candidates, direction)
        bound = epsilon_lower_bound(
            clopper_pearson_upper(fp, len(s_dprime), alpha), clopper_pearson_upper(fn, len(s_d), alpha), delta
        )
        i = int(np.argmax(bound))
        if bound[i] > best[0]:
            best = (float(bound[i]), float(candidates[i]), direction)
    return best[1], best[2]


def log_likelihood_ratio(proj: np.ndarray, *, mode: str, shift: float, rate: float, sigma: float) -> np.ndarray:
    """Sum over a trial's rows of log p(row | D) / p(row | D') for projections ``proj`` (trials, rows).

    A row holds the canary with probability ``rate``; its projection is then ``+shift`` on D and
    ``-shift`` (fixed) or 0 (poisson) on D', plus N(0, sigma^2). Rows of one release are independent.
    With sigma = 0 the ratio is degenerate, and the largest projection is returned instead.
    """
    if sigma <= 0:
        return proj.max(axis=1)
    log_keep = math.log1p(-rate) if rate < 1 else -math.inf
    log_rate = math.log(rate)
    up = (proj * shift - shift**2 / 2) / sigma**2
    num = np.logaddexp(log_keep, log_rate + up)
    if mode == "fixed":
        down = (-proj * shift - shift**2 / 2) / sigma**2
        num = num - np.logaddexp(log_keep, log_rate + down)
    return num.sum(axis=1)


def score_game(scores: dict, half: int, delta: float) -> dict:
    """The game's verdict figures: a threshold chosen on the first ``half`` trials of D and D', FP and FN measured on
    the rest, their one-sided Clopper-Pearson upper bounds (a union bound: both hold with CONFIDENCE) and the epsilon
    lower bound they imply."""
    alpha = (1.0 - CONFIDENCE) / 2  # two one-sided intervals, union bound
    threshold, direction = choose_threshold(scores["D"][:half], scores["D'"][:half], delta, alpha)
    eval_d, eval_dp = scores["D"][half:], scores["D'"][half:]
    fp_count, fn_count = _error_counts(eval_d, eval_dp, np.array([threshold]), direction)
    n_d, n_dp = len(eval_d), len(eval_dp)
    fp_upper = float(clopper_pearson_upper(fp_count, n_dp, alpha)[0])
    fn_upper = float(clopper_pearson_upper(fn_count, n_d, alpha)[0])
    return {
        "empirical_epsilon_lower_bound": float(epsilon_lower_bound(fp_upper, fn_upper, delta)),
        "confidence": CONFIDENCE,
        "max_detectable_epsilon": max_detectable_epsilon(n_d, n_dp, delta, alpha),
        "empirical_epsilon_point_estimate": float(epsilon_lower_bound(fp_count[0] / n_dp, fn_count[0] / n_d, delta)),
        "fp": float(fp_count[0] / n_dp),
        "fn": float(fn_count[0] / n_d),
        "fp_upper": fp_upper,
        "fn_upper": fn_upper,
        "threshold": threshold,
        "guess_d_when": "above" if direction > 0 else "below",
        "evaluation_trials": n_d,
    }
