"""The marginals mechanism (MST on tables): codes, counts, the exact exponential mechanism, accounting, a release."""

from __future__ import annotations

import math
import pickle
from fractions import Fraction

import dp_accounting
import numpy as np
import pyarrow as pa
import pytest
from dp_accounting import rdp
from scipy import stats

from dpcda.mechanisms import marginals as mg
from dpcda.mechanisms.base import PlanError
from dpcda.privacy.accounting import RDP_ORDERS
from dpcda.privacy.exponential import Bits, bernoulli, bernoulli_exp, exact_epsilon, exponential_mechanism
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.schemas.config import ConfigError, load_config
from dpcda.schemas.table import parse_table_schema
from dpcda.storage.tables import decode_rows, decode_uniforms, encode_batch
from tests.test_tables import SCHEMA, make_table

KEY = key_from_test_seed(1234)
P_MIN = 1e-4  # every statistical test below fails falsely with probability about 1e-4 (fixed keys: reproducible)


def bits(*path) -> Bits:
    return Bits(NoiseStream(KEY, "test", *path))


# ---------------------------------------------------------------- the exact samplers


def test_bernoulli_of_a_rational_has_its_probability():
    for p, n in ((Fraction(1, 3), 6000), (Fraction(0), 200), (Fraction(1), 200), (Fraction(7, 2**70), 200)):
        b = bits("bernoulli", str(p))
        hits = sum(bernoulli(b, p) for _ in range(n))
        if p in (0, 1):
            assert hits == n * p
        else:
            assert stats.binomtest(hits, n, float(p)).pvalue >= P_MIN
    with pytest.raises(ValueError):
        bernoulli(bits("x"), Fraction(3, 2))


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(3, 10), Fraction(1), Fraction(5, 2)])
def test_bernoulli_exp_is_exp_minus_gamma(gamma):
    b, n = bits("exp", str(gamma)), 6000
    hits = sum(bernoulli_exp(b, gamma) for _ in range(n))
    if gamma == 0:
        assert hits == n
    else:
        assert stats.binomtest(hits, n, math.exp(-gamma)).pvalue >= P_MIN


def test_the_exponential_mechanism_has_its_distribution():
    """Chi-square of 20,000 draws against exp(eps q / 2): a wrong factor (eps q, or no 1/2) fails by thousands."""
    scores = [Fraction(0), Fraction(1), Fraction(2), Fraction(5), Fraction(11, 2)]
    b, n = bits("em"), 20000
    draws = np.bincount(
        [exponential_mechanism(scores, epsilon=Fraction(1), sensitivity=Fraction(1), bits=b) for _ in range(n)],
        minlength=len(scores),
    )
    w = np.exp(np.array([float(s) for s in scores]) / 2.0)
    expected = n * w / w.sum()
    assert stats.chisquare(draws, expected).pvalue >= P_MIN
    wrong = n * np.exp(np.array([float(s) for s in scores])) / np.exp(np.array([float(s) for s in scores])).sum()
    assert stats.chisquare(draws, wrong).pvalue < 1e-12  # the test can tell the factor 1/2 apart


def test_the_sampler_is_a_function_of_the_stream_and_refuses_nonsense():
    scores = [Fraction(k) for k in range(40)]
    one = [exponential_mechanism(scores, epsilon=Fraction(1, 4), sensitivity=Fraction(1), bits=bits("s")) for _ in "ab"]
    b = bits("s")
    two = [exponential_mechanism(scores, epsilon=Fraction(1, 4), sensitivity=Fraction(1), bits=b) for _ in "ab"]
    assert one[0] == two[0]  # the same stream draws the same candidate
    with pytest.raises(ValueError):
        exponential_mechanism(scores, epsilon=Fraction(0), sensitivity=Fraction(1), bits=b)
    with pytest.raises(ValueError):
        exponential_mechanism([], epsilon=Fraction(1), sensitivity=Fraction(1), bits=b)
    assert exact_epsilon(0.3) <= Fraction(0.3) and Fraction(0.3) - exact_epsilon(0.3) < Fraction(1, 2**30)
    assert exact_epsilon(0.3).denominator <= 2**30


# ---------------------------------------------------------------- codes and counts


