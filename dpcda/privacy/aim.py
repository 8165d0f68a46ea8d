"""The budget of AIM selection (McKenna, Mullins, Sheldon, Miklau 2022): a zCDP filter over adaptively chosen rounds.

Neighbouring relation: add or remove one record (all its columns, the label included); the row count is private.

AIM spends a zCDP budget rho in rounds whose sizes it chooses as it goes: every column's one-way counts with Gaussian
noise of std sigma_0, then rounds of one exponential-mechanism selection at epsilon_t (epsilon_t^2/8 zCDP: the
mechanism is epsilon-bounded range, Cesar and Rogers 2021) followed by the chosen marginal's counts with Gaussian noise
of std sigma_t (1 / (2 sigma_t^2) zCDP: a record is one cell of a marginal, L2 sensitivity 1). With T = 16 d rounds
planned (d columns), sigma_0 = sqrt(T / (2 * 0.9 rho)) and epsilon_0 = sqrt(8 * 0.1 rho / T); a round whose measured
marginal barely moved the model halves sigma and doubles epsilon (``anneal``); a round that would leave less than one
more round's cost spends everything left instead (0.9 of it on the measurement, 0.1 on the selection) and is the last.

Why the total is rho whatever the data (the bound, stated once here): each round's parameters are a function of public
inputs and of earlier DP outputs only (the annealing test reads the model fitted to noisy counts), and a round is run
only if its cost fits in what is left (``ZcdpFilter.charge``, exact rationals). Adaptive composition of zCDP with
parameters chosen from previous outputs and a stopping rule that never exceeds the cap is a valid privacy filter
(Whitehouse, Ramdas, Rogers, Wu, "Fully-adaptive composition in differential privacy", ICML 2023, zCDP filter;
Feldman and Zrnic 2021 for the Renyi filter): the whole sequence is rho-zCDP. Its RDP curve is then alpha * rho at
every order, which is exactly dp_accounting's ``ZCDpEvent(rho)`` and exactly the composition of the realized events
(``GaussianDpEvent(sigma)``: alpha / (2 sigma^2), ``ZCDpEvent(eps^2/8)``: alpha eps^2 / 8), so the release is
accounted as the planned ``AimEvent`` (``ZCDpEvent(rho)``) and ``realized_dp_event`` recomputes it from the manifest's
rounds (tests/test_aim.py). The selection epsilons are exact rationals (``exponential.exact_epsilon``, rounded
down); every sigma is rounded up until its exact rho fits; the ledger sums exact rationals, so rounding never spends
more than the cap.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import dp_accounting

from dpcda.privacy.errors import DpcdaError
from dpcda.privacy.events import AimEvent
from dpcda.privacy.exponential import exact_epsilon

MEASURE_SHARE = Fraction(9, 10)  # AIM's alpha: of each round's rho, 0.9 on the measurement, 0.1 on the selection
ROUNDS_PER_COLUMN = 16  # AIM's default T = 16 d


class FilterError(DpcdaError, ValueError):
    """A charge over what is left of the budget (a bug: the schedule never asks for one)."""


def gaussian_rho(std: float) -> Fraction:
    """zCDP of one Gaussian measurement of L2 sensitivity 1 at noise std ``std``, exactly: 1 / (2 std^2)."""
    if not (std > 0 and math.isfinite(std)):
        raise ValueError(f"std must be positive and finite, got {std}")
    s = Fraction(std)
    return 1 / (2 * s * s)


def selection_rho(epsilon: Fraction) -> Fraction:
    """zCDP of one epsilon-DP exponential-mechanism round, exactly: epsilon^2 / 8."""
    e = Fraction(epsilon)
    if not e > 0:
        raise ValueError(f"epsilon must be positive, got {epsilon}")
    return e * e / 8


def std_for(rho: Fraction) -> float:
    """The smallest float std whose exact ``gaussian_rho`` is at most ``rho`` (> 0)."""
    rho = Fraction(rho)
    if not rho > 0:
        raise ValueError(f"rho must be positive, got {rho}")
    s = math.sqrt(1.0 / (2.0 * float(rho)))
    while gaussian_rho(s) > rho:
        s = math.nextafter(s, math.inf)
    return s


class ZcdpFilter:
    """The exact ledger of one AIM run: charges in exact rationals, refused past ``cap`` (the filter)."""

    def __init__(self, cap: float):
        if not (cap > 0 and math.isfinite(cap)):
            raise ValueError(f"rho must be positive and finite, got {cap}")
        self.cap = Fraction(cap)
        self.spent = Fraction(0)

    @property
    def remaining(self) -> Fraction:
        return self.cap - self.spent

    def charge(self, rho: Fraction) -> None:
        if rho < 0 or self.spent + rho > self.cap:
            raise FilterError(f"zCDP filter: a charge of {float(rho)} with {float(self.remaining)} left")
        self.spent += rho


@dataclasses.dataclass(frozen=True)
class Round:
    """One adaptive round's parameters: the selection's epsilon (exact) and the measurement's noise std."""

    epsilon: Fraction
    std: float
    last: bool

    @property
    def rho(self) -> Fraction:
        return selection_rho(self.epsilon) + gaussian_rho(self.std)


