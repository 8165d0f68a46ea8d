"""The release job end to end on the DirectRunner, on small generated data."""

from __future__ import annotations

import glob
import itertools
import json

import jsonschema
import numpy as np
import pyarrow.parquet as pq
import pytest

from dpcda.mechanisms.plan import normalize
from dpcda.pipeline.release import run_release
from dpcda.schemas.config import ConfigError, load_config
from dpcda.schemas.manifest import SCHEMA_PATH, Manifest
from dpcda.storage.publish import PublishError
from tests.conftest import BEAM_ARGS, make_dataset, run_cli, write_dataset


def release(tmp_path, input_glob, name="out", beam_args=BEAM_ARGS, **overrides):
    out = tmp_path / name
    cfg = load_config(None, {"input": input_glob, "output": str(out), **overrides})
    manifest = run_release(cfg, list(beam_args)).model_dump(mode="json")
    return out, manifest


def read_release(out):
    tables = [pq.read_table(p) for p in sorted(glob.glob(str(out / "synthetic" / "part-*.parquet")))]
    feats = np.concatenate([np.stack(t.column("features").to_numpy(zero_copy_only=False)) for t in tables])
    labels = np.concatenate([t.column("label").to_numpy() for t in tables])
    order = np.lexsort(np.c_[feats, labels].T[::-1])
    return feats[order], labels[order]


def expected_normalized(out, x):
    stats = json.loads((out / "normalization.json").read_text())
    return normalize(
        x,
        np.asarray(stats["mean"], np.float32),
        np.asarray(stats["std"], np.float32),
        stats["clip"],
        tuple(stats["feature_bounds"]),
    )


def test_release_end_to_end_manifest_and_balance(tmp_path, small_parquet):
    glob_, x, y = small_parquet
    out, manifest = release(tmp_path, glob_, epsilon=8.0, samples=100, seed=3)
    feats, labels = read_release(out)
    assert len(labels) == 99 and np.bincount(labels).tolist() == [33, 33, 33]  # T_k = floor(100 / 3)
    assert feats.dtype == np.float32 and feats.shape[1] == x.shape[1]
    m = Manifest(**json.loads((out / "manifest.json").read_text()))
    jsonschema.validate(json.loads((out / "manifest.json").read_text()), json.loads(SCHEMA_PATH.read_text()))
    assert m.output.rows == 99 and sum(f.rows for f in m.output.files) == 99
    # a --seed release: the mechanism's epsilon is stated, but the release itself is not private
    assert m.privacy.epsilon <= 8.0 and not m.privacy.end_to_end_dp and m.privacy.reproducible_seed
    assert any("NOT private" in c and "not this release's" in c for c in m.privacy.caveats)
    assert m.mechanism.class_sizes == [40, 40, 40]
    assert set(m.privacy.components) == {"normalization", "mixing"}
    assert not any(p.name.startswith("out.tmp") for p in tmp_path.iterdir())
    text = (out / "manifest.json").read_text()
    assert '"seed"' not in text and "key" not in json.loads(text)["privacy"]
    # the noise: generator and sampler named, every feature value on the stated grid, delta split within the target
    assert "ChaCha20" in m.privacy.noise.generator and "192-bit" in m.privacy.noise.sampler
    grid = m.privacy.noise.grids["features"]
    assert set(m.privacy.delta_breakdown) == {"accountant", "sampler"}
    assert sum(m.privacy.delta_breakdown.values()) <= m.privacy.delta == 1e-5
    assert not any("not a cryptographic" in c.lower() or "mersenne" in c.lower() for c in m.privacy.caveats)
    assert any("ChaCha20" in c for c in m.privacy.caveats)
    assert grid == 2.0 ** (np.floor(np.log2(m.mechanism.sigma_x)) - 12)


def test_schema_file_is_current():
    assert json.loads(SCHEMA_PATH.read_text()) == Manifest.model_json_schema()


def test_noise_off_l1_outputs_are_normalized_input_rows_of_their_class(tmp_path, small_parquet):
    glob_, x, y = small_parquet
    out, _ = release(tmp_path, glob_, sigma_x=0.0, mixing_order=1, seed=1, clip=2.0)
    feats, labels = read_release(out)
    z = expected_normalized(out, x)
    for k in range(3):
        allowed = {r.tobytes() for r in z[y == k]}
        assert all(r.tobytes() in allowed for r in feats[labels == k])
    assert len(labels) == len(y)


def test_noise_off_rows_are_means_of_l_distinct_same_class_rows(tmp_path):
    x, y = make_dataset(n_per_class=6, num_classes=2, dim=4, seed=5)
    glob_ = write_dataset(tmp_path / "in", x, y)
    out, _ = release(tmp_path, glob_, sigma_x=0.0, mixing_order=3, seed=2)
    feats, labels = read_release(out)
    z = expected_normalized(out, x)
    for k in range(2):
        zk = z[y == k]
        means = np.stack([zk[list(c)].mean(0) for c in itertools.combinations(range(len(zk)), 3)])
        for r in feats[labels == k]:
            assert np.abs(means - r).max(axis=1).min() < 1e-5


