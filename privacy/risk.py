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

from privacy.errors import DpcdaError


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
    e = math.exp(epsilon)
    return np.maximum.reduce([np.zeros_like(fp), 1.0 - delta - e * fp, (1.0 - delta - fp) / e])


def equal_error_rate_floor(epsilon: float, delta: float) -> float:
    """The smallest error rate an attacker can have when FP = FN."""
    _check(epsilon, delta)
    return (1.0 - delta) / (1.0 + math.exp(epsilon))


def max_advantage(epsilon: float, delta: float) -> float:
    """The largest TPR - FPR of any attacker."""
    _check(epsilon, delta)
    e = math.exp(epsilon)
    return (e - 1.0 + 2.0 * delta) / (e + 1.0)


def risk_figures(epsilon: float | None, delta: float) -> dict:
    """The manifest's and ``dpcda risk``'s figures for a claim (null epsilon: no protection at all)."""
    if epsilon is None or epsilon == math.inf:
        return {"equal_error_rate_floor": 0.0, "max_advantage": 1.0, "basis": "no guarantee (infinite epsilon)"}
    return {
        "equal_error_rate_floor": equal_error_rate_floor(epsilon, delta),
        "max_advantage": max_advantage(epsilon, delta),
        "basis": "every membership test against an (epsilon, delta)-DP release has FP + e^eps FN >= 1 - delta and "
        "FN + e^eps FP >= 1 - delta (docs/privacy.md)",
    }
