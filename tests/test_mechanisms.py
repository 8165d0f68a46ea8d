"""The mechanism family through the real pipeline (DirectRunner): DPMix, local perturbation, random projection."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpcda.mechanisms.dpmix import mix_dataset
from dpcda.pipeline.release import run_release
from dpcda.privacy.noise import key_from_test_seed
from dpcda.schemas.config import ConfigError, load_config
from dpcda.schemas.manifest import Manifest
from tests.conftest import BEAM_ARGS, make_dataset, write_dataset

KEY = key_from_test_seed(4)


def release(tmp_path, input_glob, name="out", **overrides):
    out = tmp_path / name
    cfg = load_config(None, {"input": input_glob, "output": str(out), **overrides})
    return out, run_release(cfg, list(BEAM_ARGS)).model_dump(mode="json")


def read_table(out):
    return pq.read_table(sorted((out / "synthetic").glob("part-*.parquet")))


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_dpmix_release_has_features_soft_labels_and_their_argmax(tmp_path, small_parquet, mode):
    glob_, x, y = small_parquet
    out, m = release(tmp_path, glob_, mechanism="dpmix", mode=mode, epsilon=8.0, num_classes=3, mixing_order=4, seed=2)
    Manifest(**json.loads((out / "manifest.json").read_text()))
    mech = m["mechanism"]
    assert mech["name"] == "dpmix" and mech["sigma_y"] == pytest.approx(mech["sigma_x"] * mech["label_noise_ratio"])
    assert m["privacy"]["epsilon"] <= 8.0
    assert ("features and label" if mode == "fixed" else "add or remove") in m["privacy"]["neighbouring_relation"]
    t = read_table(out)
    scores = np.stack(t.column("label_soft").to_numpy(zero_copy_only=False))
    assert scores.shape == (len(t), 3) and t.num_rows == m["output"]["rows"]
    np.testing.assert_array_equal(scores.argmax(axis=1), t.column("label").to_numpy())
    if mode == "fixed":
        assert t.num_rows == len(y) and mech["dataset_size"] == len(y) and mech["dataset_size_dp"] is None
    else:
        assert mech["dataset_size"] is None and mech["dataset_size_dp"] > 0


def test_dpmix_noise_off_rows_are_means_of_l_records_with_their_label_means():
    x, y = make_dataset(n_per_class=3, num_classes=2, dim=3, seed=1)
    x = x.astype(np.float64)
    rows = list(
        mix_dataset(
            x,
            y,
            key=KEY,
            num_classes=2,
            mode="fixed",
            mixing_order=2,
            sigma_x=0.0,
            sigma_y=0.0,
            samples=60,
            chunk_rows=16,
        )
    )
    feats = np.concatenate([f for _, f, _ in rows])
    scores = np.concatenate([s for _, _, s in rows])
    allowed = {}
    for a, b in itertools.combinations(range(len(y)), 2):
        allowed[tuple(np.round((x[a] + x[b]) / 2, 5))] = np.bincount([y[a], y[b]], minlength=2) / 2
    for f, s in zip(feats, scores):
        key = tuple(np.round(f.astype(np.float64), 5))
        assert key in allowed and np.allclose(allowed[key], s)
    # labels cross classes: some rows mix both
    assert (scores == 0.5).any()
    # the input's row order is irrelevant
    perm = np.random.default_rng(0).permutation(len(y))
    again = np.concatenate(
        [
            f
            for _, f, _ in mix_dataset(
                x[perm],
                y[perm],
                key=KEY,
                num_classes=2,
                mode="fixed",
                mixing_order=2,
                sigma_x=0.0,
                sigma_y=0.0,
                samples=60,
                chunk_rows=16,
            )
        ]
    )
    np.testing.assert_array_equal(feats, again)


def test_local_release_is_one_noisy_row_per_record_with_its_label(tmp_path, small_parquet):
    glob_, x, y = small_parquet
    out, m = release(tmp_path, glob_, mechanism="local", epsilon=8.0, seed=2)
    t = read_table(out)
    assert t.num_rows == len(y) and m["mechanism"]["name"] == "local"
    assert sorted(t.column("label").to_numpy().tolist()) == sorted(y.tolist())
    assert m["privacy"]["epsilon"] <= 8.0 and set(m["privacy"]["components"]) == {"normalization", "perturbation"}


def test_randproj_release_is_p_dimensional_and_its_projection_is_public(tmp_path, small_parquet):
    from dpcda.mechanisms.randproj import projection_matrix

    glob_, x, y = small_parquet
    out, m = release(
        tmp_path,
        glob_,
        mechanism="randproj",
        projection_dim=5,
        sigma_x=0.0,
        seed=2,
        normalization="exact",
        allow_exact_normalization=True,
    )
    t = read_table(out)
    feats = np.stack(t.column("features").to_numpy(zero_copy_only=False))
    assert feats.shape == (len(y), 5)
    mech = m["mechanism"]
    R = projection_matrix(x.shape[1], 5, mech["projection_seed"])
    assert mech["projection_norm"] == pytest.approx(np.linalg.norm(R, 2))
    z = json.loads((out / "normalization.json").read_text())
    from dpcda.mechanisms.plan import normalize

    expected = normalize(x, np.asarray(z["mean"]), np.asarray(z["std"]), z["clip"], tuple(z["feature_bounds"]))
    want = {tuple(np.round(r, 4)) for r in expected.astype(np.float64) @ R}
    assert all(tuple(np.round(r, 4)) in want for r in feats.astype(np.float64))


@pytest.mark.parametrize(
    "bad,needle",
    [
        ({"mechanism": "local", "mode": "poisson", "num_classes": 3}, "offers mode fixed only"),
        ({"mechanism": "local", "samples": 10}, "exactly one row per record"),
        ({"mechanism": "local", "mixing_order": 4}, "does not mix"),
        ({"mechanism": "dpmix"}, "num_classes: required with dpmix"),
        ({"mechanism": "randproj", "lowpass": 8}, "not images"),
    ],
)
def test_mechanism_options_that_do_not_apply_are_refused(bad, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, {"input": "x", "output": "y", "epsilon": 5.0, **bad})


def _noise_free(tmp_path, dim: int, **overrides):
    """(train glob, test glob, noise-free release folder with exact statistics) of a three-class dataset of width
    ``dim``; ``overrides``: the release's settings (mechanism, mixing order, ...)."""
    x, y = make_dataset(n_per_class=80, num_classes=3, dim=dim, seed=6)
    xt, yt = make_dataset(n_per_class=20, num_classes=3, dim=dim, seed=7)
    train_glob = write_dataset(tmp_path / "train", x, y)
    test_glob = write_dataset(tmp_path / "test", xt, yt)
    exact = dict(sigma_x=0.0, seed=1, normalization="exact", allow_exact_normalization=True)
    out, _ = release(tmp_path, train_glob, **{**exact, **overrides})
    return train_glob, test_glob, out


