"""The release-level membership audit (evaluation.membership): distances, the test's statistics, and a real release.

False-failure rates are stated per test. Every random draw has a fixed seed, so a run is reproducible; the stated
rate is the chance that a seed picked at random would make a correct implementation fail.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

from dpcda.evaluation.audit import max_detectable_epsilon
from dpcda.evaluation.membership import (
    OUTSIDE_GUARANTEE,
    _pick_rows,
    add_parser,
    class_quotas,
    cmd_audit_release,
    membership_audit,
    membership_audit_section,
    membership_test,
    nearest_distances,
    roc_auc,
)
from dpcda.storage.shards import Block
from tests.conftest import BEAM_ARGS, make_dataset, run_cli, write_dataset

ALPHA = 0.025  # each one-sided Clopper-Pearson bound (95 % together)


def _population(rng, n, d=16):
    """Rows of norm <= 1, like the release's normalised space."""
    x = rng.standard_normal((n, d))
    return x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)) * 0.9


def test_blocked_distances_equal_brute_force():
    """Deterministic (no statistical failure): blocks of every shape, a streamed reference, exact copies at 0."""
    rng = np.random.default_rng(0)
    q = _population(rng, 301, 24).astype(np.float32)
    r = _population(rng, 997, 24).astype(np.float32)
    r[::97] = q[:11]  # eleven queries have an exact copy in the reference
    brute = np.sqrt(((q[:, None, :].astype(np.float64) - r[None, :, :]) ** 2).sum(-1).min(axis=1))
    chunks = (r[:5], r[5:400], r[400:401], r[401:])  # an iterable of uneven blocks, read once
    blocked = nearest_distances(q, iter(chunks), device="cpu", query_block=64, reference_block=100)
    np.testing.assert_allclose(blocked, brute, rtol=1e-6, atol=1e-7)
    assert (blocked[:11] == 0.0).all()
    np.testing.assert_allclose(nearest_distances(q, r, device="cpu"), brute, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="width"):
        nearest_distances(q, r[:, :3], device="cpu")


