"""The marginals' size bounds (``mechanisms.marginals.limits``), checked before any row is read: too many columns
(bad-input case M6: 200 columns) and a fit that would not fit in memory (M7: 1024 bins on 11 numeric columns) are
one-line refusals, exit 2, nothing published, the input unchanged; the footprint grows as the benchmark measured."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.perf.bench_marginals_size import schema_of, write_table
from dpcda.mechanisms import marginals as mg
from dpcda.mechanisms.base import PlanError
from dpcda.pipeline.cli import EXIT_BAD_INPUT, main
from dpcda.schemas.config import load_config
from dpcda.schemas.table import parse_table_schema
from tests.test_bad_input import assert_nothing_published, assert_one_line_error, snapshot


def _release_files(tmp_path, columns: int, numeric: bool, rows: int = 20):
    """A table of ``rows`` rows of ``bench_marginals_size.schema_of`` (written as the benchmark writes it) and its
    config file: (input glob, config path, input folder)."""
    schema = schema_of(columns, numeric)
    inp = write_table(str(tmp_path / "in"), schema, rows)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"mechanism": "marginals", "table": schema}))
    return inp, str(cfg), tmp_path / "in"


@pytest.mark.parametrize(
    "columns, numeric, bins, needle",
    [
        (200, False, 20, "the table has 201 columns (the label included), more than 128"),  # M6
        (11, True, 1024, "counting and fitting this table takes about"),  # M7
    ],
)
def test_a_table_too_large_to_fit_is_refused_before_work(tmp_path, capsys, columns, numeric, bins, needle):
    inp, cfg, folder = _release_files(tmp_path, columns, numeric)
    before = snapshot(folder)
    out = tmp_path / "out"
    args = ["release", "--config", cfg, "--input", inp, "--output", str(out), "--epsilon", "1", "--seed", "1"]
    rc = main([*args, "--marginals-bins", str(bins)])
    assert rc == EXIT_BAD_INPUT
    assert_one_line_error(capsys.readouterr().err, needle)
    assert_nothing_published(out)
    assert snapshot(folder) == before


def test_samples_past_the_marginals_bound_are_refused_before_work(tmp_path, capsys):
    """Marginals plans no public row count (its rows are the fitted model's DP total), so the mixing mechanisms'
    "at most 100 x input rows" has nothing to scale: --samples has an absolute bound instead, that of dpcda sample."""
    from dpcda.pipeline.sample import MAX_SAMPLE_ROWS
    from dpcda.schemas.mechanism_params import MAX_MODEL_SAMPLES

    assert MAX_SAMPLE_ROWS == MAX_MODEL_SAMPLES == 100_000_000
    inp, cfg, folder = _release_files(tmp_path, 3, False)
    before = snapshot(folder)
    out = tmp_path / "out"
    args = ["release", "--config", cfg, "--input", inp, "--output", str(out), "--epsilon", "1", "--seed", "1"]
    assert main([*args, "--samples", str(MAX_MODEL_SAMPLES + 1)]) == EXIT_BAD_INPUT
    assert_one_line_error(capsys.readouterr().err, "samples: T=100,000,001 is more than marginals' 100,000,000")
    assert_nothing_published(out)
    assert snapshot(folder) == before
    base = {"input": "x", "output": "o/r", "epsilon": 1.0, "mechanism": "marginals", "table": schema_of(3, False)}
    assert load_config(None, {**base, "samples": MAX_MODEL_SAMPLES}).core.params.samples == MAX_MODEL_SAMPLES


def _footprint(columns: int, numeric: bool, bins: int, selection: str = "mst-label", cap=None):
    table = parse_table_schema(schema_of(columns, numeric))
    return mg.footprint(mg.domain_of(table, bins), table.encoded_width, selection, cap, 4096)


def test_the_footprint_counts_what_the_fit_holds():
    """The counts' cells are every one- and two-way marginal's; the model's bound is MST's largest pairs (and the
    label's with mst-label) or AIM's cap; the bytes grow with both, and M7's case passes the memory bound while
    passing the old cell check."""
    fp = _footprint(11, True, 1024)
    sizes = [1024] * 11 + [2]
    assert fp.count_cells == sum(sizes) + sum(a * b for i, a in enumerate(sizes) for b in sizes[i + 1 :])
    assert fp.count_cells <= mg.MAX_CELLS  # the old check let it through
    assert fp.model_cells == 11 * 1024 * 1024 + 11 * 1024 * 2  # the tree's 11 largest pairs, the label's 11
    assert fp.bytes > mg.MAX_FIT_BYTES
    assert _footprint(11, True, 1024, "mst").model_cells == 11 * 1024 * 1024
    assert _footprint(11, True, 64, "aim", cap=5000).model_cells == 5000
    small, wide = _footprint(11, True, 256), _footprint(11, True, 512)
    assert small.bytes < wide.bytes and small.count_cells < wide.count_cells
    assert mg.refusal(small, 256, "mst-label") is None


def test_the_sampling_block_holds_fewer_rows_for_a_wider_table():
    assert mg.limits.sample_block_rows(20, 4096) == 1 << 18  # wa_churn's blocks as before
    assert mg.limits.sample_block_rows(128, 4096) * 128 <= mg.limits.SAMPLE_CELLS
    assert mg.limits.sample_block_rows(128, 4096) % 4096 == 0


def test_the_model_cap_is_named_for_aim(tmp_path, monkeypatch):
    monkeypatch.setattr(mg.limits, "MAX_MODEL_CELLS", 1000)
    cfg = load_config(
        None,
        {
            "input": "x",
            "output": "o/r",
            "mechanism": "marginals",
            "epsilon": 1.0,
            "table": schema_of(4, True),
            "marginals_selection": "aim",
        },
    )
    with pytest.raises(PlanError, match="lower --marginals-max-model-size$"):
        mg.Marginals().check_before_work(cfg.core, 0)
