"""Bad input, faults and reruns.

Every bad input is refused before any noise is drawn, with exit status 2 and ONE line on stderr
(``dpcda: error: ...``) naming the file, the column and, where it applies, the row; the release
directory is then absent (or the old release untouched) and no ``OUTPUT.tmp-*`` is left behind.

Several cases run the real CLI in a subprocess (``python -m dpcda.pipeline.cli``); the rest call
``pipeline.cli.main`` in-process (same code path, no interpreter start-up per case).

Retries: Beam 2.77's DirectRunner does NOT retry a failed bundle (the FnApiRunner behind
``in_memory``/``multi_processing`` raises the bundle's error; only the legacy BundleBasedDirectRunner
retries). So the fault hook is tested as: the failing run publishes nothing, a rerun with the same key
yields exactly the unfailed run's rows, and at the DoFn level an interrupted-then-repeated attempt
yields exactly the rows of an uninterrupted one.
"""

from __future__ import annotations

import glob
import json
import os
import re
import types
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from dpcda.pipeline.cli import EXIT_BAD_INPUT, main
from dpcda.pipeline.release import run_release
from dpcda.schemas.config import load_config
from dpcda.storage.shards import block_table, write_parquet, write_tfrecord
from dpcda.transforms.mix import _MixFn
from tests.conftest import BEAM_ARGS, make_dataset, run_cli, valid_manifest, write_dataset

N_PER_CLASS, K, DIM = 10, 3, 4
X, Y = make_dataset(n_per_class=N_PER_CLASS, num_classes=K, dim=DIM, seed=2)
# sigma_x instead of epsilon: no calibration search, so each run is cheap; noise is irrelevant here.
BASE = ["--sigma-x", "0.5", "--seed", "1"]


# ---------------------------------------------------------------- helpers


def good_input(d: Path, fmt="parquet") -> str:
    """Two valid shards (part-00000/00001); bad shards are added as part-00009 so they sort last."""
    return write_dataset(d, X, Y, fmt, shards=2)


def flat(x) -> pa.Array:
    x = np.asarray(x, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), x.shape[1])


def add_table(d: Path, table: pa.Table, name="part-00009.parquet") -> str:
    good_input(d)
    pq.write_table(table, d / name)
    return str(d / name)


def last_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines, "nothing on stderr"
    return lines[-1]


def assert_one_line_error(stderr: str, *needles: str) -> str:
    line = last_line(stderr)
    assert line.startswith("dpcda: error: "), stderr[-2000:]
    assert "[while running" not in line and "Traceback" not in stderr, stderr[-2000:]
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def assert_nothing_published(out: Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(out.name + ".tmp-*")) and not list(out.parent.glob(out.name + ".old-*"))


def snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def fake_old_release(out: Path) -> dict:
    """A release of ours (its manifest validates), so that --overwrite may replace it."""
    (out / "synthetic").mkdir(parents=True)
    (out / "synthetic" / "part-00000-of-00001.parquet").write_bytes(b"old rows")
    (out / "manifest.json").write_text(json.dumps(valid_manifest()) + "\n")
    return snapshot(out)


def read_rows(out: Path):
    tables = [pq.read_table(p) for p in sorted(glob.glob(str(out / "synthetic" / "part-*.parquet")))]
    feats = np.concatenate([np.stack(t.column("features").to_numpy(zero_copy_only=False)) for t in tables])
    labels = np.concatenate([t.column("label").to_numpy() for t in tables])
    order = np.lexsort(np.c_[feats, labels].T[::-1])
    return feats[order].astype(np.float32), labels[order]


# ---------------------------------------------------------------- the real CLI, in a subprocess


def _nan_in_second_shard(d: Path):
    x = X.copy()
    x[7, 2] = np.nan
    good_input(d)
    write_parquet(str(d / "part-00009.parquet"), x, Y)
    return str(d / "*.parquet"), str(d / "part-00009.parquet"), ["'features'", "row 7", "NaN, infinite"]


def _truncated_parquet(d: Path):
    good_input(d)
    p = d / "part-00001-of-00002.parquet"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return str(d / "*.parquet"), str(p), ["unreadable Parquet shard"]


