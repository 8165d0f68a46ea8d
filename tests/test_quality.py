"""The quality report of a table release (evaluation/quality.json and its pictures): the synthetic rows beside the
release's own noisy measurements (DP) always, beside real held-out rows (not DP) only with --eval-input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpcda.evaluation import quality
from dpcda.mechanisms import marginals as mg
from tests.test_marginals import SCHEMA, make_table

SEED = 7


def _keys(obj) -> set:
    """Every key of a JSON value, at any depth."""
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def _direct_codes(table: pa.Table, bins: int) -> dict:
    """Column -> (codes, size) counted straight from the published values (not through the release's encoder)."""
    out = {}
    for col in SCHEMA["columns"]:
        values = table.column(col["name"]).to_pylist()
        if col["kind"] == "numeric":
            edges = np.linspace(col["lower"], col["upper"], bins + 1)[1:-1]
            codes = [bins if v is None else int(np.searchsorted(edges, v, side="right")) for v in values]
            size = bins
        else:
            cats = col["categories"] if col["kind"] == "categorical" else [False, True]
            codes = [len(cats) if v is None else cats.index(v) for v in values]
            size = len(cats)
        out[col["name"]] = (np.asarray(codes), size + int(col.get("nullable", False)))
    label = SCHEMA["label"]
    codes = [label["categories"].index(v) for v in table.column(label["name"]).to_pylist()]
    out[label["name"]] = (np.asarray(codes), len(label["categories"]))
    return out


# ---------------------------------------------------------------- pure parts


def test_noisy_summary_combines_repeated_measurements_and_keeps_the_label_pairs():
    dom = mg.Domain(("a", "b", "y"), (3, 2, 2), 20)
    a2, b1 = np.array([[5.0, 1.0], [2.0, 2.0], [0.0, 3.0]]), np.array([7.0, 3.0])
    pair_a1, pair_a2, pair_ab = np.arange(6.0).reshape(3, 2), np.ones((3, 2)), np.zeros((3, 2))
    measured = mg.Measurements(
        one_way=[np.array([4.0, 4.0, 2.0]), np.array([6.0, 4.0]), np.array([5.0, 5.0])],
        pairs=[(0, 2), (1,), (0, 2), (0, 1)],
        two_way=[pair_a1, b1, pair_a2, pair_ab],
        one_way_std=2.0,
        stds=[1.0, 1.0, 2.0, 1.0],
    )
    s = mg.noisy_summary(measured, dom)
    assert s["domain"] == {"names": ["a", "b", "y"], "sizes": [3, 2, 2], "bins": 20}
    assert s["one_way"][0] == {"column": "a", "counts": [4.0, 4.0, 2.0], "std": 2.0}
    # b measured twice (std 2, then std 1): weights 1/4 and 1
    np.testing.assert_allclose(s["one_way"][1]["counts"], (np.array([6.0, 4.0]) / 4 + b1) / 1.25)
    assert s["one_way"][1]["std"] == pytest.approx(1 / np.sqrt(1.25))
    assert [p["column"] for p in s["label_pairs"]] == ["a"]  # (a, b) holds no label; b's pair was never measured
    np.testing.assert_allclose(s["label_pairs"][0]["counts"], (pair_a1 + pair_a2 / 4) / 1.25)
    assert s["label_pairs"][0]["column_codes"] is None and a2.shape == (3, 2)


def test_noisy_label_rates_leave_out_merged_codes_and_clip():
    pair = {"counts": [[30.0, 10.0], [-5.0, 20.0], [4.0, 4.0]], "std": 2.0, "column_codes": [0, 1, 2, 2],
            "label_codes": None}  # fmt: skip
    rates, stds = quality.noisy_label_rates(pair, 4, 2)
    assert rates == [[0.75, 0.25], [0.0, 1.0], None, None]  # codes 2 and 3 merged: no rate of their own
    assert stds == [2.0 / 40, 2.0 / 20, None, None]
    assert quality.trend_tvd([[0.5, 0.5], None], [[0.75, 0.25], [0.0, 1.0]], [0.5, 0.5]) == pytest.approx(0.25)


def test_a_numeric_column_s_codes_are_drawn_in_value_order_with_its_spikes_marked():
    from dpcda.evaluation.quality_plot import _order, _spike_codes, _ticks
    from dpcda.evaluation.report import _pyplot

    # quality.json lists a numeric column's spikes first, then its bins, then null
    entry = {"name": "term", "codes": ["24", "36", "[8, 20)", "[20, 30)", "[30, 40]", "null"], "spikes": [24.0, 36.0],
             "edges": [8.0, 20.0, 30.0, 40.0]}  # fmt: skip
    order = _order(entry)
    assert order.tolist() == [2, 3, 0, 4, 1, 5]
    plt = _pyplot()
    fig, ax = plt.subplots()
    try:
        _ticks(ax, entry, True, order)
        ticks = ax.get_xticklabels()
        assert [t.get_text() for t in ticks] == ["8", "20", "24", "30", "36", "null"]
        assert [t.get_fontweight() for t in ticks] == ["normal", "normal", "bold", "normal", "bold", "normal"]
        assert list(ax.get_xticks()) == [0, 1, 2, 3, 4, 5] and "a code of its own" in ax.get_xlabel()
        # a spike on a bin's lower edge comes before that bin; a column without spikes keeps its order
        zero = {"name": "x", "codes": ["0", "[0, 5)", "[5, 9]"], "spikes": [0.0], "edges": [0.0, 5.0, 9.0]}
        assert _order(zero).tolist() == [0, 1, 2]
        plain = {"name": "y", "codes": ["[0, 5)", "[5, 9]", "null"], "edges": [0.0, 5.0, 9.0]}
        assert _order(plain).tolist() == [0, 1, 2]
        ax.clear()
        _ticks(ax, plain, True, _order(plain))
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "5", "null"]
        assert "a code of its own" not in ax.get_xlabel()
        # a column of spikes only (a 0/1 flag) is drawn as categories are: its values, no bold, no bin wording
        flag = {"name": "flag", "codes": ["0", "1", "null"], "spikes": [0.0, 1.0]}
        ax.clear()
        _ticks(ax, flag, False, _order(flag))
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "null"]
        assert {t.get_fontweight() for t in ax.get_xticklabels()} == {"normal"} and ax.get_xlabel() == "flag"
        assert _spike_codes(flag) == set() and _spike_codes(entry) == {0, 1}
    finally:
        plt.close(fig)