def _encoded(n=400, seed=0):
    schema = parse_table_schema(SCHEMA)
    table = make_table(n, seed)
    block = encode_batch(table, schema, "t.parquet", 0)
    return schema, table, block


def test_codes_are_the_public_bins_of_each_column():
    schema, table, block = _encoded()
    codes = mg.codes_of(block.features, block.labels, schema, 20)
    dom = mg.domain_of(schema, 20)
    assert dom.names == ("tenure", "charges", "contract", "senior", "paperless", "churn")
    assert dom.sizes == (20, 21, 3, 2, 3, 2)
    tenure = np.array(table.column("tenure").to_pylist(), np.float64)
    assert np.array_equal(codes[:, 0], np.minimum(np.floor(tenure / 72 * 20), 19))
    charges = table.column("charges").to_pylist()
    want = [20 if v is None else min(int(v / 150 * 20), 19) for v in charges]
    assert np.array_equal(codes[:, 1], want)
    cats = ["monthly", "yearly", "two-year"]
    assert np.array_equal(codes[:, 2], [cats.index(v) for v in table.column("contract").to_pylist()])
    assert np.array_equal(codes[:, 3], np.array(table.column("senior").to_pylist(), np.int64))
    assert np.array_equal(codes[:, 4], [2 if v is None else int(v) for v in table.column("paperless").to_pylist()])
    assert np.array_equal(codes[:, 5], block.labels)
    assert all((codes[:, j] < dom.sizes[j]).all() and (codes[:, j] >= 0).all() for j in range(len(dom.sizes)))


def test_the_combiner_counts_what_numpy_counts_across_random_bundles():
    """tft's pattern: the CombineFn pickled, fed random splits of the rows, accumulators merged in random order."""
    from dpcda.transforms.marginals import _CountFn

    schema, table, block = _encoded(n=1000, seed=3)
    fn = pickle.loads(pickle.dumps(_CountFn(schema, 20)))
    rng = np.random.default_rng(5)
    cuts = np.sort(rng.choice(np.arange(1, 1000), 6, replace=False))
    accs = []
    for part in np.split(np.arange(1000), cuts):
        acc = fn.create_accumulator()
        for rows in np.array_split(part, 2):
            acc = fn.add_input(acc, type(block)(block.features[rows], block.labels[rows], "t", 0))
        accs.append(acc)
    rng.shuffle(accs)
    merged = fn.extract_output(fn.merge_accumulators(iter(accs)))
    codes = mg.codes_of(block.features, block.labels, schema, 20)
    counter = fn.counter
    for j, size in enumerate(counter.domain.sizes):
        assert np.array_equal(counter.marginal(merged, (j,)), np.bincount(codes[:, j], minlength=size))
    for a, b in counter.domain.pairs:
        want = np.zeros((counter.domain.sizes[a], counter.domain.sizes[b]), np.int64)
        np.add.at(want, (codes[:, a], codes[:, b]), 1)
        assert np.array_equal(counter.marginal(merged, (a, b)), want), (a, b)
    assert merged.sum() == 1000 * (len(counter.cliques))


def test_decoded_rows_have_the_input_schema_and_land_in_their_bins():
    schema, table, block = _encoded(n=600, seed=2)
    codes = mg.codes_of(block.features, block.labels, schema, 20)
    x, y = mg.rows_of(codes, schema, 20, NoiseStream(bytes(32), "values"), integers=frozenset({"tenure"}))
    # a release's rows are exact one-hot codes: sample decoding (the table default) reads them as argmax does
    uniforms = decode_uniforms(bytes(32), "t", len(x), schema)
    back = decode_rows(x.astype(np.float64), y, schema, table.schema, uniforms=uniforms)
    argmax = schema.model_copy(update={"decoding": "argmax"})
    assert back.equals(decode_rows(x.astype(np.float64), y, argmax, table.schema))
    assert back.schema.equals(table.schema)
    again = mg.codes_of(encode_batch(back, schema, "b", 0).features, y, schema, 20)
    assert np.array_equal(again, codes)  # every value decodes inside its own bin, nulls and categories kept
    tenure = np.array(back.column("tenure").to_pylist())
    assert tenure.min() >= 0 and tenure.max() <= 72
    assert not np.array_equal(tenure, np.array(table.column("tenure").to_pylist()))  # drawn, not copied


