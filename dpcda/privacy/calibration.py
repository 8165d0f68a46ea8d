"""Calibration: from a target (epsilon, delta) to noise, as pure searches through dp_accounting.

Relations as in ``privacy.accounting``: replace-one within class for ``fixed``, add/remove-one for
``poisson``. Every search returns a noise level whose epsilon is at most the target, never over.
"""

from __future__ import annotations

import math
from typing import Sequence

import dp_accounting

from dpcda.privacy.accounting import ACCOUNTANT_BY_MODE, check_pld_delta, epsilon_of, make_accountant
from dpcda.privacy.errors import DpcdaError
from dpcda.privacy.events import Event, GaussianStatsEvent, MixingEvent, Mode

# Searches run over log(noise) so the tolerance is relative: 1e-3 -> sigma within 0.1 % of optimal.
LOG_TOL = 1e-3
LOG_BRACKET = (math.log(1e-5), math.log(1e5))


class CalibrationError(DpcdaError, ValueError):
    """The target cannot be met (e.g. the shared events alone exceed it)."""


def _search(
    mode: Mode,
    make_event,
    target_epsilon: float,
    delta: float,
    stated: float | None = None,
    accountant: str | None = None,
) -> float:
    """Smallest exp(x) with epsilon(make_event(exp(x))) <= target, within LOG_TOL in x.

    Two stages, both through ``dp_accounting.calibrate_dp_mechanism``: a coarse RDP search (fewer
    orders, so its epsilon is never below the final accountant's) gives a feasible upper end; the
    mode's own accountant then searches just below it.
    """
    final = accountant or ACCOUNTANT_BY_MODE[mode]
    if final == "pld":
        check_pld_delta(delta, make_event(1.0), stated=stated)
    lo, hi = LOG_BRACKET
    ceiling = epsilon_of(mode, make_event(math.exp(hi)), delta, accountant="rdp-coarse")
    if ceiling > target_epsilon:
        raise CalibrationError(
            f"epsilon={target_epsilon} cannot be reached even with noise {math.exp(hi):.3g} "
            f"(epsilon {ceiling:.4g}); raise epsilon or lower the other components' share"
        )

    def run(accountant: str, lo: float, hi: float, tol: float) -> float:
        def dp_event(x: float) -> dp_accounting.DpEvent:
            return dp_accounting.ComposedDpEvent([e.to_dp_event() for e in make_event(math.exp(x))])

        return dp_accounting.calibrate_dp_mechanism(
            lambda: make_accountant(mode, accountant),
            dp_event,
            target_epsilon,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
            tol=tol,
        )

    upper = run("rdp-coarse", lo, hi, 1e-2)
    # The mode's accountant is tighter than coarse RDP, usually by less than 1.5x in sigma; where it is tighter
    # still (small epsilon, tiny classes), the bracket steps down until its lower end misses the target.
    lower = upper - math.log(1.5)
    for _ in range(6):
        try:
            return math.exp(run(final, lower, upper, LOG_TOL))
        except ValueError:  # no sign change: the lower end already meets the target
            if epsilon_of(mode, make_event(math.exp(lower)), delta, final) > target_epsilon:
                raise
            upper, lower = lower, lower - math.log(1.5)
    return math.exp(upper)  # feasible (checked above): conservative by at most 1.5x


def calibrate_gaussian(
    mode: Mode, *, name: str, sensitivity: float, target_epsilon: float, delta: float
) -> GaussianStatsEvent:
    """A Gaussian stats release spending ``target_epsilon`` alone.

    ``sensitivity`` is already the one the mode's relation implies, so the Gaussian's privacy loss is that of a shift
    by one noise multiplier in either mode (``calibrate_alone``).
    """
    z = calibrate_alone(
        lambda z: GaussianStatsEvent(name, z * sensitivity, sensitivity),
        name=name,
        target_epsilon=target_epsilon,
        delta=delta,
    )
    return GaussianStatsEvent(name, z * sensitivity, sensitivity)