def test_evaluation_trains_on_dpmix_soft_labels_and_randproj_projections(tmp_path):
    from dpcda.evaluation.standalone import evaluate_standalone

    train_glob, test_glob, out = _noise_free(tmp_path, 16, name="mix", mechanism="dpmix", num_classes=3, mixing_order=1)
    rep = evaluate_standalone(str(out), test_glob, runs=1, epochs=3)
    assert rep["soft_labels"] and rep["accuracy_mean"] > 0.7  # l = 1, no noise: the data itself
    out, _ = release(
        tmp_path,
        train_glob,
        name="proj",
        mechanism="randproj",
        projection_dim=8,
        sigma_x=0.0,
        seed=1,
        normalization="exact",
        allow_exact_normalization=True,
    )
    rep = evaluate_standalone(str(out), test_glob, runs=1, epochs=3)
    assert rep["model"] == "TabularMLP" and rep["accuracy_mean"] > 0.6


def test_a_soft_label_dpmix_report_names_its_three_figures(tmp_path):
    """report.json of a DPMix release (label scores): the network alone, the linear probe alone and the stack, each
    present and named; the headline is the recipe's (stacked), with its weights; the synthetic hold-out's figures
    stand apart, labelled."""
    from pathlib import Path

    from dpcda.evaluation.standalone import evaluate_standalone

    _, test_glob, out = _noise_free(tmp_path, 64, mechanism="dpmix", num_classes=3, mixing_order=2)
    rep = evaluate_standalone(str(out), test_glob, runs=1, epochs=2)
    saved = json.loads(Path(rep["path"]).read_text())
    assert saved["soft_labels"] and saved["accuracy_of"] == "stacked"
    real = saved["real_test_accuracy"]
    assert real["headline"] == "stacked" and real["measured_on"].startswith("real test rows")
    net, probe, stacked = real["network"], real["probe"], real["stacked"]
    assert (net["name"], net["model"]) == ("CNN", "TableOneCNN") and probe["name"] == "linear probe"
    assert probe["accuracy"] == saved["probe"]["accuracy"] and stacked["accuracy_mean"] == saved["accuracy_mean"]
    assert all(0.0 <= v <= 1.0 for v in (net["accuracy_mean"], probe["accuracy"], stacked["accuracy_mean"]))
    weights = stacked["weights"]
    assert set(weights) == {"probe", "network"} and weights["probe"] + weights["network"] == pytest.approx(1.0)
    assert stacked["probe_dominated"] == (weights["network"] < 0.1) and len(stacked["coefficients"]) == 1
    assert saved["summary"].startswith(
        f"stacked: {stacked['accuracy_mean']:.4f} = CNN {net['accuracy_mean']:.4f}, probe {probe['accuracy']:.4f}, "
        f"weights probe {weights['probe']:.2f} / CNN {weights['network']:.2f}"
    )
    holdout = saved["synthetic_holdout_accuracy"]
    assert "SYNTHETIC" in holdout["measured_on"] and holdout["rows"] == saved["val_rows"] > 0
    assert {"stacked", "network", "probe"} <= set(holdout)
