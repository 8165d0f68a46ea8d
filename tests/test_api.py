"""The Python API (dpcda.release, dpcda.account): the same job and numbers as the CLI."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pytest

import dpcda
from dpcda.storage.publish import PublishError
from tests import golden
from tests.conftest import ROOT, run_cli


def test_release_of_a_table_object_matches_the_cli(tmp_path):
    """A pyarrow Table in, the same rows and manifest out as the CLI's release of the same shards and seed."""
    x, y = golden.dataset()
    feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), x.shape[1])
    rel = dpcda.release(pa.table({"features": feats, "label": y}), epsilon=10, mixing_order=4, seed=golden.SEED)
    assert rel.table.num_rows == rel.manifest["output"]["rows"] == 120
    assert rel.manifest["privacy"]["epsilon"] <= 10 and rel.manifest["mechanism"]["name"] == "dpcda"
    recorded = json.loads((ROOT / "tests" / "recorded" / "golden_rows.json").read_text())["dpcda-fixed"]
    assert golden.fingerprint(rel.directory)["rows"] == recorded["rows"]  # the CLI's rows for this seed
    written = rel.write(str(tmp_path / "out"))
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["privacy"] == rel.manifest["privacy"] and written == str(tmp_path / "out")
    with pytest.raises(PublishError, match="already exists"):
        rel.write(str(tmp_path / "out"))
    rel.write(str(tmp_path / "out"), overwrite=True)  # a release of ours: replaced


def test_release_errors_are_the_clis_one_line_errors(tmp_path):
    from dpcda.privacy.errors import DpcdaError

    with pytest.raises(DpcdaError, match="epsilon"):
        dpcda.release(str(tmp_path / "none*.parquet"), epsilon=-1)
    with pytest.raises(DpcdaError, match="no input files match|no .*files match"):
        dpcda.release(str(tmp_path / "none*.parquet"), epsilon=1)