EDGES = {
    "label": {"name": "y", "categories": ["a", "b"]},
    "columns": [
        {"name": "expenses", "kind": "numeric", "lower": 0, "upper": 200},  # 70, 90, 130, ...: encodings round down
        {"name": "age", "kind": "numeric", "lower": 18, "upper": 80},  # edges 21.1, 24.2, ...: not integers
        {"name": "table", "kind": "numeric", "lower": 40.0, "upper": 100.0, "nullable": True},  # 43, 46, ...: edges
    ],
}


def test_a_value_on_a_bin_edge_is_coded_in_the_bin_above_as_the_table_metrics_bin_it():
    """Codes read off the float32 encoding as floor(x * bins) put 70 in [0, 200] (0.35 -> 0.34999999) in the bin
    below its own: 5 % of a real table's rows (credit_data's Expenses) in another bin than the analyst's."""
    from dpcda.evaluation.table_metrics import codes as metric_codes

    schema = parse_table_schema(EDGES)
    n = 201
    table = pa.table(
        {
            "expenses": pa.array(np.arange(n, dtype=np.int64)),
            "age": pa.array(np.arange(n, dtype=np.int64) % 63 + 18),
            "table": pa.array([None if k % 50 == 0 else 40.0 + 0.5 * (k % 121) for k in range(n)], pa.float64()),
            "y": pa.array(["a", "b"] * 100 + ["a"]),
        }
    )
    block = encode_batch(table, schema, "t.parquet", 0)
    ours = mg.codes_of(block.features, block.labels, schema, 20)
    theirs = metric_codes(table, schema)
    for j, col in enumerate(schema.columns):
        assert np.array_equal(ours[:, j], theirs[col.name][0]), col.name
    old = np.minimum(np.floor(block.features[:, 0].astype(np.float64) * 20), 19)
    assert np.flatnonzero(old != ours[:, 0]).tolist() == [70, 90, 130, 140, 180, 190]  # the old reading: a bin low
    # every integer's bin in integer_bins is its code's, and values drawn inside a bin code back to it
    col = schema.columns[0]
    tab = mg.integer_bins(col, 20)
    assert [len(t) for t in tab] == [10] * 19 + [11] and {round(float(v) * 200) for v in tab[7]} == set(range(70, 80))
    edges = mg.encoded_edges(col, 20)
    codes = np.repeat(np.arange(20), 500)
    for u in (np.zeros(codes.size), np.nextafter(np.ones(codes.size), 0), np.linspace(0, 1, codes.size, False)):
        x = mg.inside_bins(codes, u, edges)
        assert x.dtype == np.float32 and x.min() >= 0 and x.max() <= 1
        assert np.array_equal(np.searchsorted(edges[1:-1], x, side="right"), codes)
    # bounds too narrow for their magnitude: float32 edges repeat, an empty bin gets its edge, inside [0, 1]
    narrow = parse_table_schema(
        {"label": EDGES["label"], "columns": [{"name": "c", "kind": "numeric", "lower": 1e15, "upper": 1e15 + 0.25}]}
    ).columns[0]
    edges = mg.encoded_edges(narrow, 20)
    assert len(np.unique(edges)) < 21
    x = mg.inside_bins(np.arange(20), np.zeros(20), edges)
    assert x.min() >= 0 and x.max() <= 1 and np.array_equal(x, edges[:-1])


def test_an_empty_integer_bin_gets_its_nearest_integer():
    col = parse_table_schema(
        {
            "label": {"name": "y", "categories": [0, 1]},
            "columns": [{"name": "k", "kind": "numeric", "lower": 0, "upper": 3}],
        }
    ).columns[0]
    table = mg.integer_bins(col, 8)
    assert len(table) == 8 and all(len(t) >= 1 for t in table)
    assert {round(float(v) * 3) for t in table for v in t} == {0, 1, 2, 3}