class AimSchedule:
    """AIM's budget schedule over a ``ZcdpFilter`` of ``rho``: the one-way measurement, then ``next_round`` until
    ``done``; ``anneal`` after a round whose marginal barely changed. Every decision it takes is in its arguments
    (public: rho, the columns; or a DP output: whether to anneal)."""

    def __init__(self, rho: float, columns: int, rounds: int | None = None):
        if columns < 1:
            raise ValueError(f"columns must be >= 1, got {columns}")
        self.filter = ZcdpFilter(rho)
        self.planned_rounds = int(rounds) if rounds is not None else ROUNDS_PER_COLUMN * columns
        if self.planned_rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        per_round = self.filter.cap / self.planned_rounds
        self.sigma = std_for(per_round * MEASURE_SHARE)
        self.epsilon = exact_epsilon(math.sqrt(8.0 * float(per_round * (1 - MEASURE_SHARE))))
        self.one_way_std = self.sigma
        self.columns = columns
        self.filter.charge(columns * gaussian_rho(self.one_way_std))
        self.done = False
        self.annealed = 0
        self.rounds: list[Round] = []

    def next_round(self) -> Round:
        """The next round's parameters, charged to the filter. A round whose cost is more than half what is left is
        replaced by a last round that spends what is left, and so is the ``planned_rounds``-th (a hard bound on the
        rounds, whatever the annealing)."""
        if self.done:
            raise FilterError("zCDP filter: no round after the last")
        regular = Round(self.epsilon, self.sigma, last=False)
        left = self.filter.remaining
        if left < 2 * regular.rho or len(self.rounds) + 1 >= self.planned_rounds:
            eps = exact_epsilon(math.sqrt(8.0 * float(left * (1 - MEASURE_SHARE))))
            rnd = Round(eps, std_for(left - selection_rho(eps)), last=True)
            self.done = True
        else:
            rnd = regular
        self.filter.charge(rnd.rho)
        self.rounds.append(rnd)
        return rnd

    def anneal(self) -> None:
        """The measured marginal barely changed the model: halve sigma, double epsilon (AIM's annealing)."""
        self.sigma /= 2.0
        self.epsilon *= 2
        self.annealed += 1


def realized_dp_event(*, one_way: int, one_way_std: float, rounds) -> dp_accounting.DpEvent:
    """The events one AIM run spent, for dp_accounting: ``one_way`` Gaussians at ``one_way_std``, then per round
    (``(epsilon, std)`` pairs) a ``ZCDpEvent(epsilon^2/8)`` and a ``GaussianDpEvent(std)``."""
    parts = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(one_way_std), one_way)]
    for eps, std in rounds:
        parts.append(dp_accounting.ZCDpEvent(float(eps) ** 2 / 8.0))
        parts.append(dp_accounting.GaussianDpEvent(std))
    return dp_accounting.ComposedDpEvent(parts)


def calibrate(*, target_epsilon: float, delta: float, one_way: int, shared=(), stated_delta: float | None = None):
    """The largest cap rho whose ``AimEvent`` (composed with ``shared``) spends at most ``target_epsilon`` at ``delta``
    (the accountant's), by the RDP accountant (``privacy.marginals.largest_rho``, MST's search)."""
    from dpcda.privacy.marginals import largest_rho

    return largest_rho(
        lambda rho: AimEvent(name="marginals", rho=rho, one_way=one_way),
        target_epsilon=target_epsilon,
        delta=delta,
        shared=shared,
        stated_delta=stated_delta,
    )
