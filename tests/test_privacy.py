"""Pure unit tests of privacy/: accounting, calibration, DP statistics, noise keys, Theorem 1."""

from __future__ import annotations

import json
import math
import pickle

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpcda.evaluation.paper import theorem1_epsilon
from dpcda.mechanisms.combiners import FirstPassCombiner
from dpcda.privacy import dp_stats
from dpcda.privacy.accounting import (
    PLD_DISCRETIZATION,
    PLD_ROUNDOFF_SHARE,
    RDP_ORDERS,
    SAMPLER_DELTA_SHARE,
    AccountingError,
    ReleaseEvents,
    account,
    epsilon_of,
)
from dpcda.privacy.calibration import CalibrationError, calibrate_alone, calibrate_gaussian, calibrate_sigma_x
from dpcda.privacy.events import GaussianStatsEvent, MixingEvent
from dpcda.privacy.noise import NoiseStream, fresh_key, key_from_test_seed

DELTA = 1e-5


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    eps=st.floats(0.5, 50), l=st.integers(1, 512), n=st.integers(10, 10**6), mode=st.sampled_from(["fixed", "poisson"])
)
def test_calibrated_sigma_never_overshoots(eps, l, n, mode):
    if mode == "fixed" and l > n:
        l = n
    samples = min(n, 2000)
    sigma = calibrate_sigma_x(
        mode, class_sizes=[n], samples_per_class=samples, mixing_order=l, clip=1.0, target_epsilon=eps, delta=DELTA
    )
    got = epsilon_of(mode, [MixingEvent(mode, n, samples, l, 1.0, sigma)], DELTA)
    assert got <= eps
    # ... and is close: 1 % less noise overshoots (the search tolerance is 0.1 % in sigma)
    assert epsilon_of(mode, [MixingEvent(mode, n, samples, l, 1.0, sigma * 0.99)], DELTA) > eps * 0.999


def test_epsilon_equals_direct_dp_accounting_fixed():
    ev = MixingEvent("fixed", 6000, 6000, 4, 1.0, 0.3)
    acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(6000, 4, dp_accounting.GaussianDpEvent(0.3 * 4 / 2)), 6000
        )
    )
    ours = account(ReleaseEvents("fixed", (), (ev,)), DELTA)
    # the accountant's delta is the target less the sampler's reserved share (1e-6 of it)
    assert ours.epsilon == pytest.approx(acc.get_epsilon(DELTA * (1 - SAMPLER_DELTA_SHARE)), rel=1e-12)
    assert ours.accountant == "rdp"


def test_epsilon_equals_direct_dp_accounting_poisson_with_shared_events():
    stats = GaussianStatsEvent("normalization", noise_std=50.0, sensitivity=10.0)
    hist = GaussianStatsEvent("class_histogram", noise_std=20.0, sensitivity=1.0)
    evs = (MixingEvent("poisson", 5000, 5000, 8, 2.0, 0.1), MixingEvent("poisson", 7000, 5000, 8, 2.0, 0.1))
    acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    # the smaller class (higher q) is the worst: parallel composition takes the max
    acc.compose(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.GaussianDpEvent(5.0),
                dp_accounting.GaussianDpEvent(20.0),
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(8 / 5000, dp_accounting.GaussianDpEvent(0.1 * 8 / 2.0)), 5000
                ),
            ]
        )
    )
    ours = account(ReleaseEvents("poisson", (stats, hist), evs), DELTA)
    # the PLD's epsilon is read at its delta less the share reserved for the FFT's round-off
    reserved = DELTA * (1 - SAMPLER_DELTA_SHARE) * (1 - PLD_ROUNDOFF_SHARE)
    assert ours.epsilon == pytest.approx(acc.get_epsilon(reserved), rel=1e-9)
    assert ours.epsilon > acc.get_epsilon(DELTA * (1 - SAMPLER_DELTA_SHARE))  # the reserve is spent, not skipped
    assert ours.worst_class_event == evs[0]
    assert set(ours.components) == {"normalization", "class_histogram", "mixing"}
    assert ours.cross_check["rdp"] >= ours.epsilon * 0.95  # RDP is looser than PLD, never far tighter


