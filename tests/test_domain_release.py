"""One command, no hand-written domain: ``dpcda release --input GLOB --label COLUMN --epsilon E --output OUT`` on a
Parquet table of integers, floats, booleans, strings, dates and nulls (the DP domain step, then marginals under
add/remove), and its refusals: one ``dpcda: error:`` line, exit 2, nothing published."""

from __future__ import annotations

import datetime
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpcda.pipeline.cli import EXIT_BAD_INPUT, main
from tests.conftest import BEAM_ARGS
from tests.test_bad_input import assert_nothing_published, assert_one_line_error

N = 1500


def _write(folder, extra: dict | None = None, n: int = N):
    rng = np.random.default_rng(11)
    folder.mkdir(parents=True, exist_ok=True)
    term = rng.choice([12, 24, 36, 48, 60], n, p=[0.1, 0.2, 0.3, 0.2, 0.2])
    amount = np.round(rng.lognormal(7, 0.6, n), 2)
    amount[rng.random(n) < 0.3] = 0.0
    cols = {
        "term": pa.array(term, pa.int64()),
        "amount": pa.array(np.where(rng.random(n) < 0.05, np.nan, amount), pa.float64(), from_pandas=True),
        "city": pa.array(rng.choice(["north", "south", "east"], n, p=[0.5, 0.3, 0.2])),
        "flag": pa.array(rng.random(n) < 0.4),
        "day": pa.array(
            [datetime.date(2020, 1, 1) + datetime.timedelta(days=int(d)) for d in rng.integers(0, 300, n)], pa.date32()
        ),
        "status": pa.array(rng.choice(["bad", "good"], n, p=[0.3, 0.7])),
        **(extra or {}),
    }
    table = pa.table(cols)
    half = n // 2
    pq.write_table(table.slice(0, half), folder / "part-0.parquet")
    pq.write_table(table.slice(half), folder / "part-1.parquet")
    return str(folder / "*.parquet"), table


BASE = ["--label", "status", "--epsilon", "8", "--seed", "3", "--marginals-iters", "100"]