def test_roc_auc_with_ties():
    assert roc_auc(np.array([3.0, 2.0]), np.array([1.0, 0.0])) == 1.0
    assert roc_auc(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == 0.5
    assert roc_auc(np.array([1.0]), np.array([1.0, 2.0])) == pytest.approx(0.25)


def test_honest_release_gives_auc_near_half_and_a_bound_below_the_claim():
    """A release drawn independently of its input (true epsilon 0). |AUC - 0.5| < 0.05: the null sd of the AUC with
    2000 + 2000 rows is 0.0091, so 5.5 sd, false failure < 1e-7. Bound < 1: the bound exceeds the true epsilon (0)
    with probability <= 5 % by construction (given the release, the rows' distances are i.i.d., so the
    Clopper-Pearson intervals are exact here); in 1000 simulated null audits of this size none was above 0."""
    rng = np.random.default_rng(1)
    members, non_members, release = _population(rng, 2000), _population(rng, 2000), _population(rng, 3000)
    dist = nearest_distances(np.concatenate([members, non_members]), release, device="cpu")
    out = membership_test(dist[:2000], dist[2000:], delta=1e-5, claimed_epsilon=1.0, seed=0)
    assert abs(out["roc_auc"] - 0.5) < 0.05, out
    assert out["empirical_epsilon_lower_bound"] < 1.0 and not out["violation"], out
    assert out["evaluation_rows"] == [1000, 1000] and out["selection_rows"] == [1000, 1000]
    assert 0 <= out["fp"] <= out["fp_upper"] <= 1 and 0 <= out["fn"] <= out["fn_upper"] <= 1


def test_leaky_release_gives_auc_near_one_and_a_large_bound():
    """A 'release' that copies every member (and adds unrelated rows): AUC 1 and FN 0, deterministically (members at
    distance 0, continuous non-members never). The threshold is the nearest held-out row of the selection half; the
    number of evaluation non-members below it is about geometric, P(>= k) ~ 2^-k, so FP <= 0.01 (10 of 1000) fails
    with probability ~5e-4, and then the bound is >= 3.9. A release copying 30 % of its members with a little noise
    is also caught (AUC 0.65 expected, sd 0.01; FN ~0.7 at FP ~0 gives a bound ~4 > 1): false failure < 1e-6."""
    rng = np.random.default_rng(2)
    members, non_members = _population(rng, 2000), _population(rng, 2000)
    release = np.concatenate([members, _population(rng, 1000)])
    dist = nearest_distances(np.concatenate([members, non_members]), release, device="cpu")
    out = membership_test(dist[:2000], dist[2000:], delta=1e-5, claimed_epsilon=1.0, seed=0)
    assert out["roc_auc"] == 1.0 and out["fn"] == 0 and out["fp"] <= 0.01, out
    assert out["max_detectable_epsilon"] == pytest.approx(max_detectable_epsilon(1000, 1000, 1e-5, ALPHA))
    assert 3.5 < out["empirical_epsilon_lower_bound"] <= out["max_detectable_epsilon"] and out["violation"], out
    assert out["guess_member_when"] == "distance below threshold"
    assert not membership_test(dist[:2000], dist[2000:], delta=1e-5, claimed_epsilon=None)["violation"]

    part = members[:600] + rng.normal(0, 1e-3, (600, members.shape[1]))
    dist = nearest_distances(np.concatenate([members, non_members]), np.concatenate([part, release[2000:]]))
    out = membership_test(dist[:2000], dist[2000:], delta=1e-5, claimed_epsilon=1.0, seed=0)
    assert 0.6 < out["roc_auc"] < 0.7 and out["empirical_epsilon_lower_bound"] > 1.0 and out["violation"], out


def test_bound_holds_at_a_tight_epsilon_and_has_power():
    """Distances whose member/non-member likelihood ratio is e^eps on [0, 0.5) and e^-eps on [0.5, 1] (randomised
    response, eps = 1.5): every threshold test has exactly the trade-off of a pure eps-DP release, tight at 0.5.
    Over 200 audits of 400 + 400 rows the bound exceeds eps with probability <= 5 % each: failing needs more than
    20 alarms, P(Binomial(200, 0.05) > 20) = 0.0016, the false-failure rate. (We saw 2; with point estimates
    instead of the Clopper-Pearson bounds about 120 alarm.) Power: the mean bound, about 1.1, must exceed eps / 2
    (sd of the mean about 0.02: false failure < 1e-6)."""
    eps, n = 1.5, 400
    p = math.exp(eps) / (1 + math.exp(eps))

    def draw(rng, near_rate):
        near = rng.random(n) < near_rate
        return np.where(near, rng.uniform(0.0, 0.5, n), rng.uniform(0.5, 1.0, n))

    alarms, bounds = 0, []
    for trial in range(200):
        rng = np.random.default_rng([5, trial])
        out = membership_test(draw(rng, p), draw(rng, 1 - p), delta=1e-5, claimed_epsilon=eps, seed=trial)
        alarms += out["violation"]
        bounds.append(out["empirical_epsilon_lower_bound"])
    assert alarms <= 20, alarms
    assert np.mean(bounds) > eps / 2, np.mean(bounds)


def test_add_remove_claims_cover_a_swap_as_two_steps():
    """Under add/remove, swapping a member for a non-member is two steps: the claim (eps, delta) covers the test as
    (2 eps, (1 + e^eps) delta). Leaky distances (members at 0), 1500 + 1500 evaluation rows: the bound is at most
    max_detectable (about 6, whatever the data) < 2 x 3.5, so never a violation with two steps; with one it is a
    violation unless more than ~35 evaluation non-members fall below the selection half's nearest one (P ~ 2^-35)."""
    rng = np.random.default_rng(6)
    members, non_members = np.zeros(3000), rng.uniform(0.01, 1.0, 3000)
    one = membership_test(members, non_members, delta=1e-5, claimed_epsilon=3.5, seed=1)
    two = membership_test(members, non_members, delta=1e-5, claimed_epsilon=3.5, seed=1, swap_steps=2)
    assert (one["test_epsilon"], one["test_delta"], one["swap_steps"]) == (3.5, 1e-5, 1)
    assert two["test_epsilon"] == 7.0 and two["test_delta"] == pytest.approx(1e-5 * (1 + math.exp(3.5)))
    assert one["violation"] and one["empirical_epsilon_lower_bound"] > 3.5, one
    assert not two["violation"] and two["empirical_epsilon_lower_bound"] <= two["max_detectable_epsilon"] < 7.0, two


def test_class_quotas_share_rows_by_held_out_classes_within_caps():
    np.testing.assert_array_equal(class_quotas(np.full(10, 6000), np.full(10, 1000), 10000), np.full(10, 1000))
    np.testing.assert_array_equal(class_quotas(np.full(10, 6000), np.full(10, 1000), 500), np.full(10, 50))
    q = class_quotas(np.array([5, 100, 100]), np.array([50, 50, 100]), 120)  # class 0 capped by its 5 members
    assert q.sum() == 120 and q[0] == 5 and (q <= np.minimum([5, 100, 100], [50, 50, 100])).all(), q
    q = class_quotas(np.array([10, 10, 10]), np.array([3, 3]), 100)  # class 2 has no held-out row
    np.testing.assert_array_equal(q, [3, 3, 0])
    q = class_quotas(np.array([9, 9, 9]), np.array([9, 9, 9]), 2)  # fewer rows than classes
    assert q.sum() == 2 and q.max() == 1


def test_pick_rows_takes_the_quota_of_each_class_without_replacement():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 1000)
    x = np.arange(1000, dtype=np.float32)[:, None]  # the row index as the feature

    def source():
        return (Block(x[i : i + 97], y[i : i + 97]) for i in range(0, 1000, 97))

    counts = np.bincount(y)
    quota = np.array([10, 0, 25])
    xa, ya = _pick_rows(source, counts, quota, np.random.default_rng(7))
    xb, _ = _pick_rows(source, counts, quota, np.random.default_rng(7))
    np.testing.assert_array_equal(np.bincount(ya, minlength=3), quota)
    assert len(np.unique(xa)) == 35 and (y[xa[:, 0].astype(int)] == ya).all()
    np.testing.assert_array_equal(xa, xb)  # the public seed fixes which rows


