"""When private sampling on the Boolean cube is DP: Theorem 4.1 of seed 002, as a calculator.

Seed 002 (Pierquin, Zimmermann, Boussard) re-implements the private sampling algorithm of Boedihardjo, Strohmer
and Vershynin (its Algorithm 1) and recalls its two theorems. Notation: n records in {-1, 1}^p (the true data), the
degree d of the marginals to match, ``binom(p, <= d) = sum_{j <= d} C(p, j)`` Walsh functions of degree <= d, a
reduced space S of m points drawn uniformly from the cube, box parameters Delta > delta > 0 (the density h* that
is sampled lies in [delta/m, Delta/m] on S), and k synthetic rows drawn independently from h*.

Theorem 4.1 (privacy). If

    k <= 1/(4 sqrt 2) * eps * (delta/Delta)^(3/2) * e^(-d/2) * binom(p, <= d)^(-1/4) * sqrt(n) / m^(3/4),

then Algorithm 1 is eps-differentially private: pure DP, the DP delta is 0 (the paper's delta is the box
parameter, not a DP delta). Solved for n, the smallest number of records for which the theorem certifies DP is

    n >= 32 k^2 (Delta/delta)^3 e^d binom(p, <= d)^(1/2) m^(3/2) / eps^2,

which grows with k^2, 1/eps^2, m^(3/2) and binom(p, <= d)^(1/2). Theorem 4.1 puts no other condition on m, but
the algorithm itself needs m >= binom(p, <= d): step 2 stops with "Failure" unless the m x binom(p, <= d) Walsh
matrix of S has smallest singular value >= sqrt(m)/(2 e^d), impossible below full column rank. "Failure" depends
on S only, never on the data. Algorithm 1 is also only defined when 2 delta <= 1 <= Delta - delta: every candidate
density sums to 1 (the degree-0 marginal), so the step-4 box [2 delta/m, (Delta - delta)/m]^S must hold the
uniform density on S (``algorithm_well_defined`` below).

Neighbouring relation. Seed 002's Definition 2.1: datasets in S^N "differing by one element", i.e. replace one
record (any of its p bits may change) in a dataset of n records, n public. The bound depends on n, so n is part
of the public parameters; add/remove-one neighbours are not covered.

Theorem 4.2 (accuracy) is what the seed's Tables 2 and 3 evaluate besides k: if ||f_n||_inf <= Delta/2^p,
n >= 16 delta^-2 gamma^-1 e^(2d) binom(p, <= d), 16 delta^-2 gamma^-1 Delta^2 e^(2d) binom(p, <= d) <= m <= 2^(p/4)
and k >= 4 delta^-2 (log(2/gamma) + log binom(p, <= d)), then with probability 1 - 4 gamma - 2^(-p/2) the algorithm
succeeds and every marginal of degree <= d of the output is within 4 delta of the data's. These bounds on m are
accuracy conditions, not privacy conditions (the seed attributes them to Theorem 4.1 in its Table 3 discussion).

Errata found by recomputing the seed's tables (tests/test_feasibility.py pins each one; docs/private_sampling.md
has the table). Both tables use the seed's relaxed constraints (3)/(4): d = 2, delta = 1/4, gamma = 1/8,
Delta = 2^p ||f_n||_inf and binom(p, <= 2) approximated by p(p+1)/2 (exactly it is p(p+1)/2 + 1).
  - Eq. (2) prints the lower bound on m with gamma^4 in the denominator; Theorem 4.2 has gamma^1, and every
    m figure of Tables 2 and 3 (the constant 5.6e4 = 16 * 16 * 8 * e^4 / 2) uses gamma^1.
  - Table 2's caption says delta >= 1/4; the text derives delta <= 1/4 (4 delta-accuracy), and the numbers use
    delta = 1/4.
  - Table 2, ASIA: m >= 2.2e10 only with binom(8, <= 2) ~ 36; the exact count 37 gives 2.3e10 (k: 7.3e-4 both).
  - Table 2, MUSHROOM: m >= 5.3e72 needs ||f_n||_inf = 1/n = 1/8124 (each row unique, as the text says); Table 1's
    rounded 1.2e-4 gives 5.1e72 (k: 1.1e-49 either way).
  - Table 2, CAR: 2^(p/4) = 2^6.25 = 76.1, printed as 77 (an integer m <= 2^(p/4) is at most 76).
  - Table 2, ADULT: k * m^(3/4) <= 9.2e-27 from Table 1's ||f_n||_inf = 1.8e-2, printed 9.5e-27; any
    ||f_n||_inf in about [1.767e-2, 1.771e-2] (which Table 1 rounds to 1.8e-2) gives both 9.5e-27 and m >= 1.5e42.
  - Table 3 (the "ideal" data set, n = 2^p, ||f_n||_inf = 2^-p so Delta = 1, eps = 10): the smallest p with
    k <= bound at m = its lower bound is 54, 69, 76, 83 for k = 1, 100, 1000, 10000; the seed prints 46, 68, 75,
    83. At p = 46 the bound is about 0.1 (p = 46 is the answer for eps = 100, not 10); at p = 68 it is 97.3 < 100
    and at p = 75 it is 906 < 1000. The m column is consistent with the printed p in rows 1, 3, 4 (m(46) = 1.2e8,
    m(75) = 3.2e8, m(83) = 3.9e8) but row 2's 2.7e8 is m(69), not m(68) = 2.6e8. Recomputed m: 1.7e8, 2.7e8,
    3.3e8, 3.9e8.
  - Table 3's last column, headed 2^(p/4), holds 2^p (7.0e13 = 2^46, 3.0e20 = 2^68, 3.8e22 = 2^75, 9.7e24 = 2^83).
    The true upper bounds 2^(p/4) (1.2e4, 1.6e5, 5.2e5, 1.8e6 at the recomputed p) are far below the lower bounds on
    m, so in the ideal case no m satisfies Theorem 4.2 for any of these k; the m-range first becomes non-empty at
    p = 119. And Delta = 1 < 1 + delta leaves Algorithm 1 undefined (see above): the ideal case needs Delta >= 5/4.
  - Section 4's running time: (1.2e8 / 1e3)^2 * 0.1 s = 1.44e9 s (46 years), printed 1.2e9 s (38 years).

Pure: standard library only. Every figure is a float computed in double precision from the closed forms above;
``min_records`` rounds up with a relative margin of 1e-12, so an n it accepts satisfies the exact inequality.
"""