def test_one_command_releases_a_table_with_its_arrow_schema(tmp_path, capsys):
    glob, table = _write(tmp_path / "in")
    out = tmp_path / "out"
    rc = main(["release", "--input", glob, "--output", str(out), *BASE, *BEAM_ARGS])
    assert rc == 0, capsys.readouterr().err[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    synth = pq.read_table(sorted((out / "synthetic").glob("*.parquet")))
    assert synth.schema == table.schema  # names, types and nullability of the input
    # integers stay integers and the loan terms come back as themselves; dates are dates; no invented category
    term = synth.column("term").drop_null().to_numpy()
    spiked = np.isin(term, [12, 24, 36, 48, 60]).mean()
    assert spiked > 0.9, spiked  # the rest: the bins' noisy share, drawn as integers of the DP range
    assert term.min() >= 8 and term.max() <= 63
    assert all(isinstance(d, datetime.date) for d in synth.column("day").drop_null().to_pylist())
    assert set(synth.column("city").drop_null().to_pylist()) <= {"north", "south", "east", "(other)"}
    amount = synth.column("amount").drop_null().to_numpy()
    assert (amount == 0.0).mean() > 0.15  # the zero spike of a float column comes back exactly
    # marginals under add/remove; the domain step's share stated, its cost composed
    mech, priv, inp = manifest["mechanism"], manifest["privacy"], manifest["input"]["table"]
    assert mech["name"] == "marginals" and mech["mode"] == "poisson"
    assert priv["epsilon"] <= 8 and "domain" in priv["components"]
    assert priv["delta_breakdown"]["domain_thresholds"] > 0 and sum(priv["delta_breakdown"].values()) <= 1e-5
    assert inp["domain"]["share"] == 0.3 and inp["domain"]["derived"] == ["term", "amount", "city", "day", "status"]
    assert inp["label"]["categories"] == ["bad", "good"] and inp["label"]["unlisted"] == "drop"
    assert [c["name"] for c in inp["columns"]] == ["term", "amount", "city", "flag", "day"]
    assert {e["type"] for e in priv["events"]["shared"]} == {"DomainEvent"}
    assert "public_class_sizes" not in json.dumps(mech) or mech.get("public_class_sizes") is None
    # the quality report names the codes the mechanism counted: spikes, derived bins, the other bucket, nulls
    quality = json.loads((out / "evaluation" / "quality.json").read_text())
    assert {e["name"]: len(e["codes"]) for e in quality["columns"]} == mech["columns"]
    city = next(e for e in quality["columns"] if e["name"] == "city")
    assert city["codes"][-2:] == ["(other)", "null"] or city["codes"][-1] == "(other)"
    spikes = {c["name"]: c.get("spikes") or [] for c in inp["columns"]}
    term_entry = next(e for e in quality["columns"] if e["name"] == "term")
    assert term_entry["spikes"] == spikes["term"] and len(spikes["term"]) >= 4  # listed first among its codes
    assert term_entry["codes"][: len(spikes["term"])] == [f"{v:.4g}" for v in spikes["term"]]
    trend = next(t for t in quality["label_trends"]["columns"] if t["name"] == "term")
    assert trend["spikes"] == term_entry["spikes"] and trend["codes"] == term_entry["codes"]


def test_drop_columns_leaves_a_column_out_and_unread_and_the_evaluation_reads_the_derived_schema(tmp_path, capsys):
    glob, table = _write(tmp_path / "in", {"note": pa.array([b"\x00"] * N, pa.binary())})
    test, _ = _write(tmp_path / "test", {"note": pa.array([b"\x01"] * 400, pa.binary())}, n=400)
    out = tmp_path / "out"
    args = ["--drop-columns", "note,flag", "--eval-input", test]
    rc = main(["release", "--input", glob, "--output", str(out), *BASE, *args, *BEAM_ARGS])
    assert rc == 0, capsys.readouterr().err[-3000:]
    synth = pq.read_table(sorted((out / "synthetic").glob("*.parquet")))
    assert synth.column_names == ["term", "amount", "city", "day", "status"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input"]["table"]["drop"] == ["note", "flag"]
    assert 0.0 <= manifest["utility"]["roc_auc"] <= 1.0


def _ids(n=N):
    return pa.array([f"C-{i:08d}-{(i * 7919) % 100003:06d}" for i in range(n)])


@pytest.mark.parametrize(
    "extra,args,needles",
    [
        ({"blob": pa.array([b"x"] * N, pa.binary())}, [], ["column 'blob': type binary", "--drop-columns blob"]),
        ({}, ["--mechanism", "dpcda"], ["the DP domain step feeds --mechanism marginals"]),
    ],
    ids=["binary", "mixing-mechanism"],
)
def test_refusals_before_any_row_is_read(tmp_path, capsys, extra, args, needles):
    glob, _ = _write(tmp_path / "in", extra)
    out = tmp_path / "out"
    base = BASE[:-2] if "--mechanism" in args else BASE  # without --marginals-iters
    rc = main(["release", "--input", glob, "--output", str(out), *base, *args, *BEAM_ARGS])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err[-3000:]
    assert_one_line_error(err, *needles)
    assert_nothing_published(out)


def _release(glob, out, *args, base=BASE):
    return main(["release", "--input", glob, "--output", str(out), *base, *args, *BEAM_ARGS])


def test_an_id_column_is_refused_by_name_through_the_dp_step_and_charged(tmp_path, capsys):
    from dpcda.storage.ledger import open_ledger

    glob, _ = _write(tmp_path / "in", {"customer_id": _ids()})
    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)
    out = tmp_path / "out"
    unseeded = [a for a in BASE if a not in ("--seed", "3")]  # a ledger records private releases only
    rc = _release(glob, out, "--ledger", ledger, "--dataset-id", "ds", base=unseeded)
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err[-3000:]
    assert_one_line_error(err, "column 'customer_id': the DP domain step released none", "--drop-columns customer_id")
    assert_nothing_published(out)
    (entry,) = [e for e in open_ledger(ledger).entries("ds") if e["state"] != "cap"]
    assert entry["state"] == "published" and "DP domain step" in entry["note"] and 0 < entry["epsilon"] < 8


def _reviewer_pair(folder, extra_record: bool):
    """4000 rows of 508 random 6-character city values (the DP threshold sends them all to "other"); D' adds one
    record with a new 40-character value."""
    rng = np.random.default_rng(5)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    pool = ["".join(rng.choice(letters, 6)) for _ in range(508)]
    n = 4000
    city = list(rng.choice(pool, n))
    status = list(rng.choice(["bad", "good"], n, p=[0.3, 0.7]))
    term = list(rng.choice([12, 24, 36], n))
    if extra_record:
        city.append("z" * 40)
        status.append("good")
        term.append(24)
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"term": pa.array(term, pa.int64()), "city": city, "status": status}), folder / "p.parquet")
    return str(folder / "*.parquet")


