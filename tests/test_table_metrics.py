"""Table metrics (evaluation.table_metrics): what an analyst reads off a released table, label included."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dpcda.evaluation.table_metrics import BINS, codes, table_metrics, tvd
from dpcda.evaluation.tabular import evaluate_tables
from dpcda.schemas.table import parse_table_schema
from tests.test_tables import SCHEMA, make_table


def test_the_same_table_scores_zero_distance_and_full_fidelity():
    schema = parse_table_schema(SCHEMA)
    t = make_table(400)
    m = table_metrics(t, t, schema)
    assert m["one_way_tvd_mean"] == m["two_way_tvd_mean"] == m["base_rate"]["max_gap"] == 0.0
    assert m["fidelity"] == 1.0 and set(m["two_way_tvd_label"]) == {c["name"] for c in SCHEMA["columns"]}


def test_a_label_unlinked_from_the_features_shows_in_the_label_pairs_only():
    """Every column's own frequencies kept, the label shuffled against the rows: one-way distances stay 0, the
    label's cross-tabs move (the old correlation gap left the label out and could not see this)."""
    schema = parse_table_schema(SCHEMA)
    real = make_table(2000)
    perm = np.random.default_rng(1).permutation(real.num_rows)
    shuffled = real.set_column(real.schema.get_field_index("churn"), "churn", real.column("churn").take(perm))
    m = table_metrics(real, shuffled, schema)
    assert m["one_way_tvd_mean"] == 0.0 and m["base_rate"]["max_gap"] == 0.0
    assert m["two_way_tvd_label"]["tenure"] > 0.3 and m["two_way_tvd_label"]["contract"] > 0.3
    assert m["two_way_tvd_label_mean"] > m["two_way_tvd_mean"] > 0


def test_a_table_collapsed_to_the_majority_class_is_seen_by_base_rate_and_balanced_accuracy():
    schema = parse_table_schema(SCHEMA)
    real = make_table(1000)
    churn = real.column("churn").to_pylist()
    majority = max(set(churn), key=churn.count)
    synth = real.set_column(
        real.schema.get_field_index("churn"), "churn", pa.array([majority] * real.num_rows, pa.string())
    )
    m = table_metrics(real, synth, schema)
    share = churn.count(majority) / len(churn)
    assert m["base_rate"]["max_gap"] == pytest.approx(1 - share)
    figures = evaluate_tables(synth, real, schema)
    assert figures["balanced_accuracy"] == 0.5 and figures["label_base_rate_gap"] == pytest.approx(1 - share)
    assert figures["accuracy"] == pytest.approx(share)  # plain accuracy rewards the collapse: kept, not headlined


def test_numbers_are_binned_on_the_public_bounds_and_nulls_are_a_value():
    schema = parse_table_schema(SCHEMA)
    t = pa.table(
        {
            "tenure": pa.array([-5, 0, 71.9, 72, 500], pa.float64()),
            "charges": pa.array([None, 0.0, 7.5, 149.9, 150.0]),
            "contract": pa.array(["monthly", None, "yearly", "two-year", "monthly"]),
            "churn": pa.array(["No", "Yes", "No", "No", "Yes"]),
            "senior": pa.array([True, False, True, False, True]),
            "paperless": pa.array([None, True, False, None, True]),
        }
    )
    c = codes(t, schema)
    assert c["tenure"][0].tolist() == [0, 0, BINS - 1, BINS - 1, BINS - 1]  # clipped into the declared range
    assert c["charges"][0].tolist() == [BINS, 0, 1, BINS - 1, BINS - 1]  # null: a code of its own
    assert c["contract"][0].tolist() == [0, 3, 1, 2, 0] and c["paperless"][0].tolist() == [2, 1, 0, 2, 1]
    assert tvd(np.array([0, 0]), np.array([1, 1]), 2) == 1.0 and tvd(np.array([0, 1]), np.array([1, 0]), 2) == 0.0