def test_rows_are_sampled_in_blocks_from_a_carried_seed_and_the_callers_generator_is_left_alone():
    """A release of N rows never asks mbi for more than ``block_rows`` at once (memory flat in N); the blocks are a
    function of the key (the generator carried from block to block), and numpy's global state is the caller's."""

    class Model:  # stands in for mbi's fitted model: synthetic_data draws from numpy's global generator, as mbi's does
        asked = []

        def synthetic_data(self, rows):
            self.asked.append(rows)
            cols = {0: np.random.randint(0, 5, rows), 1: np.random.randint(0, 2, rows)}  # named by index, as mbi's

            class Data:
                def to_dict(_):
                    return cols

            return Data()

    plan = mg.MarginalsPlan("mst", mg.Domain(("a", "y"), (5, 2), 20), 1, 0.1, None)
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    blocks = list(mg.sample_codes(Model(), 120, plan, KEY, block_rows=50))
    assert Model.asked == [50, 50, 20] and [b.shape for b in blocks] == [(50, 2), (50, 2), (20, 2)]
    assert np.array_equal(np.random.get_state()[1], before)
    again = np.concatenate(list(mg.sample_codes(Model(), 120, plan, KEY, block_rows=50)))
    assert np.array_equal(np.concatenate(blocks), again)
    assert not np.array_equal(blocks[0], blocks[1])  # carried on, not reseeded per block
    other = np.concatenate(list(mg.sample_codes(Model(), 120, plan, key_from_test_seed(1), block_rows=50)))
    assert not np.array_equal(again, other)


# ---------------------------------------------------------------- selection


def test_mst_picks_a_spanning_tree_and_prefers_the_dependent_pairs():
    rng = np.random.default_rng(0)
    n = 4000
    a = rng.integers(0, 3, n)
    b = (a + (rng.random(n) < 0.1)) % 3  # b follows a
    c = rng.integers(0, 2, n)
    d = np.where(rng.random(n) < 0.9, c, 1 - c)  # d follows c
    codes = np.stack([a, b, c, d], 1)
    dom = mg.Domain(("a", "b", "c", "d"), (3, 3, 2, 2), 20)
    counter = mg.MarginalCounter(dom)
    acc = counter.add(counter.create(), codes)
    one_way = [counter.marginal(acc, (i,)).astype(np.float64) for i in range(4)]
    scores = mg.independence_scores(counter, acc, one_way)
    assert scores[(0, 1)] > scores[(0, 2)] and scores[(2, 3)] > scores[(1, 3)]
    picked = mg.select_mst(scores, 4, 2.0, bits("mst"))
    assert len(picked) == 3 and {(0, 1), (2, 3)} <= set(picked)
    forest = mg._DisjointSet(4)
    for x, y in picked:
        assert forest.find(x) != forest.find(y)
        forest.union(x, y)


def test_mst_label_measures_the_label_pairs_from_the_same_share():
    from dpcda.privacy.marginals import split

    dom = mg.Domain(("a", "b", "y"), (3, 2, 2), 20)
    counter = mg.MarginalCounter(dom)
    rng = np.random.default_rng(1)
    acc = counter.add(counter.create(), np.stack([rng.integers(0, s, 500) for s in dom.sizes], 1))
    for selection, two_way in (("mst", 2), ("mst-label", 4)):
        assert mg.label_pairs(selection, 3) + 2 == two_way
        ev = split(1.0, one_way=3, rounds=2, two_way=two_way)
        plan = mg.MarginalsPlan(selection, dom, 10, ev.rho, ev)
        m = mg.measure(counter, acc, plan, KEY)
        assert len(m.pairs) == two_way and len(m.two_way) == two_way
        if selection == "mst-label":
            assert m.pairs[2:] == [(0, 2), (1, 2)]
            assert m.two_way[2].shape == (3, 2)
        assert ev.two_way_std == pytest.approx(math.sqrt(two_way / (2 * ev.rho / 3)))