def _membership(workdir, manifest, train, holdout):
    """The membership audit as a release stage runs it (``release_stages``): on the typed manifest's JSON."""
    return membership_audit_section(workdir, manifest.model_dump(mode="json"), train, holdout)


@pytest.fixture(scope="module")
def leaky_release(tmp_path_factory):
    """A tiny release through the real CLI (DirectRunner, test seed), noise off and l = 1: rows are copies of
    normalised input rows; the held-out rows come from the same generator."""
    d = tmp_path_factory.mktemp("membership")
    x, y = make_dataset(n_per_class=60, num_classes=3, dim=16, seed=0)
    xh, yh = make_dataset(n_per_class=60, num_classes=3, dim=16, seed=1)
    train, holdout = write_dataset(d / "train", x, y), write_dataset(d / "holdout", xh, yh)
    out = d / "release"
    res = run_cli(
        "release", "--input", train, "--output", out, "--sigma-x", "0", "--mixing-order", "1", "--seed", "5", *BEAM_ARGS
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads((out / "manifest.json").read_text()), train, holdout


def test_section_and_command_on_a_real_release(leaky_release, capsys):
    """Deterministic given the data: about 63 % of the members are copied exactly (T = N draws of one record), no
    held-out row is, so the AUC is about 0.8 and FN about 0.37 at FP 0."""
    out, manifest, train, holdout = leaky_release
    assert manifest["privacy"]["epsilon"] is None  # sigma_x 0: no claim
    canary = {"empirical_epsilon_lower_bound": 0.5, "violation": False}
    section = membership_audit_section(str(out), {**manifest, "audit": canary}, train, holdout, rows=1000)
    assert {k: section[k] for k in canary} == canary  # the canary audit's keys stay beside 'membership'
    m = section["membership"]
    assert m["outside_guarantee"] == OUTSIDE_GUARANTEE and "NOT covered by the guarantee" in m["note"]
    assert m["members"] == m["non_members"] == 180 and m["synthetic_rows"] == 180 and m["sample_seed"] == 0
    assert m["roc_auc"] > 0.7 and m["fp"] == 0.0 and 0.2 < m["fn"] < 0.55, m
    assert m["median_distance_members"] == 0.0 < m["median_distance_non_members"]
    assert m["empirical_epsilon_lower_bound"] > 1.0 and m["claimed_epsilon"] is None and m["violation"] is False
    json.dumps(section, allow_nan=False)  # what the manifest writer requires

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["audit-release", "--release", str(out), "--train", train, "--holdout", holdout, "--rows", "1000", "--json"]
    )
    capsys.readouterr()
    assert cmd_audit_release(args, []) == 0  # no claim, no violation
    printed = json.loads(capsys.readouterr().out)
    for key in ("roc_auc", "fp", "fn", "threshold", "empirical_epsilon_lower_bound", "members"):
        assert printed[key] == m[key], key
    # a claim the release cannot keep: the same figures, checked against eps 1, are a violation
    strict = membership_audit(
        str(out), {**manifest, "privacy": {**manifest["privacy"], "epsilon": 1.0}}, train, holdout
    )
    assert strict["violation"] and strict["claimed_epsilon"] == 1.0 and strict["swap_steps"] == 1
    # the same claim under add/remove covers the swap as two steps (what a poisson release's manifest states)
    relation = {"epsilon": 1.0, "neighbouring_relation": "add or remove one record (features and label)"}
    loose = membership_audit(str(out), {**manifest, "privacy": {**manifest["privacy"], **relation}}, train, holdout)
    assert loose["swap_steps"] == 2 and loose["test_epsilon"] == 2.0