def test_neighbours_differing_in_one_long_value_get_the_same_decision(tmp_path, capsys):
    """The review's pair: a decision read off footer sizes refused D' and released D; now both go through the DP
    step alike (no footer statistic is read), and on the same noise both are released with the same categories."""
    cities = []
    for i, extra in enumerate((False, True)):
        glob = _reviewer_pair(tmp_path / f"in{i}", extra)
        out = tmp_path / f"out{i}"
        rc = _release(glob, out)
        assert rc == 0, capsys.readouterr().err[-3000:]
        (city,) = [c for c in json.loads((out / "manifest.json").read_text())["input"]["table"]["columns"]
                   if c["name"] == "city"]  # fmt: skip
        cities.append(city["categories"])
    assert cities[0] == cities[1] and "z" * 40 not in cities[1]


@pytest.mark.parametrize(
    "first,second",
    [(pa.int64(), pa.float64()), (pa.timestamp("us"), pa.timestamp("ms")), (pa.string(), pa.int64())],
    ids=["int-float", "timestamp-units", "string-int"],
)
def test_shards_storing_a_derived_column_with_other_types_are_refused_before_any_spend(tmp_path, capsys, first, second):
    """Each shard's values are counted as stored (an int 12 and a float 12.0 are two values, a timestamp's integer
    is in its file's unit): a shard whose footer gives a derived column another type is refused from the footers,
    before the step spends anything (no ledger entry)."""
    from dpcda.storage.ledger import open_ledger

    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i, t in enumerate((first, second)):
        x = rng.integers(1, 40, 300)
        col = pa.array(
            [f"v{v}" for v in x] if pa.types.is_string(t) else x, pa.string() if pa.types.is_string(t) else pa.int64()
        )
        y = pa.array(rng.choice(["a", "b"], 300))
        pq.write_table(pa.table({"x": col.cast(t), "y": y}), folder / f"part-{i}.parquet")
    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)
    out = tmp_path / "out"
    args = ["--label", "y", "--epsilon", "1", "--ledger", ledger, "--dataset-id", "ds"]
    rc = main(["release", "--input", str(folder / "*.parquet"), "--output", str(out), *args, *BEAM_ARGS])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err[-3000:]
    assert_one_line_error(err, "part-1.parquet: column 'x' is", "declare the column in table:")
    assert "v1" not in err.split("dpcda: error:")[-1]  # footers only: no value is read or named
    assert_nothing_published(out)
    assert [e for e in open_ledger(ledger).entries("ds") if e["state"] != "cap"] == []


def test_a_release_stopped_after_the_domain_step_is_charged_each_run(tmp_path, capsys):
    """The review's reproducer: a label "a" x597, "b" x3 (one value released: the release stops after the DP step);
    run twice with --ledger, each run is charged the step's spend (not cancelled)."""
    from dpcda.storage.ledger import open_ledger

    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(2)
    label = ["a"] * 597 + ["b"] * 3
    pq.write_table(pa.table({"x": pa.array(rng.integers(0, 50, 600), pa.int64()), "y": label}), folder / "p.parquet")
    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)
    args = ["--label", "y", "--epsilon", "1", "--ledger", ledger, "--dataset-id", "ds"]
    for i in range(2):
        out = tmp_path / f"out{i}"
        rc = main(["release", "--input", str(folder / "*.parquet"), "--output", str(out), *args, *BEAM_ARGS])
        err = capsys.readouterr().err
        assert rc == EXIT_BAD_INPUT, err[-3000:]
        assert_one_line_error(err, "label 'y': the DP domain step released 1 of its values")
        assert_nothing_published(out)
    entries = [e for e in open_ledger(ledger).entries("ds") if e["state"] != "cap"]
    assert [e["state"] for e in entries] == ["published", "published"]
    assert all("DP domain step" in e["note"] and 0 < e["epsilon"] < 1 for e in entries)
    assert all({ev["type"] for ev in e["events"]["shared"]} == {"DomainEvent"} for e in entries)


