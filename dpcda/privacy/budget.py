"""The budget planner: how one release's (epsilon, delta) is split between its statistics and its synthesis.

Pure: shares and sensitivities in, calibrated events out; no data. Relations as in ``privacy.accounting``
(replace-one within class for ``fixed``, add/remove-one for ``poisson``); each share's ``sensitivity`` is already the
one its mode's relation implies. Every number comes from ``privacy.calibration`` and ``privacy.accounting``
(dp_accounting); nothing here is new privacy maths, only the order in which a release spends its budget:

1. adaptive shares (poisson mode: the DP class histogram, whose output chooses q_k, T_k and sigma_x), each calibrated
   alone at its share of epsilon AND of delta and accounted alone at that delta (adaptive composition,
   ``privacy.accounting``);
2. the accountant's delta: the stated delta less the sampler's reserve and the adaptive shares' deltas;
3. shared statistics (the DP normalisation moments, the DP-PCA covariance, p3gm's DP-EM), each calibrated alone at its
   share of epsilon at the accountant's delta; they compose with the synthesis;
3b. zCDP shares (``RhoShare``: a table's DP domain step), each a fraction of the largest rho the epsilon left for the
   synthesis allows on its own (RDP, at the accountant's delta), and the same fraction of delta reserved for the
   event's own additive term (taken out of the accountant's delta); they compose with the synthesis;
4. the synthesis, calibrated by ``calibrate_synthesis`` so that (shared statistics o synthesis) spends at most what
   the adaptive shares left of the target.

Shares are fractions of the target epsilon or, with an explicit sigma_x (no target), of ``REFERENCE_EPSILON``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence

from dpcda.privacy.accounting import accountant_delta, adaptive_epsilon
from dpcda.privacy.calibration import (
    CalibrationError,
    calibrate_alone,
    calibrate_gaussian,
    calibrate_noise,
    calibrate_parallel,
)
from dpcda.privacy.events import Event, GaussianStatsEvent, IteratedGaussianEvent, Mode

# With an explicit sigma_x there is no target epsilon to take shares of; the statistics then spend their share of
# this reference budget (a release states it in its manifest).
REFERENCE_EPSILON = 10.0


@dataclasses.dataclass(frozen=True)
class Share:
    """One statistic's part of the budget: ``fraction`` of epsilon (an adaptive share: of delta too).

    ``iterations``: None for one Gaussian release (``GaussianStatsEvent``); n for n adaptive Gaussian releases of the
    same statistics (``IteratedGaussianEvent``, DP-EM). ``noise`` False: released without noise (the non-private
    reference run of a mechanism, sigma_x = 0): its event is non-private and its epsilon infinite.
    """

    name: str
    fraction: float
    sensitivity: float
    adaptive: bool = False
    iterations: Optional[int] = None
    noise: bool = True

    def __post_init__(self):
        if not 0 < self.fraction < 1:
            raise ValueError(f"{self.name}: budget fraction must be in (0, 1), got {self.fraction}")
        if not self.sensitivity > 0:
            raise ValueError(f"{self.name}: sensitivity must be positive, got {self.sensitivity}")
        if self.adaptive and self.iterations is not None:
            raise ValueError(f"{self.name}: an adaptive share is one Gaussian release")


@dataclasses.dataclass(frozen=True)
class RhoShare:
    """A share of the zCDP budget (a table's DP domain step): ``fraction`` of the largest rho whose ``ZCDpEvent``
    alone spends at most the epsilon left for the synthesis at the accountant's delta (RDP), and ``fraction`` of delta
    reserved for the event's additive term. ``event_of(rho, reserved_delta, target_epsilon)`` makes the event (it
    has ``reserved_delta``); with ``event`` given (a release whose step has run), that event is taken as it is."""

    name: str
    fraction: float
    event_of: Optional[Callable[[float, float, float], Any]] = None
    event: Any = None

    def __post_init__(self):
        if not 0 < self.fraction < 1:
            raise ValueError(f"{self.name}: budget fraction must be in (0, 1), got {self.fraction}")
        if (self.event_of is None) == (self.event is None):
            raise ValueError(f"{self.name}: give event_of or event")


class _Zcdp:
    def __init__(self, rho: float):
        self.rho = rho

    def to_dp_event(self):
        import dp_accounting

        return dp_accounting.ZCDpEvent(self.rho)


@dataclasses.dataclass(frozen=True)
class PlannedShare:
    """A share's calibrated event: ``epsilon`` is the share's target, ``delta`` the delta it was calibrated at (its
    own share for an adaptive one, else the accountant's)."""

    name: str
    fraction: float
    epsilon: float
    delta: float
    adaptive: bool
    event: GaussianStatsEvent | IteratedGaussianEvent

    @property
    def noise_std(self) -> Optional[float]:
        return getattr(self.event, "noise_std", None)

    @property
    def noise_multiplier(self) -> float:
        return self.event.noise_multiplier


@dataclasses.dataclass(frozen=True)
class BudgetPlan:
    """The split of one release's budget (``plan_budget``).

    ``target_epsilon``: the release's (None with an explicit sigma_x); ``budget_epsilon``: what the fractions are of;
    ``synthesis_epsilon``: what the adaptive shares leave for (shared statistics o synthesis), None without a target.
    """

    mode: Mode
    target_epsilon: Optional[float]
    budget_epsilon: float
    delta: float
    accountant_delta: float
    shares: tuple[PlannedShare, ...]
    synthesis_epsilon: Optional[float]

    def get(self, name: str) -> Optional[PlannedShare]:
        return next((s for s in self.shares if s.name == name), None)

    @property
    def adaptive(self) -> tuple[tuple[Event, float], ...]:
        """(event, delta) of each adaptive share: ``ReleaseEvents.adaptive``."""
        return tuple((s.event, s.delta) for s in self.shares if s.adaptive)

    @property
    def shared(self) -> tuple[Event, ...]:
        """The events that compose with the synthesis, in the order given: ``ReleaseEvents.shared``."""
        return tuple(s.event for s in self.shares if not s.adaptive)


def _calibrated(mode: Mode, share: Share, epsilon: float, delta: float):
    if share.iterations is None:
        if not share.noise:
            return GaussianStatsEvent(share.name, 0.0, share.sensitivity)
        return calibrate_gaussian(
            mode, name=share.name, sensitivity=share.sensitivity, target_epsilon=epsilon, delta=delta
        )
    std = 0.0
    if share.noise:
        std = share.sensitivity * calibrate_alone(
            lambda z: IteratedGaussianEvent(share.name, share.iterations, z * share.sensitivity, share.sensitivity),
            name=share.name,
            target_epsilon=epsilon,
            delta=delta,
        )
    return IteratedGaussianEvent(share.name, share.iterations, std, share.sensitivity)


def plan_budget(
    mode: Mode,
    *,
    epsilon: Optional[float],
    delta: float,
    shares: Sequence[Share | RhoShare] = (),
    reference_epsilon: float = REFERENCE_EPSILON,
) -> BudgetPlan:
    """Calibrates every share of a release's budget (module doc) and says what is left for the synthesis.

    ``epsilon`` None: sigma_x is given, the shares are fractions of ``reference_epsilon`` and nothing is left to
    calibrate. Refuses (CalibrationError) shares whose fractions leave nothing for the synthesis.
    """
    names = [s.name for s in shares]
    if len(set(names)) != len(names):
        raise ValueError(f"shares: a name appears twice in {names}")
    if sum(s.fraction for s in shares) >= 1:
        raise CalibrationError(f"the shares {names} take the whole budget; lower them")
    budget = epsilon if epsilon is not None else reference_epsilon
    planned = []
    rho_shares = [s for s in shares if isinstance(s, RhoShare)]
    shares = [s for s in shares if not isinstance(s, RhoShare)]
    reserved = [s.event.reserved_delta if s.event is not None else s.fraction * delta for s in rho_shares]
    for s in shares:
        if s.adaptive:
            d = s.fraction * delta
            planned.append(
                PlannedShare(
                    s.name, s.fraction, s.fraction * budget, d, True, _calibrated(mode, s, s.fraction * budget, d)
                )
            )
    acc_delta = accountant_delta(delta, [p.delta for p in planned] + reserved)
    rest = None
    if epsilon is not None:
        rest = epsilon - sum(adaptive_epsilon(mode, p.event, p.delta) for p in planned)
    for s in shares:
        if not s.adaptive:
            ev = _calibrated(mode, s, s.fraction * budget, acc_delta)
            planned.append(PlannedShare(s.name, s.fraction, s.fraction * budget, acc_delta, False, ev))
    for s, r in zip(rho_shares, reserved):
        planned.append(_rho_share(mode, s, r, epsilon, rest, acc_delta))
    order = {n: i for i, n in enumerate(names)}
    planned.sort(key=lambda p: order[p.name])
    return BudgetPlan(
        mode=mode,
        target_epsilon=epsilon,
        budget_epsilon=budget,
        delta=delta,
        accountant_delta=acc_delta,
        shares=tuple(planned),
        synthesis_epsilon=rest,
    )


def _rho_share(mode, s: RhoShare, reserved: float, epsilon, rest, acc_delta: float) -> PlannedShare:
    """A ``RhoShare`` planned: its event (made from its fraction of the rho the synthesis' epsilon allows alone, or
    given), with the epsilon it spends alone (RDP, at the accountant's delta) for the manifest."""
    from dpcda.privacy.accounting import epsilon_of
    from dpcda.privacy.marginals import largest_rho

    event = s.event
    if event is None:
        if epsilon is None or not rest > 0:
            raise CalibrationError(f"{s.name}: a zCDP share needs a target epsilon (give --epsilon)")
        whole = largest_rho(_Zcdp, target_epsilon=rest, delta=acc_delta).rho
        event = s.event_of(s.fraction * whole, reserved, epsilon)
    alone = epsilon_of(mode, [event], acc_delta, "rdp")
    return PlannedShare(s.name, s.fraction, alone if math.isfinite(alone) else math.inf, acc_delta, False, event)


def calibrate_synthesis(
    plan: BudgetPlan, make_events: Callable[[float], list], *, scale: float = 1.0, parallel_first=None
) -> float:
    """The synthesis' noise: the smallest s * ``scale`` with (``plan.shared`` o ``make_events(s * scale)``) spending at
    most ``plan.synthesis_epsilon`` at the accountant's delta (``calibrate_noise``). With ``parallel_first`` (a key on
    a group's event) the events are groups that compose in parallel, each with the shared events, and every group
    must fit (``calibrate_parallel``, visiting groups in that key's order)."""
    if plan.synthesis_epsilon is None:
        raise CalibrationError("the budget has no target epsilon (sigma_x was given): nothing to calibrate")
    given = dict(
        target_epsilon=plan.synthesis_epsilon,
        delta=plan.accountant_delta,
        shared=list(plan.shared),
        scale=scale,
        stated_delta=plan.delta,
    )
    if parallel_first is not None:
        return calibrate_parallel(plan.mode, make_events, first=parallel_first, **given)
    return calibrate_noise(plan.mode, make_events, **given)
