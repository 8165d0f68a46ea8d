"""The DP domain step's Beam-free parts: public grids, what is derived and refused before any row is read, the
combiner cores (pickled, random batch splits against one-shot numpy), the derivation to a schema, and the encoding and
decoding of derived columns (other bucket, exact spikes, dates and timestamps, dropped labels)."""

from __future__ import annotations

import datetime
import math
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpcda.mechanisms.base import PlanError
from dpcda.mechanisms.domain.derive import (
    FirstPass,
    _integer_bins,
    complete,
    dp_edges,
    dp_range,
    first_pass,
    noisy_values,
    other_value,
    trim_ends,
)
from dpcda.mechanisms.domain.grid import Coarse, Fine
from dpcda.mechanisms.domain.request import request
from dpcda.mechanisms.domain.summaries import (
    CoarseCounter,
    FineCounter,
    fine_grids,
    merge_value_counts,
    numeric_values,
    value_count_shards,
    value_key,
    value_tag,
)
from dpcda.mechanisms.marginals.domain import codes_of, domain_of, numeric_codes, rows_of
from dpcda.privacy.domain import split_domain
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.schemas.table import Column, SchemaError, TableSchema
from dpcda.storage.tables import decode_rows, decode_uniforms, encode_batch

KEY = key_from_test_seed(3)


def _value_counts(batches, req) -> dict:
    """(column, value) -> count over ``batches``, through the shards the release sums."""
    shards: dict = {}
    for b in batches:
        for k, t in value_count_shards(b, req):
            shards.setdefault(k, []).append(t)
    out: dict = {}
    for (j, *_), tables in shards.items():
        merged = merge_value_counts(tables)
        for v, n in zip(merged.column("value").to_pylist(), merged.column("count").to_pylist()):
            assert (j, value_key(v)) not in out  # a value has one shard
            out[j, value_key(v)] = n
    return out


def _kept(t, req, ev) -> list:
    """The released (column, value, noisy count) triples of table ``t``."""
    shards: dict = {}
    for k, tab in value_count_shards(t, req):
        shards.setdefault(k, []).append(tab)
    return [x for (j, *_), tabs in shards.items() for x in noisy_values(KEY, j, merge_value_counts(tabs), ev)]