def test_two_runs_without_seed_differ(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    a, _ = release(tmp_path, glob_, name="a", epsilon=5.0)
    b, mb = release(tmp_path, glob_, name="b", epsilon=5.0)
    assert not np.array_equal(read_release(a)[0], read_release(b)[0])
    assert mb["privacy"]["reproducible_seed"] is False


def test_same_seed_identical_across_formats_and_running_modes(tmp_path):
    x, y = make_dataset(n_per_class=30, num_classes=3, dim=8, seed=9)
    pq_glob = write_dataset(tmp_path / "pq", x, y, "parquet", shards=3)
    tf_glob = write_dataset(tmp_path / "tf", x, y, "tfrecord", shards=2)
    a, ma = release(tmp_path, pq_glob, name="a", epsilon=6.0, seed=11)
    b, mb = release(tmp_path, tf_glob, name="b", epsilon=6.0, seed=11)
    c, mc = release(
        tmp_path,
        pq_glob,
        name="c",
        epsilon=6.0,
        seed=11,
        beam_args=["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    )
    fa, la = read_release(a)
    for other in (b, c):
        fo, lo = read_release(other)
        np.testing.assert_array_equal(fa, fo)
        np.testing.assert_array_equal(la, lo)
    assert ma["mechanism"]["sigma_x"] == mb["mechanism"]["sigma_x"] == mc["mechanism"]["sigma_x"]


def test_poisson_mode_publishes_no_exact_counts(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    out, m = release(tmp_path, glob_, mode="poisson", epsilon=8.0, num_classes=3, seed=4, histogram_budget_share=0.3)
    assert m["mechanism"]["class_sizes"] is None
    assert len(m["mechanism"]["class_sizes_dp"]) == 3
    # a 30 % share (eps 2.4) is a noise multiplier near 2: DP counts within 6 sd of the true 40
    assert all(abs(n - 40) <= 12 for n in m["mechanism"]["class_sizes_dp"]), m["mechanism"]["class_sizes_dp"]
    assert set(m["privacy"]["components"]) == {"normalization", "class_histogram", "mixing"}
    assert m["privacy"]["accountant"] == "pld" and "rdp" in m["privacy"]["cross_check"]
    assert m["privacy"]["epsilon"] <= 8.0
    feats, labels = read_release(out)
    assert len(labels) == m["output"]["rows"] == 3 * (sum(m["mechanism"]["class_sizes_dp"]) // 3)
    # the exact row count appears nowhere (T = 3 floor(N_hat / 3) may land on it: it is a function of the DP counts)
    derived = ("samples_total", "samples_per_class", "rows_per_class")

    def numbers(v):  # every number in a JSON value (a float's digits may contain "120" by chance: compare values)
        if isinstance(v, dict):
            return [n for x in v.values() for n in numbers(x)]
        if isinstance(v, list):
            return [n for x in v for n in numbers(x)]
        return [v] if isinstance(v, (int, float)) and not isinstance(v, bool) else []

    assert 120 not in numbers({k: v for k, v in m["mechanism"].items() if k not in derived})
    assert m["privacy"]["delta_breakdown"]["class_histogram"] == pytest.approx(0.3 * 1e-5 * (1 - 1e-3))  # less the
    assert m["privacy"]["delta_breakdown"]["pld_roundoff"] > 0  # share the PLD set aside for its float64 round-off
    assert sum(m["privacy"]["delta_breakdown"].values()) <= m["privacy"]["delta"]


def test_exact_normalization_needs_the_loud_flag_and_is_marked(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    with pytest.raises(ConfigError, match="i-understand"):
        load_config(None, {"input": glob_, "output": "x", "epsilon": 5.0, "normalization": "exact"})
    _, m = release(tmp_path, glob_, epsilon=5.0, normalization="exact", allow_exact_normalization=True, seed=1)
    assert m["privacy"]["end_to_end_dp"] is False
    assert "normalization" not in m["privacy"]["components"]
    assert any("NOT END-TO-END DP" in c for c in m["privacy"]["caveats"])


def test_public_normalization_file(tmp_path, small_parquet):
    glob_, x, _ = small_parquet
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"mean": [0.5] * x.shape[1], "std": [0.25] * x.shape[1]}))
    out, m = release(
        tmp_path,
        glob_,
        sigma_x=0.0,
        mixing_order=1,
        normalization="public",
        normalization_file=str(stats),
        seed=1,
        clip=100.0,
    )
    feats, _ = read_release(out)
    allowed = {r.tobytes() for r in ((x - 0.5) / 0.25).astype(np.float32)}
    assert all(r.tobytes() in allowed for r in feats)
    assert set(m["privacy"]["components"]) == {"mixing"}


def test_class_smaller_than_l_is_refused_in_fixed_mode(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    with pytest.raises(Exception, match="class 0 has 40 records, fewer than mixing_order l=41"):
        release(tmp_path, glob_, epsilon=5.0, mixing_order=41)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob("out.tmp*"))


def test_existing_release_is_not_overwritten(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    out, _ = release(tmp_path, glob_, epsilon=5.0, seed=1)
    before = (out / "manifest.json").read_text()
    with pytest.raises(PublishError, match="--overwrite"):
        release(tmp_path, glob_, epsilon=5.0, seed=2)
    assert (out / "manifest.json").read_text() == before
    release(tmp_path, glob_, epsilon=5.0, seed=2, overwrite=True)
    assert (out / "manifest.json").read_text() != before


def test_cli_release_and_account(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    res = run_cli(
        "release", "--input", glob_, "--output", tmp_path / "cli", "--epsilon", "6", "--mixing-order", "2", *BEAM_ARGS
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 120 and summary["epsilon"] <= 6
    assert "stage=mix" in res.stderr and "stage=done" in res.stderr
    res = run_cli(
        "account",
        "--mode",
        "fixed",
        "--class-size",
        "6000",
        "--samples-per-class",
        "6000",
        "--mixing-order",
        "4",
        "--clip",
        "1",
        "--epsilon",
        "10",
        "--json",
    )
    out = json.loads(res.stdout)
    assert res.returncode == 0 and out["epsilon"] <= 10 and out["sigma_x"] > 0
    res2 = run_cli(
        "account",
        "--mode",
        "fixed",
        "--class-size",
        "6000",
        "--samples-per-class",
        "6000",
        "--mixing-order",
        "4",
        "--sigma-x",
        str(out["sigma_x"]),
        "--json",
    )
    assert json.loads(res2.stdout)["epsilon"] == pytest.approx(out["epsilon"])
    res3 = run_cli("account", "--class-size", "3", "--samples-per-class", "10", "--mixing-order", "4", "--epsilon", "1")
    assert res3.returncode == 2 and "3 records, fewer than mixing_order l=4" in res3.stderr


def test_lowpass_release_rows_lie_in_the_kept_subspace_and_privacy_is_unchanged(tmp_path, small_parquet):
    from dpcda.mechanisms.postprocess import lowpass_basis

    glob_, x, _ = small_parquet  # d = 16: a 4x4 image
    plain, mp = release(tmp_path, glob_, name="plain", epsilon=8.0, samples=60, seed=3)
    low, ml = release(tmp_path, glob_, name="low", epsilon=8.0, samples=60, seed=3, lowpass=3)
    feats, _ = read_release(low)
    b = lowpass_basis((4, 4), 3)
    np.testing.assert_allclose(feats @ b.T @ b, feats, atol=1e-5)
    assert not np.allclose(read_release(plain)[0] @ b.T @ b, read_release(plain)[0], atol=1e-3)
    assert ml["mechanism"]["postprocessing"]["kept_coefficients"] == 6
    assert ml["mechanism"]["postprocessing"]["image_shape"] == [4, 4]
    assert ml["privacy"] == mp["privacy"] and mp["mechanism"]["postprocessing"] is None
    jsonschema.validate(json.loads((low / "manifest.json").read_text()), json.loads(SCHEMA_PATH.read_text()))


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--lowpass", "3"], "d=15 is not a square image; give --image-shape"),
        (["--lowpass", "3", "--image-shape", "4,4"], "image_shape: 4,4 has 16 features, the input has d=15"),
        (["--lowpass", "7", "--image-shape", "3,5"], "K=7 keeps every DCT coefficient of a 3x5 image"),
    ],
)
def test_lowpass_shape_errors_are_one_line_and_leave_nothing(tmp_path, extra, message):
    x, y = make_dataset(dim=15)
    glob_ = write_dataset(tmp_path / "in", x, y)
    out = tmp_path / "out"
    res = run_cli("release", "--input", glob_, "--output", out, "--epsilon", "4", *extra, *BEAM_ARGS)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


def test_soft_labels_column_beside_its_argmax(tmp_path, small_parquet):
    glob_, _, _ = small_parquet
    out, m = release(tmp_path, glob_, epsilon=8.0, samples=90, seed=5, sigma_y=0.6, num_classes=3, soft_labels=True)
    tables = [pq.read_table(p) for p in sorted(glob.glob(str(out / "synthetic" / "part-*.parquet")))]
    assert all(t.column_names == ["features", "label", "label_soft"] for t in tables)
    soft = np.concatenate([np.stack(t.column("label_soft").to_numpy(zero_copy_only=False)) for t in tables])
    hard = np.concatenate([t.column("label").to_numpy() for t in tables])
    assert soft.shape == (90, 3)
    np.testing.assert_array_equal(soft.argmax(axis=1), hard)
    assert "label_soft fixed_size_list<float32>[3]" in m["output"]["format"]
    jsonschema.validate(json.loads((out / "manifest.json").read_text()), json.loads(SCHEMA_PATH.read_text()))
    with pytest.raises(ConfigError, match="num_classes: required with soft_labels"):
        load_config(None, {"input": glob_, "output": str(tmp_path / "x"), "epsilon": 8.0, "soft_labels": True})
