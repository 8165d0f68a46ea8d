"""Exact decisions, in decimal and rational arithmetic: the cell of a uniform that lies beside a cell boundary.

The Gaussian samplers evaluate the inverse normal in float64; any output whose float value lies within (twice) the
error bound of a cell boundary is decided here instead: u = (U + 1/2) / 2^192 is compared with Phi(boundary),
computed in 170-digit decimal arithmetic from the boundary as an exact fraction (the package's docstring). Rare: a
few elements in a million.
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

_DIGITS = 110  # decisions need |Phi(w) - u| resolved far below u's resolution 2^-192 (1.6e-58)


@lru_cache(maxsize=4)
def _decimal_pi(prec: int) -> Decimal:
    """pi to ``prec`` digits (the recipe of the decimal module's documentation)."""
    with localcontext() as ctx:
        ctx.prec = prec + 2
        three = Decimal(3)
        lasts, t, s, n, na, d, da = 0, three, 3, 1, 0, 0, 24
        while s != lasts:
            lasts = s
            n, na = n + na, na + 8
            d, da = d + da, da + 32
            t = (t * n) / d
            s += t
        ctx.prec = prec
        return +s


def normal_cdf_decimal(w: Fraction) -> Decimal:
    """Phi(w) with absolute error below 1e-100, for |w| < 17 (cancellation costs at most 63 of the 180 digits)."""
    with localcontext() as ctx:
        ctx.prec = _DIGITS + 70
        x = abs(Decimal(w.numerator) / Decimal(w.denominator)) / Decimal(2).sqrt()
        x2 = x * x
        # erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2x^2)^n x / (1 3 5 ... (2n+1)): positive terms only.
        term = x
        total = x
        n = 0
        eps = Decimal(10) ** -(ctx.prec + 5)
        while term > eps * total:
            n += 1
            term = term * 2 * x2 / (2 * n + 1)
            total += term
        erf = 2 / _decimal_pi(ctx.prec).sqrt() * (-x2).exp() * total
        half_tail = (1 - erf) / 2  # Phi(-|w|)
        return +(half_tail if w < 0 else 1 - half_tail)


def _u_below_cdf(u_int: int, w: Fraction) -> bool:
    """Exactly: is u = (U + 1/2) / 2^192 below Phi(w)?"""
    if w <= -17:  # Phi(-17) < 1e-64 < 2^-193 <= u
        return False
    if w >= 17:  # Phi(17) > 1 - 1e-64 > 1 - 2^-193 >= u
        return True
    phi = normal_cdf_decimal(w)
    with localcontext() as ctx:
        ctx.prec = _DIGITS + 70
        u = Decimal(2 * u_int + 1) / Decimal(2**193)
        gap = phi - u
    if abs(gap) < Decimal(10) ** -(_DIGITS - 10):
        raise ArithmeticError("noise sampler: u within 1e-100 of a cell boundary; cannot decide")  # probability ~0
    return gap > 0


def exact_cell(center: float, sigma: float, g: float, u_int: int, k: int) -> float:
    """The k with Phi(((k - 1/2) g - c) / s) <= u < Phi(((k + 1/2) g - c) / s), starting the walk at ``k``."""
    c, s, gg = Fraction(center), Fraction(sigma), Fraction(g)
    k = int(k)
    while _u_below_cdf(u_int, ((k - Fraction(1, 2)) * gg - c) / s):
        k -= 1
    while not _u_below_cdf(u_int, ((k + Fraction(1, 2)) * gg - c) / s):
        k += 1
    return float(k)