def _table(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    term = rng.choice([12, 24, 36, 48, 60], n, p=[0.1, 0.2, 0.3, 0.2, 0.2])
    amount = np.round(rng.lognormal(7, 0.6, n), 2)
    amount[rng.random(n) < 0.3] = 0.0
    return pa.table(
        {
            "term": pa.array(term, pa.int64()),
            "amount": pa.array(np.where(rng.random(n) < 0.05, np.nan, amount), pa.float64(), from_pandas=True),
            "city": pa.array(rng.choice(["a", "b", "c", "rare"], n, p=[0.5, 0.3, 0.195, 0.005])),
            "flag": pa.array(rng.random(n) < 0.4),
            "day": pa.array(
                [datetime.date(2020, 1, 1) + datetime.timedelta(days=int(d)) for d in rng.integers(0, 400, n)],
                pa.date32(),
            ),
            "y": pa.array(rng.choice(["no", "yes"], n, p=[0.7, 0.3])),
        }
    )


def _request(table, tmp_path, declared=None):
    path = tmp_path / "part.parquet"
    pq.write_table(table, path)
    declared = declared or TableSchema(label={"name": "y"})
    return request(declared, table.schema)


# ---------------------------------------------------------------- grids


@pytest.mark.parametrize("t", [pa.int8(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64(), pa.date32()])
def test_integer_coarse_cells_hold_their_values_within_the_type(t):
    c = Coarse.of(t)
    store = pa.int32() if t == pa.date32() else t
    info = np.iinfo(store.to_pandas_dtype())
    lo, hi = int(info.min), int(info.max)
    values = [*range(max(lo, -2000), min(hi, 2000)), *(v for v in (lo, hi) if abs(v) < 2**53)]
    cells = c.index(np.asarray(sorted(set(values)), np.float64))
    assert np.all(np.diff(cells) >= 0)  # cells follow the values' order
    for v, k in zip(sorted(set(values)), cells):
        assert c.lower(k) <= v <= c.upper(k)
    # the cells' bounds are floats within the type (int64's largest below 2^63 - 1)
    assert lo <= c.lower(0) and c.upper(c.cells - 1) <= hi and hi - c.upper(c.cells - 1) <= 2**11


def test_float_coarse_cells_and_their_limits():
    c = Coarse.of(pa.float64())
    v = np.random.default_rng(1).standard_cauchy(5000) * 100
    for x, k in zip(v, c.index(v)):
        assert c.lower(k) <= x <= c.upper(k) or (k == c.zero and abs(x) < 2.0**-32)
    assert c.index(np.array([1e300]))[0] == c.cells - 1  # beyond the span: the top cell
    loose = Coarse.of(pa.float64(), (0.0, 100.0))
    assert loose.index(np.array([-5.0, 1e9]))[0] == loose.zero  # clipped to the limits first
    assert loose.range_of(0, loose.cells - 1) == (0.0, 100.0)


def test_fine_cells_are_integers_in_a_small_integer_range_and_leave_spikes_out():
    f = Fine(0.0, 40.0, True, (12.0,))
    assert f.per_integer and f.cells == 41
    assert list(f.index(np.array([0.0, 12.0, 13.0, 99.0]))) == [0, -1, 13, 40]
    wide = Fine(0.0, 1000.0, False)
    assert wide.cells == 64 and wide.index(np.array([1000.0]))[0] == 63 and wide.boundary(64) == 1000.0


# ---------------------------------------------------------------- before any row is read


def test_request_derives_by_type_and_keeps_declared_columns(tmp_path):
    t = _table()
    declared = TableSchema(
        label={"name": "y"},
        columns=[{"name": "city", "kind": "categorical", "categories": ["a", "b", "c", "rare"]}],
        drop=["day"],
    )
    req = _request(t, tmp_path, declared)
    assert [(d.name, d.kind) for d in req.derive] == [("term", "numeric"), ("amount", "numeric"), ("y", "label")]
    assert [c.name for c in req.booleans] == ["flag"]


def test_a_loose_numeric_column_is_derived_inside_its_limits(tmp_path):
    t = _table()
    declared = TableSchema(
        label={"name": "y", "categories": ["no", "yes"]},
        columns=[{"name": "amount", "kind": "numeric", "lower": 0, "upper": 1e6, "loose": True, "nullable": True}],
    )
    req = _request(t, tmp_path, declared)
    amount = next(d for d in req.derive if d.name == "amount")
    assert amount.coarse.limits == (0.0, 1e6)
    assert amount.coarse.range_of(0, amount.coarse.cells - 1) == (0.0, 1e6)
    assert not declared.complete


def test_request_refuses_a_type_it_cannot_synthesise_by_name(tmp_path):
    t = _table().append_column("blob", pa.array([b"x"] * 3000, pa.binary()))
    with pytest.raises(SchemaError, match=r"column 'blob': type binary cannot be synthesised.*--drop-columns blob"):
        _request(t, tmp_path)


def test_request_refuses_a_float_label(tmp_path):
    t = _table()
    with pytest.raises(SchemaError, match="label 'amount': type double"):
        _request(t, tmp_path, TableSchema(label={"name": "amount"}))


# ---------------------------------------------------------------- combiner cores


def _split(table, rng):
    cuts = np.sort(rng.choice(np.arange(1, table.num_rows), size=rng.integers(1, 6), replace=False))
    return [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, table.num_rows])]


