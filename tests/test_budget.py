"""The budget planner (privacy.budget): one split of a release's budget, used by the release, ``dpcda account`` and
``dpcda audit`` alike."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

import dpcda
from dpcda.privacy.accounting import accountant_delta, adaptive_epsilon, epsilon_of
from dpcda.privacy.budget import REFERENCE_EPSILON, Share, calibrate_synthesis, plan_budget
from dpcda.privacy.calibration import CalibrationError, calibrate_alone, calibrate_gaussian
from dpcda.privacy.events import IteratedGaussianEvent, MixingEvent
from tests import golden
from tests.conftest import run_cli

DELTA = 1e-5


def test_poisson_plan_spends_the_histogram_alone_and_the_statistics_at_the_accountants_delta():
    shares = [Share("class_histogram", 0.01, 1.0, adaptive=True), Share("normalization", 0.05, 4.0)]
    plan = plan_budget("poisson", epsilon=4.0, delta=DELTA, shares=shares)
    hist, norm = plan.shares
    assert [s.name for s in plan.shares] == ["class_histogram", "normalization"]
    assert hist.adaptive and hist.delta == 0.01 * DELTA and hist.epsilon == 0.01 * 4.0
    assert hist.event == calibrate_gaussian(
        "poisson", name="class_histogram", sensitivity=1.0, target_epsilon=0.04, delta=0.01 * DELTA
    )
    assert plan.accountant_delta == accountant_delta(DELTA, [0.01 * DELTA]) == norm.delta
    assert norm.event == calibrate_gaussian(
        "poisson", name="normalization", sensitivity=4.0, target_epsilon=0.2, delta=plan.accountant_delta
    )
    assert plan.synthesis_epsilon == 4.0 - adaptive_epsilon("poisson", hist.event, hist.delta)
    assert plan.adaptive == ((hist.event, hist.delta),) and plan.shared == (norm.event,)
    assert norm.noise_std == pytest.approx(4.0 * norm.noise_multiplier)


def test_with_an_explicit_sigma_x_the_shares_are_of_the_reference_budget():
    plan = plan_budget("fixed", epsilon=None, delta=DELTA, shares=[Share("normalization", 0.1, 2.0)])
    assert plan.budget_epsilon == REFERENCE_EPSILON and plan.synthesis_epsilon is None
    assert plan.get("normalization").epsilon == 0.1 * REFERENCE_EPSILON
    assert plan.get("pca_covariance") is None
    with pytest.raises(CalibrationError, match="sigma_x was given"):
        calibrate_synthesis(plan, lambda s: [MixingEvent("fixed", 100, 100, 4, 1.0, s)])


def test_an_iterated_share_is_calibrated_alone_and_a_noiseless_one_is_not_private():
    shares = [Share("dp_em", 0.1, math.sqrt(3.0), iterations=5)]
    em = plan_budget("poisson", epsilon=2.0, delta=DELTA, shares=shares).get("dp_em")
    z = calibrate_alone(
        lambda z: IteratedGaussianEvent("dp_em", 5, z * math.sqrt(3.0), math.sqrt(3.0)),
        name="dp_em",
        target_epsilon=0.2,
        delta=accountant_delta(DELTA),
    )
    assert em.event == IteratedGaussianEvent("dp_em", 5, math.sqrt(3.0) * z, math.sqrt(3.0))
    off = plan_budget(
        "poisson", epsilon=None, delta=DELTA, shares=[Share("dp_em", 0.1, 1.0, iterations=5, noise=False)]
    )
    assert off.get("dp_em").noise_std == 0.0
    assert math.isinf(epsilon_of("poisson", off.shared, off.accountant_delta))


def test_shares_are_checked():
    with pytest.raises(ValueError, match="fraction"):
        Share("normalization", 1.5, 1.0)
    with pytest.raises(ValueError, match="sensitivity"):
        Share("normalization", 0.1, 0.0)
    with pytest.raises(ValueError, match="twice"):
        plan_budget("fixed", epsilon=1.0, delta=DELTA, shares=[Share("a", 0.1, 1.0), Share("a", 0.1, 1.0)])


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_the_synthesis_composes_to_what_the_shares_leave_and_not_more(mode):
    shares = [Share("normalization", 0.05, 2.0)]
    if mode == "poisson":
        shares.insert(0, Share("class_histogram", 0.01, 1.0, adaptive=True))
    plan = plan_budget(mode, epsilon=3.0, delta=DELTA, shares=shares)

    def events(sigma):
        return [MixingEvent(mode, 200, 200, 4, 1.0, sigma)]

    sigma = calibrate_synthesis(plan, events)
    spent = epsilon_of(mode, [*plan.shared, *events(sigma)], plan.accountant_delta)
    assert 0.98 * plan.synthesis_epsilon <= spent <= plan.synthesis_epsilon
    whole = sum(adaptive_epsilon(mode, ev, d) for ev, d in plan.adaptive) + spent
    assert whole <= 3.0


def _account_cli(*args) -> dict:
    res = run_cli("account", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize(
    "case",
    [
        dict(mechanism="dpcda", options={}, cli=("--class-size", 40, "--samples-per-class", 40)),
        dict(
            mechanism="dpmix",
            options={"projection": "dp-pca:4", "num_classes": 3},
            cli=("--class-size", 120, "--samples-per-class", 120, "--projection", "dp-pca:4"),
        ),
    ],
    ids=["dpcda", "dpmix-projection"],
)
def test_a_release_uses_the_sigma_x_that_account_prints(case):
    """fixed mode: the class sizes are public, so ``dpcda account`` with the release's sizes and settings is exact."""
    x, y = golden.dataset()  # 3 classes of 40 rows, d = 16
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), x.shape[1])
    rel = dpcda.release(
        pa.table({"features": feats, "label": y}),
        epsilon=5,
        mechanism=case["mechanism"],
        mode="fixed",
        mixing_order=4,
        seed=golden.SEED,
        **case["options"],
    )
    m = rel.manifest
    out = _account_cli(
        "--mechanism", case["mechanism"], "--mode", "fixed", "--mixing-order", 4, "--epsilon", 5,
        "--feature-dim", 16, *case["cli"],
    )  # fmt: skip
    assert out["sigma_x"] == m["mechanism"]["sigma_x"]
    assert out["epsilon"] == m["privacy"]["epsilon"] <= 5
    assert out["shares"]["normalization"]["noise_std"] == m["normalization"]["noise_std"]
    assert list(out["shares"]) == [e["name"] for e in m["privacy"]["events"]["shared"]]
    if case["options"]:
        assert out["shares"]["pca_covariance"]["noise_std"] == m["mechanism"]["projection"]["covariance_noise_std"]


