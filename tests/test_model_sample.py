"""A marginals release keeps its fitted model (model/), and more rows are drawn from it later: ``dpcda sample`` and
``dpcda.load(DIR).sample(n)``, post-processing (no budget, no ledger entry), with the release's schema."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpcda.mechanisms.marginals import model as mm
from dpcda.schemas.table import parse_table_schema
from tests.conftest import run_cli
from tests.test_tables import SCHEMA, make_table


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A DirectRunner marginals release of a 3000-row table with a ledger (one mbi compile, about 30 s)."""
    import dpcda

    base = tmp_path_factory.mktemp("model")
    table = make_table(3000, seed=1)
    out, ledger = base / "rel", base / "ledger.sqlite"
    init = run_cli("ledger", "init", "--ledger", ledger)
    assert init.returncode == 0, init.stderr
    dpcda.release(
        table,
        epsilon=20,
        mechanism="marginals",
        schema=SCHEMA,
        output=str(out),
        ledger=str(ledger),
        dataset_id="churn",
    )
    return table, out, ledger


def _synthetic(folder: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted((folder / "synthetic").glob("*.parquet"))])


def _digests(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_marginals_release_keeps_its_model_and_no_row(release):
    table, out, _ = release
    manifest = json.loads((out / "manifest.json").read_text())
    listed = manifest["model"]
    assert listed["format"] == mm.FORMAT and listed["version"] == mm.VERSION
    assert sorted(os.listdir(out / "model")) == sorted(mm.MODEL_FILES)
    for f in listed["files"]:  # listed with the digest of what is there
        data = (out / f["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
    doc = json.loads((out / "model" / mm.MODEL_JSON).read_text())
    assert set(doc) == {"format", "version", "domain", "table", "integers", "measurements", "model"}
    assert set(doc["measurements"]) == {"one_way_std", "compressed", "cliques"}
    assert set(doc["model"]) == {"estimator", "cliques", "total"}
    n = len(doc["domain"]["names"])
    with np.load(out / "model" / mm.MODEL_ARRAYS, allow_pickle=False) as npz:
        names = set(npz.files)
        arrays = {k: npz[k] for k in names}
    k_cl, k_pot = len(doc["measurements"]["cliques"]), len(doc["model"]["cliques"])
    assert names == (
        {f"one_way_{i}" for i in range(n)}
        | {f"mapping_{i}" for i in doc["measurements"]["compressed"]}
        | {f"clique_{k}" for k in range(k_cl)}
        | {f"potential_{k}" for k in range(k_pot)}
        | {"arrow_schema"}
    )
    # the one-way counts are the noisy ones (on the noise grid, not the exact counts of the input)
    fm = mm.load_model({name: (out / "model" / name).read_bytes() for name in mm.MODEL_FILES})
    exact = table.column("contract").value_counts().to_pylist()
    noisy = fm.one_way_measurements()["contract"].counts
    assert noisy.shape == (3,) and not np.array_equal(np.sort(noisy), np.sort([e["counts"] for e in exact]))
    assert fm.one_way_measurements()["contract"].std == doc["measurements"]["one_way_std"] > 0
    # no value of a row: besides the schema's bytes, every array is shaped by the codes of one or two columns
    largest = max(doc["domain"]["sizes"])
    shaped = [a for k, a in arrays.items() if k != "arrow_schema"]
    assert all(1 <= a.ndim <= 2 and max(a.shape) <= largest for a in shaped)
    assert arrays["arrow_schema"].dtype == np.uint8


def test_a_release_without_a_model_states_none():
    from dpcda.schemas.manifest import Manifest
    from tests.conftest import valid_manifest

    m = Manifest.model_validate(valid_manifest())
    assert "model" not in m.model_dump(mode="json") and m.model is None


def test_load_samples_the_releases_schema_and_its_one_way_distributions(release):
    import dpcda
    from dpcda.evaluation.table_metrics import table_metrics

    _, out, _ = release
    model = dpcda.load(out)
    assert model.manifest["mechanism"]["name"] == "marginals"
    a, b, c = model.sample(3000, seed=3), model.sample(3000, seed=3), model.sample(3000)
    synthetic = _synthetic(out)
    assert a.schema.equals(synthetic.schema) and a.num_rows == 3000
    assert a.equals(b)  # same seed, same rows
    assert not a.equals(c)  # no seed: fresh randomness
    tvd = table_metrics(synthetic, a, parse_table_schema(SCHEMA))["one_way_tvd"]
    assert max(tvd.values()) < 0.05, tvd  # both are draws from one model: two samples of 3000 rows


def test_dpcda_sample_publishes_post_processing_and_leaves_the_ledger_alone(release, tmp_path):
    _, out, ledger = release
    before = _digests(ledger.parent)
    r1 = run_cli("sample", "--release", out, "--rows", 2500, "--output", tmp_path / "s1", "--seed", 11)
    assert r1.returncode == 0, r1.stderr
    assert _main("sample", "--release", out, "--rows", 2500, "--output", tmp_path / "s2", "--seed", 11) == 0
    assert _digests(ledger.parent) == before  # no ledger entry, nothing read or written beside the release
    s1, s2 = _synthetic(tmp_path / "s1"), _synthetic(tmp_path / "s2")
    assert s1.equals(s2) and s1.schema.equals(_synthetic(out).schema) and s1.num_rows == 2500
    m = json.loads((tmp_path / "s1" / "manifest.json").read_text())
    rel_manifest = (out / "manifest.json").read_bytes()
    rel = json.loads(rel_manifest)
    assert m["kind"] == "sample" and m["source"]["path"] == str(out)
    assert m["source"]["manifest_sha256"] == hashlib.sha256(rel_manifest).hexdigest()
    assert m["privacy"]["inherited"] is True and m["privacy"]["epsilon_spent"] == 0
    assert (m["privacy"]["epsilon"], m["privacy"]["delta"]) == (rel["privacy"]["epsilon"], rel["privacy"]["delta"])
    assert "post-processing of release" in m["privacy"]["statement"]
    assert m["output"]["rows"] == m["sampling"]["rows"] == 2500 and m["sampling"]["reproducible_seed"] is True
    assert [f["sha256"] for f in m["source"]["model"]] == [f["sha256"] for f in rel["model"]["files"]]
    assert "ledger" not in rel or rel["ledger"]["dataset_id"] == "churn"  # the release's own entry, unchanged
    # a sample of ours is replaced with --overwrite
    assert _main("sample", "--release", out, "--rows", 10, "--output", tmp_path / "s1", "--overwrite") == 0
    assert _synthetic(tmp_path / "s1").num_rows == 10


def _main(*args) -> int:
    """The CLI in this process (``dpcda.pipeline.cli.main``; one subprocess run above shows the real command)."""
    from dpcda.pipeline.cli import main

    return main([str(a) for a in args])


def _refused(capsys, *args, needle: str):
    capsys.readouterr()
    rc = _main("sample", *args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("dpcda: error: "), lines
    assert needle in lines[0], lines[0]
    return lines[0]


def test_dpcda_sample_refusals_are_one_line_and_write_nothing(release, tmp_path, small_parquet, capsys):
    import dpcda

    _, out, _ = release
    dest = tmp_path / "s"
    for rows in ("0", "-3", "x", "1.5", "100000001"):
        _refused(capsys, "--release", out, "--rows", rows, "--output", dest, needle="--rows must be an integer")
    _refused(capsys, "--release", tmp_path, "--rows", 5, "--output", dest, needle="not a release")
    _refused(capsys, "--release", out, "--rows", 5, "--output", out / "more", needle="inside the release")
    (dest).mkdir()
    (dest / "keep.txt").write_text("mine")
    _refused(capsys, "--release", out, "--rows", 5, "--output", dest, needle="not a release of ours")
    assert sorted(os.listdir(dest)) == ["keep.txt"]
    # a release whose mechanism keeps no model (mixing)
    mixing = tmp_path / "mix"
    dpcda.release(small_parquet[0], epsilon=10, mixing_order=4, seed=1, output=str(mixing))
    _refused(capsys, "--release", mixing, "--rows", 5, "--output", tmp_path / "m", needle="keeps no model")
    assert not (tmp_path / "m").exists() and not (out / "more").exists()


def test_an_interrupt_after_dpcda_sample_published_says_so(release, tmp_path, capsys, monkeypatch):
    import signal
    import time

    import dpcda.pipeline.cli.base as base

    _, out, _ = release
    said = base.published

    def published(what: str) -> None:
        said(what)
        os.kill(os.getpid(), signal.SIGINT)  # the CLI's handler raises here: after the sample is published
        time.sleep(5)
        raise AssertionError("the interrupt did not arrive")

    monkeypatch.setattr(base, "published", published)
    sample = tmp_path / "more"
    capsys.readouterr()
    assert _main("sample", "--release", out, "--rows", 50, "--output", sample) == 130
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line == f"dpcda: interrupted; the sample at {sample} WAS published and is complete", line
    assert _synthetic(sample).num_rows == 50 and (sample / "manifest.json").is_file()


def _copy_with(out: Path, tmp_path: Path, name: str, change) -> Path:
    bad = tmp_path / f"bad-{name}"
    shutil.copytree(out, bad)
    path = bad / "model" / name
    path.write_bytes(change(path.read_bytes()))
    return bad


def test_a_changed_or_truncated_model_is_refused(release, tmp_path, capsys):
    import dpcda
    from dpcda.mechanisms.marginals.model import ModelError

    _, out, _ = release
    truncated = _copy_with(out, tmp_path, mm.MODEL_ARRAYS, lambda b: b[:-64])
    line = _refused(capsys, "--release", truncated, "--rows", 5, "--output", tmp_path / "s", needle="differs")
    assert "changed or truncated" in line and not (tmp_path / "s").exists()
    edited = _copy_with(out, tmp_path, mm.MODEL_JSON, lambda b: b + b" ")
    with pytest.raises(ModelError, match="differs from the manifest"):
        dpcda.load(edited)


def test_the_format_refuses_what_it_does_not_define(release):
    """Checked after the digests: a file that matches its digest still holds only what the format defines."""
    _, out, _ = release
    files = {name: (out / "model" / name).read_bytes() for name in mm.MODEL_FILES}
    doc = json.loads(files[mm.MODEL_JSON])
    with np.load(io.BytesIO(files[mm.MODEL_ARRAYS]), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}

    def npz(**arrs) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrs)
        return buf.getvalue()

    cases = {
        "extra key": {**files, mm.MODEL_JSON: json.dumps({**doc, "rows_seen": [1, 2]}).encode()},
        "other version": {**files, mm.MODEL_JSON: json.dumps({**doc, "version": 99}).encode()},
        "extra array": {**files, mm.MODEL_ARRAYS: npz(**arrays, secret=np.arange(3.0))},
        "object array": {**files, mm.MODEL_ARRAYS: _pickled(arrays)},
        "wrong shape": {**files, mm.MODEL_ARRAYS: npz(**{**arrays, "one_way_0": np.zeros(99)})},
        "not finite": {**files, mm.MODEL_ARRAYS: npz(**{**arrays, "potential_0": arrays["potential_0"] * np.nan})},
        "missing file": {mm.MODEL_JSON: files[mm.MODEL_JSON]},
    }
    for what, blobs in cases.items():
        with pytest.raises(mm.ModelError, match="the model was changed or is incomplete") as err:
            mm.load_model(blobs)
        assert "\n" not in str(err.value), what


def _pickled(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays, rows=np.array([{"a": 1}], dtype=object))
    return buf.getvalue()


@pytest.mark.slow
def test_an_aim_release_keeps_a_model_that_samples(tmp_path):
    """AIM's cliques include single columns and repeats: the model keeps each measurement as measured (45 s)."""
    import dpcda
    from dpcda.evaluation.table_metrics import table_metrics

    out = tmp_path / "aim"
    rel = dpcda.release(
        make_table(2000, seed=2), epsilon=5, mechanism="marginals", schema=SCHEMA, seed=3, output=str(out),
        marginals_selection="aim",
    )  # fmt: skip
    model = dpcda.load(out)
    assert [list(m.clique) for m in model.model.cliques] == rel.manifest["mechanism"]["cliques"]
    more = model.sample(4000, seed=1)
    assert more.schema.equals(rel.table.schema) and more.num_rows == 4000
    tvd = table_metrics(rel.table, more, parse_table_schema(SCHEMA))["one_way_tvd"]
    assert max(tvd.values()) < 0.05, tvd