def _truncated_tfrecord(d: Path):
    good_input(d, "tfrecord")
    p = d / "part-00001-of-00002.tfrecord"
    data = p.read_bytes()
    p.write_bytes(data[:-7])  # cut inside the last record
    return str(d / "*.tfrecord"), str(p), ["truncated TFRecord shard at record 14"]


def _narrower_shard(d: Path):
    good_input(d)
    write_parquet(str(d / "part-00009.parquet"), np.full((5, DIM - 1), 0.5), Y[:5])
    return (
        str(d / "*.parquet"),
        str(d / "part-00009.parquet"),
        ["'features'", "row 0", f"width {DIM - 1}, but the input's width is {DIM}"],
    )


CLASS_BYTES = N_PER_CLASS * (12 * DIM + 8)  # float64 copy, int64 index, the runner's float32 rows


def _class_too_large(d: Path):
    return (
        good_input(d),
        None,
        [
            "class 0 needs about",
            f"({N_PER_CLASS} records at d={DIM})",
            "max_class_bytes",
            "--max-class-bytes",
            "column 'label'",
        ],
    )


SUBPROCESS_CASES = {
    # name: (builder, extra flags, an old release at OUTPUT and --overwrite?)
    "nan-feature-keeps-old-release": (_nan_in_second_shard, [], True),
    "truncated-parquet": (_truncated_parquet, [], False),
    "truncated-tfrecord": (_truncated_tfrecord, [], False),
    "wrong-width-shard": (_narrower_shard, [], False),
    # refused on the in-memory path only (auto sends the class to the join path: tests/test_join.py)
    "class-too-large": (_class_too_large, ["--max-class-bytes", str(CLASS_BYTES - 1), "--mixing-path", "memory"], True),
}


@pytest.mark.parametrize("case", list(SUBPROCESS_CASES))
def test_cli_subprocess_refuses_bad_input(tmp_path, case):
    build, extra, old = SUBPROCESS_CASES[case]
    input_glob, bad_file, needles = build(tmp_path / "in")
    out = tmp_path / "out"
    before = fake_old_release(out) if old else None
    res = run_cli(
        "release", "--input", input_glob, "--output", out, *BASE, *extra, *(["--overwrite"] if old else []), *BEAM_ARGS
    )
    assert res.returncode == EXIT_BAD_INPUT, res.stderr[-3000:]
    assert_one_line_error(res.stderr, *([bad_file] if bad_file else []), *needles)
    if old:
        assert snapshot(out) == before
        assert not list(tmp_path.glob("out.tmp-*")) and not list(tmp_path.glob("out.old-*"))
    else:
        assert_nothing_published(out)


def test_cli_subprocess_clips_out_of_bounds_and_reports_counters(tmp_path):
    """clip mode: values outside the bounds are clipped and counted; an empty first shard is fine;
    the Beam counters (namespace 'dpcda') are reported on the stage=pipeline log line."""
    d = tmp_path / "in"
    d.mkdir()
    x = X.copy()
    x[4, 1], x[6, 0] = 1.5, -0.25
    write_parquet(str(d / "a-empty.parquet"), np.zeros((0, DIM)), np.zeros(0))
    write_parquet(str(d / "b.parquet"), x, Y)
    out = tmp_path / "out"
    res = run_cli("release", "--input", d / "*.parquet", "--output", out, *BASE, *BEAM_ARGS)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"{d / 'b.parquet'}: 2 feature values outside the declared bounds were clipped" in res.stderr
    line = next(ln for ln in res.stderr.splitlines() if "stage=pipeline" in ln)
    counts = dict(re.findall(r"(\w+)=(\d+)\b", line))
    n = N_PER_CLASS * K
    assert counts == {
        **counts,
        "rows": str(n),
        "rows_read": str(n),
        "rows_rejected": "0",
        "values_clipped_to_bounds": "2",
        "rows_synthesized": str(n),
        "rows_written": str(n),
    }
    assert json.loads((out / "manifest.json").read_text())["output"]["rows"] == n
    assert not list(tmp_path.glob("out.tmp-*"))


# ---------------------------------------------------------------- the same CLI, in-process


