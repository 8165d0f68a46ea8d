"""Seed 000's Theorem 1, reproduced as written: an informational figure, never the guarantee.

As written: sampling rate p = l / N over the whole dataset, T sequential compositions, RDP
epsilon(alpha) = alpha / l^2 * (2 c^2 / sigma_x^2 + 1 / sigma_y^2) including the label term, and the
subsampled-RDP bound of Wang et al. (2019) for sampling without replacement, minimised over integer
alpha >= 3. DESIGN.md lists why this is not our guarantee (exact private z-scores, rate l/N where
class-centric sampling has l/N_k, label changes across classes). The product's epsilon comes from
``privacy.accounting`` (this module lives with the evaluation because it is the paper's claim under test, not ours).
Evaluated with mpmath because B(l) is an alternating sum of huge terms.
"""

from __future__ import annotations

import math

import mpmath

MAX_ALPHA = 64
MAX_DIGITS = 3000


def _rdp_base(alpha: int, l: int, clip: float, sigma_x: float, sigma_y: float) -> mpmath.mpf:
    term_x = 2 * mpmath.mpf(clip) ** 2 / mpmath.mpf(sigma_x) ** 2
    term_y = 0 if math.isinf(sigma_y) else 1 / mpmath.mpf(sigma_y) ** 2  # inf: label term dropped
    return mpmath.mpf(alpha) / l**2 * (term_x + term_y)


def theorem1_epsilon(
    *,
    sigma_x: float,
    sigma_y: float,
    mixing_order: int,
    clip: float,
    num_records: int,
    num_samples: int,
    delta: float,
    max_alpha: int = MAX_ALPHA,
) -> float:
    """Theorem 1's epsilon. ``sigma_y == 0`` or ``sigma_x == 0`` gives infinity, as the formula does."""
    if sigma_x <= 0 or sigma_y <= 0:
        return math.inf
    l = mixing_order
    p = mpmath.mpf(l) / num_records

    def eps(a):
        return _rdp_base(a, l, clip, sigma_x, sigma_y)

    # B(n) is an alternating sum of terms up to exp((n-1) eps(n)): enough digits to cancel exactly.
    # Orders needing more than MAX_DIGITS are skipped (the minimum over fewer orders is an upper bound).
    def digits(a):
        return float((a - 1) * eps(a)) / 2.3 + 40

    top = max([a for a in range(3, max_alpha + 1) if digits(a) <= MAX_DIGITS], default=None)
    if top is None:
        return math.inf
    best = math.inf
    with mpmath.workdps(int(digits(top))):
        e = [eps(i) for i in range(top + 1)]
        E = [mpmath.exp((i - 1) * e[i]) for i in range(top + 1)]
        B = [mpmath.fsum((-1) ** i * math.comb(n, i) * E[i] for i in range(n + 1)) for n in range(top + 1)]
        S = [p**j * mpmath.sqrt(abs(B[2 * (j // 2)] * B[(j + 1) // 2])) for j in range(top + 1)]
        first = p**2 * min(4 * (mpmath.exp(e[2]) - 1), 2 * mpmath.exp(e[2]))
        for alpha in range(3, top + 1):
            G = mpmath.fsum(math.comb(alpha, j) * S[j] for j in range(3, alpha + 1))
            rdp_total = float(num_samples * mpmath.log(1 + math.comb(alpha, 2) * first + 4 * G) / (alpha - 1))
            best = min(best, rdp_total + math.log(1 / delta) / (alpha - 1))
            if rdp_total >= best:
                break  # the RDP term only grows with alpha: no larger order can do better
    return best


def theorem1_calibrate_sigma_x(
    *,
    target_epsilon: float,
    sigma_y_over_sigma_x: float,
    mixing_order: int,
    clip: float,
    num_records: int,
    num_samples: int,
    delta: float,
) -> float:
    """Smallest sigma_x (sigma_y tied to it by a fixed ratio) whose Theorem 1 epsilon <= target.

    This is how the paper calibrated; the reproduction benchmark uses it for the 'paper' column.
    """

    def f(sx):
        return theorem1_epsilon(
            sigma_x=sx,
            sigma_y=math.inf if math.isinf(sigma_y_over_sigma_x) else sx * sigma_y_over_sigma_x,
            mixing_order=mixing_order,
            clip=clip,
            num_records=num_records,
            num_samples=num_samples,
            delta=delta,
        )

    lo, hi = math.log(1e-4 * clip), math.log(1e4 * clip)
    if f(math.exp(hi)) > target_epsilon:
        raise ValueError("target epsilon unreachable under Theorem 1")
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if f(math.exp(mid)) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return math.exp(hi)