def test_adaptive_histogram_is_accounted_alone_and_added():
    """Poisson mode: the histogram at its own (eps, delta) share, plus the rest at the remaining delta."""
    hist = GaussianStatsEvent("class_histogram", noise_std=40.0, sensitivity=1.0)
    mix = MixingEvent("poisson", 5000, 5000, 8, 1.0, 0.1)
    hist_delta = 0.01 * DELTA
    ours = account(
        ReleaseEvents("poisson", (), (mix,), ((hist, hist_delta),), gaussian_draws=10**8, binomial_draws=10**5), DELTA
    )
    alone = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    alone.compose(dp_accounting.GaussianDpEvent(40.0))
    rest = account(ReleaseEvents("poisson", (), (mix,)), DELTA - hist_delta / (1 - SAMPLER_DELTA_SHARE))
    hist_eps = alone.get_epsilon(hist_delta * (1 - PLD_ROUNDOFF_SHARE))
    assert ours.components["class_histogram"] == pytest.approx(hist_eps, rel=1e-12)
    assert ours.epsilon == pytest.approx(hist_eps + rest.epsilon, rel=1e-9)
    parts = ours.delta_breakdown
    assert set(parts) == {"accountant", "pld_roundoff", "class_histogram", "sampler"}
    assert sum(parts.values()) <= DELTA and 0 < parts["sampler"] < 1e-20
    # the PLD read the accountant's and the histogram's epsilons below their deltas: the rest is the round-off's share
    assert parts["class_histogram"] == pytest.approx(hist_delta * (1 - PLD_ROUNDOFF_SHARE), rel=1e-12)
    assert parts["pld_roundoff"] == pytest.approx(
        PLD_ROUNDOFF_SHARE / (1 - PLD_ROUNDOFF_SHARE) * (parts["accountant"] + parts["class_histogram"]), rel=1e-12
    )


def test_sampler_delta_that_does_not_fit_is_refused():
    loud = GaussianStatsEvent("normalization", noise_std=0.25, sensitivity=1.0)  # epsilon about 24
    assert account(ReleaseEvents("poisson", (loud,), (), gaussian_draws=10**12), DELTA).epsilon > 20
    louder = GaussianStatsEvent("normalization", noise_std=0.08, sensitivity=1.0)  # epsilon about 130
    with pytest.raises(AccountingError, match="sampler"):
        account(ReleaseEvents("poisson", (louder,), (), gaussian_draws=10**6), DELTA)


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_epsilon_falls_as_sigma_and_class_size_rise(mode):
    eps_sigma = [epsilon_of(mode, [MixingEvent(mode, 2000, 2000, 4, 1.0, s)], DELTA) for s in (0.1, 0.2, 0.4, 0.8)]
    assert all(a > b for a, b in zip(eps_sigma, eps_sigma[1:]))
    eps_n = [epsilon_of(mode, [MixingEvent(mode, n, 2000, 4, 1.0, 0.2)], DELTA) for n in (500, 2000, 8000, 32000)]
    assert all(a > b for a, b in zip(eps_n, eps_n[1:]))


def test_no_noise_is_infinite_and_unreachable_target_is_refused():
    assert math.isinf(epsilon_of("fixed", [MixingEvent("fixed", 100, 100, 4, 1.0, 0.0)], DELTA))
    big = GaussianStatsEvent("normalization", noise_std=0.01, sensitivity=1.0)
    with pytest.raises(CalibrationError, match="statistics releases alone"):
        calibrate_sigma_x(
            "fixed",
            class_sizes=[100],
            samples_per_class=100,
            mixing_order=4,
            clip=1.0,
            target_epsilon=1.0,
            delta=DELTA,
            shared=[big],
        )


def test_calibrate_gaussian_spends_its_share():
    ev = calibrate_gaussian("fixed", name="normalization", sensitivity=3.0, target_epsilon=0.5, delta=DELTA)
    # calibrated exactly (PLD); the RDP view used to compose it with the mixing is a little looser, never tighter
    assert 0.5 <= epsilon_of("fixed", [ev], DELTA) < 0.5 * 1.3
    assert ev.noise_std / ev.sensitivity == pytest.approx(ev.noise_multiplier)