def _missing_features_first_file(d):  # found while peeking at the first shard, before Beam starts
    d.mkdir(parents=True)
    pq.write_table(pa.table({"pixels": flat(X), "label": pa.array(Y)}), d / "a.parquet")
    return str(d / "*.parquet"), str(d / "a.parquet"), ["column 'features' is missing", "pixels"]


def _missing_label_later_file(d):
    f = add_table(d, pa.table({"features": flat(X[:5]), "target": pa.array(Y[:5])}))
    return str(d / "*.parquet"), f, ["column 'label' is missing"]


def _features_scalar(d):
    f = add_table(d, pa.table({"features": pa.array(X[:5, 0]), "label": pa.array(Y[:5])}))
    return str(d / "*.parquet"), f, ["column 'features' has type float", "expected fixed_size_list"]


def _features_strings(d):
    vals = pa.array([["a"] * DIM] * 3, pa.list_(pa.string()))
    f = add_table(d, pa.table({"features": vals, "label": pa.array(Y[:3])}))
    return str(d / "*.parquet"), f, ["column 'features' holds string"]


def _label_strings(d):
    f = add_table(d, pa.table({"features": flat(X[:5]), "label": pa.array([str(v) for v in Y[:5]])}))
    return str(d / "*.parquet"), f, ["column 'label' has type string", "expected int64"]


def _ragged_rows(d):
    vals = pa.array([[0.1] * DIM, [0.1] * DIM, [0.1] * (DIM + 1)], pa.list_(pa.float32()))
    f = add_table(d, pa.table({"features": vals, "label": pa.array([0, 1, 2])}))
    return str(d / "*.parquet"), f, ["column 'features' row 2", f"width {DIM + 1}, but the input's width is {DIM}"]


def _inf_feature(d):
    x = X.copy()
    x[3, 1] = -np.inf
    f = add_table(d, block_table(x, Y))
    return str(d / "*.parquet"), f, ["column 'features' row 3", "a value is NaN, infinite or beyond the float32 range"]


def _out_of_bounds_refused(d):
    x = X.copy()
    x[4, 1], x[6, 0] = 1.5, -0.25
    f = add_table(d, block_table(x, Y))
    return str(d / "*.parquet"), f, ["column 'features' row 4", "a value lies outside feature_bounds [0, 1]"]


def _label_table(d, labels):
    return add_table(d, pa.table({"features": flat(X[: len(labels)]), "label": pa.array(labels)}))


def _negative_label(d):
    f = _label_table(d, [0, 1, -1, 2])
    return str(d / "*.parquet"), f, ["column 'label' row 2", "negative label"]


def _fractional_label(d):
    f = _label_table(d, [0.0, 1.0, 2.0, 1.5])
    return str(d / "*.parquet"), f, ["column 'label' row 3", "label is not an integer"]


def _missing_label_value(d):
    f = _label_table(d, [0, None, 1])
    return str(d / "*.parquet"), f, ["column 'label' row 1", "missing label"]


def _label_not_below_num_classes(d):
    f = _label_table(d, [0, 1, 2, 3])
    return str(d / "*.parquet"), f, ["column 'label' row 3", f"label >= num_classes {K}"]


def _huge_label_without_num_classes(d):
    f = _label_table(d, [0, 1, 10**12])
    return str(d / "*.parquet"), f, ["column 'label' row 2", "pass --num-classes"]


def _empty_glob(d):
    d.mkdir(parents=True)
    return str(d / "*.parquet"), str(d / "*.parquet"), ["no input files match"]


def _zero_rows(d):
    d.mkdir(parents=True)
    for name in ("a.parquet", "b.parquet"):
        write_parquet(str(d / name), np.zeros((0, DIM)), np.zeros(0))
    return str(d / "*.parquet"), str(d / "*.parquet"), ["zero rows"]


def _garbage_tfrecord(d):
    good_input(d, "tfrecord")
    (d / "part-00009.tfrecord").write_bytes(b"this is not a TFRecord file\n" * 4)
    return str(d / "*.tfrecord"), str(d / "part-00009.tfrecord"), ["corrupt TFRecord shard at record 0"]


