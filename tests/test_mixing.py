"""Beam-free tests of the mixing core: sampling distributions, exact means, reproducibility."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from dpcda.mechanisms.dpcda import mix_class, sample_rows
from dpcda.privacy.noise import NoiseStream, key_from_test_seed

KEY = key_from_test_seed(1)


def test_poisson_rows_include_each_record_with_rate_q():
    n, q, rows = 40, Fraction(1, 10), 20000
    flat, offsets = sample_rows(
        n, mode="poisson", mixing_order=4, rows=rows, stream=NoiseStream(KEY, "p"), sampling_rate=q
    )
    sizes = np.diff(np.append(offsets, len(flat)))
    # m ~ Binomial(n, q): mean n q, variance n q (1 - q); z-test with false-failure rate < 1e-5
    assert abs(sizes.mean() - n * 0.1) < 4.5 * np.sqrt(n * 0.1 * 0.9 / rows)
    incl = np.bincount(flat, minlength=n) / rows
    assert np.all(np.abs(incl - 0.1) < 4.5 * np.sqrt(0.1 * 0.9 / rows))
    for s, m in zip(offsets[:500], sizes[:500]):
        assert len(set(flat[s : s + m].tolist())) == m


def test_fixed_rows_are_l_distinct_records():
    flat, offsets = sample_rows(12, mode="fixed", mixing_order=5, rows=300, stream=NoiseStream(KEY, "f"))
    assert offsets.tolist() == list(range(0, 1500, 5))
    assert all(len(set(r)) == 5 for r in flat.reshape(300, 5).tolist())


def test_noise_off_each_row_is_a_mean_of_l_distinct_rows():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 5)).astype(np.float32)
    l = 3
    means = {tuple(np.round(x[list(c)].mean(0), 4)) for c in itertools.combinations(range(7), l)}
    out = np.concatenate(
        [
            f
            for _, f, _ in mix_class(
                x,
                key=KEY,
                class_index=2,
                num_classes=4,
                mode="fixed",
                mixing_order=l,
                sigma_x=0.0,
                samples=200,
                chunk_rows=64,
            )
        ]
    )
    assert out.shape == (200, 5)
    assert all(tuple(np.round(r, 4)) in means for r in out)


def test_noise_off_l1_rows_are_input_rows_and_labels_are_the_class():
    x = np.random.default_rng(1).normal(size=(9, 4)).astype(np.float32)
    chunks = list(
        mix_class(
            x,
            key=KEY,
            class_index=1,
            num_classes=3,
            mode="fixed",
            mixing_order=1,
            sigma_x=0.0,
            samples=50,
            chunk_rows=16,
        )
    )
    rows = {r.tobytes() for r in x}
    assert all(r.tobytes() in rows for _, f, _ in chunks for r in f)
    assert all((lab == 1).all() for _, _, lab in chunks)
    assert [c for c, _, _ in chunks] == [0, 1, 2, 3]


def test_same_key_same_rows_any_input_order_and_retried_chunk_reproduces():
    x = np.random.default_rng(2).normal(size=(30, 6)).astype(np.float32)
    kw = dict(
        key=KEY, class_index=0, num_classes=2, mode="fixed", mixing_order=4, sigma_x=0.5, samples=100, chunk_rows=32
    )
    a = np.concatenate([f for _, f, _ in mix_class(x, **kw)])
    b = np.concatenate([f for _, f, _ in mix_class(x[::-1].copy(), **kw)])
    np.testing.assert_array_equal(a, b)
    retried = next(mix_class(x, chunks=[2], **kw))
    np.testing.assert_array_equal(retried[1], a[64:96])
    c = np.concatenate([f for _, f, _ in mix_class(x, **{**kw, "key": key_from_test_seed(2)})])
    assert not np.allclose(a, c)


def test_noise_has_the_calibrated_scale():
    x = np.zeros((20, 400), np.float32)
    out = np.concatenate(
        [
            f
            for _, f, _ in mix_class(
                x,
                key=KEY,
                class_index=0,
                num_classes=1,
                mode="poisson",
                mixing_order=2,
                sigma_x=0.3,
                samples=50,
                chunk_rows=50,
                sampling_rate=0.1,
            )
        ]
    )
    # KS test against N(0, 0.3^2); false-failure rate 1e-4
    assert stats.kstest(out.ravel()[:5000] / 0.3, "norm").pvalue >= 1e-4


def test_label_noise_flips_some_labels_only_when_asked():
    x = np.zeros((5, 2), np.float32)
    kw = dict(
        key=KEY, class_index=0, num_classes=10, mode="fixed", mixing_order=1, sigma_x=0.0, samples=2000, chunk_rows=2000
    )
    _, _, lab = next(mix_class(x, **kw))
    assert (lab == 0).all()
    _, _, lab = next(mix_class(x, sigma_y=1.0, **kw))
    assert 0.2 < (lab != 0).mean() < 0.9


def test_empty_class_in_poisson_mode_still_gets_its_rows_of_noise():
    out = list(
        mix_class(
            np.zeros((0, 4), np.float32),
            key=KEY,
            class_index=1,
            num_classes=2,
            mode="poisson",
            mixing_order=2,
            sigma_x=0.5,
            samples=10,
            chunk_rows=4,
            sampling_rate=1.0,
        )
    )
    feats = np.concatenate([f for _, f, _ in out])
    assert feats.shape == (10, 4) and np.all(np.isfinite(feats)) and feats.std() > 0.1
    assert all((lab == 1).all() for _, _, lab in out)


# --- low-pass post-processing -------------------------------------------------------------------------------


def test_lowpass_basis_is_orthonormal_and_matches_scipy_dct():
    from scipy.fft import dctn, idctn

    from dpcda.mechanisms.postprocess import lowpass_basis

    b = lowpass_basis((28, 28), 16).astype(np.float64)
    assert b.shape == (136, 784)  # #{(u, v): u + v < 16} = 16 * 17 / 2
    np.testing.assert_allclose(b @ b.T, np.eye(136), atol=1e-5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 28, 28))
    u, v = np.meshgrid(np.arange(28), np.arange(28), indexing="ij")
    ref = idctn(dctn(x, axes=(1, 2), norm="ortho") * ((u + v) < 16), axes=(1, 2), norm="ortho").reshape(5, -1)
    np.testing.assert_allclose(x.reshape(5, -1) @ b.T @ b, ref, atol=1e-4)


def test_lowpass_basis_channels_are_separate_blocks():
    from dpcda.mechanisms.postprocess import lowpass_basis

    b = lowpass_basis((3, 4, 5), 2)
    assert b.shape == (9, 60)  # 3 channels x {(0,0), (0,1), (1,0)}
    for c in range(3):
        block = b[3 * c : 3 * c + 3]
        assert np.all(block[:, : 20 * c] == 0) and np.all(block[:, 20 * (c + 1) :] == 0)
    with pytest.raises(ValueError, match="image_shape"):
        lowpass_basis((784,), 4)


def test_lowpass_is_a_projection_of_the_very_same_noisy_rows():
    """Post-processing: with one key, the low-passed release is exactly the plain release, projected."""
    from dpcda.mechanisms.postprocess import lowpass_basis

    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 36)).astype(np.float32)
    kw = dict(
        key=KEY, class_index=0, num_classes=2, mode="fixed", mixing_order=3, sigma_x=0.5, samples=50, chunk_rows=16
    )
    plain = np.concatenate([f for _, f, _ in mix_class(x, **kw)])
    low = np.concatenate([f for _, f, _ in mix_class(x, lowpass=((6, 6), 4), **kw)])
    b = lowpass_basis((6, 6), 4)
    np.testing.assert_allclose(low, plain @ b.T @ b, atol=1e-5)
    np.testing.assert_allclose(low @ b.T @ b, low, atol=1e-5)  # idempotent: already in the kept subspace
    # the noise outside the kept subspace is gone: the residual energy drops by about kept / d
    assert np.linalg.norm(low) < 0.6 * np.linalg.norm(plain)
    with pytest.raises(ValueError, match="has 49 features"):
        next(mix_class(x, lowpass=((7, 7), 4), **kw))


def test_soft_labels_are_the_scores_behind_the_hard_labels():
    x = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    kw = dict(
        key=KEY, class_index=2, num_classes=5, mode="fixed", mixing_order=2, sigma_x=0.3, samples=300, chunk_rows=128
    )
    hard = np.concatenate([lab for _, _, lab in mix_class(x, sigma_y=0.8, **kw)])
    soft = np.concatenate([lab for _, _, lab in mix_class(x, sigma_y=0.8, soft_labels=True, **kw)])
    feats_soft = np.concatenate([f for _, f, _ in mix_class(x, sigma_y=0.8, soft_labels=True, **kw)])
    feats_hard = np.concatenate([f for _, f, _ in mix_class(x, sigma_y=0.8, **kw)])
    assert soft.shape == (300, 5) and soft.dtype == np.float32
    np.testing.assert_array_equal(soft.argmax(axis=1), hard)
    np.testing.assert_array_equal(feats_soft, feats_hard)
    assert 0 < (hard != 2).mean() < 0.5  # sigma_y 0.8: noisy, mostly still k
    np.testing.assert_allclose((soft - np.eye(5)[2]).std(), 0.8, rtol=0.1)
    exact = np.concatenate([lab for _, _, lab in mix_class(x, soft_labels=True, **kw)])  # sigma_y = 0
    np.testing.assert_array_equal(exact, np.tile(np.eye(5, dtype=np.float32)[2], (300, 1)))


def test_separable_lowpass_equals_the_dense_projection_with_channels():
    from dpcda.mechanisms.postprocess import LowPass, lowpass_basis

    rows = torch.from_numpy(np.random.default_rng(1).normal(size=(7, 60)).astype(np.float32))
    b = lowpass_basis((3, 4, 5), 3)
    np.testing.assert_allclose(LowPass((3, 4, 5), 3, "cpu")(rows).numpy(), rows.numpy() @ b.T @ b, atol=1e-5)
    with pytest.raises(ValueError, match="lowpass K"):
        LowPass((4, 4), 0, "cpu")


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_a_chunk_asked_for_float32_is_the_float64_chunk_rounded(mode):
    """``mix_chunk(dtype=float32)`` (what ``mix_class`` asks for without a basis; on a card the cast runs there) is
    the float64 rows rounded to nearest, the same draws; an empty poisson chunk (q tiny) too."""
    from dpcda.mechanisms.dpcda import mix_chunk, sample_index_tensors

    x = torch.from_numpy(np.random.default_rng(3).uniform(0, 1, (50, 7)))
    for rate in (Fraction(4, 50), Fraction(1, 10**9)):
        kw = dict(mode=mode, mixing_order=4, sigma_x=0.3, rows=40, sampling_rate=rate)

        def run(dtype, kw=kw):
            return mix_chunk(
                x, index_stream=NoiseStream(KEY, "i"), noise_stream=NoiseStream(KEY, "n"), dtype=dtype, **kw
            )

        wide, narrow = run(np.float64), run(np.float32)
        assert wide.dtype == np.float64 and narrow.dtype == np.float32
        np.testing.assert_array_equal(narrow, wide.astype(np.float32))
    flat, offsets = sample_index_tensors(
        50, mode="poisson", mixing_order=4, rows=40, stream=NoiseStream(KEY, "i"), sampling_rate=Fraction(1, 10**9)
    )
    assert flat.dtype == offsets.dtype == torch.int64 and flat.numel() == 0 and offsets.tolist() == [0] * 40
