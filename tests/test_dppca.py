"""DP-PCA projection for mixing (mechanisms.dppca, --projection dp-pca:K): exact sums, the sensitivity in the bits,
the basis, mixing in K dimensions, and the release's accounting."""

from __future__ import annotations

import glob
import json
import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpcda.mechanisms.dpcda import mix_class
from dpcda.mechanisms.dppca import CovarianceCombiner, dp_basis, project_rows
from dpcda.privacy import dp_stats
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from tests.conftest import make_dataset, run_cli, write_dataset

KEY = key_from_test_seed(2)


def clipped_rows(n, d, clip=1.0, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x * (clip * (1 - CLIP_MARGIN) / np.linalg.norm(x, axis=1, keepdims=True))


def test_covariance_sums_are_exact_and_split_invariant():
    x = clipped_rows(500, 7, clip=2.5)
    comb = CovarianceCombiner(2.5)
    one = comb.add(comb.create(), x)
    q = dp_stats.covariance_quantize(x, 2.5).astype(np.int64)
    exact = np.array(
        [[int(sum(int(a) * int(b) for a, b in zip(q[:, i], q[:, j]))) for j in range(7)] for i in range(7)]
    )
    np.testing.assert_array_equal(one.sum_qq, exact)
    parts = [comb.add(comb.create(), x[a:b]) for a, b in ((0, 13), (13, 300), (300, 500))]
    merged = comb.merge(pickle.loads(pickle.dumps(p)) for p in parts)  # accumulators travel pickled
    np.testing.assert_array_equal(merged.sum_qq, exact)
    assert merged.rows == 500


def test_one_record_moves_the_quantized_upper_triangle_by_at_most_the_sensitivity():
    """Worst cases: full-norm rows whose coordinates all round up, and two orthogonal ones (a replacement)."""
    iu_norm = lambda m, d: np.linalg.norm(m[np.triu_indices(d)])  # noqa: E731
    for d in (2, 9, 30):
        ratios = []
        for seed in range(50):
            rng = np.random.default_rng(seed)
            x = np.abs(rng.normal(size=d))
            x *= (1 - CLIP_MARGIN) / np.linalg.norm(x)
            # push every coordinate to just above a half step, so that rint rounds each one up
            steps = np.floor(x * 2**16) + 0.5 + 1e-6
            x = np.minimum(steps / 2**16, x + 0.5 / 2**16)
            x *= (1 - CLIP_MARGIN) / max(np.linalg.norm(x), 1.0)
            y = np.zeros(d)
            y[np.argmin(x)] = -(1 - CLIP_MARGIN)  # nearly orthogonal, full norm, on one coordinate
            q, p = dp_stats.covariance_quantize(np.stack([x, y]), 1.0)
            for row in (q, p):  # add/remove: one outer product (largest when the row sits on one coordinate)
                ratios.append(iu_norm(np.outer(row, row), d) / dp_stats.covariance_sensitivity(d, "poisson"))
            swap = iu_norm(np.outer(q, q) - np.outer(p, p), d)  # replace-one (the bound 2 ||q||^2 is loose here)
            assert swap <= dp_stats.covariance_sensitivity(d, "fixed")
        assert max(ratios) <= 1.0
        assert max(ratios) > 0.99  # a row on one coordinate reaches the bound: a smaller sensitivity would fail


def test_covariance_sums_stay_exact_across_blocks():
    x = clipped_rows((1 << 16) + 77, 3)  # more than one exact float64 block
    comb = CovarianceCombiner(1.0)
    got = comb.add(comb.create(), x).sum_qq
    q = dp_stats.covariance_quantize(x, 1.0).astype(np.int64).astype(object)
    np.testing.assert_array_equal(got, (q.T @ q).astype(np.int64))


def test_large_sums_are_noised_without_rounding_them_first():
    key = key_from_test_seed(5)
    small = np.array([[3 * 2**40 + 12345, 7], [7, 2**45 + 99]], np.int64)
    iu = np.triu_indices(2)
    sigma = 1e6
    split = dp_stats.dp_covariance(small, 2.0**16, noise_std=sigma, stream=NoiseStream(key, "pca"))
    direct = NoiseStream(key, "pca").gaussian(small[iu].astype(np.float64), sigma)
    np.testing.assert_array_equal(split[iu], direct)  # the split draws exactly what the sampler draws on S itself
    big = np.array([[2**60 + 3, 5], [5, 2**58 + 1]], np.int64)  # beyond float64's exact integers
    out = dp_stats.dp_covariance(big, 2.0**16, noise_std=sigma, stream=NoiseStream(key, "pca"))[iu]
    noise = [float(int(round(o)) - int(b)) for o, b in zip(out, big[iu])]
    assert max(abs(n) for n in noise) < 10 * sigma + 2**8  # float64's spacing at 2^60 is 2^8


def test_the_basis_spans_the_top_directions_without_noise_and_is_orthonormal():
    rng = np.random.default_rng(1)
    d, K = 12, 3
    directions = np.linalg.qr(rng.normal(size=(d, K)))[0]
    x = rng.normal(size=(2000, K)) * [3.0, 2.0, 1.5] @ directions.T + 0.05 * rng.normal(size=(2000, d))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)) / (1 - CLIP_MARGIN)
    comb = CovarianceCombiner(1.0)
    V = dp_basis(comb.add(comb.create(), x), dim=d, components=K, clip=1.0, noise_std=0.0, key=KEY)
    np.testing.assert_allclose(V.T @ V, np.eye(K), atol=1e-12)
    overlap = np.linalg.svd(directions.T @ V, compute_uv=False)  # cosines of the principal angles
    assert overlap.min() > 0.99
    noisy = dp_basis(comb.add(comb.create(), x), dim=d, components=K, clip=1.0, noise_std=5e8, key=KEY)
    np.testing.assert_allclose(noisy.T @ noisy, np.eye(K), atol=1e-12)


