"""p3gm as a mechanism of the release: its config, its plan and accounting (recomputed independently from the
manifest's events), the Beam release end to end, ``dpcda account`` and ``dpcda audit`` for it."""

from __future__ import annotations

import glob
import json
import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pyarrow.parquet as pq
import pytest
from dp_accounting import pld, rdp

from dpcda.privacy.accounting import accountant_delta
from dpcda.privacy.composition import event_from_json, event_to_json, release_events_from_json
from dpcda.privacy.events import DpSgdEvent, IteratedGaussianEvent
from tests.conftest import make_dataset, run_cli, write_dataset

SMALL = {  # a model small enough for the fast tier
    "p3gm_latent_dim": 3,
    "p3gm_hidden": 16,
    "p3gm_em_iterations": 3,
    "p3gm_epochs": 1.0,
    "p3gm_batch": 20,
}


def _flags(knobs: dict) -> list:
    return [a for k, v in knobs.items() for a in ("--" + k.replace("_", "-"), v)]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mode": "fixed"}, "add/remove only"),
        ({"mixing_order": 4}, "does not mix"),
        ({"projection": "dp-pca:3"}, "projection"),
        ({"lowpass": 8}, "lowpass"),
        ({"soft_labels": True}, "soft_labels"),
        ({"mixing_path": "join"}, "one worker"),
        ({"p3gm_em_budget_share": 0.4}, "under half the budget"),
        ({"p3gm_hidden": 10, "p3gm_latent_dim": 8}, "p3gm_hidden"),
        ({"p3gm_batch": 1 << 15}, "p3gm_batch"),
    ],
)
def test_bad_p3gm_configs_are_refused(fields, message):
    from dpcda.schemas.config import ConfigError, load_config

    base = {"input": "in/*.parquet", "output": "out", "epsilon": 4.0, "mechanism": "p3gm", "num_classes": 3}
    with pytest.raises(ConfigError, match=message):
        load_config(None, {**base, **fields})


def test_p3gm_defaults_to_the_add_remove_relation():
    from dpcda.schemas.config import load_config

    cfg = load_config(None, {"input": "i", "output": "o", "epsilon": 1.0, "mechanism": "p3gm", "num_classes": 10})
    assert cfg.mode == "poisson" and cfg.mechanism.mixing_order == 1 and cfg.mechanism.pca_components == 10


@pytest.mark.parametrize("weight, expected", [(None, math.sqrt(12)), (5.0, 5.0)])
def test_the_label_weight_reaches_the_fit(weight, expected):
    from dpcda.mechanisms.inprocess import first_pass
    from dpcda.mechanisms.p3gm import spec_from_plan
    from dpcda.mechanisms.plan import build_plan
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.schemas.config import load_config

    x, y = make_dataset(n_per_class=30, num_classes=3, dim=12)
    fields = {"input": "i", "output": "o", "epsilon": 2.0, "mechanism": "p3gm", "num_classes": 3, **SMALL}
    cfg = load_config(None, {**fields, **({} if weight is None else {"p3gm_label_weight": weight})})
    plan = build_plan(first_pass(x, y), cfg.core, key_from_test_seed(0))
    assert plan.synthesis.label_weight == pytest.approx(expected)
    assert spec_from_plan(plan).label_weight == pytest.approx(expected)


def test_replan_runs_the_changed_plan():
    import dataclasses

    from dpcda.mechanisms.inprocess import release_in_process
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.schemas.config import load_config

    x, y = make_dataset(n_per_class=30, num_classes=3, dim=12)
    fields = {"input": "i", "output": "o", "epsilon": 2.0, "mechanism": "p3gm", "num_classes": 3, **SMALL}
    cfg = load_config(None, fields)
    key = key_from_test_seed(0)

    def quiet(plan):
        return dataclasses.replace(plan, synthesis=dataclasses.replace(plan.synthesis, noise_multiplier=0.0))

    f0, _, p0, _ = release_in_process(x, y, cfg.core, key)
    f1, _, p1, _ = release_in_process(x, y, cfg.core, key, replan=quiet)
    assert p0.synthesis.noise_multiplier > 0 and p1.synthesis.noise_multiplier == 0.0
    assert p1.synthesis.grad_clip == p0.synthesis.grad_clip  # clipping kept
    assert p0.accounting.epsilon <= 2.0 and p1.accounting.epsilon == math.inf and not p1.end_to_end_dp
    assert not np.array_equal(f0, f1)
    # public statistics, as the launcher reads them from normalization_file
    public = load_config(None, {**fields, "normalization": "public", "normalization_file": "stats.json"})
    mean, std = np.full(12, 0.5), np.full(12, 2.0)
    _, _, p2, _ = release_in_process(x, y, public.core, key, public_stats=(mean, std))
    assert np.array_equal(p2.mean, mean) and np.array_equal(p2.std, std)
    from dpcda.mechanisms.plan import PlanError

    for bad in [(mean[:5], std), (mean, np.zeros(12)), (0.5, std)]:
        with pytest.raises(PlanError, match="normalization public"):
            release_in_process(x, y, public.core, key, public_stats=bad)