def test_stage_in_a_release_run_and_table_of_errors(tmp_path, leaky_release):
    """The stage inside run_release (run directory, draft manifest): an honest release at eps 2 on the same data.
    Unless the release leaks, the AUC is 0.5 with sd 0.03 on 180 + 180 rows: |AUC - 0.5| < 0.2 fails at 6.7 sd
    (< 1e-10); a violation has probability <= 5 % by construction (nominal: the rows share one release), far less
    at this size, where even a null test almost never gives a bound above 0."""
    from dpcda.pipeline.release import Stage, run_release
    from dpcda.schemas.config import load_config
    from dpcda.storage.paths import expand_glob

    _, _, train, holdout = leaky_release
    cfg = load_config(None, {"input": train, "output": str(tmp_path / "honest"), "epsilon": 2.0, "seed": 3})
    stage = Stage("membership audit", "audit", lambda workdir, m: _membership(workdir, m, cfg.input, holdout))
    manifest = run_release(cfg, list(BEAM_ARGS), (stage,), eval_input=holdout).model_dump(mode="json")
    m = json.loads((tmp_path / "honest" / "manifest.json").read_text())["audit"]["membership"]
    assert m == manifest["audit"]["membership"]
    assert abs(m["roc_auc"] - 0.5) < 0.2 and not m["violation"] and m["claimed_epsilon"] <= 2.0, m
    assert m["empirical_epsilon_lower_bound"] <= m["max_detectable_epsilon"]
    assert m["max_detectable_epsilon"] == pytest.approx(max_detectable_epsilon(90, 90, m["test_delta"], ALPHA))

    from dpcda.evaluation.audit import AuditError

    with pytest.raises(AuditError, match="both training and held-out"):
        membership_audit(str(tmp_path / "honest"), manifest, train, expand_glob(train)[0])
    with pytest.raises(AuditError, match="at least 4"):
        membership_audit(str(tmp_path / "honest"), manifest, train, holdout, rows=3)


def test_a_table_release_is_audited_in_its_encoded_space(tmp_path):
    """A leaky table release (noise off, l = 1) of tests.test_tables' churn table, the stage run inside the release.
    Deterministic given the data: about 63 % of the members come back (decoded, then re-encoded) next to their own
    round-tripped row, a held-out row never does; the clip squeezes every row of this table close together (we saw
    medians 7e-5 and 2e-4, AUC 0.70, FP 0, FN 0.68, bound 2.3), so the margins are set below those."""
    import pyarrow.parquet as pq

    from dpcda.pipeline.release import Stage, run_release
    from dpcda.schemas.config import load_config
    from tests.test_tables import SCHEMA, make_table

    for name, seed in (("train", 0), ("holdout", 9)):
        (tmp_path / name).mkdir()
        pq.write_table(make_table(300, seed=seed), tmp_path / name / "part-0.parquet")
    train, holdout = str(tmp_path / "train" / "*.parquet"), str(tmp_path / "holdout" / "*.parquet")
    cfg = load_config(
        None,
        {
            "input": train,
            "output": str(tmp_path / "out"),
            # argmax: the audit re-encodes real rows by argmax, as the rows are decoded here (sampling would scatter
            # the clip-squeezed one-hot scores of this noise-free release away from their records' own values)
            "table": {**SCHEMA, "decoding": "argmax"},
            "mechanism": "dpcda",  # a table's default is marginals; this audits mixed rows
            "sigma_x": 0.0,
            "mixing_order": 1,
            "seed": 2,
        },
    )
    stage = Stage("membership audit", "audit", lambda workdir, m: _membership(workdir, m, cfg.input, holdout))
    m = run_release(cfg, list(BEAM_ARGS), (stage,), eval_input=holdout).audit["membership"]
    assert m["space"].startswith("table rows encoded") and m["members"] == m["non_members"] > 200, m
    assert m["space"].endswith("decoded (argmax) and re-encoded as the released rows were"), m
    assert m["roc_auc"] > 0.6 and m["median_distance_members"] < m["median_distance_non_members"] / 2, m
    assert m["fp"] < 0.05 and m["guess_member_when"] == "distance below threshold", m
    assert m["empirical_epsilon_lower_bound"] > 1.0 and m["synthetic_rows"] == 300, m
