"""EvaluateUtility: models, training, reports and the stage, on small generated data (CPU, seconds each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpcda.evaluation.models import TableOneCNN, TabularMLP, make_model
from dpcda.evaluation.train import Recipe, RowScale, stratified_split, train_and_score
from dpcda.mechanisms.plan import normalize
from tests.conftest import ROOT, make_dataset, run_cli, write_dataset

FASHION = "/usr/share/datasets/fashion-mnist"


def make_release_dir(root: Path, x, y, *, dim_bounds=(0.0, 1.0), clip=1.0, shards=2) -> Path:
    """A noise-free l=1 release (sigma_x = 0) made by hand: normalised records + normalization.json."""
    mean, std = x.mean(0), np.maximum(x.std(0), 0.01)
    syn = normalize(x, mean, std, clip, dim_bounds)
    write_dataset(root / "synthetic", syn, y, shards=shards)
    (root / "normalization.json").write_text(
        json.dumps(
            {
                "mean": mean.tolist(),
                "std": std.tolist(),
                "clip": clip,
                "feature_bounds": list(dim_bounds),
                "method": "exact",
            }
        )
    )
    return root


# ---------------------------------------------------------------- models


def test_table1_cnn_matches_the_paper_for_28x28():
    model = make_model(784, 10)
    assert isinstance(model, TableOneCNN)
    assert model.flat_dim == 3136
    assert sum(p.numel() for p in model.parameters()) == 344_330  # Table 1, counted by hand
    model.eval()
    assert model(torch.zeros(3, 784)).shape == (3, 10)


@pytest.mark.parametrize(
    "shape,kind",
    [
        ((3, 32, 32), TableOneCNN),
        ((1, 9, 9), TableOneCNN),
        ((2, 5, 6), TableOneCNN),
        (64, TableOneCNN),
        (16, TabularMLP),
        (50, TabularMLP),
        ((20,), TabularMLP),
    ],
)
def test_make_model_picks_cnn_for_images_and_mlp_otherwise(shape, kind):
    model = make_model(shape, 4).eval()
    assert isinstance(model, kind)
    d = int(np.prod(shape))
    assert model(torch.randn(2, d)).shape == (2, 4)


def test_make_model_rejects_a_shape_that_does_not_fit():
    with pytest.raises(ValueError, match="input_shape"):
        make_model((2, 3), 4)  # 2x3 image: too small for two pools
    with pytest.raises(ValueError, match="num_classes"):
        make_model(16, 1)


def test_row_scale_makes_noisy_and_clean_rows_comparable():
    clean = torch.randn(4, 100) * 0.01
    noisy = clean + torch.randn(4, 100) * 5
    for rows in (clean, noisy):
        rms = RowScale()(rows).pow(2).mean(1).sqrt()
        torch.testing.assert_close(rms, torch.ones(4), rtol=1e-4, atol=1e-4)


def test_stratified_split_holds_out_a_share_of_every_class():
    y = np.repeat(np.arange(3), [50, 20, 1])
    tr, val = stratified_split(y, 0.1, seed=0)
    assert sorted(np.concatenate([tr, val]).tolist()) == list(range(len(y)))
    assert np.bincount(y[val], minlength=3).tolist() == [5, 2, 0]
    tr0, val0 = stratified_split(y, 0.0, seed=0)
    assert len(val0) == 0 and len(tr0) == len(y)


# ---------------------------------------------------------------- training


@pytest.fixture(scope="module")
def tabular_result():
    x, y = make_dataset(n_per_class=120, num_classes=3, dim=16, seed=1)
    xt, yt = make_dataset(n_per_class=40, num_classes=3, dim=16, seed=2)
    mean, std = x.mean(0), x.std(0)
    syn, test = normalize(x, mean, std, 1.0, (0, 1)), normalize(xt, mean, std, 1.0, (0, 1))
    return train_and_score(syn, y, test, yt, num_classes=3, runs=2, epochs=4, device="cpu", progress=False), len(yt)


def test_report_numbers_are_consistent(tabular_result):
    res, n_test = tabular_result
    assert res["runs"] == 2 and len(res["accuracies"]) == 2 and res["seeds"] == [0, 1]
    assert res["accuracy_mean"] == pytest.approx(np.mean(res["accuracies"]))
    assert res["accuracy_std"] == pytest.approx(np.std(res["accuracies"]))
    conf = np.asarray(res["confusion_matrix"])
    assert conf.shape == (3, 3) and conf.sum() == pytest.approx(n_test) == res["test_rows"]
    per_class = np.diag(conf) / conf.sum(1)
    np.testing.assert_allclose(res["per_class_accuracy"], per_class)
    for run in res["curves"]:
        c = np.asarray(run["confusion_matrix"])
        assert c.sum() == n_test and np.trace(c) / n_test == pytest.approx(run["accuracy"])
        assert len(run["train_loss"]) == len(run["val_accuracy"]) == 4
        assert -1 <= run["selected_epoch"] < 4  # -1: the start (the probe) kept
        assert "test_accuracy" not in run  # real test data is never tracked unless asked for diagnosis
    assert res["device"] == "cpu" and res["wall_seconds"] > 0
    assert res["train_rows"] + res["val_rows"] == 360 and res["val_rows"] == 36


def test_noise_free_release_beats_chance_widely(tabular_result):
    res, _ = tabular_result
    assert res["accuracy_mean"] > 0.8  # chance is 1/3


def test_same_seed_same_result():
    x, y = make_dataset(n_per_class=30, num_classes=3, dim=16, seed=3)
    a, b = (
        train_and_score(x, y, x[:20], y[:20], num_classes=3, epochs=2, device="cpu", progress=False, seed=7)
        for _ in range(2)
    )
    assert a["accuracies"] == b["accuracies"] and a["curves"][0]["train_loss"] == b["curves"][0]["train_loss"]


def test_bad_inputs_are_refused():
    x, y = make_dataset(n_per_class=10, num_classes=3, dim=16)
    with pytest.raises(ValueError, match="labels"):
        train_and_score(x, y, x, y + 5, num_classes=3, progress=False)
    with pytest.raises(ValueError, match="same d"):
        train_and_score(x, y, x[:, :8], y, num_classes=3, progress=False)
    with pytest.raises(ValueError, match="val_fraction"):
        Recipe(val_fraction=1.0)


# ---------------------------------------------------------------- stage and report


@pytest.fixture(scope="module")
def image_release(tmp_path_factory):
    """8x8 'images' (d = 64, so the CNN path) as a noise-free l=1 release, with a real test split."""
    root = tmp_path_factory.mktemp("eval")
    x, y = make_dataset(n_per_class=100, num_classes=4, dim=64, seed=4)
    xt, yt = make_dataset(n_per_class=25, num_classes=4, dim=64, seed=5)
    release = make_release_dir(root / "release", x, y)
    test_glob = write_dataset(root / "test", xt, yt)
    return release, test_glob, len(yt)


def test_evaluate_standalone_writes_report_and_pngs(image_release):
    from PIL import Image

    from dpcda.evaluation.standalone import evaluate_standalone
    from dpcda.storage import prepared

    release, test_glob, n_test = image_release
    names = ["circle", "square", "star", "moon"]  # what dpcda prepare records beside a split's shards
    Path(os.path.dirname(test_glob), prepared.MARKER).write_text(json.dumps({"files": [], "label_names": names}))
    rep = evaluate_standalone(str(release), test_glob, runs=1, epochs=3)
    out = release / "evaluation"
    assert rep["path"] == str(out / "report.json")
    saved = json.loads((out / "report.json").read_text())
    assert saved["model"] == "TableOneCNN" and saved["input_shape"] == [1, 8, 8]
    assert saved["test_rows"] == n_test and np.asarray(saved["confusion_matrix"]).sum() == n_test
    assert saved["synthetic_rows"] == 400 and saved["accuracy_mean"] == rep["accuracy_mean"]
    assert rep["accuracy_mean"] > 0.6  # 4 classes: chance is 0.25
    assert saved["class_names"] == names and "dpcda prepare" in saved["class_names_from"]
    for name, min_size in (("samples.png", 150), ("curves.png", 300)):
        with Image.open(out / name) as img:
            img.verify()
        with Image.open(out / name) as img:
            w, h = img.size
            assert min_size <= w <= 4000 and 100 <= h <= 4000, (name, img.size)


def test_evaluate_standalone_custom_out_and_missing_normalization(image_release, tmp_path):
    from dpcda.evaluation.stage import EvaluationError
    from dpcda.evaluation.standalone import evaluate_standalone

    release, test_glob, _ = image_release
    rep = evaluate_standalone(str(release), test_glob, runs=1, epochs=1, out=str(tmp_path / "rep"))
    assert Path(rep["path"]).exists() and rep["path"].startswith(str(tmp_path))
    bare = tmp_path / "bare"
    write_dataset(bare / "synthetic", np.zeros((4, 64), np.float32), np.arange(4) % 2)
    with pytest.raises(EvaluationError, match="normalization.json"):
        evaluate_standalone(str(bare), test_glob, runs=1, epochs=1)
    with pytest.raises(EvaluationError, match="no synthetic"):
        evaluate_standalone(str(tmp_path / "nothing"), test_glob, runs=1, epochs=1)


def test_test_rows_get_the_release_normalization(image_release):
    from dpcda.evaluation.stage import load_test

    release, test_glob, _ = image_release
    norm = json.loads((release / "normalization.json").read_text())
    x, y = load_test(test_glob, norm, 64)
    assert x.dtype == np.float32 and np.all(np.linalg.norm(x, axis=1) <= norm["clip"] + 1e-5)


def test_sample_rows_take_the_class_names_of_the_label_decoding(tmp_path):
    """A table release's manifest decodes its labels; an image release's rows are named by what dpcda prepare
    recorded beside the test split (Fashion-MNIST's class names); names of another length, or none: numbers."""
    from dpcda.evaluation.stage import class_names
    from dpcda.pipeline.prepare import LABEL_NAMES
    from dpcda.storage import prepared

    table = {"input": {"table": {"label": {"name": "churn", "categories": ["no", "yes"]}}}}
    assert class_names(table, "unused", 2)[0] == ["no", "yes"] and class_names(table, "unused", 3) == (None, None)
    assert LABEL_NAMES["fashion-mnist"][0] == "T-shirt/top" and len(LABEL_NAMES["fashion-mnist"]) == 10
    proc = run_cli("prepare", "digits", "--out", tmp_path / "digits", "--shards", 1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    glob_ = str(tmp_path / "digits" / "test" / "*.parquet")
    assert class_names(None, glob_, 10) == (LABEL_NAMES["digits"], class_names(None, glob_, 10)[1])
    assert class_names(None, glob_, 3) == (None, None)
    (tmp_path / "digits" / "test" / prepared.MARKER).write_text('{"files": [], "label_names": "not a list"}')
    assert class_names(None, glob_, 10) == (None, None) and prepared.label_names(str(tmp_path)) is None


def test_curves_name_the_real_test_and_the_synthetic_hold_out_figures(tmp_path):
    from PIL import Image

    from dpcda.evaluation.report import real_test_line, write_curves

    x, y = make_dataset(n_per_class=60, num_classes=3, dim=64, seed=1)
    res = train_and_score(x, y, x[:30], y[:30], num_classes=3, epochs=2, device="cpu", progress=False)
    line = real_test_line(res)
    real = res["real_test_accuracy"]
    assert line.startswith(f"real test rows: stacked (probe + CNN) {res['accuracy_mean']:.4f}")
    assert f"CNN alone {real['network']['accuracy_mean']:.4f}" in line and "probe alone" in line
    assert "weights probe" in line
    with Image.open(write_curves(str(tmp_path / "c.png"), res["curves"], res)) as img:
        assert img.size[0] > 600 and img.size[1] > 300


def test_samples_grid_for_flat_rows(tmp_path):
    from PIL import Image

    from dpcda.evaluation.report import write_samples

    x, y = make_dataset(n_per_class=5, num_classes=3, dim=10)
    path = write_samples(str(tmp_path / "s.png"), x, y, num_classes=3, per_class=4)
    with Image.open(path) as img:
        assert img.size[0] > 100 and img.size[1] > 100


def test_samples_in_input_units_undo_the_release_normalization(tmp_path):
    from PIL import Image

    from dpcda.evaluation.report import to_pixels, write_samples

    rng = np.random.default_rng(3)
    pixels = rng.uniform(0.2, 0.8, size=(30, 16))
    mean, std = pixels.mean(0), pixels.std(0)
    z = (pixels - mean) / std
    rows = z / np.linalg.norm(z, axis=1, keepdims=True) * 0.5  # what a release with c = 0.5 carries
    norm = {"mean": mean.tolist(), "std": std.tolist(), "clip": 0.5, "feature_bounds": [0.0, 1.0]}
    back = to_pixels(rows, norm)
    # exact where a row's z-score had the average norm sqrt(d); on the bounds' scale in any case
    scale = np.linalg.norm(z, axis=1, keepdims=True) / np.sqrt(16)
    assert np.allclose(mean + (back - mean) * scale, pixels)
    assert to_pixels(np.full((1, 16), 1e3), norm).max() == 1.0 and to_pixels(np.full((1, 16), -1e3), norm).min() == 0
    path = write_samples(str(tmp_path / "s.png"), rows, np.arange(30) % 3, num_classes=3, per_class=4, norm=norm)
    with Image.open(path) as img:
        assert img.size[0] > 100


def test_evaluation_imports_without_beam():
    code = (
        "import sys; sys.modules['apache_beam'] = None; "
        "import dpcda.evaluation.models, dpcda.evaluation.train, dpcda.evaluation.report, dpcda.evaluation.stage; "
        "assert 'apache_beam' not in [m for m in sys.modules if sys.modules[m] is not None]"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not os.path.exists(FASHION), reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_slice_noise_free_beats_chance():
    from dpcda.pipeline.prepare import load_fashion_mnist

    x, y = load_fashion_mnist("train", FASHION)
    xt, yt = load_fashion_mnist("test", FASHION)
    x, y, xt, yt = x[:1500], y[:1500], xt[:500], yt[:500]
    mean, std = x.mean(0), np.maximum(x.std(0), 0.01)
    res = train_and_score(
        normalize(x, mean, std, 1.0, (0, 1)),
        y,
        normalize(xt, mean, std, 1.0, (0, 1)),
        yt,
        num_classes=10,
        epochs=3,
        device="cpu",
        progress=False,
    )
    assert res["model"] == "TableOneCNN" and res["accuracy_mean"] > 0.55  # chance is 0.1


def test_release_cli_with_evaluation_fills_manifest_utility(tmp_path):
    x, y = make_dataset(n_per_class=80, num_classes=3, dim=16, seed=6)
    xt, yt = make_dataset(n_per_class=20, num_classes=3, dim=16, seed=7)
    train_glob = write_dataset(tmp_path / "train", x, y)
    test_glob = write_dataset(tmp_path / "test", xt, yt)
    out = tmp_path / "rel"
    proc = run_cli(
        "release",
        "--input",
        train_glob,
        "--output",
        out,
        "--sigma-x",
        "0",
        "--mixing-order",
        "1",
        "--seed",
        "1",
        "--eval-input",
        test_glob,
        "--eval-runs",
        "2",
        "--eval-epochs",
        "3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    util = manifest["utility"]
    assert util["runs"] == 2 and util["epochs"] == 3
    # the test set is not declared public: its figures are marked, its exact size left out
    assert "test_rows" not in util and util["test_set_public"] is False and "guarantee" in util["outside_guarantee"]
    assert util["report"] == "evaluation/report.json" and util["accuracy_mean"] > 0.7
    report = json.loads((out / util["report"]).read_text())
    assert report["accuracy_mean"] == util["accuracy_mean"]
    assert (out / "evaluation" / "samples.png").exists() and (out / "evaluation" / "curves.png").exists()
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert printed["accuracy"] == util["accuracy_mean"]
    # the figure is named: which model it is, and the network alone and the probe alone beside it
    assert printed["accuracy_of"] == util["accuracy_of"] == "stacked" and printed["summary"] == util["summary"]
    assert util["summary"].startswith("stacked: ") and util["network_accuracy"] == pytest.approx(
        report["real_test_accuracy"]["network"]["accuracy_mean"]
    )
    assert set(util["stack_weights"]) == {"probe", "network"} and util["synthetic_holdout_accuracy"]["rows"] > 0
    assert "stage=evaluate real_test_accuracy stacked=" in proc.stderr and " probe=" in proc.stderr
    assert "stage=evaluate synthetic_holdout_accuracy stacked=" in proc.stderr