def calibrate_alone(make_event, *, name: str, target_epsilon: float, delta: float) -> float:
    """Smallest noise multiplier z (within LOG_TOL) such that ``make_event(z)`` alone spends ``target_epsilon``.

    For events whose privacy loss is a Gaussian shift in either relation (statistics with the relation's own
    sensitivity, DP-EM's iterations). Searched with the PLD accountant, exact for Gaussians: RDP over a finite list
    of orders has an epsilon floor near log(1/delta) / max order, which would make small shares unreachable;
    dp_accounting's PLD ``REPLACE_ONE`` would double the shift again, so the add/remove PLD is used.
    """

    def relation_acc():
        return make_accountant("poisson", "pld")

    def event(x: float) -> dp_accounting.DpEvent:
        return make_event(math.exp(x)).to_dp_event()

    def eps_at(x: float) -> float:
        return relation_acc().compose(event(x)).get_epsilon(delta)

    if not delta >= ALONE_MIN_DELTA:
        raise CalibrationError(
            f"{name}: its share of delta, {delta:.6g}, is below {ALONE_MIN_DELTA:g}, where the PLD of a lone Gaussian "
            f"drops tail mass of that order and calls for many times the noise; raise delta"
        )
    lo, hi = _alone_bracket(eps_at, target_epsilon, name)
    if lo is None:
        return math.exp(hi)  # the floor of the range already meets the target
    return math.exp(
        dp_accounting.calibrate_dp_mechanism(
            relation_acc,
            event,
            target_epsilon,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
            tol=LOG_TOL,
        )
    )


# calibrate_alone searches z in [0.05, 1e6]. A PLD's size grows with its range of privacy losses, which is wide at
# small z (a Gaussian at z = 0.05 takes about a second to discretize, at z = 1 a twentieth of that), so the bracket
# is found by steps of 4x from z = 1 and the search only evaluates small z when the answer is there.
ALONE_RANGE = (math.log(0.05), math.log(1e6))
# A lone Gaussian's PLD matches the exact (analytic) Gaussian curve to 0.1 % in z down to delta 1e-14; near 1e-15 its
# truncated tails reach delta and at 3e-16 it asks for 40x the noise (tests/test_privacy.py measures both), so a share
# below 1e-14 is refused rather than silently drowned.
ALONE_MIN_DELTA = 1e-14
ALONE_START, ALONE_STEP = 0.0, math.log(4.0)


def _alone_bracket(eps_at, target_epsilon: float, name: str) -> tuple[float | None, float]:
    """(lo, hi) in log z with eps_at(lo) > target >= eps_at(hi), epsilon decreasing in z; (None, floor) when the
    floor of the range already meets the target. Refuses a target that z = 1e6 cannot meet."""
    if math.isnan(target_epsilon) or target_epsilon <= 0:
        raise CalibrationError(f"{name}: epsilon share must be positive, got {target_epsilon}")
    floor, ceiling = ALONE_RANGE
    x = ALONE_START
    if not eps_at(x) <= target_epsilon:  # written so that a NaN epsilon counts as over the target
        while True:  # upwards, to the first feasible point
            nxt = min(x + ALONE_STEP, ceiling)
            if eps_at(nxt) <= target_epsilon:
                return x, nxt
            if nxt >= ceiling:
                raise CalibrationError(
                    f"{name}: epsilon share {target_epsilon:.3g} cannot be reached even with noise "
                    f"multiplier {math.exp(ceiling):.3g}; raise epsilon or the share"
                )
            x = nxt
    while True:  # downwards, to the first infeasible point
        nxt = max(x - ALONE_STEP, floor)
        if not eps_at(nxt) <= target_epsilon:
            return nxt, x
        if nxt <= floor:
            return None, floor
        x = nxt


def calibrate_noise(
    mode: Mode,
    make_events,
    *,
    target_epsilon: float,
    delta: float,
    shared: Sequence[Event] = (),
    scale: float = 1.0,
    stated_delta: float | None = None,
    accountant: str | None = None,
) -> float:
    """Smallest s * ``scale`` such that ``[*shared, *make_events(s * scale)]`` spends at most ``target_epsilon``.

    Mechanism-agnostic: ``make_events(sigma)`` returns the mechanism's events at noise ``sigma``. ``delta`` is the
    accountant's; ``stated_delta``, the release's (of which ``delta`` is a share), only words a refusal.
    ``accountant``: the one the release is accounted with, where it is not the mode's ('rdp' for zCDP events).
    """
    if target_epsilon is None or target_epsilon <= 0 or not math.isfinite(target_epsilon):
        raise CalibrationError(f"epsilon must be a positive finite number, got {target_epsilon}")
    if shared and epsilon_of(mode, shared, delta, accountant) >= target_epsilon:
        raise CalibrationError(
            f"the statistics releases alone spend epsilon {epsilon_of(mode, shared, delta, accountant):.4g} "
            f">= target {target_epsilon}; lower their budget share"
        )
    return (
        _search(mode, lambda s: [*shared, *make_events(s * scale)], target_epsilon, delta, stated_delta, accountant)
        * scale
    )