def test_mst_compresses_cells_its_noisy_counts_cannot_tell_from_empty_and_decompresses_uniformly():
    """private-pgm's compress_domain: one-way cells below 3 stds merged (post-processing of the noisy counts), the pairs
    measured on the merged codes (a record still in one cell: sensitivity 1), codes mapped back uniformly."""
    from dpcda.privacy.marginals import split

    dom = mg.Domain(("a", "b", "y"), (6, 4, 2), 20)
    counter = mg.MarginalCounter(dom)
    rng = np.random.default_rng(2)
    n = 4000
    a = rng.choice(6, n, p=[0.5, 0.5, 0, 0, 0, 0])  # codes 2 to 5 empty
    codes = np.stack([a, rng.integers(0, 4, n), (a + rng.integers(0, 2, n)) % 2], 1)
    acc = counter.add(counter.create(), codes)
    ev = split(10.0, one_way=3, rounds=2, two_way=4)
    mapping = mg.compression([counter.marginal(acc, (i,)).astype(float) for i in range(3)], ev.one_way_std)
    assert list(mapping) == [0] and mapping[0].tolist() == [0, 1, 2, 2, 2, 2]
    noisy = [np.array([0.5, 9.0, 2.9]), np.array([0.0, 0.0]), np.array([3.0, 0.1]), np.array([4.0, 5.0])]
    comp = mg.compression(noisy, 1.0)
    assert comp[0].tolist() == [1, 0, 1] and comp[1].tolist() == [0, 0]  # nothing kept: one code
    assert comp[2].tolist() == [0, 1] and 3 not in comp  # 3 stds is kept; nothing merged: left out
    small = mg.CompressedCounter(counter, mapping)
    assert small.domain.sizes == (3, 4, 2)
    for clique in ((0,), (0, 1), (0, 2), (1, 2)):
        mapped = codes.copy()
        mapped[:, 0] = mapping[0][codes[:, 0]]
        want = np.zeros(tuple(small.domain.sizes[c] for c in clique), np.int64)
        np.add.at(want, tuple(mapped[:, c] for c in clique), 1)
        assert np.array_equal(small.marginal(acc, clique), want), clique
    plan = mg.MarginalsPlan("mst-label", dom, 10, ev.rho, ev)
    m = mg.measure(counter, acc, plan, KEY)
    assert list(m.mapping) == [0] and m.mapping[0].tolist() == [0, 1, 2, 2, 2, 2]  # the empty codes merged
    assert [y.shape for y in m.two_way if y.shape[0] in (3, 6)] and all(
        y.shape[0] == 3 for (i, _), y in zip(m.pairs, m.two_way) if i == 0
    )  # the pairs measured on the merged codes
    assert [len(y) for y in m.one_way] == [6, 4, 2]  # the one-way counts as measured: the full domain
    # decompressing: kept codes to their own, the merged code uniformly over the merged ones
    back = mg.decompress(np.stack([np.repeat([0, 1, 2], 4000), np.zeros(12000, np.int64)], 1), {0: mapping[0]},
                         NoiseStream(KEY, "decompress"))  # fmt: skip
    assert np.array_equal(back[:8000, 0], np.repeat([0, 1], 4000)) and not back[:, 1].any()
    drawn = np.bincount(back[8000:, 0], minlength=6)
    assert drawn[:2].sum() == 0 and stats.chisquare(drawn[2:]).pvalue >= P_MIN
    inter = mg.compression([np.array([0.5, 9.0, 2.9, 8.0])], 1.0)  # merged codes between kept ones
    assert inter[0].tolist() == [2, 0, 2, 1]
    back = mg.decompress(np.array([[0], [1], [2]] * 100), inter, NoiseStream(KEY, "decompress", "inter"))
    assert back[0::3, 0].tolist() == [1] * 100 and back[1::3, 0].tolist() == [3] * 100  # the k-th kept code
    assert set(back[2::3, 0].tolist()) == {0, 2}


# ---------------------------------------------------------------- accounting


