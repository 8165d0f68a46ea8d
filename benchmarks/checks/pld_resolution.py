"""How small a delta the PLD accountant resolves: dp_accounting's FFT composition against a direct convolution.

    python -m benchmarks.checks.pld_resolution                  # the default configurations (a minute or two)
    python -m benchmarks.checks.pld_resolution --config 6.667e-5 60000 0.55

The accountant of add/remove releases (``privacy.accounting.make_accountant("poisson")``) composes T Poisson-sampled
Gaussians by FFT in float64. The reference composes the very same pessimistic single-step PMFs (dp_accounting's own,
at ``PLD_DISCRETIZATION``) by direct convolution, whose summands are all non-negative, so its rounding error is
relative only; its tails below 1e-40 are moved pessimistically (left tail to the lowest kept loss, right tail to
infinity). For each configuration the table gives the largest |delta_fft - delta_ref| over epsilon in [0.05, 30],
and, at the configuration's floor and at each delta, the reference delta at the epsilon the accountant reports, over
delta: above 1 the reported
(epsilon, delta) claims more than the pessimistic PLD supports. This is what ``PLD_MIN_DELTA``,
``PLD_DELTA_PER_COMPOSITION`` and the reserved ``PLD_ROUNDOFF_SHARE`` rest on (the reported epsilon is the
accountant's, read with that share set aside; the absolute error column uses dp_accounting's unreserved ``get_delta``).

Reads dp_accounting's PMF internals (``_pmf_remove``, ``_probs``): a benchmark, not product code.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import dp_accounting
import numpy as np
from dp_accounting import pld
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpcda.privacy.accounting import PLD_DISCRETIZATION, PLD_MIN_DELTA, make_accountant, pld_least_delta

TAIL = 1e-40
DELTAS = (1e-6, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12)
# (q, T, z): Fashion-MNIST-sized classes (6,000 rows, l = 4) and one class of 60,000, each at two noise levels, and
# larger T (l = 4) for how the round-off grows with the number of compositions
CONFIGS = (
    (4 / 6000, 6000, 0.6),
    (4 / 6000, 6000, 1.0),
    (4 / 60000, 60000, 0.55),
    (4 / 60000, 60000, 0.9),
    (4 / 200_000, 200_000, 0.55),
    (4 / 2_000_000, 2_000_000, 0.55),
)


def _truncate(p: np.ndarray, offset: int, inf: float):
    left = int(np.searchsorted(np.cumsum(p), TAIL / 2))
    right = len(p) - int(np.searchsorted(np.cumsum(p[::-1]), TAIL / 2))
    right = max(right, left + 1)
    kept = p[left:right].copy()
    kept[0] += p[:left].sum()  # the left tail to the lowest kept loss (pessimistic)
    return kept, offset + left, inf + p[right:].sum()  # the right tail to infinity (pessimistic)


def _convolve(a, b):
    (pa, oa, ia), (pb, ob, ib) = a, b
    return _truncate(np.convolve(pa, pb), oa + ob, 1 - (1 - ia) * (1 - ib))


def _self_compose(pmf, times: int):
    out, base = None, pmf
    while times:
        if times & 1:
            out = base if out is None else _convolve(out, base)
        times >>= 1
        if times:
            base = _convolve(base, base)
    return out


def reference(q: float, steps: int, z: float) -> list:
    """The remove and add PMFs of ``steps`` compositions, by direct convolution: [(probs, lowest index, inf mass)]."""
    one = pld_lib.from_gaussian_mechanism(
        standard_deviation=z,
        value_discretization_interval=PLD_DISCRETIZATION,
        sampling_prob=q,
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    out = []
    for pmf in (one._pmf_remove, one._pmf_add):
        dense = pmf.to_dense_pmf()
        out.append(_self_compose((np.asarray(dense._probs, float), dense._lower_loss, dense._infinity_mass), steps))
    return out


def delta_at(curve, eps: float) -> float:
    p, offset, inf = curve
    losses = (np.arange(len(p)) + offset) * PLD_DISCRETIZATION
    above = losses > eps
    return inf + float(np.dot(-np.expm1(eps - losses[above]), p[above]))


def epsilon_at(curve, delta: float) -> float:
    p, offset, inf = curve
    top = (offset + len(p) - 1) * PLD_DISCRETIZATION
    return pld_pmf._get_epsilon_for_delta(inf, itertools.count(top, -PLD_DISCRETIZATION), np.flip(p), delta)


def measure(q: float, steps: int, z: float) -> dict:
    t = time.perf_counter()
    acc = make_accountant("poisson")
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps
        )
    )
    curves = reference(q, steps, z)
    grid = np.linspace(0.05, 30, 600)
    fft = np.array([pld.PLDAccountant.get_delta(acc, e) for e in grid])  # dp_accounting's own, unreserved
    ref = np.array([max(delta_at(c, e) for c in curves) for e in grid])
    ratios = {}
    floor = pld_least_delta(steps)  # the least delta the product accepts for T steps
    for d in (floor, *DELTAS):
        eps = acc.get_epsilon(d)
        ratios[d] = max(delta_at(c, eps) for c in curves) / d if math.isfinite(eps) else float("nan")
    return {
        "q": q,
        "T": steps,
        "z": z,
        "max_abs_error": float(np.abs(fft - ref).max()),
        "min_fft_delta": float(fft.min()),
        "floor": floor,
        "ratios": ratios,
        "seconds": time.perf_counter() - t,
    }


def table(rows: list[dict]) -> str:
    head = (
        "| q | T | z | max abs delta error | least FFT delta | floor | at the floor | "
        + " | ".join(f"{d:g}" for d in DELTAS)
        + " | s |"
    )
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(DELTAS) + "---:|"]
    for r in rows:
        cells = " | ".join(f"{r['ratios'][d]:.4f}" for d in DELTAS)
        lines.append(
            f"| {r['q']:.3g} | {r['T']} | {r['z']:g} | {r['max_abs_error']:.2e} | {r['min_fft_delta']:.2e} | "
            f"{r['floor']:.2g} | {r['ratios'][r['floor']]:.4f} | {cells} | {r['seconds']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", nargs=3, type=float, action="append", metavar=("Q", "T", "Z"), help="(repeatable)")
    args = ap.parse_args(argv)
    configs = [(q, int(t), z) for q, t, z in args.config] if args.config else CONFIGS
    rows = [measure(*c) for c in configs]
    print(
        f"\nPLD accountant (FFT, float64, discretization {PLD_DISCRETIZATION:g}) against a direct convolution of the "
        f"same PMFs; columns per delta: the reference delta at the reported epsilon, over delta (PLD_MIN_DELTA = "
        f"{PLD_MIN_DELTA:g})\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