def test_feature_stats_noise_free_match_numpy_and_constant_features_are_floored():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (500, 6))
    x[:, 0] = 0.0  # a constant feature: std 0
    comb = FirstPassCombiner((0.0, 1.0))
    acc = comb.add(comb.create(), x.astype(np.float32), np.zeros(500, np.int64))
    mean, std = dp_stats.feature_stats(n=500, sum_qu=acc.sum_qu, sum_qv=acc.sum_qv, bounds=(0.0, 1.0), min_std=0.01)
    np.testing.assert_allclose(mean, x.mean(0), atol=2**-16)  # the sums' resolution
    np.testing.assert_allclose(std[1:], x.std(0)[1:], atol=2**-14)
    assert std[0] == pytest.approx(0.01, abs=2**-19)  # floored, then on the public grid
    assert np.all(np.isfinite((x - mean) / std))


def test_feature_stats_noise_is_centered_and_scaled():
    sums = np.zeros(2000, np.int64)
    m1, _ = dp_stats.feature_stats(
        n=10_000,
        sum_qu=sums,
        sum_qv=sums - 5000 * 2**16,
        bounds=(-1.0, 1.0),
        min_std=1e-3,
        noise_std=100.0,
        stream=NoiseStream(key_from_test_seed(1), "stats"),
    )
    # mean_u = noise / n: std 0.01; KS-free check on moments (false-failure rate < 1e-6)
    assert abs(m1.mean()) < 0.01 * 6 / math.sqrt(2000)
    assert m1.std() == pytest.approx(0.01, rel=0.1)


def test_sensitivities_follow_the_relation():
    assert dp_stats.moments_sensitivity(8, "poisson") == pytest.approx(4.0)
    assert dp_stats.moments_sensitivity(8, "fixed") == pytest.approx(8.0)
    assert MixingEvent("fixed", 10, 1, 4, 2.0, 1.0).noise_multiplier == pytest.approx(1.0)
    assert MixingEvent("poisson", 10, 1, 4, 2.0, 1.0).noise_multiplier == pytest.approx(2.0)