def test_the_split_is_mst_thirds_and_the_epsilon_is_dp_accountings():
    """Recomputed with dp_accounting directly: Gaussians of multiplier std (sensitivity 1 each) and zCDP rounds."""
    from dpcda.privacy.accounting import accountant_delta
    from dpcda.privacy.marginals import calibrate

    delta = accountant_delta(1e-5)
    ev = calibrate(target_epsilon=2.0, delta=delta, one_way=6, rounds=5, two_way=5)
    third = ev.rho / 3
    assert ev.one_way_std == pytest.approx(math.sqrt(6 / (2 * third)), rel=1e-6)
    assert ev.two_way_std == pytest.approx(math.sqrt(5 / (2 * third)), rel=1e-6)
    assert 5 * ev.round_epsilon**2 / 8 == pytest.approx(third, rel=1e-6)
    acc = rdp.RdpAccountant(RDP_ORDERS, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.GaussianDpEvent(ev.one_way_std), 6)
    acc.compose(dp_accounting.ZCDpEvent(ev.round_epsilon**2 / 8), 5)
    acc.compose(dp_accounting.GaussianDpEvent(ev.two_way_std), 5)
    eps = acc.get_epsilon(delta)
    assert 2.0 * (1 - 2e-3) <= eps <= 2.0  # calibrated to the target, never over it


# ---------------------------------------------------------------- refusals


def _cfg(**kw):
    return load_config(None, {"input": "x", "output": "o/r", "mechanism": "marginals", "epsilon": 1.0, **kw})


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"table": None}, "table: marginals counts a table's columns"),
        ({"table": SCHEMA, "mode": "fixed"}, "mode: marginals offers mode poisson only (its counts are accounted"),
        ({"table": SCHEMA, "epsilon": None, "sigma_x": 0.0}, "epsilon: marginals calibrates"),
        ({"table": SCHEMA, "normalization": "public", "normalization_file": "n.json"}, "normalization: marginals"),
        ({"table": SCHEMA, "mixing_path": "join"}, "mixing_path: marginals does not mix"),
        ({"table": SCHEMA, "audit": True}, "audit: no audit game"),
        ({"table": SCHEMA, "projection": "dp-pca:2"}, "projection:"),
        ({"table": SCHEMA, "marginals_bins": 1}, "marginals_bins"),
        ({"table": SCHEMA, "marginals_bins": True}, "marginals_bins: expected an integer, got a boolean"),
        ({"table": SCHEMA, "marginals_bins": "many"}, "marginals_bins"),
        ({"table": SCHEMA, "marginals_bins": 5000}, "marginals_bins"),
        ({"table": SCHEMA, "marginals_iters": 0}, "marginals_iters"),
        ({"table": SCHEMA, "marginals_iters": False}, "marginals_iters: expected an integer, got a boolean"),
        ({"table": SCHEMA, "marginals_selection": "greedy"}, "marginals_selection"),
        ({"table": SCHEMA, "mixing_order": 4}, "mixing_order: marginals does not mix records"),
        ({"table": SCHEMA, "marginals_selection": "aim", "marginals_max_model_size": 0}, "marginals_max_model_size"),
    ],
)
def test_bad_marginals_configs_are_one_line_errors(fields, needle):
    with pytest.raises(ConfigError) as err:
        _cfg(**fields)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_good_marginals_config_defaults_to_add_remove():
    cfg = _cfg(table=SCHEMA)
    assert cfg.mode == "poisson" and cfg.mechanism.selection == "mst-label" and cfg.mechanism.bins == 20


def test_too_many_cells_are_refused_before_work(monkeypatch):
    monkeypatch.setattr(mg.limits, "MAX_CELLS", 100)
    with pytest.raises(PlanError, match="^marginals: the one- and two-way counts of this table take"):
        mg.Marginals().check_before_work(_cfg(table=SCHEMA).core, 0)