def test_projected_rows_stay_inside_the_clip_and_mixed_rows_lie_in_the_basis():
    d, K = 10, 3
    V = np.linalg.qr(np.random.default_rng(3).normal(size=(d, K)))[0]
    x = clipped_rows(200, d, clip=1.0)
    z = project_rows(x, V * (1 + 1e-9), clip=1.0)  # a slightly inflated basis must still not push a row past c
    assert np.linalg.norm(z, axis=1).max() <= 1.0 * (1 - CLIP_MARGIN)
    rows = np.concatenate(
        [
            f
            for _, f, _ in mix_class(
                x,
                key=KEY,
                class_index=0,
                num_classes=1,
                mode="fixed",
                mixing_order=4,
                sigma_x=0.3,
                samples=50,
                chunk_rows=16,
                basis=V,
                clip=1.0,
            )
        ]
    )
    residual = rows - (rows @ V) @ V.T
    assert np.abs(residual).max() < 1e-5  # float32 rows in span(V): no noise in the d - K other directions


def test_a_release_with_a_projection_accounts_the_covariance_and_releases_rows_of_rank_k(tmp_path):
    x, y = make_dataset(n_per_class=40, num_classes=3, dim=16)
    inp = write_dataset(tmp_path / "in", x, y)
    res = run_cli(
        "release",
        "--input",
        inp,
        "--output",
        tmp_path / "rel",
        "--epsilon",
        4,
        "--seed",
        1,
        "--projection",
        "dp-pca:3",
        "--mixing-order",
        2,
    )
    assert res.returncode == 0, res.stderr
    m = json.loads((tmp_path / "rel" / "manifest.json").read_text())
    assert m["privacy"]["epsilon"] <= 4.0
    assert m["privacy"]["components"]["pca_covariance"] > 0
    assert m["mechanism"]["projection"]["components"] == 3
    assert m["privacy"]["events"]["shared"][1]["name"] == "pca_covariance"
    # the covariance's noise, recomputed independently: a Gaussian of std / replace-one sensitivity spends its share
    import dp_accounting
    from dp_accounting import pld

    from dpcda.privacy.accounting import accountant_delta

    z = m["mechanism"]["projection"]["covariance_noise_std"] / dp_stats.covariance_sensitivity(16, "fixed")
    acc = pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4)
    eps = acc.compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(accountant_delta(1e-5))
    assert 0.9 * 0.4 <= eps <= 0.4 * 1.001  # pca_budget_share 0.1 of epsilon 4
    t = pq.read_table(sorted(glob.glob(str(tmp_path / "rel" / "synthetic" / "*.parquet"))))
    rows = np.stack(t.column("features").to_numpy(zero_copy_only=False)).astype(np.float64)
    s = np.linalg.svd(rows, compute_uv=False)
    assert s[3] < 1e-5 * s[0]  # every row in one 3-dimensional subspace


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"mechanism": "local", "mixing_order": 1, "projection": "dp-pca:3"}, "mixing mechanisms"),
        ({"projection": "dp-pca:3", "mixing_path": "join"}, "join mixing path"),
        ({"projection": "pca:3"}, "projection"),
    ],
)
def test_bad_projections_are_refused(fields, message):
    from dpcda.schemas.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(None, {"input": "in/*.parquet", "output": "out", "epsilon": 4.0, **fields})


def test_a_projection_as_wide_as_the_rows_is_refused_in_one_line(tmp_path):
    x, y = make_dataset(n_per_class=10, num_classes=2, dim=16)
    inp = write_dataset(tmp_path / "in", x, y)
    res = run_cli("release", "--input", inp, "--output", tmp_path / "rel", "--epsilon", 4, "--projection", "dp-pca:16")
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and last.startswith("dpcda: error:") and "below the feature dimension" in last