def test_first_pass_sums_are_exact_on_random_splits_and_pickle():
    """Integer sums: any split of the input, in any order, pickled or not, gives bit-identical accumulators."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-0.2, 1.2, (1000, 5)).astype(np.float32)  # some values outside the bounds: clipped
    y = rng.integers(0, 3, 1000)
    comb = FirstPassCombiner((0.0, 1.0))
    whole = comb.add(comb.create(), x, y)
    cuts = np.sort(rng.choice(np.arange(1, 1000), 7, replace=False))
    parts = [comb.add(comb.create(), a, b) for a, b in zip(np.split(x, cuts), np.split(y, cuts))]
    merged = comb.merge(pickle.loads(pickle.dumps(p)) for p in reversed(parts))
    np.testing.assert_array_equal(merged.sum_qu, whole.sum_qu)
    np.testing.assert_array_equal(merged.sum_qv, whole.sum_qv)
    np.testing.assert_array_equal(merged.class_counts, np.bincount(y))
    u = np.clip(x.astype(np.float64), 0, 1) * 2 - 1
    np.testing.assert_allclose(merged.sum_qu * 2.0**-16, u.sum(0), atol=1000 * 2**-17)
    assert merged.count == 1000 and merged.dim == 5


def test_noise_keys_are_fresh_and_streams_keyed_by_path():
    assert fresh_key() != fresh_key()
    k = key_from_test_seed(7)
    assert k == key_from_test_seed(7) and k != key_from_test_seed(8)
    a = NoiseStream(k, "stats").gaussian(np.zeros(4), 1.0)
    np.testing.assert_array_equal(a, NoiseStream(k, "stats").gaussian(np.zeros(4), 1.0))
    assert not np.array_equal(a, NoiseStream(k, "histogram").gaussian(np.zeros(4), 1.0))


def test_paper_theorem1_as_written():
    kw = dict(mixing_order=4, clip=1.0, num_records=60000, num_samples=60000, delta=DELTA)
    assert math.isinf(theorem1_epsilon(sigma_x=1.0, sigma_y=0.0, **kw))
    e = [theorem1_epsilon(sigma_x=s, sigma_y=s, **kw) for s in (0.5, 1.0, 2.0)]
    assert e[0] > e[1] > e[2] > 0
    assert theorem1_epsilon(sigma_x=1.0, sigma_y=1.0, **{**kw, "num_samples": 120000}) > e[1]


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_calibration_over_unequal_classes_covers_every_class(mode):
    sizes = [900, 400, 2500]
    sigma = calibrate_sigma_x(
        mode, class_sizes=sizes, samples_per_class=500, mixing_order=4, clip=1.0, target_epsilon=6.0, delta=DELTA
    )
    events = tuple(MixingEvent(mode, n, 500, 4, 1.0, sigma) for n in sizes)
    acc = account(ReleaseEvents(mode, (), events), DELTA)
    assert acc.epsilon <= 6.0 and acc.worst_class_event.class_size == 400
    assert all(epsilon_of(mode, [e], DELTA) <= 6.0 for e in events)


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
@pytest.mark.parametrize("target", [0.02, 0.1, 0.5, 3.0])
def test_calibrate_gaussian_small_shares_are_reached_not_floored(mode, target):
    """A lone Gaussian has no epsilon floor: a 1 % share of a small budget must get noise, not 'infinite' noise."""
    ev = calibrate_gaussian(mode, name="class_histogram", sensitivity=1.0, target_epsilon=target, delta=DELTA)
    acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)  # shift of one noise multiplier
    got = acc.compose(ev.to_dp_event()).get_epsilon(DELTA)
    assert target * 0.98 <= got <= target
    assert ev.noise_multiplier < 1000  # e.g. 0.1 of epsilon needs z ~ 45, never ~ 6e4


@pytest.mark.parametrize(
    "target, k",
    # (250, 1): the answer lies between the floor z = 0.05 and the first step below it; (400, 1): the floor meets it
    [(0.001, 1), (0.3, 1), (4.0, 1), pytest.param(250.0, 1, marks=pytest.mark.slow), (400.0, 1), (2.0, 20)],
)
def test_calibrate_alone_finds_the_optimum_of_the_whole_range(target, k):
    """The stepped bracket is a speed-up only: the answer is still the smallest z in [0.05, 1e6] that meets the
    target (within the search tolerance), never over it, for one Gaussian or k iterations of one."""

    def make(z):
        return _SelfComposed(GaussianStatsEvent("em", z, 1.0), k)

    z = calibrate_alone(make, name="em", target_epsilon=target, delta=DELTA)

    def acc():
        return pld.PLDAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            value_discretization_interval=PLD_DISCRETIZATION,
        )

    def eps(z):
        return acc().compose(make(z).to_dp_event()).get_epsilon(DELTA)

    assert eps(z) <= target
    if z == pytest.approx(0.05):  # the floor of the range
        assert target == 400.0
    else:  # the smallest feasible z within the search tolerance (epsilon falls as z grows)
        assert eps(z * math.exp(-2e-3)) > target


class _SelfComposed:
    def __init__(self, ev, k):
        self.ev, self.k = ev, k

    def to_dp_event(self):
        return dp_accounting.SelfComposedDpEvent(self.ev.to_dp_event(), self.k)


def test_calibrate_alone_refuses_a_share_no_noise_can_meet():
    with pytest.raises(CalibrationError, match="cannot be reached even with noise multiplier 1e"):
        calibrate_alone(lambda z: GaussianStatsEvent("x", z, 1.0), name="x", target_epsilon=1e-9, delta=1e-12)
    for bad in (float("nan"), 0.0, -1.0):  # never the floor's little noise for a share that is not a number
        with pytest.raises(CalibrationError, match="must be positive"):
            calibrate_alone(lambda z: GaussianStatsEvent("x", z, 1.0), name="x", target_epsilon=bad, delta=1e-5)


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_moments_vector_sensitivity_holds_for_worst_case_records(mode):
    """The noised vector moves by at most moments_sensitivity when one record is added/removed or replaced."""
    rng = np.random.default_rng(5)
    d = 6
    u = rng.uniform(-1, 1, (50, d))
    extremes = [np.ones(d), -np.ones(d), np.zeros(d), rng.uniform(-1, 1, d)]

    def vec(rows):
        qu, qv = dp_stats.quantized_contributions(rows)
        return dp_stats.moments_vector(qu.sum(0), qv.sum(0))

    bound = dp_stats.moments_sensitivity(d, mode) + 1e-9
    for a in extremes:
        if mode == "poisson":  # add one record (its count too)
            assert np.linalg.norm(vec(np.vstack([u, a])) - vec(u)) <= bound
        else:  # replace one record's features
            for b in extremes:
                assert np.linalg.norm(vec(np.vstack([u, a])) - vec(np.vstack([u, b]))) <= bound
    # tight: adding an all-ones record moves the vector by exactly sqrt(2d)
    assert np.linalg.norm(vec(np.vstack([u, np.ones(d)])) - vec(u)) == pytest.approx(np.sqrt(2 * d))


def test_dpmix_event_combines_features_and_labels_as_dp_accounting_would():
    """z = l / sqrt(4c^2/sigma_x^2 + 2/sigma_y^2) under replace-one; an independent dp_accounting run agrees."""
    from dpcda.privacy.events import DpmixEvent

    ev = DpmixEvent("fixed", 60000, 60000, 16, 1.0, 0.07, 0.05)
    z = 16 / math.sqrt(4 / 0.07**2 + 2 / 0.05**2)
    assert ev.noise_multiplier == pytest.approx(z)
    acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(
        dp_accounting.SelfComposedDpEvent(
            dp_accounting.SampledWithoutReplacementDpEvent(60000, 16, dp_accounting.GaussianDpEvent(z)), 60000
        )
    )
    ours = account(ReleaseEvents("fixed", (), (ev,)), DELTA)
    assert ours.epsilon == pytest.approx(acc.get_epsilon(DELTA * (1 - SAMPLER_DELTA_SHARE)), rel=1e-12)
    p = DpmixEvent("poisson", 60000, 60000, 16, 1.0, 0.07, 0.05)
    assert p.noise_multiplier == pytest.approx(16 / math.sqrt(1 / 0.07**2 + 1 / 0.05**2))


def test_account_cli_for_dpmix_prints_both_sigmas_and_is_tight():
    import json
    import subprocess
    import sys

    from dpcda.privacy.events import DpmixEvent
    from tests.conftest import ROOT

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "dpcda.pipeline.cli",
            "account",
            "--mechanism",
            "dpmix",
            "--class-size",
            "60000",
            "--samples-per-class",
            "60000",
            "--mixing-order",
            "16",
            "--clip",
            "1",
            "--epsilon",
            "10",
            "--delta",
            "1e-5",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["sigma_y"] == pytest.approx(r["sigma_x"])  # the default label noise ratio is 1
    ev = DpmixEvent("fixed", 60000, 60000, 16, 1.0, r["sigma_x"], r["sigma_y"])
    acc = rdp.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(ev.to_dp_event())
    independent = acc.get_epsilon(DELTA)
    assert 0.95 * 10 <= independent <= 10  # <= E and not more than 5 % loose


def test_risk_figures_match_the_attacker_inequalities():
    from dpcda.privacy.risk import equal_error_rate_floor, fn_floor, max_advantage

    assert round(equal_error_rate_floor(1.0, 1e-5), 4) == 0.2689
    for eps, delta in [(0.0, 0.0), (0.5, 1e-5), (1.0, 1e-5), (10.0, 1e-5)]:
        fp = np.linspace(0, 1, 10001)
        fn = fn_floor(eps, delta, fp)
        e = np.exp(eps)
        # the floor satisfies both inequalities (Kairouz et al.) and touches one of them wherever it is positive
        assert np.all(fp + e * fn >= 1 - delta - 1e-12) and np.all(fn + e * fp >= 1 - delta - 1e-12)
        assert np.all((fn == 0) | np.isclose(fp + e * fn, 1 - delta) | np.isclose(fn + e * fp, 1 - delta))
        eer = fp[np.argmin(np.abs(fp - fn))]
        assert abs(eer - equal_error_rate_floor(eps, delta)) < 1e-3
        assert abs((1 - fn - fp).max() - max_advantage(eps, delta)) < 1e-3
    assert max_advantage(0.0, 0.0) == 0.0 and equal_error_rate_floor(0.0, 0.0) == 0.5


def test_risk_cli_prints_the_floor(tmp_path):
    from tests.conftest import run_cli

    res = run_cli("risk", "--epsilon", 1, "--delta", 1e-5, "--json", "--plot", tmp_path / "r.png")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert f"{out['equal_error_rate_floor']:.4f}" == "0.2689" and (tmp_path / "r.png").stat().st_size > 1000
    res = run_cli("risk", "--epsilon", "-1")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("dpcda: error: epsilon")


def test_risk_figures_survive_a_large_finite_epsilon_and_name_the_relation():
    from dpcda.privacy.risk import fn_floor, risk_figures

    for eps in (709.0, 710.0, 1e4):
        fig = risk_figures(eps, 1e-5)
        assert fig["equal_error_rate_floor"] >= 0 and fig["max_advantage"] <= 1
        assert np.all(np.isfinite(fn_floor(eps, 1e-5, np.linspace(0, 1, 11))))
    assert "membership" in risk_figures(1.0, 1e-5, "add or remove one record (features and label)")["basis"]
    replace = risk_figures(1.0, 1e-5, "replace one record's features within the same class; class sizes are public")
    assert "NOT whether a record was in the input" in replace["basis"]


def test_the_pld_accountant_refuses_a_delta_below_its_float64_resolution():
    """Below about 1e-10 the PLD's epsilon is FFT round-off (at 1e-13 the calibration used to end in brentq's
    ValueError); a poisson calibration or account below PLD_MIN_DELTA is refused in one line, fixed mode's RDP is not
    limited."""
    from dpcda.privacy.accounting import PLD_MIN_DELTA, AccountingError

    kw = dict(class_sizes=[6000], samples_per_class=6000, mixing_order=4, clip=1.0, target_epsilon=4.0)
    for delta in (1e-13, PLD_MIN_DELTA * 0.99):
        with pytest.raises(AccountingError, match="below 1e-08"):
            calibrate_sigma_x("poisson", delta=delta, **kw)
    with pytest.raises(AccountingError, match=r"delta: 1e-10 is below 1\.02e-08"):  # the release's delta, stated
        account(ReleaseEvents("poisson", (), (MixingEvent("poisson", 6000, 6000, 4, 1.0, 0.3),)), 1e-10)
    # the floor grows with the number of composed mechanisms (the FFT's round-off does): 2e-13 per composition
    with pytest.raises(AccountingError, match=r"below 1\.2e-07, the least .* for 600000 composed"):
        calibrate_sigma_x("poisson", delta=1e-7, **{**kw, "samples_per_class": 600_000})
    # no PLD number is claimed for a release without noise: nothing to refuse
    free = account(ReleaseEvents("poisson", (), (MixingEvent("poisson", 6000, 6000, 4, 1.0, 0.0),)), 1e-12)
    assert free.epsilon == math.inf
    sigma = calibrate_sigma_x("fixed", delta=1e-13, **kw)
    assert epsilon_of("fixed", [MixingEvent("fixed", 6000, 6000, 4, 1.0, sigma)], 1e-13) <= 4.0


def test_a_lone_gaussian_share_is_exact_to_1e_14_and_refused_below():
    """The PLD of one Gaussian matches the analytic curve (dp_accounting's GaussianPrivacyLoss) down to 1e-14; at
    3e-16 its truncated tails reach delta and it would ask for tens of times the noise: such a share is refused."""
    from dp_accounting.pld import common
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    def exact(delta):
        params = common.DifferentialPrivacyParameters(1.0, delta)
        return GaussianPrivacyLoss.from_privacy_guarantee(params, sensitivity=1.0).standard_deviation

    ev = calibrate_gaussian("fixed", name="normalization", sensitivity=1.0, target_epsilon=1.0, delta=1e-14)
    assert 1.0 <= ev.noise_multiplier / exact(1e-14) < 1.002
    acc = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    assert acc.compose(GaussianStatsEvent("x", 2 * exact(3e-16), 1.0).to_dp_event()).get_epsilon(3e-16) > 1.0
    with pytest.raises(CalibrationError, match=r"normalization: its share of delta, 3e-16, is below 1e-14"):
        calibrate_gaussian("fixed", name="normalization", sensitivity=1.0, target_epsilon=1.0, delta=3e-16)


def test_the_pld_accountant_sets_its_round_off_share_aside_both_ways():
    """make_accountant's PLD reads epsilon at delta (1 - PLD_ROUNDOFF_SHARE), and its get_delta is the inverse."""
    from dpcda.privacy.accounting import make_accountant

    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 400
    )
    ours = make_accountant("poisson").compose(event)
    raw = pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION).compose(event)
    assert ours.get_epsilon(1e-6) == raw.get_epsilon(1e-6 * (1 - PLD_ROUNDOFF_SHARE)) > raw.get_epsilon(1e-6)
    assert ours.get_delta(2.0) == pytest.approx(raw.get_delta(2.0) / (1 - PLD_ROUNDOFF_SHARE), rel=1e-15)