# ---------------------------------------------------------------- a release, end to end


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A DirectRunner release of a 3000-row table through the Python API (one mbi compile, about 15 s)."""
    import dpcda

    table = make_table(3000, seed=1)
    rel = dpcda.release(table, epsilon=20, mechanism="marginals", schema=SCHEMA, seed=7)
    return table, rel


def test_a_release_keeps_the_schema_the_marginals_and_the_base_rate(released):
    from dpcda.evaluation.table_metrics import table_metrics

    table, rel = released
    out = rel.table
    assert out.schema.remove_metadata().equals(table.schema)
    assert abs(out.num_rows - 3000) < 100  # the DP row count (the fitted model's total)
    m = table_metrics(table, out, parse_table_schema(SCHEMA))
    assert max(m["one_way_tvd"].values()) < 0.05, m["one_way_tvd"]
    assert m["base_rate"]["max_gap"] < 0.03, m["base_rate"]
    assert m["two_way_tvd_label"]["contract"] < 0.05  # the label's strongest pair is measured and kept
    tenure = np.array(out.column("tenure").to_pylist())
    assert tenure.min() >= 0 and tenure.max() <= 72 and pa.types.is_integer(out.schema.field("tenure").type)


def test_a_boolean_column_stored_as_0_and_1_is_scored_like_one_stored_as_bool():
    """The metrics' codes of a boolean column: an int64 0/1 column is False/True (it was scored as values outside
    the declared ones on both sides, so its TVD was 0 whatever the rows held)."""
    from dpcda.evaluation.table_metrics import codes, table_metrics

    schema = parse_table_schema({"label": {"name": "y", "categories": ["a", "b"]},
                                 "columns": [{"name": "flag", "kind": "boolean", "nullable": True}]})  # fmt: skip
    y = pa.array(["a", "b", "a", "b"])
    as_int = pa.table({"flag": pa.array([0, 1, 1, None], pa.int64()), "y": y})
    as_bool = pa.table({"flag": pa.array([False, True, True, None]), "y": y})
    assert codes(as_int, schema)["flag"][0].tolist() == codes(as_bool, schema)["flag"][0].tolist() == [0, 1, 1, 2]
    other = pa.table({"flag": pa.array([0, 0, 0, 2], pa.int64()), "y": y})
    assert codes(other, schema)["flag"][0].tolist() == [0, 0, 0, 3]  # 2 is outside 0 and 1
    assert table_metrics(as_int, other, schema)["one_way_tvd"]["flag"] == 0.75


def test_the_manifest_states_the_selection_and_its_epsilon_recomputes(released):
    _, rel = released
    mech, privacy = rel.manifest["mechanism"], rel.manifest["privacy"]
    n = len(mech["columns"])
    # the default selection, mst-label: the tree's n - 1 pairs selected, the label's n - 1 pairs chosen in advance
    assert mech["name"] == "marginals" and mech["selection"] == "mst-label" and mech["selection_rounds"] == n - 1
    assert len(mech["cliques"]) == 2 * (n - 1)
    assert all(a in mech["columns"] and b in mech["columns"] for a, b in mech["cliques"])
    assert rel.manifest["normalization"]["method"] == "none" and privacy["accountant"] == "rdp"
    assert mech["rho"] == pytest.approx(sum(mech["rho_split"].values()), rel=1e-9)
    acc = rdp.RdpAccountant(RDP_ORDERS, dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.GaussianDpEvent(mech["one_way_noise_std"]), n)
    acc.compose(dp_accounting.ZCDpEvent(mech["round_epsilon"] ** 2 / 8), n - 1)
    acc.compose(dp_accounting.GaussianDpEvent(mech["two_way_noise_std"]), 2 * (n - 1))
    eps = acc.get_epsilon(privacy["delta_breakdown"]["accountant"])
    assert privacy["components"]["marginals"] == pytest.approx(eps, rel=1e-6)
    # no class histogram: the whole target goes to the marginals, and the row count is the model's total
    stated = privacy["components"]["marginals"]
    assert set(privacy["components"]) == {"marginals"}
    assert stated <= privacy["epsilon"] == 20 and stated >= 20 * (1 - 2e-3)
    assert sum(privacy["delta_breakdown"].values()) <= privacy["delta"]
    assert mech["samples_total"] == rel.table.num_rows == round(mech["fit"]["total"])
    assert "row count is private" in privacy["neighbouring_relation"]


def test_a_marginals_release_states_only_what_it_has(released):
    """No mixing furniture (issue 53.7): no normalization.json (its rows are codes on public bins, never z-scored),
    no statistics file in the manifest, no poisson caveat about q_k, T_k and sigma_x, no sigma_x anywhere."""
    import os

    _, rel = released
    assert not os.path.exists(os.path.join(rel.directory, "normalization.json"))
    assert rel.manifest["normalization"]["statistics_file"] is None
    caveats = " ".join(rel.manifest["privacy"]["caveats"])
    assert "q_k" not in caveats and "sigma_x" not in caveats
    assert "sigma_x" not in rel.manifest["mechanism"] and "features" not in rel.manifest["privacy"]["noise"]["grids"]