# ---------------------------------------------------------------- releases


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("quality-in")
    (d / "train").mkdir()
    (d / "test").mkdir()
    train, test = make_table(3000, seed=1), make_table(800, seed=2)
    pq.write_table(train, d / "train" / "part-0.parquet")
    pq.write_table(test, d / "test" / "part-0.parquet")
    return d, train, test


def _release(inputs, out, **options):
    import dpcda

    d, _, _ = inputs
    rel = dpcda.release(str(d / "train" / "*.parquet"), epsilon=20, schema=SCHEMA, seed=SEED, output=str(out),
                        **options)  # fmt: skip
    report = json.loads((out / "evaluation" / "quality.json").read_text())
    return rel, report


@pytest.fixture(scope="module")
def dp_only(inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("quality-dp") / "release"
    return (out, *_release(inputs, out, mechanism="marginals"))


def test_a_marginals_release_publishes_its_quality_report_with_no_real_data_figure(dp_only):
    out, rel, report = dp_only
    assert report["real_data"] is False
    assert set(report["sources"]) == {"synthetic", "noisy_measurement"} and report["sources"]["noisy_measurement"]["dp"]
    assert not _keys(report) & {"real", "classifier", "real_held_out_not_dp", "outside_guarantee", "roc_auc"}
    utility = rel.manifest["utility"]
    assert set(utility) == {"quality"} and not _keys(utility) & {"real_held_out_not_dp", "outside_guarantee"}
    assert utility["quality"]["report"] == "evaluation/quality.json"
    assert utility["quality"]["compared_with"] == ["noisy measurement (DP)"]
    names = [c["name"] for c in SCHEMA["columns"]]
    assert [c["name"] for c in report["columns"]] == [*names, "churn"]
    pictures = {p["file"]: p["panels"] for p in report["pictures"]}
    assert pictures == {"quality.png": [*names, "churn"], "quality_label.png": names}  # one panel per column
    for name in pictures:
        assert (out / "evaluation" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "measurements.draft.json").exists()  # the draft is read by the report, never published
    assert sorted(p.name for p in out.iterdir()) == ["evaluation", "manifest.json", "model", "synthetic"]


def test_the_report_s_distances_agree_with_the_published_rows(dp_only):
    out, rel, report = dp_only
    synth = pq.read_table(out / "synthetic")
    direct = _direct_codes(synth, report["binning"]["bins"])
    for entry in report["columns"]:
        codes, size = direct[entry["name"]]
        shares = np.bincount(codes, minlength=size) / len(codes)
        np.testing.assert_array_equal(entry["synthetic"], shares, err_msg=entry["name"])
        noisy = np.asarray(entry["noisy_measurement"])
        assert noisy.min() >= 0 and noisy.sum() == pytest.approx(1.0)
        assert entry["tvd"]["synthetic_vs_noisy_measurement"] == pytest.approx(0.5 * np.abs(shares - noisy).sum())
    summary = report["summary"]["one_way_tvd_synthetic_vs_noisy_measurement"]
    assert summary["mean"] == pytest.approx(np.mean([e["tvd"]["synthetic_vs_noisy_measurement"]
                                                     for e in report["columns"]]))  # fmt: skip
    assert rel.manifest["utility"]["quality"]["one_way_tvd_mean_vs_noisy_measurement"] == summary["mean"]
    label = direct["churn"][0]
    for trend in report["label_trends"]["columns"]:  # mst-label measures the label's pair with every column
        codes, size = direct[trend["name"]]
        for b in range(size):
            rows = label[codes == b]
            expected = None if not len(rows) else (np.bincount(rows, minlength=2) / len(rows)).tolist()
            assert trend["synthetic"][b] == expected
        assert trend["noisy_measurement"] is not None and "synthetic_vs_noisy_measurement" in trend["tvd"]


def test_the_report_reads_the_rows_batch_by_batch_to_the_same_figures(dp_only):
    """A release's rows are counted batch by batch (memory set by the codes, not the rows): small batches give the
    report the whole table gives."""
    from dpcda.schemas.table import parse_table_schema
    from dpcda.storage.tables import declared_schema

    out, rel, _ = dp_only
    synth = pq.read_table(out / "synthetic")
    schema = parse_table_schema(declared_schema(rel.manifest["input"]["table"]), "manifest")
    whole = quality.quality_report(synth, schema)
    assert whole["summary"]["synthetic_rows"] == synth.num_rows > 700
    parts = quality.quality_report(iter(synth.to_batches(max_chunksize=700)), schema)
    assert parts == whole


def test_an_evaluation_reads_every_kth_synthetic_row_above_its_cap(dp_only, monkeypatch):
    """Above the cap, the rows a classifier is trained on are every k-th released row, read batch by batch."""
    from dpcda.evaluation.tabular import synthetic_sample

    out, rel, _ = dp_only
    synth = pq.read_table(out / "synthetic").replace_schema_metadata(None)
    n = rel.manifest["output"]["rows"]
    assert synthetic_sample(str(out / "synthetic" / "*.parquet"), n, cap=n) == (synth, 1)
    from dpcda.evaluation import tabular

    monkeypatch.setattr(tabular, "SYNTHETIC_BATCH_ROWS", 97)  # batch ends that are no multiple of k
    got, step = synthetic_sample(str(out / "synthetic" / "*.parquet"), n, cap=n // 3)
    assert step == -(-n // (n // 3)) >= 3 and got.equals(synth.take(np.arange(0, n, step)))


def test_the_noisy_shares_are_the_release_s_own_dp_counts(dp_only, inputs):
    """Recomputed from the input with the test seed's noise stream: the one-way counts the release measured."""
    from dpcda.privacy.noise import NoiseStream, key_from_test_seed
    from dpcda.schemas.table import parse_table_schema

    _, rel, report = dp_only
    _, train, _ = inputs
    schema = parse_table_schema(SCHEMA)
    codes = quality.table_codes(train, schema, 20, "train")
    dom = mg.domain_of(schema, 20)
    std = rel.manifest["mechanism"]["one_way_noise_std"]
    key = key_from_test_seed(SEED)
    for i, entry in enumerate(report["columns"]):
        exact = np.bincount(codes[:, i], minlength=dom.sizes[i])
        noisy = NoiseStream(key, "marginals", "one-way", i).gaussian(exact, std)
        np.testing.assert_allclose(entry["noisy_measurement"], quality.clipped_shares(noisy)[0], rtol=0, atol=1e-12)


def test_with_eval_input_the_real_figures_and_the_auc_appear_marked(inputs, tmp_path):
    d, _, test = inputs
    out = tmp_path / "release"
    rel, report = _release(inputs, out, mechanism="marginals", eval_input=str(d / "test" / "*.parquet"))
    assert report["real_data"] is True and report["sources"]["real"]["dp"] is False
    assert report["sources"]["real"]["legend"] == "real held-out (not DP)" and report["outside_guarantee"]
    direct = _direct_codes(test, 20)
    for entry in report["columns"]:
        codes, size = direct[entry["name"]]
        real = np.bincount(codes, minlength=size) / len(codes)
        # rounded to 3 decimals: the exact fractions k/n would give away the test rows' count n
        np.testing.assert_array_equal(entry["real"], np.round(real, 3), err_msg=entry["name"])
        assert entry["tvd"]["synthetic_vs_real"] == pytest.approx(
            0.5 * np.abs(np.asarray(entry["synthetic"]) - np.round(real, 3)).sum()
        )
    assert all(t["real"] is not None and "synthetic_vs_real" in t["tvd"] for t in report["label_trends"]["columns"])
    utility = rel.manifest["utility"]
    clf = report["classifier"]
    assert clf["dp"] is False and clf["roc_auc"] == utility["roc_auc"] > 0.6  # the table evaluation's figure
    assert "HistGradientBoostingClassifier" in clf["models"]["gradient_boosting"]["estimator"]
    assert report["summary"]["real_held_out_not_dp"]["roc_auc"] == clf["roc_auc"]
    marked = utility["quality"]["real_held_out_not_dp"]
    assert marked["roc_auc"] == clf["roc_auc"] and "outside_guarantee" in marked and "test_rows" not in marked
    assert utility["quality"]["compared_with"] == ["noisy measurement (DP)", "real held-out (not DP)"]
    assert utility["report"] == "evaluation/report.json"  # the table evaluation is kept beside the quality entry
    assert utility["synthetic_rows_evaluated"] == rel.manifest["output"]["rows"] and "synthetic_sample" not in utility


def test_a_mixing_release_reports_the_synthetic_side_and_says_why(inputs, tmp_path):
    out = tmp_path / "release"
    rel, report = _release(inputs, out, mechanism="dpcda", mode="poisson")
    assert "absent" in report["sources"]["noisy_measurement"] and "mixes records" in report["sources"][
        "noisy_measurement"]["absent"]  # fmt: skip
    assert not _keys(report) & {"real", "classifier"}
    assert all("noisy_measurement" not in c for c in report["columns"])
    assert report["summary"]["one_way_tvd_synthetic_vs_noisy_measurement"] is None
    assert report["binning"]["bins"] == 20 and len(report["pictures"][0]["panels"]) == len(SCHEMA["columns"]) + 1
    assert rel.manifest["utility"]["quality"]["compared_with"] == []