from __future__ import annotations

import math
import numbers

from dpcda.privacy.errors import DpcdaError

THEOREM = "seed 002 Theorem 4.1 (Boedihardjo, Strohmer and Vershynin's private sampling, Algorithm 1)"
NEIGHBOURING_RELATION = "replace one record (any of its p bits), n records, n public"
GUARANTEE = "pure epsilon-DP (DP delta 0) for the exact Algorithm 1"

DEFAULT_DEGREE = 2
DEFAULT_DELTA = 0.25  # the largest delta with a meaningful 4-delta accuracy; the seed's choice
DEFAULT_BIG_DELTA = 4.0  # h* <= 4/m: room to match marginals of a moderately skewed table
REDUCED_SPACE_FACTOR = 8  # default m = 8 binom(p, <= d): S then rarely forces shrinkage (n grows as m^(3/2))
DEFAULT_GAMMA = 0.125  # Theorem 4.2's failure parameter; 1/8 gives the seed's "50 % chance of success"
MARGIN = 1e-12  # relative rounding margin: every float figure here is within 1e-13 of the exact one


class FeasibilityError(DpcdaError, ValueError):
    """A parameter of Theorem 4.1 or 4.2 that is out of range."""


# ---------------------------------------------------------------- argument checks


def _int(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise FeasibilityError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise FeasibilityError(f"{name} must be {bounds}, got {value}")
    return int(value)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FeasibilityError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise FeasibilityError(f"{name} must be positive and finite, got {value:g}")
    return value


def _box(delta, big_delta) -> tuple[float, float]:
    delta, big_delta = _positive("delta", delta), _positive("big_delta", big_delta)
    if not delta < big_delta:
        raise FeasibilityError(f"big_delta (Delta) must exceed delta, got Delta={big_delta:g} <= delta={delta:g}")
    return delta, big_delta


def _gamma(gamma) -> float:
    gamma = _positive("gamma", gamma)
    if not gamma < 0.25:
        raise FeasibilityError(f"gamma must be in (0, 1/4) (success probability 1 - 4 gamma - 2^-p/2), got {gamma:g}")
    return gamma


MAX_DIMENSION = 4000  # Theorem 4.2's 2^(p/4) stays a float (below 2^1024); the sampler itself takes 20 columns


def _dimension_and_degree(p, degree) -> tuple[int, int]:
    p = _int("dimension", p, 1, MAX_DIMENSION)
    return p, _int("degree", degree, 1, p)


# ---------------------------------------------------------------- Theorem 4.1


def walsh_count(p: int, degree: int = DEFAULT_DEGREE, *, paper_approximation: bool = False) -> float:
    """binom(p, <= d): the number of Walsh functions of degree <= d (the seed's relaxed form: p(p+1)/2 for d = 2)."""
    p, degree = _dimension_and_degree(p, degree)
    if paper_approximation:
        if degree != 2:
            raise FeasibilityError(f"degree: the seed's approximation p(p+1)/2 is for degree 2, got {degree}")
        return p * (p + 1) / 2
    return float(sum(math.comb(p, j) for j in range(degree + 1)))


def privacy_bound(
    *,
    p: int,
    epsilon: float,
    records: int,
    reduced_space: int,
    degree: int = DEFAULT_DEGREE,
    delta: float = DEFAULT_DELTA,
    big_delta: float = DEFAULT_BIG_DELTA,
    paper_approximation: bool = False,
) -> float:
    """Theorem 4.1's right-hand side: the largest synthetic size k (a real number) it certifies as eps-DP."""
    count = walsh_count(p, degree, paper_approximation=paper_approximation)
    epsilon = _positive("epsilon", epsilon)
    n = _int("records", records, 1)
    m = _int("reduced_space", reduced_space, 1)
    delta, big_delta = _box(delta, big_delta)
    return _bound(epsilon, delta, big_delta, degree, count, float(n), float(m))


def default_reduced_space(p: int, degree: int = DEFAULT_DEGREE) -> int:
    """The sampler's default m, 8 binom(p, <= d): a random Walsh matrix with 8 times more rows than columns is
    well conditioned, and the QP then has room to match the marginals without shrinking (m = 2 binom shrank most
    tables by half in our trials); Theorem 4.1's n grows as m^(3/2), so no larger by default."""
    return REDUCED_SPACE_FACTOR * int(walsh_count(p, degree))


def _log_bound(epsilon, delta, big_delta, degree, count, log_n: float, log_m: float) -> float:
    """log of Theorem 4.1's bound (in logs: n and m may be far beyond float range, e.g. the ideal case's 2^p)."""
    return (
        math.log(epsilon)
        - math.log(4 * math.sqrt(2))
        + 1.5 * (math.log(delta) - math.log(big_delta))
        - degree / 2
        - math.log(count) / 4
        + log_n / 2
        - 0.75 * log_m
    )


def _bound(epsilon, delta, big_delta, degree, count, n: float, m: float) -> float:
    log = _log_bound(epsilon, delta, big_delta, degree, count, math.log(n), math.log(m))
    return math.exp(log) if log < 709 else math.inf


def min_records(
    *,
    p: int,
    epsilon: float,
    synthetic_size: int = 1,
    reduced_space: int | None = None,
    degree: int = DEFAULT_DEGREE,
    delta: float = DEFAULT_DELTA,
    big_delta: float = DEFAULT_BIG_DELTA,
) -> int:
    """The smallest n for which Theorem 4.1 certifies eps-DP: 32 k^2 (Delta/delta)^3 e^d binom^(1/2) m^(3/2) / eps^2.

    ``reduced_space`` None: the sampler's default m (``default_reduced_space``). With m = binom(p, <= d), the
    smallest m the algorithm can run with, it is the least n the theorem can ever accept for these p, eps, k.
    """
    count = walsh_count(p, degree)
    epsilon = _positive("epsilon", epsilon)
    k = _int("synthetic_size", synthetic_size, 1)
    m = default_reduced_space(p, degree) if reduced_space is None else _int("reduced_space", reduced_space, 1)
    delta, big_delta = _box(delta, big_delta)
    log = (
        math.log(32)
        + 2 * math.log(k)
        + 3 * (math.log(big_delta) - math.log(delta))
        + degree
        + math.log(count) / 2
        + 1.5 * math.log(m)
        - 2 * math.log(epsilon)
    )
    if log > 700:
        raise FeasibilityError(f"synthetic_size {k}: Theorem 4.1 needs more than e^700 records (epsilon {epsilon:g})")
    return max(1, math.ceil(math.exp(log) * (1 + MARGIN)))


def max_synthetic_size(**kwargs) -> int:
    """The largest integer k that Theorem 4.1 certifies (0: not even one row); arguments of ``privacy_bound``."""
    bound = privacy_bound(**kwargs)
    return int(math.floor(bound * (1 - MARGIN))) if math.isfinite(bound) else 2**63 - 1


# ---------------------------------------------------------------- Theorem 4.2 and the algorithm's own needs


def algorithm_well_defined(delta: float, big_delta: float) -> bool:
    """2 delta <= 1 <= Delta - delta: the step-4 box can hold a density (each candidate sums to 1)."""
    delta, big_delta = _box(delta, big_delta)
    return 2 * delta <= 1 <= big_delta - delta


def accuracy_conditions(
    *,
    p: int,
    degree: int = DEFAULT_DEGREE,
    delta: float = DEFAULT_DELTA,
    big_delta: float = DEFAULT_BIG_DELTA,
    gamma: float = DEFAULT_GAMMA,
    paper_approximation: bool = False,
) -> dict:
    """Theorem 4.2's bounds that depend on parameters only (its density condition ||f_n|| <= Delta/2^p needs data)."""
    count = walsh_count(p, degree, paper_approximation=paper_approximation)
    delta, big_delta = _box(delta, big_delta)
    gamma = _gamma(gamma)
    base = 16 * math.exp(2 * degree) * count / (delta**2 * gamma)
    low, high = base * big_delta**2, 2.0 ** (p / 4)
    return {
        "min_reduced_space": low,
        "max_reduced_space": high,
        "reduced_space_range_consistent": low <= high,
        "min_records": base,
        "min_synthetic_size": 4 / delta**2 * (math.log(2 / gamma) + math.log(count)),
        "success_probability": max(0.0, 1 - 4 * gamma - 2.0 ** (-p / 2)),  # a lower bound; vacuous below 0
        "accuracy": 4 * delta,
    }


# ---------------------------------------------------------------- the whole report


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x >= 1e6 else f"{x:g}"


def conditions(
    p: int,
    epsilon: float,
    synthetic_size: int = 1,
    *,
    records: int | None = None,
    reduced_space: int | None = None,
    degree: int = DEFAULT_DEGREE,
    delta: float = DEFAULT_DELTA,
    big_delta: float = DEFAULT_BIG_DELTA,
    gamma: float = DEFAULT_GAMMA,
) -> dict:
    """Theorem 4.1's verdict and figures (stable keys; ``feasibility --json`` prints this dict).

    ``reduced_space`` None: the sampler's default m (``default_reduced_space``). ``min_records`` is the least n at
    that m; ``min_records_any_reduced_space`` the least n at m = binom(p, <= d), below which no m can go. ``dp`` is
    None without ``records``; otherwise True exactly when records >= min_records. ``reason`` is one line.
    Figures beyond the floating-point range (a high degree) are one FeasibilityError line.
    """
    try:
        return _conditions(p, epsilon, synthetic_size, records, reduced_space, degree, delta, big_delta, gamma)
    except OverflowError:
        raise FeasibilityError(
            f"dimension {p}, degree {degree}: the theorem's figures exceed the floating-point range (about 1e308); "
            f"give a smaller dimension or degree"
        ) from None


def _conditions(p, epsilon, synthetic_size, records, reduced_space, degree, delta, big_delta, gamma) -> dict:
    count = walsh_count(p, degree)
    epsilon = _positive("epsilon", epsilon)
    k = _int("synthetic_size", synthetic_size, 1)
    delta, big_delta = _box(delta, big_delta)
    n = None if records is None else _int("records", records, 1)
    m = default_reduced_space(p, degree) if reduced_space is None else _int("reduced_space", reduced_space, 1)
    common = dict(p=p, epsilon=epsilon, synthetic_size=k, degree=degree, delta=delta, big_delta=big_delta)
    need = min_records(reduced_space=m, **common)
    need_any_m = min_records(reduced_space=int(count), **common)
    acc = accuracy_conditions(p=p, degree=degree, delta=delta, big_delta=big_delta, gamma=gamma)
    m_acc = math.ceil(acc["min_reduced_space"] * (1 - MARGIN))
    need_at_acc = min_records(reduced_space=m_acc, **common) if m_acc < 2**62 else None
    params = f"p={p}, eps={epsilon:g}, k={k}, d={degree}, m={m}, delta={delta:g}, Delta={big_delta:g}"
    bound = None
    if n is None:
        dp = None
        reason = f"Theorem 4.1 needs n >= {_fmt(need)} records for {params}"
    else:
        bound = _bound(epsilon, delta, big_delta, degree, count, float(n), float(m))
        dp = n >= need
        if dp:
            reason = f"DP: n={n} records >= {_fmt(need)}, which Theorem 4.1 needs for {params}"
        else:
            reason = f"not DP: n={n} records, Theorem 4.1 needs n >= {_fmt(need)} for {params}"
    return {
        "theorem": THEOREM,
        "neighbouring_relation": NEIGHBOURING_RELATION,
        "guarantee": GUARANTEE,
        "dimension": p,
        "degree": degree,
        "epsilon": epsilon,
        "synthetic_size": k,
        "delta": delta,
        "big_delta": big_delta,
        "gamma": gamma,
        "walsh_count": int(count),
        "records": n,
        "reduced_space": m,
        "reduced_space_given": reduced_space is not None,
        "min_records": need,
        "min_records_any_reduced_space": need_any_m,
        "synthetic_size_bound": bound,
        "dp": dp,
        "reason": reason,
        "algorithm_well_defined": algorithm_well_defined(delta, big_delta) and m >= count,
        "accuracy_theorem": {**acc, "min_records_for_privacy_at_min_reduced_space": need_at_acc},
    }


# ---------------------------------------------------------------- the seed's Tables 2 and 3


def paper_table2_row(
    *,
    p: int,
    n: int,
    f_inf: float,
    epsilon: float = 1.0,
    degree: int = 2,
    delta: float = 0.25,
    gamma: float = 0.125,
    paper_approximation: bool = True,
) -> dict:
    """A row of seed 002's Table 2: Delta = 2^p ||f_n||_inf; k * m^(3/4) <= ``k_m34``; ``m_low`` <= m <= ``m_high``."""
    f_inf = _positive("f_inf", f_inf)
    big_delta = 2.0**p * f_inf
    acc = accuracy_conditions(
        p=p, degree=degree, delta=delta, big_delta=big_delta, gamma=gamma, paper_approximation=paper_approximation
    )
    count = walsh_count(p, degree, paper_approximation=paper_approximation)
    k_m34 = _bound(_positive("epsilon", epsilon), delta, big_delta, degree, count, float(_int("n", n, 1)), 1.0)
    return {"big_delta": big_delta, "k_m34": k_m34, "m_low": acc["min_reduced_space"], "m_high": 2.0 ** (p / 4)}


def ideal_case_k_bound(
    p: int,
    *,
    epsilon: float = 10.0,
    degree: int = 2,
    delta: float = 0.25,
    gamma: float = 0.125,
    paper_approximation: bool = True,
) -> float:
    """Seed 002's ideal data set: n = 2^p, Delta = 1, m at its Theorem 4.2 lower bound; Theorem 4.1's bound on k."""
    acc = accuracy_conditions(
        p=p, degree=degree, delta=delta, big_delta=1.0, gamma=gamma, paper_approximation=paper_approximation
    )
    count = walsh_count(p, degree, paper_approximation=paper_approximation)
    epsilon = _positive("epsilon", epsilon)
    log = _log_bound(epsilon, delta, 1.0, degree, count, p * math.log(2), math.log(acc["min_reduced_space"]))
    return math.exp(log) if log < 709 else math.inf


def paper_table3_row(
    k: int,
    *,
    epsilon: float = 10.0,
    degree: int = 2,
    delta: float = 0.25,
    gamma: float = 0.125,
    paper_approximation: bool = True,
    p_max: int = 1000,
) -> dict:
    """A row of seed 002's Table 3: the smallest p whose ideal case certifies k rows, with m's bounds at that p."""
    k = _int("k", k, 1)
    for p in range(max(degree, 1), p_max + 1):
        bound = ideal_case_k_bound(
            p, epsilon=epsilon, degree=degree, delta=delta, gamma=gamma, paper_approximation=paper_approximation
        )
        if k <= bound * (1 - MARGIN):
            acc = accuracy_conditions(
                p=p, degree=degree, delta=delta, big_delta=1.0, gamma=gamma, paper_approximation=paper_approximation
            )
            return {
                "p_low": p,
                "k_bound": bound,
                "m_low": acc["min_reduced_space"],
                "m_high": 2.0 ** (p / 4),
                "cube_size": 2.0**p,
                "reduced_space_range_consistent": acc["reduced_space_range_consistent"],
            }
    raise FeasibilityError(f"k: no dimension up to {p_max} certifies {k} rows at epsilon {epsilon:g}")
