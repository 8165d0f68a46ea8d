"""Residual codes (a nullable column's null, a categorical column's other bucket) that the data does not hold are not
drawn (``marginals.residual``), real ones are; a merged code decompresses in proportion to its codes' noisy counts
(``estimation.decompress``). Post-processing of the noisy one-way counts only."""

from __future__ import annotations

import numpy as np
import pytest

from dpcda.mechanisms.marginals import estimation
from dpcda.mechanisms.marginals.domain import domain_of, numeric_codes
from dpcda.mechanisms.marginals.estimation import code_weights, decompress
from dpcda.mechanisms.marginals.model import kept_rules_of
from dpcda.mechanisms.marginals.residual import absent_codes, residual_codes, stated_absent
from dpcda.mechanisms.marginals.rules import KeptRules, code_intervals
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.schemas.table import encode_numeric, parse_table_schema
from tests.test_tables import SCHEMA, make_table

RESIDUAL = {  # the table of tests.test_tables with tenure nullable (it holds no null) and an other bucket (none there)
    **SCHEMA,
    "columns": [
        {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 72, "nullable": True},
        {"name": "charges", "kind": "numeric", "lower": 0.0, "upper": 150.0, "nullable": True},
        {"name": "contract", "kind": "categorical", "categories": ["monthly", "yearly", "two-year"], "other": "misc"},
        {"name": "senior", "kind": "boolean"},
        {"name": "paperless", "kind": "boolean", "nullable": True},
    ],
}


def test_the_residual_codes_below_three_stds_are_absent_and_no_other_code_is():
    schema = parse_table_schema(RESIDUAL)
    dom = domain_of(
        schema, 4
    )  # tenure 4 bins + null, charges 4 + null, contract 3 + other, senior 2, paperless 2 + null
    assert residual_codes(schema, dom) == {0: {4: "null"}, 1: {4: "null"}, 2: {3: "other"}, 4: {2: "null"}}
    std = 10.0
    one_way = [
        np.array([0.0, 0.0, 50.0, 50.0, 29.9]),  # tenure: null below 3 stds; two empty bins stay (values, not residue)
        np.array([40.0, 40.0, 40.0, 40.0, 30.0]),  # charges: null at 3 stds is kept
        np.array([0.0, 90.0, 90.0, -12.0]),  # contract: a declared category at zero stays, the other bucket goes
        np.array([50.0, 50.0]),
        np.array([40.0, 40.0, 300.0]),  # paperless: many nulls, kept
    ]
    absent = absent_codes(schema, dom, one_way, std)
    assert absent == {0: (4,), 2: (3,)}
    assert stated_absent(schema, dom, absent) == {"tenure": ["null"], "contract": ["other"]}
    assert absent_codes(schema, dom, one_way, 0.0) == {}  # exact counts (no noise): nothing to tell apart


def test_a_merged_code_decompresses_in_proportion_to_its_codes_clamped_noisy_counts():
    mapping = {0: np.array([0, 1, 2, 2, 2])}  # codes 2, 3, 4 merged into compressed code 2
    codes = np.array([[2]] * 4000 + [[0]] * 10 + [[1]] * 10, np.int64)
    stream = lambda: NoiseStream(key_from_test_seed(4), "test", "decompress")  # noqa: E731
    w = code_weights([np.array([5.0, 5.0, -3.0, 30.0, 10.0])])
    got = decompress(codes, mapping, stream(), w)[:, 0]
    assert set(got[4000:4010]) == {0} and set(got[4010:]) == {1}  # kept codes map to themselves
    share = np.bincount(got[:4000], minlength=5) / 4000
    assert share[2] == 0.0  # a negative noisy count: no mass
    assert abs(share[3] - 0.75) < 0.03 and abs(share[4] - 0.25) < 0.03
    absent = code_weights([np.array([5.0, 5.0, -3.0, 30.0, 10.0])], {0: (3,)})
    assert set(decompress(codes, mapping, stream(), absent)[:4000, 0]) == {4}  # an absent code is never drawn
    none = code_weights([np.array([5.0, 5.0, -3.0, -1.0, 0.0])])
    assert set(decompress(codes, mapping, stream(), none)[:4000, 0]) == {2, 3, 4}  # all at most zero: uniform
    assert set(decompress(codes, mapping, stream())[:4000, 0]) == {2, 3, 4}  # without weights: uniform