def test_events_round_trip_through_json_exactly():
    sgd = DpSgdEvent("dp_sgd", Fraction(300, 59999), 800, 1.37)
    em = IteratedGaussianEvent("dp_em", 20, 31.5, math.sqrt(3))
    for ev in (sgd, em):
        back = event_from_json(json.loads(json.dumps(event_to_json(ev))))
        assert back == ev
    assert isinstance(event_from_json(event_to_json(sgd)).sampling_rate, Fraction)


def test_the_dp_sgd_event_is_a_poisson_subsampled_gaussian_composed_per_step():
    ev = DpSgdEvent("dp_sgd", Fraction(1, 200), 400, 1.1)
    ours = pld.PLDAccountant(value_discretization_interval=1e-3).compose(ev.to_dp_event()).get_epsilon(1e-5)
    theirs = (
        pld.PLDAccountant(value_discretization_interval=1e-3)
        .compose(dp_accounting.PoissonSampledDpEvent(0.005, dp_accounting.GaussianDpEvent(1.1)), 400)
        .get_epsilon(1e-5)
    )
    assert ours == pytest.approx(theirs, rel=1e-9)


def _independent_epsilon(events: dict, delta: float, accountant: str) -> float:
    """epsilon of a p3gm manifest's events, recomputed with dp_accounting directly (not through privacy/)."""
    dp = []
    for e in events["shared"] + events["per_class"]:
        if e["type"] == "GaussianStatsEvent":
            dp.append(dp_accounting.GaussianDpEvent(e["noise_std"] / e["sensitivity"]))
        elif e["type"] == "IteratedGaussianEvent":
            dp.append(
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.GaussianDpEvent(e["noise_std"] / e["sensitivity"]), e["iterations"]
                )
            )
        elif e["type"] == "DpSgdEvent":
            q = float(Fraction(e["sampling_rate"]))
            one = dp_accounting.PoissonSampledDpEvent(
                math.nextafter(q, 2.0), dp_accounting.GaussianDpEvent(e["noise_multiplier"])
            )
            dp.append(dp_accounting.SelfComposedDpEvent(one, e["steps"]))
        else:
            raise AssertionError(f"unexpected event {e['type']}")
    adaptive = events["adaptive"]
    rest = accountant_delta(delta, [d for _, d in adaptive])
    if accountant == "pld":
        acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    else:
        acc = rdp.RdpAccountant(orders=[1 + x / 10 for x in range(1, 100)] + list(range(12, 256)))
    eps = acc.compose(dp_accounting.ComposedDpEvent(dp)).get_epsilon(rest)
    for e, d in adaptive:
        hist = pld.PLDAccountant(value_discretization_interval=1e-4)
        eps += hist.compose(dp_accounting.GaussianDpEvent(e["noise_std"] / e["sensitivity"])).get_epsilon(d)
    return eps