def test_coarse_counter_merges_random_splits_to_the_one_shot_counts(tmp_path):
    t = _table()
    req = _request(t, tmp_path)
    counter = pickle.loads(pickle.dumps(CoarseCounter(req)))
    whole = counter.add(counter.create(), t)
    rng = np.random.default_rng(7)
    for _ in range(5):
        parts = [counter.add(counter.create(), b) for b in _split(t, rng)]
        assert np.array_equal(counter.merge(iter(parts)), whole)
    for j, d in enumerate(req.numeric):
        v = numeric_values(t.column(d.name))
        assert np.array_equal(counter.column(whole, j), np.bincount(d.coarse.index(v), minlength=d.coarse.cells))


def test_fine_counter_merges_random_splits_to_the_one_shot_counts(tmp_path):
    t = _table()
    req = _request(t, tmp_path)
    ranges = {"term": (0.0, 63.0), "amount": (0.0, 8192.0), "day": (18262.0, 18700.0)}
    fines = fine_grids(req, ranges, {"term": [36.0], "amount": [0.0]})
    counter = pickle.loads(pickle.dumps(FineCounter(req, fines)))
    whole = counter.add(counter.create(), t)
    rng = np.random.default_rng(8)
    for _ in range(5):
        assert np.array_equal(counter.merge(counter.add(counter.create(), b) for b in _split(t, rng)), whole)
    term = t.column("term").to_numpy()
    expect = np.bincount(term[term != 36], minlength=64)
    assert np.array_equal(counter.column(whole, 0), expect)


def test_each_values_noise_is_the_first_draw_of_its_own_stream(tmp_path):
    t = _table()
    req = _request(t, tmp_path)
    ev = split_domain(0.05, coarse=len(req.numeric), values=len(req.counted), fine=len(req.numeric),
                      reserved_delta=1e-6, epsilon=10.0)  # fmt: skip
    kept = _kept(t, req, ev)
    want = []
    for (j, v), n in _value_counts([t], req).items():
        noisy = float(
            NoiseStream(KEY, "domain", "value", j, value_tag(v)).gaussian(np.array([float(n)]), ev.values_std)[0]
        )
        if noisy >= ev.threshold:
            want.append((j, v, noisy))
    assert sorted(kept, key=repr) == sorted(want, key=repr) and len(kept) > 5


def test_a_value_is_counted_under_one_key_whatever_its_encoding_in_a_batch(tmp_path):
    t = _table(400)
    req = _request(t, tmp_path)
    city = [d.name for d in req.counted].index("city")
    amount = [d.name for d in req.counted].index("amount")
    dictionary = t.set_column(t.schema.get_field_index("city"), "city", t.column("city").dictionary_encode())
    signed = pa.array(np.where(np.arange(400) % 2 == 0, -0.0, 0.0))  # zeros of both signs: one value
    t = t.set_column(t.schema.get_field_index("amount"), "amount", signed)
    dictionary = dictionary.set_column(dictionary.schema.get_field_index("amount"), "amount", signed)
    total = _value_counts([t.slice(0, 150), dictionary.slice(150)], req)  # asserts one shard per value
    assert {v: n for (j, v), n in total.items() if j == amount} == {0.0: 400}
    assert sum(n for (j, _), n in total.items() if j == city) == 400
    assert {v for (j, v) in total if j == city} <= {"a", "b", "c", "rare"}