def test_account_names_the_shares_a_release_spends():
    base = ("--class-size", 500, "--samples-per-class", 500, "--mixing-order", 4, "--epsilon", 2)
    dp = _account_cli(*base)
    alone = _account_cli(*base, "--normalization", "public")
    assert list(dp["shares"]) == ["normalization"] and dp["shares"]["normalization"]["epsilon"] == 0.1
    assert "noise_std" not in dp["shares"]["normalization"]  # no --feature-dim: the multiplier only
    assert alone["shares"] == {} and alone["sigma_x"] < dp["sigma_x"]
    poisson = _account_cli(*base, "--mode", "poisson")
    assert list(poisson["shares"]) == ["class_histogram", "normalization"]
    assert poisson["shares"]["class_histogram"]["adaptive"] and "DP class histogram" in poisson["note"]
    assert poisson["synthesis_epsilon"] < 2 and poisson["epsilon"] <= 2
    table = run_cli("account", *base, "--mode", "poisson")
    assert "share class_histogram: epsilon 0.02" in table.stdout, table.stdout


def test_account_refuses_a_projection_without_the_dimension():
    res = run_cli("account", "--class-size", 50, "--samples-per-class", 50, "--epsilon", 2, "--projection", "dp-pca:3")
    assert res.returncode != 0 and "--feature-dim" in res.stderr


def test_the_audit_calibrates_as_account_does():
    from dpcda.evaluation.audit import run_audit

    r = run_audit(mode="poisson", mixing_order=2, epsilon=4.0, class_size=6, samples_per_class=2, trials=40, seed=0)
    out = dpcda.account("dpcda", mode="poisson", class_size=6, samples_per_class=2, mixing_order=2, epsilon=4.0)
    assert r["sigma_x"] == out["sigma_x"]
    assert r["statistics_epsilon"] == {k: v["epsilon"] for k, v in out["shares"].items()}
    assert r["synthesis_epsilon"] == out["synthesis_epsilon"]


@pytest.mark.parametrize(
    "settings,needle",
    [
        ({"mode": "poisson", "sigma_x": 0.5, "num_classes": 10}, "sigma_x: poisson mode"),
        ({"mode": "poisson", "epsilon": 1.0, "num_classes": 10, "normalization_budget_share": 0.45,
          "histogram_budget_share": 0.1}, "normalization_budget_share"),
        ({"mechanism": "local", "epsilon": 1.0, "projection": "dp-pca:3", "feature_dim": 10}, "projection"),
        ({"epsilon": 1.0, "projection": "foo", "feature_dim": 10}, "projection"),
    ],
)  # fmt: skip
def test_account_refuses_what_a_release_refuses(settings, needle):
    from dpcda.api import account
    from dpcda.privacy.calibration import CalibrationError

    with pytest.raises(CalibrationError, match=needle):
        account(**{"mechanism": "dpcda", "class_size": 6000, "samples_per_class": 6000, **settings})


def test_account_says_an_exact_normalisation_is_not_end_to_end_dp():
    from dpcda.api import account

    out = account("dpcda", class_size=6000, samples_per_class=600, epsilon=1.0, normalization="exact")
    assert "NOT end-to-end DP" in out["note"]