def calibrate_parallel(
    mode: Mode,
    make_groups,
    *,
    target_epsilon: float,
    delta: float,
    shared: Sequence[Event] = (),
    scale: float = 1.0,
    stated_delta: float | None = None,
    first=None,
) -> float:
    """Smallest s * ``scale`` such that, for EVERY group g, ``[*shared, make_groups(s * scale)[g]]`` spends at most
    ``target_epsilon``: groups compose in parallel (a record is in one group only), so the release's epsilon is the
    largest over groups (``privacy.accounting.account``).

    No group is assumed to be the worst. Groups are visited in the order of ``first`` (a key on a group's event,
    e.g. its class size: the likely worst first); a group whose epsilon at the current noise is already within the
    target keeps it, any other is calibrated alone (``calibrate_noise``), which raises the noise. Epsilon falls as the
    noise rises, so the last noise found meets every group visited before it: the result is the largest of the
    groups' own calibrations, and every group is checked against it. Identical groups are visited once, and a group
    that releases nothing (a class with no rows) not at all.
    """
    at_scale = list(make_groups(scale))
    seen, order = set(), []
    for g in sorted(range(len(at_scale)), key=(lambda g: first(at_scale[g])) if first is not None else None):
        if isinstance(at_scale[g].to_dp_event(), dp_accounting.NoOpDpEvent):
            continue  # a group that releases nothing (no rows) needs no noise
        if at_scale[g] not in seen:
            seen.add(at_scale[g])
            order.append(g)
    sigma = None
    for g in order:

        def one(s: float, g: int = g) -> list:
            return [make_groups(s)[g]]

        if sigma is not None and epsilon_of(mode, [*shared, *one(sigma)], delta) <= target_epsilon:
            continue
        sigma = calibrate_noise(
            mode,
            one,
            target_epsilon=target_epsilon,
            delta=delta,
            shared=shared,
            scale=scale,
            stated_delta=stated_delta,
        )
    if sigma is None:
        raise CalibrationError("calibration needs at least one group of events")
    # the groups kept on the way are checked again at the noise returned (the argument above, verified)
    late = [g for g in order if epsilon_of(mode, [*shared, make_groups(sigma)[g]], delta) > target_epsilon]
    if late:
        raise CalibrationError(f"calibration: group {late[0]} spends more than the target at the noise found")
    return sigma


def calibrate_sigma_x(
    mode: Mode,
    *,
    class_sizes: Sequence[int],
    samples_per_class: int,
    mixing_order: int,
    clip: float,
    target_epsilon: float,
    delta: float,
    shared: Sequence[Event] = (),
    stated_delta: float | None = None,
) -> float:
    """Smallest sigma_x such that every class's (shared ∘ mixing) epsilon is <= the target.

    Parallel composition over classes: the most demanding class sets sigma_x. With T_k equal across classes that
    is the smallest one (epsilon falls as N_k rises, a tested property); ``account`` re-checks every class.
    """
    if target_epsilon <= 0 or not math.isfinite(target_epsilon):
        raise CalibrationError(f"epsilon must be a positive finite number, got {target_epsilon}")
    if shared and epsilon_of(mode, shared, delta) >= target_epsilon:
        raise CalibrationError(
            f"the statistics releases alone spend epsilon {epsilon_of(mode, shared, delta):.4g} "
            f">= target {target_epsilon}; lower their budget share"
        )
    size = min(int(n) for n in class_sizes)

    def make(s_over_c: float):
        return [*shared, MixingEvent(mode, size, samples_per_class, mixing_order, clip, s_over_c * clip)]

    sigma = _search(mode, make, target_epsilon, delta, stated_delta) * clip
    return sigma