def test_a_p3gm_release_end_to_end(tmp_path):
    x, y = make_dataset(n_per_class=60, num_classes=3, dim=12)
    inp = write_dataset(tmp_path / "in", x, y)
    out = tmp_path / "rel"
    res = run_cli(
        "release",
        "--input",
        inp,
        "--output",
        out,
        "--mechanism",
        "p3gm",
        "--epsilon",
        3,
        "--num-classes",
        3,
        "--seed",
        1,
        "--runner=DirectRunner",
        "--direct_running_mode=in_memory",
        *_flags({**SMALL, "p3gm_encoder_hidden": 5}),
    )
    assert res.returncode == 0, res.stderr
    m = json.loads((out / "manifest.json").read_text())
    mech, priv = m["mechanism"], m["privacy"]
    assert mech["name"] == "p3gm" and mech["mode"] == "poisson" and mech["latent_dim"] == 3
    assert priv["epsilon"] <= 3.0
    assert {"normalization", "pca_covariance", "dp_em", "dp_sgd", "class_histogram"} <= set(priv["components"])
    assert mech["dp_sgd"]["label_weight"] == pytest.approx(math.sqrt(12))  # the default: sqrt(d)
    assert (mech["dp_sgd"]["hidden"], mech["dp_sgd"]["encoder_hidden"]) == (16, 5)
    sgd = release_events_from_json(priv["events"]).per_class[0]
    assert sgd.steps == mech["dp_sgd"]["steps"] == math.ceil(1 / sgd.sampling_rate)  # one epoch
    # an independent recomputation of the manifest's events: at most the target, and the calibration is not loose
    independent = _independent_epsilon(priv["events"], 1e-5, "pld")
    assert independent <= 3.0 * 1.001
    assert independent >= 3.0 * 0.95
    assert _independent_epsilon(priv["events"], 1e-5, "rdp") >= independent * 0.98  # RDP is the looser one
    t = pq.read_table(sorted(glob.glob(str(out / "synthetic" / "*.parquet"))))
    assert t.num_rows == m["output"]["rows"] == mech["samples_total"]
    feats = np.stack(t.column("features").to_numpy(zero_copy_only=False))
    labels = t.column("label").to_numpy()
    assert feats.shape[1] == 12 and np.isfinite(feats).all()
    assert set(np.unique(labels)) <= {0, 1, 2}
    assert np.linalg.norm(feats, axis=1).max() <= mech["clip"] * 1.5  # the decoder's rows live in the clipped units


def test_account_p3gm_prints_the_whole_chain_within_the_target():
    res = run_cli(
        "account",
        "--mechanism",
        "p3gm",
        "--class-size",
        60000,
        "--feature-dim",
        784,
        "--num-classes",
        10,
        "--epsilon",
        1,
        "--p3gm-epochs",
        1,  # a twentieth of the default's steps: the same chain, calibrated faster
        "--json",
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    # 1 epoch of expected batch 1500: q = 1500 / N_hat, steps = 1 / q (N_hat: the DP count of the stand-in data)
    assert out["epsilon"] <= 1.0
    assert out["sgd_sampling_rate"] == pytest.approx(0.025, rel=0.1)  # the DP count's noise moves it a little
    assert out["sgd_steps"] == pytest.approx(1 / out["sgd_sampling_rate"], abs=1)
    assert out["em_noise_std"] > 0 and out["sgd_noise_multiplier"] > 0 and out["pca_covariance_noise_std"] > 0
    assert out["cross_check"]["rdp"] >= out["epsilon"]


def test_account_p3gm_needs_the_model_sizes():
    res = run_cli("account", "--mechanism", "p3gm", "--class-size", 100, "--epsilon", 1)
    assert res.returncode == 2 and "--feature-dim" in res.stderr.strip().splitlines()[-1]


def test_account_p3gm_reports_a_bad_field_in_one_line():
    """The account command builds p3gm's config through load_config: a field error is one line, not a traceback."""
    base = ("account", "--mechanism", "p3gm", "--class-size", 600, "--feature-dim", 20, "--num-classes", 3)
    for extra, needle in (
        (("--epsilon", 1, "--delta", 1e-9), "delta: 1e-09 is below"),
        (("--epsilon", 1, "--p3gm-latent-dim", 600), "p3gm_latent_dim"),
    ):
        res = run_cli(*base, *extra)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
        assert needle in res.stderr.strip().splitlines()[-1]


def test_the_dp_sgd_audit_finds_no_violation_and_catches_a_false_claim():
    from dpcda.evaluation.audit import run_audit

    ok = run_audit(mechanism="p3gm", mode="poisson", mixing_order=2, class_size=2, epsilon=2.0, trials=2000)
    assert not ok["violation"] and ok["accounted_epsilon"] <= 2.0
    # the same noise, claimed far more private than it is: the game must see it
    bad = run_audit(
        mechanism="p3gm", mode="poisson", mixing_order=2, class_size=2, sigma_x=0.3, claimed_epsilon=0.5, trials=2000
    )
    assert bad["violation"] and bad["empirical_epsilon_lower_bound"] > 0.5


def test_a_non_finite_gradient_is_dropped_not_propagated():
    import torch

    from dpcda.mechanisms.dpsgd import clip_factors

    f = clip_factors(torch.tensor([0.5, 4.0, float("inf"), float("nan")], dtype=torch.float64), 1.0)
    assert f[0] == 1.0 and 0 < f[1] < 0.25 and f[2] == 0 and f[3] == 0
