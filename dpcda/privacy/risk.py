"""What an (epsilon, delta) claim means to a membership attacker (seed 003, after Kairouz et al. 2015).

Any test that tries to tell a dataset with a record from one without it, against an (eps, delta)-DP release, has
false-positive rate FP and false-negative rate FN with

    FP + e^eps FN >= 1 - delta   and   FN + e^eps FP >= 1 - delta.

(Seed 003 prints both with <=, which is the wrong way round: with <=, the trivial test FP = 0, FN = 1 would break
the bound for any eps > 0. The inequalities are lower bounds on the attacker's errors.)

From them: the smallest FN at a given FP (the trade-off curve), the smallest equal error rate
(1 - delta) / (1 + e^eps), and the largest advantage TPR - FPR, (e^eps - 1 + 2 delta) / (e^eps + 1).
"""

from __future__ import annotations

import math

import numpy as np

from dpcda.privacy.errors import DpcdaError

EXP_CAP = 700.0  # e^700 is finite in float64; e^710 overflows


class RiskError(DpcdaError, ValueError):
    """An (epsilon, delta) pair that is not a claim."""


def _check(epsilon: float, delta: float) -> None:
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise RiskError(f"epsilon must be finite and >= 0, got {epsilon}")
    if not 0 <= delta < 1:
        raise RiskError(f"delta must be in [0, 1), got {delta}")


def fn_floor(epsilon: float, delta: float, fp) -> np.ndarray:
    """The smallest false-negative rate any attacker can have at false-positive rate ``fp``."""
    _check(epsilon, delta)
    fp = np.asarray(fp, dtype=np.float64)
    e = math.exp(min(epsilon, EXP_CAP))  # beyond the cap the floor is 0 at every fp > 0 anyway
    return np.maximum.reduce([np.zeros_like(fp), 1.0 - delta - e * fp, (1.0 - delta - fp) / e])


def equal_error_rate_floor(epsilon: float, delta: float) -> float:
    """The smallest error rate an attacker can have when FP = FN."""
    _check(epsilon, delta)
    t = math.exp(-epsilon)  # written in e^-eps: no overflow for a large finite epsilon
    return (1.0 - delta) * t / (1.0 + t)


def max_advantage(epsilon: float, delta: float) -> float:
    """The largest TPR - FPR of any attacker."""
    _check(epsilon, delta)
    t = math.exp(-epsilon)
    return (1.0 - t + 2.0 * delta * t) / (1.0 + t)


def risk_figures(epsilon: float | None, delta: float, relation: str = "add/remove") -> dict:
    """The manifest's and ``dpcda risk``'s figures for a claim (null epsilon: no protection at all).

    ``relation``: the claim's neighbouring relation. Under add/remove the figures bound membership tests; under a
    replace-one relation they bound only tests between two records the relation swaps (e.g. two records of one
    class, when class sizes are public): whether a record is in the data at all may be visible.
    """
    if epsilon is None or epsilon == math.inf:
        return {"equal_error_rate_floor": 0.0, "max_advantage": 1.0, "basis": "no guarantee (infinite epsilon)"}
    if "add" in relation and "remove" in relation:
        test = "every membership test (was this record in the input?)"
    else:
        test = (
            f"every test telling apart two inputs that differ as '{relation}' (NOT whether a record was in the "
            "input at all, which this relation does not protect)"
        )
    return {
        "equal_error_rate_floor": equal_error_rate_floor(epsilon, delta),
        "max_advantage": max_advantage(epsilon, delta),
        "basis": f"{test} against this (epsilon, delta) claim has FP + e^eps FN >= 1 - delta and "
        "FN + e^eps FP >= 1 - delta (docs/privacy.md)",
    }