@pytest.mark.parametrize("mechanism", ["dpcda", "dpmix", "local"])
def test_account_is_what_the_cli_prints(mechanism):
    kw = dict(class_size=500, epsilon=2.0, samples_per_class=500, mixing_order=4)
    out = dpcda.account(mechanism, **kw)
    res = run_cli(
        "account", "--mechanism", mechanism, "--class-size", 500, "--epsilon", 2, "--samples-per-class", 500,
        "--mixing-order", 4, *(("--mode", "fixed") if mechanism != "dpcda" else ()), "--json",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    cli = json.loads(res.stdout)
    assert cli["sigma_x"] == pytest.approx(out["sigma_x"], rel=0) and cli["epsilon"] == out["epsilon"] <= 2.0


def test_the_readme_python_example_runs(tmp_path, monkeypatch):
    """The README's Python block, run as written (in a folder holding the data it names)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index("## Python API")) + len("```python\n")
    code = text[start : text.index("```", start)]
    x, y = golden.dataset()
    from dpcda.pipeline.prepare import write_shards

    write_shards(np.asarray(x), np.asarray(y), str(tmp_path / "data" / "fashion-mnist" / "train"), "parquet", 2)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the documented example itself
    assert (tmp_path / "releases" / "python-api" / "manifest.json").exists()


# ---------------------------------------------------------------- the API speaks Python


@pytest.fixture(scope="module")
def table_release():
    """A pandas DataFrame, filtered (its index no longer 0..n-1), released with a schema: about 12 s."""
    from tests.test_tables import SCHEMA, make_table

    frame = make_table(200, seed=1).to_pandas()
    frame = frame[frame.tenure > 3]
    rel = dpcda.release(frame, epsilon=5, schema=SCHEMA, mechanism="dpcda", mixing_order=4, seed=1)
    yield frame, rel
    rel.close()


def test_a_table_given_to_release_takes_marginals_under_add_remove_by_default():
    """dpcda.release(table, schema=...) without a mechanism: marginals, mode poisson, no exact size in the manifest
    (the ``table_release`` fixture names dpcda: mixing stays available by name)."""
    from tests.test_tables import SCHEMA, exact_sizes, make_table

    with dpcda.release(make_table(300, seed=2), epsilon=5, schema=SCHEMA, seed=1) as rel:
        mech = rel.manifest["mechanism"]
        assert (mech["name"], mech["mode"]) == ("marginals", "poisson") and exact_sizes(rel.manifest) == []
        assert rel.table.schema.names == make_table(1).schema.names


def test_a_dataframe_is_released_without_its_index_and_the_manifest_names_it_in_memory(table_release):
    """Bad-input case L5: a filtered DataFrame was refused (its index arrived as column __index_level_0__)."""
    from dpcda.api_support import IN_MEMORY

    frame, rel = table_release
    assert rel.table.column_names == list(frame.columns)
    assert rel.manifest["input"]["pattern"] == IN_MEMORY  # not the private copy's temporary path
    assert "files" not in rel.manifest["input"]  # the input's file count is not stated
    assert [f["name"] for f in rel.manifest["input"]["table"]["arrow_schema"]] == list(frame.columns)


def test_a_release_has_a_short_repr_and_the_package_lists_its_api(table_release):
    _, rel = table_release
    text = repr(rel)
    assert len(text) < 200 and text.startswith(f"Release({rel.directory!r}, mechanism='dpcda', rows=")
    assert f"epsilon={rel.manifest['privacy']['epsilon']}" in text
    assert set(dpcda.__all__) == {"release", "account", "Release", "load"} <= set(dir(dpcda))
    import pydoc

    doc = pydoc.render_doc(dpcda.release)
    assert '"columns": [' in doc and '"kind": "numeric", "lower": 0, "upper": 72' in doc and "DataFrame" in doc


def test_api_messages_name_keyword_arguments_and_the_callers_table(table_release, tmp_path):
    """Messages of the Python API name its keyword arguments, never the CLI's flags, and an in-memory table as the
    caller's source, never its temporary copy."""
    from dpcda.privacy.errors import DpcdaError

    frame, rel = table_release
    with pytest.raises(DpcdaError) as err:
        dpcda.release(frame, epsilon=5)  # a table without its schema
    text = str(err.value)
    assert text.startswith("source (an in-memory table given to dpcda.release): column 'features' is missing")
    assert "with schema= (or in a config= file's table:)" in text and "--" not in re.sub(r"'dpcda [^']*'", "", text)
    assert "dpcda-input-" not in text and "\n" not in text
    rel.write(str(tmp_path / "out"))
    with pytest.raises(PublishError, match=r"already exists there; pass overwrite=True to replace it$"):
        rel.write(str(tmp_path / "out"))
    with pytest.raises(DpcdaError, match=r"^epsilon=True: a number, not a bool$"):  # bad-input case L2
        dpcda.release(frame, epsilon=True)
    with pytest.raises(DpcdaError, match="give exactly one of epsilon= or sigma_x="):  # L10: dpcda.account
        dpcda.account("dpcda", class_size=100, samples_per_class=10)
    with pytest.raises(DpcdaError, match="give samples_per_class="):
        dpcda.account("dpcda", class_size=100, epsilon=1.0)
    # the command's own words are kept where the command is what the message suggests
    from dpcda.api_support import in_python_words

    cap = "a stored cap changes only with 'dpcda ledger cap --ledger l.db --dataset-id ds --epsilon E'"
    assert in_python_words(f"this release gives --budget-cap 9; {cap}") == f"this release gives budget_cap= 9; {cap}"
    assert in_python_words("pass --i-understand-exact-normalization-is-not-dp") == "pass allow_exact_normalization=True"


@pytest.mark.parametrize(
    "source, says",
    [
        (["a.parquet", "b.parquet"], "source: a list of 2 paths; give one glob string that matches the shards"),
        (None, "source: a NoneType; give a glob string"),
        (3, "source: a int; give a glob string"),
        (b"data/*.parquet", "source: a bytes; give a glob string"),
        (pa.table({"features": pa.array([], pa.float32()), "label": pa.array([], pa.int64())}), "no rows"),
    ],
)
def test_a_source_of_another_kind_is_refused_naming_source_and_the_kinds(source, says, tmp_path):
    """Bad-input case M4: a list of paths, None, an int or bytes ended in pyarrow's ValueError or TypeError."""
    from dpcda.privacy.errors import DpcdaError

    with pytest.raises(DpcdaError) as err:
        dpcda.release(source, epsilon=1, output=str(tmp_path / "rel"))
    assert says in str(err.value) and "\n" not in str(err.value)
    if "glob string" in says:
        assert "a pyarrow Table or RecordBatch, a pandas DataFrame" in str(err.value)
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_non_finite_value_is_one_error_naming_source_and_column_with_no_beam_traceback(bad, tmp_path, capfd):
    """Bad-input case M5: Beam printed its own ERROR record with the whole traceback to stderr before the right
    one-line error, which named the hidden temporary copy."""
    from dpcda.privacy.errors import DpcdaError
    from tests.test_tables import SCHEMA, make_table

    table = make_table(60, seed=2)
    tenure = table.column("tenure").to_pylist()
    table = table.set_column(0, "tenure", pa.array([float(v) for v in tenure[:-1]] + [float(bad)], pa.float64()))
    capfd.readouterr()
    with pytest.raises(DpcdaError) as err:
        dpcda.release(table, epsilon=5, schema=SCHEMA, mechanism="dpcda", output=str(tmp_path / "rel"))
    assert (
        str(err.value) == "source (an in-memory table given to dpcda.release): column 'tenure' row 59: NaN or infinite"
    )
    err_text = capfd.readouterr().err
    assert "apache_beam.runners.common" not in err_text and "Traceback" not in err_text, err_text[-2000:]
    assert not (tmp_path / "rel").exists()
    assert not [p for p in tmp_path.parent.glob("dpcda-input-*")]  # (tempfile's folder is elsewhere: nothing here)


def test_write_refuses_a_path_inside_the_release_and_says_what_stands_at_a_path(table_release, tmp_path):
    """Bad-input cases L7 (a copy nested inside its own source was accepted) and L4 (a file or a foreign folder at
    the path was 'a release already exists there; pass --overwrite', and then overwrite was refused too)."""
    _, rel = table_release
    with pytest.raises(PublishError, match="inside this release's own folder"):
        rel.write(os.path.join(rel.directory, "sub"))
    assert not os.path.exists(os.path.join(rel.directory, "sub"))
    (tmp_path / "file").write_text("mine")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine")
    (tmp_path / "empty").mkdir()
    for name, says in [
        ("file", "is a file, not a release; refusing to replace it, choose another output="),
        ("folder", "a folder that is not a release of ours (no valid manifest.json); refusing to replace it"),
        ("empty", "an empty folder (no valid manifest.json); refusing to replace it"),
    ]:
        for overwrite in (False, True):
            with pytest.raises(PublishError, match=re.escape(says)):
                rel.write(str(tmp_path / name), overwrite=overwrite)
    assert (tmp_path / "file").read_text() == "mine" and (tmp_path / "folder" / "notes.txt").read_text() == "mine"


def test_a_release_removes_its_private_folders_when_closed_or_collected(tmp_path):
    """Bad-input case L6: the first Release of a process stayed alive after del and gc.collect() (a library keeps an
    exception from an import the release made, and with it the frames of that call), and with it the private copy
    of the input, until the process exited. Now: close(), a with block, or collection removes them."""
    import subprocess
    import sys

    code = """
import gc, json, os, sys, weakref
import pyarrow as pa
import dpcda
from tests import golden
x, y = golden.dataset()
feats = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), x.shape[1])
table = pa.table({"features": feats, "label": y})
rel = dpcda.release(table, epsilon=10, mixing_order=4, seed=1)
folders = list(rel._folders)
assert all(os.path.isdir(f) for f in folders) and len(folders) == 2
alive = weakref.ref(rel)
del rel
gc.collect()
collected = [alive() is None, [os.path.exists(f) for f in folders]]
with dpcda.release(table, epsilon=10, mixing_order=4, seed=1) as rel:
    inside = list(rel._folders)
    rows = rel.table.num_rows
closed = [os.path.exists(f) for f in inside] + [rel.table.num_rows == rows, rel.closed]
print(json.dumps([collected, closed]))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    collected, closed = json.loads(res.stdout.strip().splitlines()[-1])
    assert collected == [True, [False, False]] and closed == [False, False, True, True]
