"""Binomial draws (poisson-mode row sizes) by inversion: the CDF of Binomial(n, q), q rational, tabulated to 192 bits
in decimal arithmetic, and a 192-bit uniform compared with it word by word.

The table runs up to the point M where the upper tail is below 2^-193 (every threshold below 2^192), so a draw's
distance from Binomial(n, q) is below (M + 1) 2^-192 + 2^-193 <= 2^-171 (M < 2^20 is enforced). The device compares
the same words with the same table (``privacy.noise.device.indices.binomial_from_halves``).
"""

from __future__ import annotations

from decimal import Decimal, localcontext
from functools import lru_cache

import numpy as np

from dpcda.privacy.noise.constants import MAX_BINOMIAL_TABLE, UNIFORM_WORDS


@lru_cache(maxsize=256)
def binomial_thresholds(n: int, num: int, den: int) -> np.ndarray:
    """(M, 3) uint64 words of C_j = round(2^192 F(j)) < 2^192, j < M, F the Binomial(n, num/den) CDF.

    The table stops where the upper tail is below 2^-194 or where C_j would round to 2^192 (no U reaches it); draws
    above the last threshold are m = M, which then carries pmf(M) and a tail below 2^-193.
    """
    with localcontext() as ctx:
        ctx.prec = 100
        q = Decimal(num) / Decimal(den)
        ratio = q / (1 - q)
        pmf = (1 - q) ** n
        cdf = Decimal(0)
        tail_limit = Decimal(2) ** -194
        scale = Decimal(2) ** 192
        thresholds = []
        j = 0
        mean = Decimal(n) * q
        top = 1 << 192
        while True:
            cdf += pmf
            if (1 - cdf) < tail_limit and j >= mean or j == n:
                break
            threshold = int((cdf * scale).to_integral_value())
            if threshold >= top:  # no 192-bit U reaches it: draws above the last threshold are m = j
                break
            if thresholds and threshold < thresholds[-1]:
                raise ArithmeticError(f"Binomial({n}, {num}/{den}): table not monotone")  # never expected
            thresholds.append(threshold)
            if len(thresholds) >= MAX_BINOMIAL_TABLE:
                raise ValueError(f"Binomial({n}, {num}/{den}): table longer than {MAX_BINOMIAL_TABLE}")
            pmf = pmf * (n - j) / (j + 1) * ratio
            j += 1
    mask = (1 << 64) - 1
    return np.array([[(v >> 128) & mask, (v >> 64) & mask, v & mask] for v in thresholds], dtype=np.uint64).reshape(
        -1, UNIFORM_WORDS
    )


def count_below(u: np.ndarray, th: np.ndarray) -> np.ndarray:
    """int64 m per draw: how many thresholds C_j of ``th`` ((M, 3) uint64, ``binomial_thresholds``) are <= U, for the
    192-bit uniforms ``u`` ((3, n) uint64, row 0 the most significant words): the draw of Binomial(n, q)."""
    # m = number of thresholds C_j <= U (C_j = 2^192 F(j), increasing), compared word by word.
    t0, t1, t2 = (th[None, :, i] for i in range(UNIFORM_WORDS))
    u0, u1, u2 = (u[i, :, None] for i in range(UNIFORM_WORDS))
    below = (t0 < u0) | ((t0 == u0) & ((t1 < u1) | ((t1 == u1) & (t2 <= u2))))
    return below.sum(axis=1).astype(np.int64)