@pytest.mark.parametrize("shards", [1, 64])  # 1: every kind of a column meets in one shard
def test_a_value_stored_as_different_types_in_different_files_is_one_value_with_one_stream(tmp_path, shards):
    """Files may store a column as int64, int32, uint64 (values above int64's range too), float32 or float64, or a
    string column as string, large_string or dictionary: each kind of value is counted under one key whatever the
    file's type, and no two keys hold one stream's name (two draws of one noise)."""
    t = _table(50)
    req = _request(t, tmp_path)
    term = [d.name for d in req.counted].index("term")
    city = [d.name for d in req.counted].index("city")

    def batch(term_values, term_type, city_values, city_type):
        b = t.slice(0, len(term_values))
        b = b.set_column(b.schema.get_field_index("term"), "term", pa.array(term_values, term_type))
        return b.set_column(b.schema.get_field_index("city"), "city", pa.array(city_values, city_type))

    big, top = (1 << 64) - 1, (1 << 63) - 1  # uint64's largest; int64's largest, stored as either
    batches = [
        batch([12, 12, top], pa.int64(), ["a", "a", "b"], pa.string()),
        batch([top, 1 << 63, 24], pa.uint64(), ["a", "b", "c"], pa.string()),
        batch([12, 36, 24], pa.int32(), ["a", "b", "b"], pa.large_string()),
        batch([12, big, 24], pa.uint64(), ["b", "b", "c"], pa.dictionary(pa.int8(), pa.string())),
        batch([12.0, -0.0, 0.5], pa.float32(), ["c", "c", "c"], pa.string()),
        batch([12.0, 0.0, 24.0], pa.float64(), ["a", "a", "a"], pa.string()),
    ]
    keys: dict = {}
    for b in batches:
        for k, tab in value_count_shards(b, req, shards):
            keys.setdefault(k, []).append(tab)
    names: dict = {}
    counts: dict = {}
    for (j, kind, shard), tabs in keys.items():
        merged = merge_value_counts(tabs)  # one Arrow type per key: no promotion needed
        for v, n in zip(merged.column("value").to_pylist(), merged.column("count").to_pylist()):
            name = (j, value_tag(value_key(v)))
            assert name not in names, f"stream {name} in keys {names.get(name)} and {(j, kind, shard)}"
            names[name] = (j, kind, shard)
            counts[j, type(v).__name__, v] = n
    assert {(k[1], k[2]): n for k, n in counts.items() if k[0] == term} == {
        ("int", 12): 4, ("int", 24): 3, ("int", 36): 1, ("int", big): 1, ("int", top): 2, ("int", 1 << 63): 1,
        ("float", 12.0): 2, ("float", 0.0): 2, ("float", 0.5): 1, ("float", 24.0): 1,
    }  # fmt: skip
    assert {k[2]: n for k, n in counts.items() if k[0] == city} == {"a": 7, "b": 6, "c": 5}


def test_the_value_count_combiner_sums_every_input_across_accumulators():
    from dpcda.transforms.domain import _MergeCountsFn

    rng = np.random.default_rng(4)
    fn = _MergeCountsFn()
    tables = [pa.table({"value": pa.array(rng.integers(0, 50, 20)), "count": pa.array(rng.integers(1, 9, 20))})
              for _ in range(150)]  # fmt: skip
    want: dict = {}
    for tab in tables:
        for v, n in zip(tab.column("value").to_pylist(), tab.column("count").to_pylist()):
            want[v] = want.get(v, 0) + n
    accs = []
    for part in np.array_split(np.arange(150), 4):  # more inputs per accumulator than it holds before merging
        acc = fn.create_accumulator()
        for i in part:
            acc = fn.add_input(acc, tables[i])
        accs.append(pickle.loads(pickle.dumps(acc)))
    accs.append(fn.create_accumulator())  # an empty one
    out = fn.extract_output(fn.merge_accumulators([fn.merge_accumulators(accs[:2]), *accs[2:]]))
    assert dict(zip(out.column("value").to_pylist(), out.column("count").to_pylist())) == want
    assert fn.extract_output(fn.create_accumulator()) is None
    pending = fn.create_accumulator()
    for tab in tables[:5]:  # extracted without a merge (Beam may): every pending table counts
        pending = fn.add_input(pending, tab)
    five = fn.extract_output(pending)
    assert five.column("count").to_numpy().sum() == sum(t.column("count").to_numpy().sum() for t in tables[:5])


def test_draws_in_chunks_are_the_draws_at_once_every_value_once(tmp_path, monkeypatch):
    import dataclasses

    import dpcda.mechanisms.domain.derive as derive

    t = _table()
    req = _request(t, tmp_path)
    ev = split_domain(0.05, coarse=len(req.numeric), values=len(req.counted), fine=len(req.numeric),
                      reserved_delta=1e-6, epsilon=10.0)  # fmt: skip
    everything = dataclasses.replace(ev, threshold=-1e12)  # every value comes back
    amount = [d.name for d in req.counted].index("amount")
    tabs = [tab for (j, *_), tab in value_count_shards(t, req, 1) if j == amount]
    counts = merge_value_counts(tabs)
    whole = noisy_values(KEY, amount, counts, everything)
    monkeypatch.setattr(derive, "DRAW_CHUNK", 7)
    assert counts.num_rows > 100 and noisy_values(KEY, amount, counts, everything) == whole
    assert len({v for _, v, _ in whole}) == counts.num_rows