def test_a_float_label_is_refused(tmp_path, capsys):
    glob, _ = _write(tmp_path / "in")
    out = tmp_path / "out"
    args = [a if a != "status" else "amount" for a in BASE]
    rc = main(["release", "--input", glob, "--output", str(out), *args, *BEAM_ARGS])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err[-3000:]
    assert_one_line_error(err, "label 'amount': type double")
    assert_nothing_published(out)


def test_a_config_cannot_declare_the_domain_steps_record(tmp_path, capsys):
    glob, _ = _write(tmp_path / "in")
    conf = tmp_path / "c.yaml"
    conf.write_text("table:\n  label: {name: status}\n  domain: {share: 0.5, event: {}, derived: []}\n")
    rc = main(["release", "--config", str(conf), "--input", glob, "--output", str(tmp_path / "o"), "--epsilon", "1"])
    assert rc == EXIT_BAD_INPUT
    assert_one_line_error(capsys.readouterr().err, "table.domain: written by a release's DP domain step")


def test_schema_infer_drafts_marginals_under_add_remove_and_a_shortened_draft_runs_it(tmp_path, capsys):
    import yaml

    from dpcda.schemas.config import load_config

    glob, _ = _write(tmp_path / "in")
    out = tmp_path / "table.yaml"
    assert main(["schema", "infer", "--input", glob, "--label", "status", "--out", str(out)]) == 0
    draft = yaml.safe_load(out.read_text())
    assert draft["mechanism"] == "marginals" and draft["mode"] == "poisson"
    # the user keeps what they know (a boolean) and deletes the rest: the release derives it
    draft["table"]["columns"] = [c for c in draft["table"]["columns"] if c["name"] == "flag"]
    del draft["table"]["label"]["categories"]
    conf = tmp_path / "c.yaml"
    conf.write_text(yaml.safe_dump(draft))
    cfg = load_config(str(conf), {"input": glob, "output": str(tmp_path / "o"), "epsilon": 1.0})
    assert cfg.mechanism.name == "marginals" and cfg.mode == "poisson" and cfg.derives_label


def test_account_states_the_domain_steps_share_like_a_release(capsys):
    from dpcda.api import account

    out = account("marginals", class_size=1, epsilon=1.0, table_columns=6, derived_numeric=3, derived_categorical=2,
                  domain_budget_share=0.3)  # fmt: skip
    dom = out["shares"]["domain"]
    assert dom["share"] == 0.3 and dom["reserved_delta"] == pytest.approx(3e-6)
    assert out["epsilon"] <= 1.0 and "domain" in out["components"]
    assert dom["rho"] / (dom["rho"] + out["rho"]) == pytest.approx(0.3, rel=0.05)
    assert main(["account", "--mechanism", "marginals", "--class-size", "1", "--epsilon", "1"]) == EXIT_BAD_INPUT
    assert "--table-columns" in capsys.readouterr().err


def test_a_table_whose_undeclared_columns_are_booleans_needs_no_measurement(tmp_path, capsys):
    """With the label's categories declared and only booleans left, the schema is completed without a DP step."""
    from dpcda.mechanisms.domain.derive import assemble
    from dpcda.mechanisms.domain.request import request
    from dpcda.schemas.table import TableSchema

    glob, table = _write(tmp_path / "in")
    declared = TableSchema(
        label={"name": "status", "categories": ["bad", "good"]},
        columns=[c for c in [{"name": "term", "kind": "numeric", "lower": 0, "upper": 72}]],
        drop=["amount", "city", "day"],
    )
    req = request(declared, table.schema)
    assert not req.derive and [c.name for c in req.booleans] == ["flag"]
    schema = assemble(req, {})
    assert [c.name for c in schema.columns] == ["term", "flag"] and schema.domain is None and schema.complete


