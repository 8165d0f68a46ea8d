"""AIM selection for the marginals mechanism: the zCDP filter never overspends, a release's rounds recompute to at most
its epsilon with dp_accounting, the scores, the in-process path states its picks, and the new config's refusals."""

from __future__ import annotations

import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given, settings
from hypothesis import strategies as st

from dpcda.mechanisms import marginals as mg
from dpcda.privacy.accounting import RDP_ORDERS
from dpcda.privacy.aim import (
    AimSchedule,
    FilterError,
    ZcdpFilter,
    gaussian_rho,
    realized_dp_event,
    selection_rho,
    std_for,
)
from dpcda.privacy.events import AimEvent
from dpcda.schemas.config import ConfigError, load_config
from tests.test_tables import SCHEMA, make_table

DELTA = 1e-6


def _epsilon(event) -> float:
    acc = rdp.RdpAccountant(RDP_ORDERS, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(event)
    return acc.get_epsilon(DELTA)


# ---------------------------------------------------------------- the filter (privacy.aim)


@settings(max_examples=200, deadline=None)
@given(
    rho=st.floats(min_value=1e-4, max_value=50.0),
    columns=st.integers(min_value=1, max_value=40),
    anneals=st.lists(st.booleans(), min_size=0, max_size=800),
)
def test_no_sequence_of_annealing_decisions_overspends(rho, columns, anneals):
    """Whatever the annealing decisions (an adversary's, here random), the exact rho spent is at most the cap, the
    rounds stop by the planned count, only the last round spends what is left, and dp_accounting's epsilon of the
    realized events is at most the planned ZCDpEvent(cap)'s."""
    sched = AimSchedule(rho, columns)
    decisions = iter(anneals)
    while not sched.done:
        rnd = sched.next_round()
        assert sched.filter.spent <= sched.filter.cap
        if not rnd.last and next(decisions, False):
            sched.anneal()
    assert sched.filter.spent <= Fraction(rho)
    assert 1 <= len(sched.rounds) <= sched.planned_rounds == 16 * columns
    assert [r.last for r in sched.rounds] == [False] * (len(sched.rounds) - 1) + [True]
    spent = columns * gaussian_rho(sched.one_way_std) + sum(r.rho for r in sched.rounds)
    assert spent == sched.filter.spent  # the ledger is the sum of the rounds' exact costs
    realized = realized_dp_event(
        one_way=columns, one_way_std=sched.one_way_std, rounds=[(r.epsilon, r.std) for r in sched.rounds]
    )
    planned = AimEvent(name="marginals", rho=rho, one_way=columns).to_dp_event()
    assert _epsilon(realized) <= _epsilon(planned) * (1 + 1e-12)
    with pytest.raises(FilterError):
        sched.next_round()


def test_the_filter_refuses_a_charge_past_its_cap():
    f = ZcdpFilter(1.0)
    f.charge(Fraction(3, 4))
    with pytest.raises(FilterError):
        f.charge(Fraction(1, 3))
    f.charge(Fraction(1, 4))
    assert f.remaining == 0
    with pytest.raises(FilterError):
        f.charge(Fraction(1, 10**30))


def test_std_for_rounds_up_and_the_costs_are_exact():
    for rho in (Fraction(1, 3), Fraction(7, 10**9), Fraction(5)):
        s = std_for(rho)
        assert gaussian_rho(s) <= rho and gaussian_rho(math.nextafter(s, 0)) > rho
    assert selection_rho(Fraction(1, 2)) == Fraction(1, 32)


def test_the_schedule_is_aims():
    """T = 16 d, sigma_0 = sqrt(T / (2 * 0.9 rho)), epsilon_0 = sqrt(8 * 0.1 rho / T); annealing halves and doubles."""
    sched = AimSchedule(2.0, 5)
    assert sched.planned_rounds == 80
    assert sched.one_way_std == pytest.approx(math.sqrt(80 / (2 * 0.9 * 2.0)), rel=1e-12)
    r = sched.next_round()
    assert float(r.epsilon) == pytest.approx(math.sqrt(8 * 0.1 * 2.0 / 80), rel=1e-8)
    sched.anneal()
    r2 = sched.next_round()
    assert r2.std == r.std / 2 and r2.epsilon == 2 * r.epsilon and sched.annealed == 1


def test_the_planned_event_is_zcdp_of_the_cap():
    ev = AimEvent(name="marginals", rho=0.5, one_way=3)
    assert ev.to_dp_event() == dp_accounting.ZCDpEvent(0.5)
    assert isinstance(AimEvent("marginals", 0.0, 3).to_dp_event(), dp_accounting.NonPrivateDpEvent)


# ---------------------------------------------------------------- selection pieces


def test_the_candidates_are_the_pair_workloads_closure_with_aims_weights():
    w = mg.aim_candidates(4)
    assert set(w) == {(0,), (1,), (2,), (3,)} | {(a, b) for a in range(4) for b in range(a + 1, 4)}
    assert all(w[(i,)] == 3 for i in range(4)) and all(w[p] == 6 for p in w if len(p) == 2)


def test_aim_scores_subtract_the_noise_bias_and_move_by_the_weight_per_record():
    exact = {(0, 1): np.array([[5, 0], [0, 5]]), (0,): np.array([5, 5])}
    est = {(0, 1): np.full((2, 2), 2.5), (0,): np.array([5.0, 5.0])}
    weights = {(0, 1): 2, (0,): 1}
    unit = 1 << mg.SCORE_BITS
    s = mg.aim_scores(exact, est, weights, std=0.0)
    assert s[(0, 1)] == 2 * 10 * unit and s[(0,)] == 0
    biased = mg.aim_scores(exact, est, weights, std=1.0)
    assert biased[(0,)] == -round(math.sqrt(2 / math.pi) * 2 * unit)
    moved = mg.aim_scores({**exact, (0, 1): np.array([[6, 0], [0, 5]])}, est, weights, std=1.0)
    assert abs(moved[(0, 1)] - biased[(0, 1)]) <= max(weights.values()) * unit  # the stated sensitivity


def test_aim_scores_refuse_a_model_that_is_not_finite_and_stay_exact_for_huge_estimates():
    """A NaN in the model's counts would wrap the int64 score past any sensitivity: refused (the model is DP). A huge
    finite estimate is clipped (post-processing), and one record still moves the score by at most w units."""
    exact = {(0,): np.array([1, 0])}
    with pytest.raises(mg.PlanError, match="not finite"):
        mg.aim_scores(exact, {(0,): np.array([np.nan, 0.0])}, {(0,): 3}, std=1.0)
    unit = 1 << mg.SCORE_BITS
    est = {(0,): np.full(2, 1e300)}
    s0 = mg.aim_scores({(0,): np.array([0, 0])}, est, {(0,): 3}, std=1.0)
    s1 = mg.aim_scores(exact, est, {(0,): 3}, std=1.0)
    assert s0[(0,)] > 0 and abs(s1[(0,)] - s0[(0,)]) <= 3 * unit
    assert mg._exact_sum(np.full(1000, (1 << 62) - 1, np.int64)) == 1000 * ((1 << 62) - 1)


def test_an_aim_run_spends_what_its_record_says_with_the_parameters_it_states(monkeypatch):
    """Every Gaussian and exponential-mechanism call of a small AIM run is captured: the noise paths are distinct, the
    stds and epsilons passed are the recorded ones, the EM's sensitivity is max w_r units, and the exact rho of the
    parameters actually used fits the cap."""
    from dpcda.privacy import exponential as ex
    from dpcda.privacy import noise as nz
    from dpcda.privacy.noise import key_from_test_seed

    monkeypatch.setattr(mg.aim, "AIM_ROUND_ITERS", 5)
    rho = 0.5
    dom = mg.Domain(("a", "b", "y"), (4, 3, 2), 4)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    a = np.where(y == 1, rng.integers(0, 2, 400), rng.integers(1, 4, 400))
    codes = np.stack([a, rng.integers(0, 3, 400), y], 1).astype(np.int64)
    counter = mg.MarginalCounter(dom)
    acc = counter.add(counter.create(), codes)
    plan = mg.MarginalsPlan(
        selection="aim", domain=dom, iterations=5, rho=rho, event=AimEvent("marginals", rho, 3), max_model_size=None
    )
    gaussians, ems = [], []
    gaussian, em = nz.NoiseStream.gaussian, ex.exponential_mechanism

    def spy_gaussian(self, center, sigma):
        gaussians.append((self.path, sigma))
        return gaussian(self, center, sigma)

    def spy_em(scores, *, epsilon, sensitivity, bits):
        ems.append((Fraction(epsilon), Fraction(sensitivity)))
        return em(scores, epsilon=epsilon, sensitivity=sensitivity, bits=bits)

    monkeypatch.setattr(nz.NoiseStream, "gaussian", spy_gaussian)
    monkeypatch.setattr(ex, "exponential_mechanism", spy_em)
    rec = mg.measure_aim(counter, acc, plan, key_from_test_seed(1)).record
    paths = [p for p, _ in gaussians]
    assert len(paths) == len(set(paths)) and rec["rounds_run"] == len(rec["rounds"]) == len(ems) > 0
    assert [s for p, s in gaussians if "aim-round" in p] == [r["noise_std"] for r in rec["rounds"]]
    assert {s for p, s in gaussians if "aim-one-way" in p} == {rec["one_way_noise_std"]}
    assert [float(e) for e, _ in ems] == [r["epsilon"] for r in rec["rounds"]]
    assert {s for _, s in ems} == {max(mg.aim_candidates(3).values()) << mg.SCORE_BITS}
    spent = sum(gaussian_rho(s) for _, s in gaussians) + sum(selection_rho(e) for e, _ in ems)
    assert spent <= Fraction(rho)


def test_merged_measurements_are_inverse_variance_weighted():
    mbi = mg._mbi()
    a = mbi.LinearMeasurement(np.array([1.0, 3.0]), ("x",), stddev=1.0)
    b = mbi.LinearMeasurement(np.array([3.0, 5.0]), ("x",), stddev=2.0)
    c = mbi.LinearMeasurement(np.array([0.0]), ("y",), stddev=1.0)
    out = mg.merged(mbi, [a, c, b])
    assert [m.clique for m in out] == [("x",), ("y",)]
    assert np.allclose(out[0].noisy_measurement, [(1 + 3 / 4) / 1.25, (3 + 5 / 4) / 1.25])
    assert out[0].stddev == pytest.approx(1 / math.sqrt(1.25))


# ---------------------------------------------------------------- releases


def _in_process(selection, **kw):
    from dpcda.mechanisms.inprocess import first_pass, release_in_process
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.schemas.config import ReleaseConfig
    from dpcda.schemas.table import parse_table_schema
    from dpcda.storage.tables import encode_batch

    schema = parse_table_schema(SCHEMA)
    cfg = ReleaseConfig(
        input="in-process",
        output="in-process",
        epsilon=8.0,
        seed=3,
        table=schema,
        mechanism="marginals",
        mode="poisson",
        marginals_selection=selection,
        marginals_bins=4,
        marginals_iters=100,
        **kw,
    )
    block = encode_batch(make_table(2000, seed=2), schema, "train", 0)
    return release_in_process(
        block.features, block.labels, cfg.core, key_from_test_seed(3), first=first_pass(block.features, block.labels)
    )


@pytest.mark.parametrize("selection", ["mst", "aim"])
def test_the_in_process_path_states_its_picks(selection):
    """The in-process plan carries the measured cliques (it dropped them before), as the Beam path's stated plan."""
    feats, labels, plan, _ = _in_process(selection)
    mp = plan.synthesis
    assert len(feats) == len(labels) > 0
    assert mp.selected and all(set(c) <= set(mp.domain.names) for c in mp.selected)
    assert mp.estimated_total is not None and mp.fit_seconds is not None
    if selection == "aim":
        assert mp.aim["rounds_run"] == len(mp.selected) == len(mp.aim["rounds"])
        assert [list(c) for c in mp.selected] == [r["clique"] for r in mp.aim["rounds"]]
    else:
        assert len(mp.selected) == len(mp.domain.names) - 1


@pytest.fixture(scope="module")
def aim_release():
    import dpcda

    return dpcda.release(
        make_table(2000, seed=1),
        epsilon=6,
        mechanism="marginals",
        schema=SCHEMA,
        seed=5,
        marginals_selection="aim",
        marginals_bins=4,
        marginals_iters=100,
    )


def test_an_aim_releases_rounds_recompute_to_at_most_its_epsilon(aim_release):
    """Independent accounting: the manifest's rounds (one-way Gaussians, then per round ZCDpEvent(eps^2/8) and
    GaussianDpEvent(std)) composed by dp_accounting spend at most the target epsilon (no class histogram is drawn)."""
    man = aim_release.manifest
    mech, privacy = man["mechanism"], man["privacy"]
    aim = mech["aim"]
    assert mech["selection"] == "aim" and aim["rounds_run"] == len(aim["rounds"]) == mech["selection_rounds"] >= 1
    assert aim["annealing_steps"] == sum(r["annealed"] for r in aim["rounds"])
    assert aim["max_model_size_cells"] == mg.AIM_MAX_MODEL_SIZE == 1 << 16  # stated in the manifest
    n = len(mech["columns"])
    delta = privacy["delta_breakdown"]["accountant"]
    acc = rdp.RdpAccountant(RDP_ORDERS, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.GaussianDpEvent(aim["one_way_noise_std"]), n)
    for r in aim["rounds"]:
        acc.compose(dp_accounting.ZCDpEvent(r["epsilon"] ** 2 / 8))
        acc.compose(dp_accounting.GaussianDpEvent(r["noise_std"]))
    realized_marginals = acc.get_epsilon(delta)
    assert realized_marginals <= privacy["components"]["marginals"] * (1 + 1e-9)
    from dpcda.privacy.composition import release_events_from_json

    events = release_events_from_json(privacy["events"])
    planned = [e for e in (*events.shared, *events.per_class) if isinstance(e, AimEvent)]
    assert len(planned) == 1 and planned[0].rho == mech["rho"]  # the cap, as the ledger composes it
    for e in (*events.shared, *events.per_class):  # whatever else composes with the synthesis (none today)
        if not isinstance(e, AimEvent):
            acc.compose(e.to_dp_event())
    # no class histogram (the row count is the model's total, post-processing): the marginals are the release
    assert set(privacy["components"]) == {"marginals"}
    assert acc.get_epsilon(delta) <= privacy["epsilon"] == 6
    rounds_rho = sum(r["epsilon"] ** 2 / 8 + 1 / (2 * r["noise_std"] ** 2) for r in aim["rounds"])
    assert n / (2 * aim["one_way_noise_std"] ** 2) + rounds_rho <= mech["rho"] * (1 + 1e-12)
    assert mech["rho"] == pytest.approx(sum(mech["rho_split"].values()), rel=1e-9)
    grids = privacy["noise"]["grids"]
    assert "marginals_one_way" in grids and "marginals_aim_std_0" in grids


def test_an_aim_release_keeps_the_label_base_rate(aim_release):
    from dpcda.evaluation.table_metrics import table_metrics
    from dpcda.schemas.table import parse_table_schema

    m = table_metrics(make_table(2000, seed=1), aim_release.table, parse_table_schema(SCHEMA))
    # numeric columns are on 4 bins here (table_metrics reads 20), so only the coded columns' TVDs are compared
    assert m["base_rate"]["max_gap"] < 0.05, m["base_rate"]
    assert max(m["one_way_tvd"][c] for c in ("contract", "senior", "paperless")) < 0.05, m["one_way_tvd"]


# ---------------------------------------------------------------- refusals


def _cfg(**kw):
    return load_config(None, {"input": "x", "output": "o/r", "mechanism": "marginals", "epsilon": 1.0, **kw})


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"marginals_selection": "AIM"}, "marginals_selection"),
        ({"marginals_selection": "aim+"}, "marginals_selection"),
        ({"marginals_selection": "aim", "marginals_max_model_size": 0}, "marginals_max_model_size"),
        ({"marginals_selection": "aim", "marginals_max_model_size": -5}, "marginals_max_model_size"),
        ({"marginals_selection": "aim", "marginals_max_model_size": 1 << 40}, "marginals_max_model_size"),
        ({"marginals_selection": "aim", "marginals_max_model_size": True}, "marginals_max_model_size: expected an"),
        ({"marginals_selection": "aim", "marginals_max_model_size": "big"}, "marginals_max_model_size"),
        ({"marginals_selection": "aim", "marginals_max_model_size": 1.5}, "marginals_max_model_size"),
        ({"marginals_selection": "mst", "marginals_max_model_size": 1000}, "marginals_max_model_size: selection aim"),
        ({"marginals_max_model_size": 1000}, "marginals_max_model_size: selection aim"),
    ],
)
def test_bad_aim_configs_are_one_line_errors(fields, needle):
    with pytest.raises(ConfigError) as err:
        _cfg(table=SCHEMA, **fields)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_good_aim_config():
    cfg = _cfg(table=SCHEMA, marginals_selection="aim", marginals_max_model_size=5000)
    assert cfg.mechanism.selection == "aim" and cfg.mechanism.max_model_size == 5000
    assert _cfg(table=SCHEMA, marginals_selection="aim").mechanism.max_model_size is None