@pytest.fixture(scope="module")
def residual_release(tmp_path_factory):
    """A 3000-row table with a nullable column that holds no null and an other bucket that holds no value, released
    (and kept) at eps 1, seeded."""
    import dpcda

    out = tmp_path_factory.mktemp("residual") / "rel"
    table = make_table(3000, seed=1)
    dpcda.release(table, epsilon=1.0, mechanism="marginals", schema=RESIDUAL, seed=5, marginals_bins=4, output=str(out))
    return table, out


def test_a_release_draws_no_absent_residual_code_and_keeps_the_real_nulls(residual_release, monkeypatch):
    import pyarrow.parquet as pq

    import dpcda

    table, out = residual_release
    model = dpcda.load(out)
    mech = model.manifest["mechanism"]
    assert mech["absent_codes"] == {"tenure": ["null"], "contract": ["other"]}
    kept = kept_rules_of(model.model)  # the saved model rebuilds the release's absent codes from its noisy counts
    assert kept is not None and kept.absent == {0: (4,), 2: (3,)}
    want = code_weights(model.model.one_way, kept.absent)
    seen = []

    def recording(codes, mapping, stream, weights=None):
        seen.append(weights)
        return decompress(codes, mapping, stream, weights)

    monkeypatch.setattr(estimation, "decompress", recording)
    released = pq.read_table(out / "synthetic")
    for synthetic in (released, model.sample(20000, seed=1), model.sample(5000)):  # the saved model's draws too
        assert synthetic.column("tenure").null_count == 0
        assert "misc" not in set(synthetic.column("contract").to_pylist())
        for name in ("charges", "paperless"):  # 10 % and 14 % real nulls: kept
            real = table.column(name).null_count / table.num_rows
            assert abs(synthetic.column(name).null_count / synthetic.num_rows - real) <= 0.03, name
    assert seen and all(len(w) == len(want) and all(np.array_equal(a, b) for a, b in zip(w, want)) for w in seen)


def test_a_residual_code_a_rule_needs_stays_allowed():
    """{if: internet none, then: backup null}: backup's null absent would forbid internet's declared value 'none'."""
    schema = parse_table_schema(
        {
            "label": {"name": "y", "categories": ["a", "b"]},
            "columns": [
                {"name": "internet", "kind": "categorical", "categories": ["dsl", "none"]},
                {"name": "backup", "kind": "categorical", "categories": ["yes", "no"], "nullable": True},
                {"name": "phone", "kind": "boolean", "nullable": True},
            ],
            "rules": [{"if": {"internet": "none"}, "then": {"backup": None}}],
        }
    )
    dom = domain_of(schema, 4)
    kept = KeptRules(schema, dom, absent={1: (2,), 2: (2,)})
    assert kept.absent == {2: (2,)}  # phone's null goes; backup's stays, the rule needs it
    codes = np.array([[1, 2, 0, 0], [0, 0, 1, 1], [0, 1, 2, 0]])  # internet none with backup null; ...; phone null
    assert kept.holds(codes).tolist() == [True, True, False]


def test_spike_codes_come_first_with_or_without_declared_edges():
    """A numeric column's codes are its spikes, then its bins (declared edges, or the mechanism's equal bins)."""
    both = {"name": "v", "kind": "numeric", "lower": 0, "upper": 20, "spikes": [0.0, 12.0], "edges": [0, 10, 20]}
    plain = {"name": "v", "kind": "numeric", "lower": 0, "upper": 20, "spikes": [0.0, 12.0]}
    for col, bins in ((both, 2), (plain, 4)):
        schema = parse_table_schema({"label": {"name": "y", "categories": ["a", "b"]}, "columns": [col]})
        c = schema.columns[0]
        assert domain_of(schema, 4).sizes[0] == 2 + bins
        values = np.array([0.0, 12.0, 3.0, 19.0])
        got = numeric_codes(c, encode_numeric(c, values).astype(np.float32), 4)
        assert got.tolist() == [0, 1, 2, 1 + bins]
        lo, hi = code_intervals(c, 4, integer=False)
        assert len(lo) == 2 + bins and lo[:2].tolist() == hi[:2].tolist() == [0.0, 12.0]
        assert lo[2] > 0 and hi[-1] < 20 and hi[2] < lo[3]  # bins a little inside their edges