def test_the_projection_gain_bounds_the_spectral_norm_with_the_same_bits_on_every_cpu():
    """``projection_gain``: at least the exact ||R||_2 (50-digit SVD of small projections), at most 2^-19 above
    LAPACK's estimate, 20 significant bits; the two CPUs' estimates of the golden projection (one ulp apart) give one
    gain; nothing but a finite positive norm is taken."""
    import mpmath

    from dpcda.mechanisms.base import PlanError
    from dpcda.mechanisms.randproj import projection_matrix
    from dpcda.privacy.events import GAIN_BITS, SVD_ALLOWANCE, projection_gain

    for d, p, seed in [(12, 3, 0), (20, 8, 1), (9, 9, 2), (30, 1, 3)]:
        R = projection_matrix(d, p, seed)
        s = float(np.linalg.norm(R, 2))
        gain = projection_gain(s)
        with mpmath.workdps(50):
            exact = max(mpmath.svd_r(mpmath.matrix(R.tolist()), compute_uv=False))
            assert mpmath.mpf(gain) >= exact * (1 + mpmath.mpf(2) ** -31)
        assert s * (1 + SVD_ALLOWANCE) <= gain <= s * (1 + SVD_ALLOWANCE) * (1 + 2.0 ** (1 - GAIN_BITS))
        mantissa, _ = math.frexp(gain)
        assert (mantissa * 2**GAIN_BITS).is_integer()
    R = projection_matrix(784, 100, 0)  # a release's shape: against a long-double power iteration on R^T R
    m = R.astype(np.longdouble).T @ R.astype(np.longdouble)
    v = np.ones(100, np.longdouble)
    for _ in range(300):
        v = m @ v
        v /= np.sqrt(v @ v)
    assert np.longdouble(projection_gain(np.linalg.norm(R, 2))) >= np.sqrt(v @ m @ v) * (1 + np.longdouble(2) ** -31)
    intel, amd = 2.4753226347234905, 2.47532263472349
    assert math.nextafter(amd, 3.0) == intel
    assert projection_gain(intel) == projection_gain(amd) == 2.475322723388672
    for bad in (0.0, -1.0, math.inf, math.nan, 5e-324, 1.7e308):
        with pytest.raises(ValueError, match="finite and positive"):
            projection_gain(bad)
    with pytest.raises(PlanError, match="entries"):
        projection_matrix(4096, 1025, 0)