def _unreadable_tfrecord(d):
    good_input(d, "tfrecord")
    (d / "part-00009.tfrecord").mkdir()  # matches the glob, cannot be read
    return str(d / "*.tfrecord"), str(d / "part-00009.tfrecord"), ["not a regular file"]


def _tfrecord_int_features(d):
    from tfrecord import example_pb2

    from dpcda.storage.shards import _frame

    good_input(d, "tfrecord")
    ex = example_pb2.Example()
    ex.features.feature["features"].int64_list.value.extend([1] * DIM)
    ex.features.feature["label"].int64_list.value.append(0)
    (d / "part-00009.tfrecord").write_bytes(_frame(ex.SerializeToString()))
    return str(d / "*.tfrecord"), str(d / "part-00009.tfrecord"), ["column 'features' row 0", "expected float_list"]


def _tfrecord_wrong_width(d):
    good_input(d, "tfrecord")
    write_tfrecord(str(d / "part-00009.tfrecord"), np.full((3, DIM + 2), 0.5), Y[:3])
    return (
        str(d / "*.tfrecord"),
        str(d / "part-00009.tfrecord"),
        ["column 'features' row 0", f"width {DIM + 2}, but the input's width is {DIM}"],
    )


def _class_smaller_than_l(d):
    return good_input(d), None, [f"class 0 has {N_PER_CLASS} records", f"mixing_order l={N_PER_CLASS + 1}"]


INPROCESS_CASES = {
    "missing-features-column": (_missing_features_first_file, []),
    "missing-label-column": (_missing_label_later_file, []),
    "features-not-a-list": (_features_scalar, []),
    "features-of-strings": (_features_strings, []),
    "labels-of-strings": (_label_strings, []),
    "row-of-wrong-width": (_ragged_rows, []),
    "infinite-feature": (_inf_feature, []),
    "out-of-bounds-refused": (_out_of_bounds_refused, ["--out-of-bounds", "refuse"]),
    "negative-label": (_negative_label, []),
    "non-integer-label": (_fractional_label, []),
    "null-label": (_missing_label_value, []),
    "label-not-below-num-classes": (_label_not_below_num_classes, ["--num-classes", str(K)]),
    "huge-label-without-num-classes": (_huge_label_without_num_classes, []),
    "empty-glob": (_empty_glob, []),
    "zero-rows": (_zero_rows, []),
    "garbage-tfrecord": (_garbage_tfrecord, []),
    "unreadable-tfrecord": (_unreadable_tfrecord, []),
    "tfrecord-int-features": (_tfrecord_int_features, []),
    "tfrecord-wrong-width": (_tfrecord_wrong_width, []),
    "class-smaller-than-l": (_class_smaller_than_l, ["--mixing-order", str(N_PER_CLASS + 1)]),
}


@pytest.mark.parametrize("case", list(INPROCESS_CASES))
def test_cli_refuses_bad_input(tmp_path, capsys, case):
    build, extra = INPROCESS_CASES[case]
    input_glob, bad_file, needles = build(tmp_path / "in")
    out = tmp_path / "out"
    rc = main(["release", "--input", input_glob, "--output", str(out), *BASE, *extra, *BEAM_ARGS])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err[-3000:]
    assert_one_line_error(err, *([bad_file] if bad_file else []), *needles)
    assert_nothing_published(out)


def test_existing_release_is_kept_without_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    before = fake_old_release(out)
    rc = main(["release", "--input", good_input(tmp_path / "in"), "--output", str(out), *BASE, *BEAM_ARGS])
    assert rc == EXIT_BAD_INPUT
    assert_one_line_error(capsys.readouterr().err, str(out), "a release already exists", "--overwrite")
    assert snapshot(out) == before and not list(tmp_path.glob("out.tmp-*"))


# ---------------------------------------------------------------- faults, retries, reruns


class _FailFirstAttempt(beam.DoFn):
    def __init__(self, marker_dir):
        self.marker_dir = marker_dir

    def process(self, x):
        marker = os.path.join(self.marker_dir, str(x))
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError(f"first attempt of {x}")
        yield x


