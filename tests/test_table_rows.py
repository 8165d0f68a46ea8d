"""Table releases keep the label's base rate: DP-CDA rows per class in proportion to the class sizes (with the
accounting per class that follows), DPMix hard labels drawn from the released label scores, ``sample`` decoding."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dpcda.mechanisms.dpcda import proportional_rows
from dpcda.mechanisms.inprocess import first_pass, release_in_process
from dpcda.mechanisms.plan import PlanError
from dpcda.privacy.accounting import PLD_ROUNDOFF_SHARE, epsilon_of, make_accountant
from dpcda.privacy.calibration import calibrate_noise, calibrate_parallel
from dpcda.privacy.composition import release_events_from_json
from dpcda.privacy.events import MixingEvent
from dpcda.privacy.noise import key_from_test_seed
from dpcda.schemas.config import ConfigError, ReleaseConfig, load_config
from dpcda.schemas.table import parse_table_schema
from dpcda.storage.tables import decode_rows, decode_uniforms, encode_batch, label_uniforms
from tests.conftest import BEAM_ARGS, run_cli

SCHEMA = {
    "label": {"name": "churn", "categories": ["No", "Yes"]},
    "columns": [
        {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 72},
        {"name": "contract", "kind": "categorical", "categories": ["monthly", "yearly", "two-year"]},
        {"name": "senior", "kind": "boolean"},
    ],
}


def minority_table(n: int, rate: float = 0.2, seed: int = 0) -> pa.Table:
    """A churn-like table whose label 'Yes' (class 1) is ``rate`` of the rows."""
    rng = np.random.default_rng(seed)
    churn = (np.arange(n) < round(rate * n)).astype(np.int64)
    rng.shuffle(churn)
    tenure = np.where(churn == 1, rng.integers(0, 20, n), rng.integers(20, 73, n))
    contract = np.array(["monthly", "yearly", "two-year"])[np.where(churn == 1, 0, rng.integers(1, 3, n))]
    return pa.table(
        {
            "tenure": pa.array(tenure.astype(np.int64)),
            "contract": pa.array(contract.tolist(), type=pa.string()),
            "senior": pa.array((rng.random(n) < 0.2).tolist(), type=pa.bool_()),
            "churn": pa.array(np.array(["No", "Yes"])[churn].tolist(), type=pa.string()),
        }
    )


# ---------------------------------------------------------------- the rule


def test_proportional_rows_is_a_largest_remainder_rounding_with_a_row_per_nonempty_class():
    assert proportional_rows(100, [80, 20]) == (80, 20)
    # floors (3, 3, 3), remainders 10 * N_k mod 30 = (10, 10, 10): the one row left goes to the lowest index
    assert proportional_rows(10, [10, 10, 10]) == (4, 3, 3)
    # 9 * (14, 27, 59) / 100 = (1.26, 2.43, 5.31): floors (1, 2, 5), the one row left goes to class 1 (0.43)
    assert proportional_rows(9, [14, 27, 59]) == (1, 3, 5)
    # tiny classes still get one row each, taken from the largest; an empty class gets none
    assert proportional_rows(10, [1, 998, 1, 0]) == (1, 8, 1, 0)
    for total, sizes in [(7, [3, 0, 5, 1]), (1000, [1, 1, 1, 997]), (5, [2, 2, 2, 2, 2])]:
        rows = proportional_rows(total, sizes)
        assert sum(rows) == total
        assert all((r >= 1) == (n > 0) for r, n in zip(rows, sizes))
        assert all(abs(r - total * n / sum(sizes)) < 1 + 1e-9 or r == 1 for r, n in zip(rows, sizes))
    assert proportional_rows(2, [5, 5, 5]) is None  # fewer rows than non-empty classes
    assert proportional_rows(5, [0, 0]) is None


# ---------------------------------------------------------------- the config field


def _cfg(**kw):
    return ReleaseConfig(input="i", output="o", epsilon=1.0, **kw)


def test_class_rows_defaults_to_proportional_for_dpcda_tables_only():
    table = parse_table_schema(SCHEMA)
    assert _cfg().mechanism.class_rows == "equal"
    assert _cfg(table=table, mechanism="dpcda").mechanism.class_rows == "proportional"  # a table's default: marginals
    assert _cfg(table=table, mechanism="dpcda", class_rows="equal").mechanism.class_rows == "equal"
    assert "class_rows" not in _cfg(table=table, mechanism="dpmix", num_classes=2).mechanism.model_fields  # dpcda's
    assert _cfg(class_rows="proportional").mechanism.class_rows == "proportional"  # an image release may ask for it


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"class_rows": "half"}, "class_rows"),
        ({"class_rows": 1}, "class_rows"),
        (
            {"class_rows": "proportional", "mechanism": "dpmix", "num_classes": 2},
            "class_rows: a dpcda parameter; this release's mechanism is dpmix",
        ),
        ({"class_rows": "proportional", "mechanism": "local"}, "class_rows"),
    ],
)
def test_bad_class_rows_is_refused_naming_the_field(tmp_path, fields, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(fields))
    with pytest.raises(ConfigError, match=needle):
        load_config(str(cfg), {"input": "x", "output": "y", "epsilon": 1.0})


# ---------------------------------------------------------------- calibration over every class


def test_calibration_covers_a_class_that_is_not_the_smallest():
    """sizes (100, 1000), T_k (10, 20000): the larger class, with far more rows, is the worst; calibrating on the
    smallest class alone (the old rule) would overshoot it."""
    target, delta = 2.0, 1e-6

    def events(sigma):
        return [MixingEvent("fixed", 100, 10, 4, 1.0, sigma), MixingEvent("fixed", 1000, 20000, 4, 1.0, sigma)]

    smallest_only = calibrate_noise("fixed", lambda s: events(s)[:1], target_epsilon=target, delta=delta)
    assert epsilon_of("fixed", events(smallest_only)[1:], delta) > target  # the old rule's sigma is not enough
    sigma = calibrate_parallel("fixed", events, target_epsilon=target, delta=delta, first=lambda e: e.class_size)
    per_class = [epsilon_of("fixed", [e], delta) for e in events(sigma)]
    assert max(per_class) <= target
    assert max(per_class) > 0.99 * target  # the worst class is at the target, not far below it
    assert sigma == pytest.approx(calibrate_noise("fixed", lambda s: events(s)[1:], target_epsilon=target, delta=delta))


def test_equal_rows_calibrate_on_the_smallest_class_as_before():
    def events(sigma):
        return [MixingEvent("fixed", n, 50, 4, 1.0, sigma) for n in (300, 100, 200)]

    alone = calibrate_noise("fixed", lambda s: events(s)[1:2], target_epsilon=3.0, delta=1e-6)
    assert calibrate_parallel("fixed", events, target_epsilon=3.0, delta=1e-6, first=lambda e: e.class_size) == alone


# ---------------------------------------------------------------- in-process releases: the base rate


def _release(cfg_fields: dict, table: pa.Table, seed: int = 3):
    schema = parse_table_schema(cfg_fields.pop("table"))
    cfg = ReleaseConfig(input="in-process", output="in-process", seed=seed, table=schema, **cfg_fields)
    block = encode_batch(table, schema, "train", 0)
    key = key_from_test_seed(seed)
    feats, labels, plan, scores = release_in_process(
        block.features, block.labels, cfg.core, key, first=first_pass(block.features, block.labels)
    )
    x01 = feats.astype(np.float64) * plan.std + plan.mean
    labels = scores if scores is not None else labels
    sample = schema.decoding == "sample"
    uniforms = decode_uniforms(key, "t", len(x01), schema) if sample else None
    draws = label_uniforms(key, "t", len(x01)) if sample and scores is not None else None
    out = decode_rows(x01, labels, schema, table.schema, uniforms=uniforms, label_draws=draws)
    rate = out.column("churn").to_pylist().count("Yes") / out.num_rows
    return out, plan, rate


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_dpcda_proportional_rows_keep_a_20_percent_minority(mode):
    table = minority_table(2000)
    fields = dict(epsilon=10.0, mechanism="dpcda", mode=mode, mixing_order=4, num_classes=2)
    _, plan, rate = _release({**fields, "table": SCHEMA}, table)
    mix = plan.synthesis
    assert mix.class_rows == "proportional"
    if mode == "fixed":
        assert mix.samples_per_class == (1600, 400) and rate == 0.2
    else:  # T_k from the DP histogram (its share is 1 % of eps 10: a noise std near 100 on each count)
        assert abs(rate - 0.2) < 0.05 and sum(mix.samples_per_class) == plan.samples_total
    assert plan.accounting.epsilon <= 10.0
    _, plan_eq, rate_eq = _release({**fields, "class_rows": "equal", "table": SCHEMA}, table)
    assert rate_eq == 0.5 and len(set(plan_eq.synthesis.samples_per_class)) == 1


def test_dpmix_sampled_labels_follow_the_base_rate_where_argmax_erases_the_minority():
    table = minority_table(4000)
    fields = dict(epsilon=10.0, mechanism="dpmix", mixing_order=16, num_classes=2)
    _, _, sampled = _release({**fields, "table": SCHEMA}, table)
    _, _, argmax = _release({**fields, "table": {**SCHEMA, "decoding": "argmax"}}, table)
    assert argmax < 0.08  # the argmax of a mean of 16 labels: the minority wins only with 8+ of 16 draws
    assert abs(sampled - 0.2) < 0.06, sampled


def test_label_draws_are_their_own_stream_and_required():
    key = key_from_test_seed(1)
    schema = parse_table_schema(SCHEMA)
    assert not np.array_equal(label_uniforms(key, "t", 8), decode_uniforms(key, "t", 8, schema)[:, 0])
    scores = np.array([[0.8, 0.2]] * 4000)
    with pytest.raises(ValueError, match="label_uniforms"):
        decode_rows(np.zeros((4000, schema.encoded_width)), scores, schema, minority_table(10).schema,
                    uniforms=decode_uniforms(key, "t", 4000, schema))  # fmt: skip
    drawn = decode_rows(
        np.zeros((4000, schema.encoded_width)),
        scores,
        schema,
        minority_table(10).schema,
        uniforms=decode_uniforms(key, "t", 4000, schema),
        label_draws=label_uniforms(key, "t", 4000),
    )
    assert abs(drawn.column("churn").to_pylist().count("Yes") / 4000 - 0.2) < 0.03  # 6 sd


# ---------------------------------------------------------------- a release: the stated accounting, rechecked


def test_a_proportional_release_states_epsilon_that_covers_every_class(tmp_path):
    """Recomputed from the manifest alone: each class's mixing (its stated T_k rows at its stated q_k, z from the
    stated sigma_x) composed with the stated statistics events, plus the histogram's stated epsilon; the guarantee
    must cover the worst class."""
    d = tmp_path / "in"
    d.mkdir()
    table = minority_table(1500, seed=2)
    pq.write_table(table, d / "part-0.parquet")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"table": SCHEMA, "mechanism": "dpcda", "mode": "poisson", "mixing_order": 4}))
    res = run_cli(
        "release", "--config", cfg, "--input", d / "*.parquet", "--output", tmp_path / "out", "--epsilon", 4,
        *BEAM_ARGS,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    mech, priv = m["mechanism"], m["privacy"]
    assert mech["class_rows"] == "proportional" and mech["samples_per_class"] is None
    rows, rates = mech["rows_per_class"], mech["sampling_rates"]
    assert sum(rows) == mech["samples_total"] == m["output"]["rows"]
    assert rows[1] < rows[0]  # the minority keeps its share
    assert m["input"]["table"]["decoding"] == "sample"
    stated = release_events_from_json(priv["events"])
    assert [e.samples for e in stated.per_class] == rows  # the accounted events are the stated rows
    z = mech["sigma_x"] * mech["mixing_order"] / mech["clip"]
    acc_delta = priv["delta_breakdown"]["accountant"] / (1 - PLD_ROUNDOFF_SHARE)
    per_class = []
    for t, q in zip(rows, rates):
        acc = make_accountant("poisson")
        mixing = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), t
        )
        acc.compose(dp_accounting.ComposedDpEvent([e.to_dp_event() for e in stated.shared] + [mixing]))
        per_class.append(acc.get_epsilon(acc_delta) + priv["components"]["class_histogram"])
    assert max(per_class) <= priv["epsilon"] * (1 + 1e-6)
    assert priv["epsilon_this_histogram"] == pytest.approx(max(per_class), rel=1e-3)
    assert all(math.isfinite(e) for e in per_class)


def test_proportional_rows_refuse_fewer_rows_than_classes():
    table = minority_table(400)
    with pytest.raises(PlanError, match="--samples >= 2"):
        _release(dict(epsilon=10.0, mechanism="dpcda", mode="fixed", samples=1, num_classes=2, table=SCHEMA), table)


def test_a_class_with_no_rows_spends_nothing_and_sets_no_noise():
    """poisson: a class whose DP size is 0 gets no rows (its event is empty); calibration skips it."""

    def events(sigma):
        return [MixingEvent("poisson", 4, 0, 4, 1.0, sigma), MixingEvent("poisson", 500, 500, 4, 1.0, sigma)]

    sigma = calibrate_parallel("poisson", events, target_epsilon=3.0, delta=1e-6, first=lambda e: e.class_size)
    assert sigma == pytest.approx(calibrate_noise("poisson", lambda s: events(s)[1:], target_epsilon=3.0, delta=1e-6))
    assert epsilon_of("poisson", events(sigma), 1e-6) <= 3.0


def test_per_class_rows_of_another_length_than_the_classes_are_refused():
    from dpcda.mechanisms import registry

    with pytest.raises(ValueError):
        registry.get("dpcda").synthesis_events(
            "fixed", group_sizes=[100, 200, 300], samples=(10, 20), mixing_order=4, clip=1.0, sigma_x=1.0
        )