def test_the_beam_step_over_several_files_gives_the_schema_of_the_exact_counts(tmp_path):
    """DeriveDomain's two passes (each reading every file) against the step computed in one process."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from dpcda.transforms.domain import DeriveDomain

    t = _table()
    folder = tmp_path / "in"
    folder.mkdir()
    for i, part in enumerate(_split(t, np.random.default_rng(3))):
        pq.write_table(part, folder / f"part-{i}.parquet")
    files = sorted(str(f) for f in folder.glob("*.parquet"))
    assert len(files) >= 2
    req = _request(t, tmp_path)
    ev = split_domain(0.05, coarse=len(req.numeric), values=len(req.counted), fine=len(req.numeric),
                      reserved_delta=1e-6, epsilon=10.0)  # fmt: skip
    want = _derive_all(t, tmp_path)
    assert any(c.edges for c in want.columns if c.kind == "numeric")  # pass 2's fine counts chose edges
    opts = PipelineOptions(flags=[], runner="DirectRunner", direct_running_mode="in_memory")
    with beam.Pipeline(options=opts) as p:
        key = p | "Key" >> beam.Create([KEY])
        assert_that(p | DeriveDomain(files, req, ev, key, 0.3), equal_to([want]))


def test_value_counts_sum_over_batches_to_the_columns_counts(tmp_path):
    t = _table()
    req = _request(t, tmp_path)
    rng = np.random.default_rng(9)
    total = _value_counts(_split(t, rng), req)
    j = [d.name for d in req.counted].index("term")
    assert {v: n for (c, v), n in total.items() if c == j} == dict(
        zip(*np.unique(t.column("term").to_numpy(), return_counts=True))
    )
    # floats: nulls and NaN are not values
    a = [d.name for d in req.counted].index("amount")
    assert sum(n for (c, _), n in total.items() if c == a) == len(numeric_values(t.column("amount")))


def test_value_tags_are_distinct_for_values_that_print_alike():
    assert len({value_tag(v) for v in [1, 1.0, "1", True, "a/b", "a", 0.0, "b"]}) == 8


# ---------------------------------------------------------------- derivation (post-processing of DP outputs)


def test_dp_range_ignores_an_empty_side_and_extends_over_one_gap():
    c = Coarse.of(pa.int64())
    noisy = np.random.default_rng(0).normal(0, 10, c.cells)
    z = c.zero
    noisy[z] = 500.0  # zeros
    noisy[z + 5 : z + 9] = [400, 0, 300, 35]  # 16..255 with an empty cell at 32..63
    first, last = dp_range(c, noisy, 10.0)
    assert c.range_of(first, last) == (0.0, 255.0)
    noisy[z + 8] = 25.0  # 2.5 stds: noise reaches it in 0.6 % of empty cells, and a range crosses several; not taken
    assert c.range_of(*dp_range(c, noisy, 10.0)) == (0.0, 127.0)


def test_integer_bins_hold_a_non_spike_integer_each():
    edges = _integer_bins([0.0, 1.5, 2.2, 3.0, 9.0, 10.0], 0.0, 10.0, {1.0, 2.0, 3.0, 10.0})
    assert edges[0] == 0.0 and edges[-1] == 10.0
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        top = b if i == len(edges) - 2 else b - 1
        assert [v for v in range(int(a), int(top) + 1) if v not in {1, 2, 3, 10}]
    assert _integer_bins([0.0, 1.0], 0.0, 1.0, {0.0, 1.0}) == []


def test_dp_edges_are_increasing_and_span_the_range():
    f = Fine(16.0, 128.0, False)
    noisy = np.random.default_rng(2).normal(50, 20, f.cells)
    edges = dp_edges(f, noisy)
    assert edges[0] == 16.0 and edges[-1] == 128.0 and all(b > a for a, b in zip(edges, edges[1:]))


def test_trim_ends_draws_a_range_end_in_to_a_wall_of_values_inside_its_end_bin():
    """A float column whose range starts at 16 (its grid's cell) and whose values start with a heap at 18.25: the first
    fine cell [16, 17.75) is left out, the values' cells kept; a light tail (no cell of 3 stds in the last bin) keeps
    the range's end; the range still holds a spike."""
    f = Fine(16.0, 128.0, False)
    noisy = np.full(f.cells, 10.0)
    noisy[0], noisy[1], noisy[2] = 20.0, 400.0, 600.0  # 20: noise on an empty cell, below one std
    edges = [16.0, f.boundary(3), 64.0, 128.0]
    out = trim_ends(f, noisy, edges, 45.0)
    assert out == [f.boundary(1), f.boundary(3), 64.0, 128.0]
    noisy[0] = 100.0  # more than a std over one cell: values may be there, kept
    assert trim_ends(f, noisy, edges, 45.0) == edges
    noisy[0] = 20.0
    spiked = Fine(16.0, 128.0, False, spikes=(16.5,))
    assert trim_ends(spiked, noisy, edges, 45.0)[0] == 16.5


def test_trim_ends_cuts_an_integer_columns_last_bin_after_its_last_value():
    """Per-integer fine cells over [0, 40]: values at 36 and 37, none above: the range ends at 37 (it ended at 40);
    spikes' cells are not counted; an integer column's edges stay integers with a value in every bin."""
    f = Fine(0.0, 40.0, True, spikes=(38.0,))
    noisy = np.full(f.cells, 200.0)
    noisy[36], noisy[37], noisy[38], noisy[39], noisy[40] = 300.0, 300.0, 500.0, -30.0, 12.0  # 38: a spike's cell
    out = trim_ends(f, noisy, [0.0, 20.0, 36.0, 40.0], 45.0)
    assert out[-1] == 38.0  # 38 is a spike: the range holds it
    f = Fine(0.0, 40.0, True)
    noisy[38] = -10.0
    out = trim_ends(f, noisy, [0.0, 20.0, 36.0, 40.0], 45.0)
    assert out == [0.0, 20.0, 36.0, 37.0]
    assert trim_ends(f, np.full(f.cells, 10.0), [0.0, 20.0, 40.0], 45.0) == [0.0, 20.0, 40.0]  # no wall: unchanged


def test_trim_ends_merges_an_integer_end_bin_left_with_its_inner_edge_only():
    """Values 1..38 on per-integer cells over [0, 40]: both ends are cut (1 and 38), also where the last bin keeps only
    the value at its inner edge (the bin then merges into the one before); an integer column on 64 equal cells ends on
    the last integer of its last cell of values."""
    f = Fine(0.0, 40.0, True)
    noisy = np.zeros(f.cells)
    noisy[1:39] = 400.0
    edges = dp_edges(f, noisy)
    assert edges[-2] == 38.0  # the last bin [38, 40] holds 38 only
    out = trim_ends(f, noisy, edges, 45.0)
    assert out[0] == 1.0 and out[-1] == 38.0 and all(b > a for a, b in zip(out, out[1:]))
    wide = Fine(0.0, 127.0, True)  # 128 integers: 64 cells of 127/64 (1.98) integers each
    noisy = np.where(np.arange(wide.cells) < 56, 300.0, 0.0)  # values in cells 0..55 (up to 111), the last bin from 100
    out = trim_ends(wide, noisy, [0.0, 64.0, 100.0, 127.0], 45.0)
    assert out == [0.0, 64.0, 100.0, float(math.ceil(wide.boundary(56)) - 1)] and out[-1] == 111.0


def test_other_value_is_not_a_category():
    assert other_value(["a"]) == "(other)"
    assert other_value(["(other)", "(other)*"]) == "(other)**"


def test_complete_gives_a_schema_with_the_inputs_columns_in_order(tmp_path):
    t = _table()
    req = _request(t, tmp_path)
    ev = split_domain(0.05, coarse=len(req.numeric), values=len(req.counted), fine=len(req.numeric),
                      reserved_delta=1e-6, epsilon=10.0)  # fmt: skip
    assert ev.threshold > 15  # the rare city holds about 15 rows
    cc = CoarseCounter(req)
    kept = _kept(t, req, ev)
    first = first_pass(req, cc.add(cc.create(), t), kept, ev, KEY)
    assert isinstance(first, FirstPass)
    assert first.spikes["term"] == [12.0, 24.0, 36.0, 48.0, 60.0]  # the loan terms come back as spikes
    assert 0.0 in first.spikes["amount"]
    fines = fine_grids(req, first.ranges, first.spikes)
    fc = FineCounter(req, fines)
    schema = complete(req, first, fc.add(fc.create(), t), fines, ev, KEY, 0.3)
    assert [c.name for c in schema.columns] == ["term", "amount", "city", "flag", "day"]
    city = schema.columns[2]
    assert city.categories == ["a", "b", "c"] and city.other == "(other)"  # 'rare' (0.5 %) went to the other bucket
    assert schema.label.categories == ["no", "yes"] and schema.label.unlisted == "drop"
    assert schema.domain.to_event() == ev and schema.domain.derived == ["term", "amount", "city", "day", "y"]
    term = schema.columns[0]
    assert term.spikes == [12.0, 24.0, 36.0, 48.0, 60.0] and (term.lower, term.upper) == (8.0, 63.0)
    # the schema's codes: a spike is one code, then the bins (each holds an integer that is no spike), the null
    dom = domain_of(schema, 20)
    assert dict(zip(dom.names, dom.sizes))["term"] == 5 + len(term.edges) - 1 + term.nullable
    block = encode_batch(t, schema, "t", 0)
    codes = codes_of(block.features, block.labels, schema, 20)
    assert codes[:, 0].max() < 5  # every record's term is a spike's code


def _derive_all(t, tmp_path, rho=0.05):
    req = _request(t, tmp_path)
    ev = split_domain(rho, coarse=len(req.numeric), values=len(req.counted), fine=len(req.numeric),
                      reserved_delta=1e-6, epsilon=10.0)  # fmt: skip
    kept = _kept(t, req, ev)
    cc = CoarseCounter(req)
    first = first_pass(req, cc.add(cc.create(), t), kept, ev, KEY)
    fines = fine_grids(req, first.ranges, first.spikes)
    fc = FineCounter(req, fines)
    return complete(req, first, fc.add(fc.create(), t), fines, ev, KEY, 0.3)


def test_an_id_column_is_refused_by_name_from_its_dp_output_not_its_footers(tmp_path):
    ids = [f"CUST-{i:09d}-{i * 7919 % 100003:06d}" for i in range(3000)]
    t = _table().append_column("customer", pa.array(ids))
    req = _request(t, tmp_path)  # the request reads the schema only: no refusal before the DP step
    assert "customer" in [d.name for d in req.derive]
    with pytest.raises(
        PlanError, match=r"column 'customer': the DP domain step released none.*--drop-columns customer"
    ):
        _derive_all(t, tmp_path)
    # declared, or dropped, it is not refused
    _request(t, tmp_path, TableSchema(label={"name": "y"}, drop=["customer"]))


# ---------------------------------------------------------------- encoding and decoding of derived columns


def _derived_schema():
    return TableSchema(
        label={"name": "y", "categories": ["no", "yes"], "unlisted": "drop"},
        columns=[
            Column(name="term", kind="numeric", lower=0, upper=63, edges=[], spikes=[12, 24, 36]),
            Column(
                name="amount",
                kind="numeric",
                lower=0,
                upper=4096,
                edges=[0, 100, 1000, 4096],
                spikes=[0, 45.3],
                nullable=True,
            ),  # fmt: skip
            Column(name="city", kind="categorical", categories=["a", "b"], other="(other)"),
            Column(name="day", kind="numeric", lower=18262, upper=18700, edges=[18262, 18400, 18700]),
        ],
    )


def _rows():
    return pa.table(
        {
            "term": pa.array([12, 24, 36, 13], pa.int64()),
            "amount": pa.array([0.0, 45.3, 500.0, None]),
            "city": pa.array(["a", "zzz", "b", "a"]),
            "day": pa.array(
                [datetime.date(2020, 1, 1), datetime.date(2020, 6, 1), None, datetime.date(2021, 1, 1)], pa.date32()
            ).fill_null(datetime.date(2020, 2, 2)),  # fmt: skip
            "y": pa.array(["no", "maybe", "yes", None]),
        }
    )


def test_encoding_counts_other_values_and_drops_unlisted_labels():
    s = _derived_schema()
    block = encode_batch(_rows(), s, "t", 0)
    assert list(block.labels) == [0, 1]  # 'maybe' and the null label left out
    codes = codes_of(block.features, block.labels, s, 20)
    # term: spikes 12, 24 (rows 0, 2 of the input); amount: spike 0.0, bin [100, 1000); city: a, b
    assert codes[:, 0].tolist() == [0, 2] and codes[:, 1].tolist() == [0, 3] and codes[:, 2].tolist() == [0, 1]


def test_numeric_codes_take_spikes_by_their_encoding_and_the_nearest_spike_without_bins():
    col = Column(name="t", kind="numeric", lower=0, upper=63, edges=[], spikes=[12, 24, 36])
    x = ((np.array([12.0, 13.0, 30.0, 63.0]) - 0) / 63).astype(np.float32)
    assert numeric_codes(col, x, 20).tolist() == [0, 0, 1, 2]


def test_decoding_gives_exact_spikes_dates_and_the_other_value():
    s = _derived_schema()
    arrow = _rows().schema
    dom = domain_of(s, 20)
    codes = np.array([[0, 1, 2, 0, 1], [2, 0, 0, 1, 0], [1, 4, 1, 1, 1], [0, 3, 2, 0, 0]])  # amount code 5: null
    assert dom.sizes[1] == 2 + 3 + 1
    x, y = rows_of(codes, s, 20, NoiseStream(KEY, "test", "rows"), frozenset({"term", "day"}))
    out = decode_rows(x, y, s, arrow, uniforms=None if s.decoding != "sample" else _onehot_uniforms(s, len(x)))
    assert out.schema == arrow
    assert out.column("term").to_pylist() == [12, 36, 24, 12]
    assert out.column("amount").to_pylist()[:2] == [45.3, 0.0]  # spikes come back exactly, floats included
    assert out.column("city").to_pylist() == ["(other)", "a", "b", "(other)"]
    days = out.column("day").to_pylist()
    assert all(isinstance(d, datetime.date) for d in days)


def _onehot_uniforms(schema, rows):
    return decode_uniforms(KEY, "test", rows, schema) * 0 + 0.5  # one-hot scores: any uniform picks the one


def test_timestamps_round_trip_as_integers():
    col = Column(name="ts", kind="numeric", lower=1.6e18, upper=1.7e18)
    s = TableSchema(label={"name": "y", "categories": ["a", "b"]}, columns=[col])
    t = pa.table({"ts": pa.array([1_650_000_000_000_000_000], pa.timestamp("ns")), "y": ["a"]})
    block = encode_batch(t, s, "t", 0)
    out = decode_rows(block.features, block.labels, s, t.schema, uniforms=decode_uniforms(KEY, "t", 1, s))
    assert out.schema == t.schema
    got = out.column("ts").cast(pa.int64()).to_pylist()[0]
    assert abs(got - 1_650_000_000_000_000_000) <= 1e17 * 2**-23  # float32 encoding of the range
