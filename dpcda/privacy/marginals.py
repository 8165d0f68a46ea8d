"""The budget of the marginals mechanism (MST): a zCDP rho split in three, calibrated to a target epsilon.

Neighbouring relation: add or remove one record (all its columns, the label included); the row count is private.

MST (McKenna, Miklau, Sheldon 2021) spends rho in three equal thirds: every column's one-way marginal (Gaussian noise
on the counts), the selection of pairs of columns (``rounds`` exponential-mechanism rounds, one per pair picked), and
the picked pairs' two-way marginals (Gaussian noise). A record is one cell of each marginal, so k marginals with noise
std sigma per cell spend k / (2 sigma^2) zCDP; a round at epsilon spends epsilon^2 / 8. The events
(``privacy.events.MarginalsEvent``) are composed by dp_accounting's RDP accountant, and rho is calibrated through
``privacy.calibration.calibrate_noise`` (dp_accounting's search) so that the epsilon it reports is at most the target.
"""

from __future__ import annotations

import math

from dpcda.privacy.calibration import calibrate_noise
from dpcda.privacy.events import MarginalsEvent
from dpcda.privacy.exponential import exact_epsilon

ACCOUNTANT = "rdp"  # the selection rounds are zCDP events, which the PLD accountant does not take
SHARES = (1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)  # rho for one-way measurement, selection, two-way measurement


def split(rho: float, *, one_way: int, rounds: int, two_way: int) -> MarginalsEvent:
    """The event that spends ``rho`` (zCDP) as MST does: a third each, noise stds and the round epsilon from it.

    The round epsilon is rounded down to a multiple of 2^-30 (``exponential.exact_epsilon``: the sampler works on
    exact rationals); the event states the rounded value, so it is what is accounted."""
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be positive and finite, got {rho}")
    r1, r2, r3 = (rho * s for s in SHARES)
    eps = float(exact_epsilon(math.sqrt(8.0 * r2 / rounds))) if rounds else 0.0
    return MarginalsEvent(
        name="marginals",
        one_way=one_way,
        one_way_std=math.sqrt(one_way / (2.0 * r1)) if one_way else 0.0,
        rounds=rounds,
        round_epsilon=eps,
        two_way=two_way,
        two_way_std=math.sqrt(two_way / (2.0 * r3)) if two_way else 0.0,
    )


def calibrate(
    *,
    target_epsilon: float,
    delta: float,
    one_way: int,
    rounds: int,
    two_way: int,
    shared=(),
    stated_delta: float | None = None,
) -> MarginalsEvent:
    """The split of the largest rho whose events (composed with ``shared``) spend at most ``target_epsilon`` at
    ``delta`` (the accountant's delta), by the RDP accountant. Searched over z = 1 / sqrt(2 rho)."""
    return largest_rho(
        lambda rho: split(rho, one_way=one_way, rounds=rounds, two_way=two_way),
        target_epsilon=target_epsilon,
        delta=delta,
        shared=shared,
        stated_delta=stated_delta,
    )


def largest_rho(event_of, *, target_epsilon: float, delta: float, shared=(), stated_delta: float | None = None):
    """``event_of(rho)`` at the largest rho whose event (composed with ``shared``) spends at most ``target_epsilon`` at
    ``delta`` (the accountant's), by the RDP accountant (dp_accounting's search, ``privacy.calibration
    .calibrate_noise``, over z = 1 / sqrt(2 rho)): MST's split and AIM's cap."""

    def events(z: float) -> list:
        return [event_of(1.0 / (2.0 * z * z))]

    z = calibrate_noise(
        "poisson",
        events,
        target_epsilon=target_epsilon,
        delta=delta,
        shared=list(shared),
        stated_delta=stated_delta,
        accountant=ACCOUNTANT,
    )
    return events(z)[0]
