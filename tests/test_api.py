"""The Python API (dpcda.release, dpcda.account): the same job and numbers as the CLI."""

from __future__ import annotations

import json

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
