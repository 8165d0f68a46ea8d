"""The DP domain step's accounting (privacy.domain, the planner's RhoShare, account's reserved delta): the stated
epsilon is never exceeded and the thresholds' delta is covered."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from dpcda.privacy.accounting import ReleaseEvents, account
from dpcda.privacy.budget import RhoShare, Share, plan_budget
from dpcda.privacy.composition import event_from_json, event_to_json
from dpcda.privacy.domain import DomainEvent, normal_tail, split_domain, threshold_delta, value_threshold
from dpcda.privacy.marginals import calibrate
from dpcda.privacy.noise import grid_for

DELTA = 1e-5


def _event(rho=0.01, reserved=3e-6, epsilon=1.0, **counts):
    counts = {"coarse": 9, "values": 20, "fine": 9, **counts}
    return split_domain(rho, reserved_delta=reserved, epsilon=epsilon, coarse_cells=100, fine_cells=64, **counts)


def test_normal_tail_matches_mpmath():
    import mpmath

    with mpmath.workdps(50):  # never the process's precision: other tests' exact checks rely on theirs
        for z in (0.0, 1.0, 3.0, 5.5, 8.0, 12.0):
            exact = mpmath.erfc(mpmath.mpf(z) / mpmath.sqrt(2)) / 2
            assert normal_tail(z) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("std", [0.5, 7.3, 48.1, 1000.0])
@pytest.mark.parametrize("columns", [1, 20])
@pytest.mark.parametrize("delta", [1e-6, 3e-9, 1e-12])
def test_value_threshold_keeps_its_delta(std, columns, delta):
    t = value_threshold(std, delta, columns)
    assert threshold_delta(std, t, columns) <= delta
    # and it is the smallest to 1e-6 of a std: a threshold lower by that misses the delta
    assert threshold_delta(std, t - 1e-6 * std, columns) > delta * (1 - 1e-6)


def test_threshold_delta_counts_the_rounding_grid_and_every_column():
    std, t = 10.0, 60.0
    one = normal_tail((t - grid_for(std) / 2 - 1) / std)
    assert threshold_delta(std, t, 1) >= one
    assert threshold_delta(std, t, 7) == pytest.approx(7 * threshold_delta(std, t, 1))


def test_split_domain_spends_rho_and_covers_its_reserved_delta():
    for epsilon in (0.1, 1.0, 10.0, 50.0):
        ev = _event(rho=0.02, epsilon=epsilon)
        assert ev.rho == pytest.approx(0.02, rel=1e-12)
        assert ev.covers(epsilon)
        assert math.exp(epsilon) * ev.values_delta <= ev.reserved_delta
        assert not ev.covers(epsilon + 1.0)  # the reserve is for the target epsilon, not more


def test_split_domain_uses_only_the_measurements_with_columns():
    ev = _event(rho=0.01, coarse=0, fine=0)
    assert ev.coarse_std == 0 and ev.fine_std == 0
    assert ev.rho == pytest.approx(0.01)
    assert ev.values_std == pytest.approx(math.sqrt(20 / (2 * 0.01)))


def test_the_event_is_the_composition_of_its_gaussians():
    ev = _event(rho=0.03)
    acc = dp_accounting.rdp.RdpAccountant(orders=[2.0, 8.0, 32.0])
    acc.compose(ev.to_dp_event())
    for order, rdp in zip([2.0, 8.0, 32.0], acc._rdp):  # a Gaussian's Renyi divergence is alpha / (2 z^2): alpha rho
        assert rdp == pytest.approx(order * ev.rho, rel=1e-9)


def test_the_event_reads_back_from_the_manifest_json():
    ev = _event()
    assert event_from_json(event_to_json(ev)) == ev


def _plan(epsilon, share=0.3, events=None):
    def event_of(rho, reserved, eps):
        return split_domain(rho, coarse=9, values=20, fine=9, reserved_delta=reserved, epsilon=eps)

    rho = RhoShare("domain", share, event_of=event_of) if events is None else RhoShare("domain", share, event=events)
    shares = [Share("class_histogram", 0.01, 1.0, adaptive=True), rho]
    return plan_budget("poisson", epsilon=epsilon, delta=DELTA, shares=shares)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 3.0, 10.0])
def test_a_release_with_a_domain_step_never_exceeds_its_epsilon(epsilon):
    plan = _plan(epsilon)
    dom = plan.get("domain").event
    assert plan.accountant_delta == pytest.approx(DELTA * (1 - 1e-6) - 0.01 * DELTA - dom.reserved_delta)
    ev = calibrate(
        target_epsilon=plan.synthesis_epsilon,
        delta=plan.accountant_delta,
        one_way=20,
        rounds=19,
        two_way=38,
        shared=plan.shared,
        stated_delta=DELTA,
    )
    acc = account(
        ReleaseEvents("poisson", plan.shared, (ev,), plan.adaptive, gaussian_draws=dom.gaussian_draws),
        DELTA,
        relation="marginals/poisson",
        accountant="rdp",
    )
    assert acc.epsilon <= epsilon
    assert acc.epsilon >= 0.99 * epsilon  # and spends nearly all of it
    assert sum(acc.delta_breakdown.values()) <= DELTA
    assert acc.delta_breakdown["domain_thresholds"] == dom.reserved_delta
    assert "domain" in acc.components
    # the domain step takes its share of the rho the synthesis epsilon allows
    assert dom.rho / (dom.rho + ev.rho) == pytest.approx(0.3, rel=0.05)


def test_the_release_plans_the_same_split_with_the_event_given():
    first = _plan(1.0)
    again = _plan(1.0, events=first.get("domain").event)
    assert again.accountant_delta == first.accountant_delta
    assert again.synthesis_epsilon == first.synthesis_epsilon
    assert again.get("domain").event == first.get("domain").event


def test_account_refuses_a_threshold_term_its_reserve_does_not_cover():
    ev = _event(rho=0.001, reserved=3e-6, epsilon=1.0)
    events = ReleaseEvents("poisson", (ev,), ())
    account(events, DELTA, accountant="rdp", relation="marginals/poisson")  # fits at its own epsilon
    big = _event(rho=2.0, reserved=3e-6, epsilon=1.0)  # spends far more than the epsilon its threshold was set for
    with pytest.raises(Exception, match="threshold term exceeds its reserved delta"):
        account(ReleaseEvents("poisson", (big,), ()), DELTA, accountant="rdp", relation="marginals/poisson")


def test_a_domain_share_needs_a_target_epsilon():
    from dpcda.privacy.calibration import CalibrationError

    with pytest.raises(CalibrationError, match="needs a target epsilon"):
        plan_budget("poisson", epsilon=None, delta=DELTA, shares=[RhoShare("domain", 0.3, event_of=lambda *a: None)])


def test_the_thresholds_release_a_value_of_one_record_at_most_at_the_rate_the_delta_allows():
    """The noise module's rounded Gaussian on a count of 1, against the threshold: empirical rate (fixed seed) below
    the bound's (the bound is checked at a deliberately low threshold, where the rate is measurable)."""
    from dpcda.privacy.noise import NoiseStream, key_from_test_seed

    std, columns = 3.0, 1
    t = value_threshold(std, 1e-2, columns)
    draws = NoiseStream(key_from_test_seed(5), "test", "threshold").gaussian(np.ones(200_000), std)
    rate = float((draws >= t).mean())
    bound = threshold_delta(std, t, columns)
    # binomial sd of the rate: sqrt(p / n) ~ 2.2e-4; the rate stays within 5 sds of the bound (false failure < 1e-6)
    assert rate <= bound + 5 * math.sqrt(bound / 200_000)


def test_domain_event_is_a_dataclass_of_plain_numbers():
    ev = _event()
    assert isinstance(ev, DomainEvent)
    assert all(isinstance(v, (int, float, str)) for v in event_to_json(ev).values())