def test_direct_runner_does_not_retry_failed_bundles(tmp_path):
    """Pins the finding the retry tests below rely on: a failed bundle fails the in_memory run.
    If a Beam upgrade makes the DirectRunner retry, this fails: then also test that a run with
    the fault hook yields the unfailed run's rows in one go."""
    with pytest.raises(Exception, match="first attempt of 1"):
        with beam.Pipeline(options=PipelineOptions(BEAM_ARGS)) as p:
            _ = p | beam.Create([1]) | beam.ParDo(_FailFirstAttempt(str(tmp_path)))


def inject_fault(monkeypatch, faults: Path) -> None:
    """Fail the first attempt of each class's mixing after its first chunk (marker files in ``faults`` record the
    attempts), by wrapping the core the mixing DoFn calls."""
    import dpcda.transforms.mix as mix_mod

    real = mix_mod.mix_class

    def failing(x, **kw):
        k = kw["class_index"]
        for i, item in enumerate(real(x, **kw)):
            marker = faults / f"class-{k}"
            if i == 1 and not marker.exists():
                marker.touch()
                raise RuntimeError(f"injected fault: first attempt of class {k}")
            yield item

    monkeypatch.setattr(mix_mod, "mix_class", failing)


def test_failed_mixing_publishes_nothing_and_rerun_matches_unfailed_run(tmp_path, monkeypatch):
    input_glob = good_input(tmp_path / "in")
    common = {"input": input_glob, "sigma_x": 0.5, "mixing_order": 3, "seed": 5, "chunk_rows": 4}  # 3 chunks/class

    def release(name):
        cfg = load_config(None, {**common, "output": str(tmp_path / name)})
        return run_release(cfg, list(BEAM_ARGS)).model_dump(mode="json")

    unfailed = release("unfailed")
    faults = tmp_path / "faults"
    faults.mkdir()
    inject_fault(monkeypatch, faults)
    # Each run stops at the first class whose first attempt fails (after its first chunk) and
    # publishes nothing; a rerun with the same key gets further, until every class has failed once.
    for attempt in range(1, K + 1):
        with pytest.raises(RuntimeError, match="injected fault: first attempt of class"):
            release("out")
        assert len(os.listdir(faults)) == attempt
        assert_nothing_published(tmp_path / "out")
    monkeypatch.undo()
    rerun = release("out")
    assert rerun["output"]["rows"] == unfailed["output"]["rows"] == K * N_PER_CLASS
    fa, la = read_rows(tmp_path / "unfailed")
    fb, lb = read_rows(tmp_path / "out")
    assert fa.tobytes() == fb.tobytes() and la.tobytes() == lb.tobytes()
    assert not list(tmp_path.glob("out.tmp-*"))


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_mix_dofn_retry_after_partial_output_is_identical(tmp_path, monkeypatch, mode):
    from dpcda.privacy.noise import key_from_test_seed

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, DIM)).astype(np.float32)
    mix = types.SimpleNamespace(  # the mechanism's own plan (mechanisms.dpcda.DpcdaPlan)
        mixing_order=3,
        sigma_x=0.5,
        samples_per_class=(10,) * K,
        sampling_rates=(0.25,) * K,
        sigma_y=0.0,
        lowpass=None,
        denoise_spec=None,
    )
    plan = types.SimpleNamespace(feature_dim=DIM, num_classes=K, mode=mode, synthesis=mix)
    key = key_from_test_seed(5)
    element = (1, x)
    fn = _MixFn("cpu", 4, "features", "label")
    fn.setup()
    unfailed = list(fn.process(element, plan, key))
    assert len(unfailed) == 3  # chunks of 4, 4, 2 rows

    inject_fault(monkeypatch, tmp_path)
    partial = []
    with pytest.raises(RuntimeError, match="injected fault: first attempt of class 1"):
        for table in fn.process(element, plan, key):
            partial.append(table)
    assert len(partial) == 1 and partial[0].equals(unfailed[0])
    # The retry may see the class's blocks in another order: the rows must not change.
    retried_element = (1, np.concatenate([x[5:], x[:5]]))
    retried = list(fn.process(retried_element, plan, key))
    assert len(retried) == len(unfailed)
    for a, b in zip(unfailed, retried):
        assert a.equals(b)
