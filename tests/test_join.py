"""The plan-and-join mixing path (mechanisms.joinmix, transforms.join): the same rows as the in-memory path for the
same index order, the right distribution, and the same release on every runner."""

from __future__ import annotations

import glob
import json
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from scipy import stats

from dpcda.mechanisms.dpcda import canonical_order, mix_chunk, mix_class
from dpcda.mechanisms.dpmix import mix_dataset
from dpcda.mechanisms.joinmix import Streams, block_partials, chunk_requests, finish_chunk, record_offsets
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from tests.conftest import make_dataset, run_cli, write_dataset

KEY = key_from_test_seed(11)


def join_rows(x, y, *, mechanism, group, mode, l, sigma_x, sigma_y=0.0, samples, chunk_rows, rate, R, K, soft=False):
    """The join path's rows for one group whose records are ``x`` (in index order): every stage, shuffled."""
    streams = Streams(mechanism)
    rng = np.random.default_rng(0)  # only shuffles the order of the test's own messages
    out_f, out_l = [], []
    for c in range(-(-samples // chunk_rows)):
        rows = min(chunk_rows, samples - c * chunk_rows)
        values = {}
        for j in range(-(-len(x) // R)):
            values.setdefault((group, j), []).append(("rec", (0, x[j * R : (j + 1) * R], y[j * R : (j + 1) * R])))
        for k, req in chunk_requests(
            streams=streams,
            key=KEY,
            group=group,
            chunk=c,
            records=len(x),
            mode=mode,
            mixing_order=l,
            rows=rows,
            sampling_rate=rate,
            block_rows=R,
        ):
            values.setdefault(k, []).append(("req", req))
        parts = []
        for (g, j), vs in values.items():
            vs = [vs[i] for i in rng.permutation(len(vs))]
            parts += [
                p for _, p in block_partials(g, j, vs, dim=x.shape[1], num_classes=K, with_labels=mechanism == "dpmix")
            ]
        parts = [parts[i] for i in rng.permutation(len(parts))] + [None]
        f, lab = finish_chunk(
            parts,
            streams=streams,
            key=KEY,
            group=group,
            chunk=c,
            rows=rows,
            dim=x.shape[1],
            num_classes=K,
            mixing_order=l,
            sigma_x=sigma_x,
            sigma_y=sigma_y,
            soft_labels=soft,
        )
        out_f.append(f)
        out_l.append(lab)
    return np.concatenate(out_f), np.concatenate(out_l)


def unit_rows(n, d, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / (np.linalg.norm(x, axis=1, keepdims=True) * 1.01)


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_join_core_gives_the_in_memory_rows_bit_for_bit(mode):
    n, d, l, T, K = 300, 6, 4, 250, 3
    x = unit_rows(n, d)
    x = x[canonical_order(x)]  # records already in the in-memory path's order
    rate = Fraction(l, n) if mode == "poisson" else Fraction(0)
    ref = list(
        mix_class(
            x,
            key=KEY,
            class_index=1,
            num_classes=K,
            mode=mode,
            mixing_order=l,
            sigma_x=0.4,
            samples=T,
            chunk_rows=64,
            sampling_rate=rate,
            sigma_y=0.7,
        )
    )
    feats, labels = join_rows(
        x,
        np.ones(n, np.int64),
        mechanism="dpcda",
        group=1,
        mode=mode,
        l=l,
        sigma_x=0.4,
        sigma_y=0.7,
        samples=T,
        chunk_rows=64,
        rate=rate,
        R=32,
        K=K,
    )
    np.testing.assert_array_equal(feats, np.concatenate([f for _, f, _ in ref]))
    np.testing.assert_array_equal(labels, np.concatenate([lab for _, _, lab in ref]))


def test_join_core_gives_dpmix_in_memory_rows_bit_for_bit():
    n, d, l, T, K = 200, 5, 3, 150, 4
    x, y = unit_rows(n, d, 1), np.arange(n) % K
    perm = canonical_order(x, y)
    x, y = x[perm], y[perm]
    ref = list(
        mix_dataset(
            x,
            y,
            key=KEY,
            num_classes=K,
            mode="fixed",
            mixing_order=l,
            sigma_x=0.3,
            sigma_y=0.2,
            samples=T,
            chunk_rows=50,
        )
    )
    feats, scores = join_rows(
        x,
        y,
        mechanism="dpmix",
        group=0,
        mode="fixed",
        l=l,
        sigma_x=0.3,
        sigma_y=0.2,
        samples=T,
        chunk_rows=50,
        rate=Fraction(0),
        R=16,
        K=K,
    )
    np.testing.assert_array_equal(feats, np.concatenate([f for _, f, _ in ref]))
    np.testing.assert_array_equal(scores, np.concatenate([s for _, _, s in ref]))


def test_join_rows_mix_l_distinct_records_with_uniform_index_frequencies():
    """Records are the basis vectors e_i / 2: a noiseless row reveals its index set. False-failure rate of the
    chi-square test: 1e-4."""
    n, l, T = 12, 3, 4000
    x = np.eye(n) * 0.5
    feats, _ = join_rows(
        x,
        np.zeros(n, np.int64),
        mechanism="dpcda",
        group=0,
        mode="fixed",
        l=l,
        sigma_x=0.0,
        samples=T,
        chunk_rows=512,
        rate=Fraction(0),
        R=5,
        K=1,
    )
    picked = np.isclose(feats, 0.5 / l, atol=1e-6)
    assert np.all(picked | np.isclose(feats, 0.0, atol=1e-6))
    assert np.all(picked.sum(axis=1) == l)  # l distinct records in every row
    freq = picked.sum(axis=0)
    assert stats.chisquare(freq).pvalue >= 1e-4


def test_join_poisson_rows_draw_binomial_record_counts():
    """Record counts per row follow Binomial(n, q) (chi-square over bins, false-failure rate 1e-4)."""
    n, l, T = 40, 4, 4000
    x = np.eye(n) * 0.5
    rate = Fraction(l, n)
    feats, _ = join_rows(
        x,
        np.zeros(n, np.int64),
        mechanism="dpcda",
        group=0,
        mode="poisson",
        l=l,
        sigma_x=0.0,
        samples=T,
        chunk_rows=1000,
        rate=rate,
        R=7,
        K=1,
    )
    m = np.isclose(feats, 0.5 / l, atol=1e-6).sum(axis=1)
    bins = np.minimum(m, 9)
    observed = np.bincount(bins, minlength=10)
    p = stats.binom.pmf(np.arange(9), n, float(rate))
    expected = T * np.append(p, 1 - p.sum())
    assert stats.chisquare(observed, expected).pvalue >= 1e-4


def test_record_offsets_follow_sorted_blocks():
    counts = [(("b", 0), np.array([2, 1])), (("a", 10), np.array([1, 0])), (("a", 0), np.array([3, 4]))]
    offs = record_offsets(counts, 2)
    assert offs[("a", 0)].tolist() == [0, 0]
    assert offs[("a", 10)].tolist() == [3, 4]
    assert offs[("b", 0)].tolist() == [4, 4]


def test_a_chunk_with_no_records_still_gets_its_noise():
    feats, labels = finish_chunk(
        [None],
        streams=Streams("dpcda"),
        key=KEY,
        group=2,
        chunk=0,
        rows=5,
        dim=3,
        num_classes=3,
        mixing_order=4,
        sigma_x=1.0,
        sigma_y=0.0,
        soft_labels=False,
    )
    ref = NoiseStream(KEY, "mix-noise", 2, 0).gaussian(np.zeros((5, 3)), 1.0).astype(np.float32)
    np.testing.assert_array_equal(feats, ref)
    assert labels.tolist() == [2] * 5


def test_mix_chunk_reference_is_the_streams_used():
    """The join path's stream names are the in-memory path's (a renamed stream would silently change releases)."""
    x = torch.from_numpy(unit_rows(20, 3))
    a = mix_chunk(
        x,
        mode="fixed",
        mixing_order=2,
        sigma_x=0.5,
        rows=4,
        index_stream=Streams("dpcda").index(KEY, 0, 0),
        noise_stream=Streams("dpcda").noise(KEY, 0, 0),
    )
    b = mix_chunk(
        x,
        mode="fixed",
        mixing_order=2,
        sigma_x=0.5,
        rows=4,
        index_stream=NoiseStream(KEY, "mix-index", 0, 0),
        noise_stream=NoiseStream(KEY, "mix-noise", 0, 0),
    )
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------- through the release job


def _rows(out):
    t = pq.read_table(sorted(glob.glob(f"{out}/synthetic/*.parquet")))
    x = np.stack(t.column("features").to_numpy(zero_copy_only=False))
    y = t.column("label").to_numpy()
    table = np.c_[x, y]
    return table[np.lexsort(table.T)]


def test_join_release_states_its_path_and_keeps_the_privacy_numbers(tmp_path):
    x, y = make_dataset(n_per_class=40, num_classes=3, dim=12)
    inp = write_dataset(tmp_path / "in", x, y, shards=3)
    common = ["--input", inp, "--epsilon", 3, "--seed", 4, "--chunk-rows", 16]
    mem = run_cli("release", *common, "--output", tmp_path / "mem", "--mixing-path", "memory")
    join = run_cli("release", *common, "--output", tmp_path / "join", "--mixing-path", "join", "--join-block-rows", 8)
    assert mem.returncode == 0 and join.returncode == 0, mem.stderr + join.stderr
    m1, m2 = (json.loads((tmp_path / o / "manifest.json").read_text()) for o in ("mem", "join"))
    assert m1["mechanism"]["mixing_paths"] == ["memory"] * 3 and m2["mechanism"]["mixing_paths"] == ["join"] * 3
    assert m1["privacy"] == m2["privacy"]
    a, b = _rows(tmp_path / "mem"), _rows(tmp_path / "join")
    assert a.shape == b.shape == (120, 13)
    assert np.bincount(b[:, -1].astype(int)).tolist() == [40, 40, 40]


@pytest.mark.slow
def test_auto_sends_a_class_over_the_budget_to_the_join_path(tmp_path):
    x, y = make_dataset(n_per_class=40, num_classes=3, dim=12)
    inp = write_dataset(tmp_path / "in", x, y, shards=3)
    common = ["--input", inp, "--epsilon", 3, "--seed", 4, "--chunk-rows", 16]
    auto = run_cli("release", *common, "--output", tmp_path / "auto", "--max-class-bytes", 2000)
    assert auto.returncode == 0, auto.stderr
    assert json.loads((tmp_path / "auto" / "manifest.json").read_text())["mechanism"]["mixing_paths"] == ["join"] * 3
    refused = run_cli(
        "release", *common, "--output", tmp_path / "r", "--max-class-bytes", 2000, "--mixing-path", "memory"
    )
    assert refused.returncode == 2 and "--mixing-path auto or join" in refused.stderr


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(["--mode", "poisson", "--num-classes", 3], marks=pytest.mark.slow),
        pytest.param(["--mechanism", "dpmix", "--num-classes", 3], marks=pytest.mark.slow),
    ],
)
def test_join_release_is_the_same_on_every_runner(tmp_path, extra):
    x, y = make_dataset(n_per_class=30, num_classes=3, dim=8)
    inp = write_dataset(tmp_path / "in", x, y, shards=3)
    outs = []
    for mode in ("in_memory", "multi_processing"):
        out = tmp_path / mode
        res = run_cli(
            "release",
            "--input",
            inp,
            "--output",
            out,
            "--epsilon",
            3,
            "--seed",
            9,
            "--mixing-path",
            "join",
            "--join-block-rows",
            8,
            "--chunk-rows",
            16,
            *extra,
            "--runner=DirectRunner",
            f"--direct_running_mode={mode}",
            "--direct_num_workers=2",
        )
        assert res.returncode == 0, res.stderr
        outs.append(_rows(out))
    np.testing.assert_array_equal(outs[0], outs[1])