def test_declared_rules_are_kept_by_the_derived_schema_and_refused_where_bins_are_not_equal(tmp_path):
    """A partial table: section's public rules come back in the completed schema; a rule on a label whose categories
    the step derives, or on a column with spikes (its codes are not equal bins), is refused before any work."""
    from pydantic import ValidationError

    from dpcda.mechanisms.domain.derive import assemble
    from dpcda.mechanisms.domain.request import request
    from dpcda.schemas.table import TableSchema

    _, table = _write(tmp_path / "in")
    term = {"name": "term", "kind": "numeric", "lower": 0, "upper": 72}
    rule = {"if": {"flag": True}, "then": {"status": "good"}}
    declared = TableSchema(
        label={"name": "status", "categories": ["bad", "good"]},
        columns=[term, {"name": "flag", "kind": "boolean"}],
        drop=["amount", "city", "day"],
        rules=[rule],
    )
    schema = assemble(request(declared, table.schema), {})
    assert schema.rules == declared.rules and schema.complete
    with pytest.raises(ValidationError, match="rules: a rule on label 'status' needs its categories declared"):
        TableSchema(label={"name": "status"}, columns=[{"name": "flag", "kind": "boolean"}], rules=[rule])
    spiky = {**term, "spikes": [12, 24]}
    with pytest.raises(ValidationError, match="rules: column 'term' has edges, spikes"):
        TableSchema(label={"name": "status", "categories": ["bad", "good"]}, columns=[spiky],
                    rules=[{"if": {"term": None}, "then": {"status": "bad"}}])  # fmt: skip


def _stopped_after_the_step(folder):
    """The review's label reproducer: "a" x597, "b" x3, so the release stops after the DP domain step."""
    folder.mkdir()
    rng = np.random.default_rng(2)
    label = ["a"] * 597 + ["b"] * 3
    pq.write_table(pa.table({"x": pa.array(rng.integers(0, 50, 600), pa.int64()), "y": label}), folder / "p.parquet")
    return str(folder / "*.parquet")


@pytest.mark.parametrize("how", ["second interrupt in the clean-up", "killed, then ledger resolve"])
def test_the_charge_does_not_rest_on_the_exception_that_stopped_the_run(tmp_path, capsys, monkeypatch, how):
    """A reservation is marked with the step's spend before the step reads a row, so a cancel charges it: a second
    interrupt raised while the run cleans up (the first error then never reaches the ledger), or a run that died
    without a word whose reservation ``ledger resolve`` settles, are charged as the plain failure is."""
    from dpcda.pipeline import release_ledger
    from dpcda.storage import publish
    from dpcda.storage.ledger import open_ledger
    from dpcda.storage.ledger_resolve import resolve

    glob = _stopped_after_the_step(tmp_path / "in")
    ledger = str(tmp_path / "ledger.db")
    open_ledger(ledger, create=True)
    if how.startswith("second"):
        abandon = publish.abandon

        def interrupted(target, err):
            abandon(target, err)
            raise KeyboardInterrupt  # the clean-up's own interrupt replaces the error settle sees

        monkeypatch.setattr(publish, "abandon", interrupted)
    else:
        # the process died: nothing settles the reservation
        monkeypatch.setattr(release_ledger, "settle", lambda *a: None)
    args = ["--label", "y", "--epsilon", "1", "--ledger", ledger, "--dataset-id", "ds"]
    main(["release", "--input", glob, "--output", str(tmp_path / "out"), *args, *BEAM_ARGS])
    capsys.readouterr()
    entries = [e for e in open_ledger(ledger).entries("ds") if e["state"] != "cap"]
    if how.startswith("killed"):
        assert [e["state"] for e in entries] == ["pending"] and entries[0]["charge_on_failure"]["epsilon"] > 0
        assert resolve(open_ledger(ledger), "ds", entries[0]["run"], force=True) == "charged"
        entries = [e for e in open_ledger(ledger).entries("ds") if e["state"] != "cap"]
    assert [e["state"] for e in entries] == ["published"], entries
    assert "DP domain step" in entries[0]["note"] and 0 < entries[0]["epsilon"] < 1
    assert "charge_on_failure" not in entries[0]
