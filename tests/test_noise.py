"""The secure noise package (privacy/noise/): exact samplers, their precision argument, and the float32 attack.

Statistical tests state their false-failure rate; every generator is keyed by a fixed test seed.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats

from dpcda.privacy import noise
from dpcda.privacy.noise import (
    NoiseStream,
    binomial,
    exact,
    gaussian,
    grid_for,
    key_from_test_seed,
    normal_cdf_decimal,
    pool,
    sampler_delta,
    upper_quantile,
)
from dpcda.privacy.noise import stream as noise_stream

KEY = key_from_test_seed(11)
mpmath.mp.prec = 320


@pytest.fixture(autouse=True)
def _exact_precision():
    """320 bits for every test here, whatever a test run before it in this process left (set, not assumed)."""
    with mpmath.workprec(320):
        yield


def _exact_quantile(u: mpmath.mpf) -> mpmath.mpf:
    return mpmath.sqrt(2) * mpmath.erfinv(2 * u - 1)


# ---------------------------------------------------------------- the float pieces the exactness argument assumes


def test_as241_error_is_far_below_the_assumed_bound():
    rng = np.random.default_rng(0)
    p = np.concatenate(
        [
            np.exp(rng.uniform(math.log(2.0**-193), math.log(0.5), 1500)),
            rng.uniform(0.02, 0.5, 500),
            [2.0**-193, 1e-30, 0.075, 0.0749999, 0.5],
        ]
    )
    t = upper_quantile(p)
    worst = max(float(abs(mpmath.mpf(tt) + _exact_quantile(mpmath.mpf(pp))) / (1 + abs(tt))) for pp, tt in zip(p, t))
    assert worst < noise.Z_ERROR / 2**6, worst  # observed about 2^-51; the sampler assumes 2^-40


def test_decimal_normal_cdf_matches_mpmath_in_the_tails_and_centre():
    for w in [Fraction(0), Fraction(1, 3), Fraction(-7, 2), Fraction(-13, 1), Fraction(139, 10), Fraction(-169, 10)]:
        ours = mpmath.mpf(str(normal_cdf_decimal(w)))
        ref = mpmath.ncdf(mpmath.mpf(w.numerator) / w.denominator)
        assert abs(ours - ref) <= mpmath.mpf(10) ** -100  # what the exact decisions need (u resolution is 2^-192)
    with mpmath.workdps(130):
        assert str(exact._decimal_pi(100))[:100] == mpmath.nstr(mpmath.pi, 110, strip_zeros=False)[:100]


def test_grid_is_a_power_of_two_between_2_to_minus_13_and_minus_12_of_sigma():
    for s in (1e-7, 0.0695, 0.2262, 1.0, 3.0, 12345.0):
        g = grid_for(s)
        assert math.frexp(g)[0] == 0.5 and 2.0**-13 < g / s <= 2.0**-12
    with pytest.raises(ValueError):
        grid_for(0.0)


# ---------------------------------------------------------------- the Gaussian sampler is exact given U


def _reference_value(center: float, sigma: float, u_int: int) -> float:
    """g * round((c + sigma * Phi^-1(u)) / g) at 256-bit precision, u = (U + 1/2) / 2^192."""
    g = grid_for(sigma)
    u = (mpmath.mpf(u_int) + mpmath.mpf(0.5)) / mpmath.mpf(2) ** 192
    y = mpmath.mpf(center) + mpmath.mpf(sigma) * _exact_quantile(u)
    return float(mpmath.floor(y / g + mpmath.mpf(0.5)) * g)


def _run(center, sigma, u_ints):
    mask = (1 << 64) - 1
    words = np.array([[(u >> 128) & mask, (u >> 64) & mask, u & mask] for u in u_ints], np.uint64).T.copy()
    return gaussian.rounded_gaussian(np.asarray(center, np.float64), sigma, grid_for(sigma), words)


def test_random_uniforms_give_exactly_the_ideal_cells():
    rng = np.random.default_rng(1)
    u_ints = [int.from_bytes(rng.bytes(24), "little") for _ in range(300)]
    u_ints += [0, 1, (1 << 191) - 1, 1 << 191, (1 << 192) - 1, (1 << 192) - 2]  # both tails and the centre
    centers = rng.normal(size=len(u_ints)) * 0.3
    got = _run(centers, 0.2262, u_ints)
    want = [_reference_value(c, 0.2262, u) for c, u in zip(centers, u_ints)]
    np.testing.assert_array_equal(got, want)
    assert abs(got[len(u_ints) - 6] - centers[-6]) > 16 * 0.2262  # U = 0: the far tail (z < -16.4)


def test_uniforms_at_a_cell_boundary_are_decided_exactly():
    """U values on either side of a boundary: the float value cannot tell them apart, the decimal check can."""
    sigma, center = 0.0695, 0.123456789
    g = grid_for(sigma)
    u_ints, expected_cells = [], []
    for k in (-3, 0, 5, 40, -47):  # boundaries near the centre and about 3 sigma out
        b = (k + mpmath.mpf(0.5)) * g
        u_b = mpmath.ncdf((b - mpmath.mpf(center)) / mpmath.mpf(sigma))
        base = int(mpmath.floor(u_b * mpmath.mpf(2) ** 192 - mpmath.mpf(0.5)))  # (U + 1/2) / 2^192 <= u_b
        for off in (-2, -1, 0, 1, 2, 3):
            u_ints.append(base + off)
            expected_cells.append(k if off <= 0 else k + 1)
    got = _run(np.full(len(u_ints), center), sigma, u_ints)
    np.testing.assert_array_equal(np.rint(got / g).astype(int), expected_cells)


def test_gaussian_moments_and_ks():
    """10^6 draws: mean and std within 5 standard errors (false failure < 1e-6 each), KS p >= 1e-4."""
    z = NoiseStream(KEY, "test", "moments").gaussian(np.zeros(1_000_000), 0.7) / 0.7
    assert abs(z.mean()) < 5 / 1000
    assert abs(z.std() - 1) < 5 * math.sqrt(0.5) / 1000
    assert stats.kstest(z, "norm").pvalue >= 1e-4  # grid rounding moves the CDF by < 1e-4, below the KS resolution


def test_noise_lands_on_the_grid_whatever_the_center():
    """The output grid is the same for every center: no low bits of the query survive."""
    sigma = 0.25
    g = grid_for(sigma)
    centers = np.array([0.1, 0.1 + 1e-12, 1 / 3, -2.718281828])
    out = NoiseStream(KEY, "test", "grid").gaussian(np.repeat(centers, 1000), sigma)
    assert np.all(out / g == np.rint(out / g))


def test_sigma_zero_is_the_identity_and_tiny_sigma_is_refused():
    s = NoiseStream(KEY, "test", "zero")
    np.testing.assert_array_equal(s.gaussian(np.array([0.5, 1 / 3]), 0.0), [0.5, 1 / 3])
    with pytest.raises(ArithmeticError, match="too small"):
        s.gaussian(np.array([1e10]), 1e-10)


@pytest.mark.parametrize("sigma", [42.0, 0.37, 3.3e5])
def test_one_draw_per_path_is_each_streams_first_draw_bit_for_bit(sigma):
    from dpcda.privacy.noise.paths import gaussian_per_path

    rng = np.random.default_rng(5)
    n = 2 * noise.BLOCK + 17  # more than one block, the last one short
    centers = rng.integers(0, 500, n).astype(np.float64)
    centers[::7] = rng.normal(0, 1e6, len(centers[::7]))
    paths = [("test", "per-path", i % 3, f"{i:08x}") for i in range(n)]
    got = gaussian_per_path(KEY, paths, centers, sigma)
    want = np.array([NoiseStream(KEY, *p).gaussian(centers[i : i + 1], sigma)[0] for i, p in enumerate(paths)])
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))  # -0.0 and 0.0 told apart too


def test_one_draw_per_path_reads_each_streams_words_0_1_2_as_top_middle_low(monkeypatch):
    """The uniform of element i is its stream's first three words in order (the layout of a one-element draw)."""
    import dpcda.privacy.noise.paths as per_path

    real, seen = per_path.rounded_gaussian, []

    def spy(center, sigma, g, u):
        seen.append(u.copy())
        return real(center, sigma, g, u)

    monkeypatch.setattr(per_path, "rounded_gaussian", spy)
    paths = [("test", "layout", i) for i in range(7)]
    per_path.gaussian_per_path(KEY, paths, np.zeros(7), 1.0)
    words = np.stack([NoiseStream(KEY, *p).words(3) for p in paths], axis=1)  # (3, n): word k of stream i
    assert len(seen) == 1 and np.array_equal(seen[0], words)


def test_a_block_refused_on_its_mix_of_values_is_drawn_element_by_element(monkeypatch):
    import dpcda.privacy.noise.paths as per_path

    real = per_path.rounded_gaussian

    def refuse_blocks(center, sigma, g, u):  # the block's bound (largest t with largest center) refused
        if len(center) > 1:
            raise ArithmeticError("noise sampler: sigma is too small for the values' size")
        return real(center, sigma, g, u)

    monkeypatch.setattr(per_path, "rounded_gaussian", refuse_blocks)
    paths = [("test", "mix", i) for i in range(5)]
    got = per_path.gaussian_per_path(KEY, paths, np.arange(5.0), 0.9)
    want = [NoiseStream(KEY, *p).gaussian(np.array([float(i)]), 0.9)[0] for i, p in enumerate(paths)]
    np.testing.assert_array_equal(got, want)


def test_one_draw_per_path_refuses_where_the_stream_refuses_and_a_path_named_twice():
    from dpcda.privacy.noise.paths import gaussian_per_path

    paths = [("test", "p", i) for i in range(3)]
    np.testing.assert_array_equal(gaussian_per_path(KEY, paths, [0.5, 1 / 3, 2.0], 0.0), [0.5, 1 / 3, 2.0])
    with pytest.raises(ArithmeticError, match="too small"):  # as NoiseStream(KEY, *paths[1]).gaussian would
        gaussian_per_path(KEY, paths, [1.0, 1e10, 2.0], 1e-10)
    with pytest.raises(ValueError, match="named twice"):
        gaussian_per_path(KEY, [("test", "p", 1), ("test", "p", "1")], [1.0, 2.0], 1.0)  # one subkey
    with pytest.raises(ValueError, match="2 paths for 3 centers"):
        gaussian_per_path(KEY, paths[:2], [1.0, 2.0, 3.0], 1.0)


@pytest.mark.slow
def test_tail_counts_beyond_5_sigma_over_1e8_draws():
    """P(|Z| > 5) = 5.733e-7: over 1e8 draws about 57 exceedances; Poisson interval with false failure < 1e-4."""
    n, count = 100_000_000, 0
    s = NoiseStream(KEY, "test", "tails")
    for _ in range(n // 2_000_000):
        count += int((np.abs(s.gaussian(np.zeros(2_000_000), 1.0)) > 5.0).sum())
    expected = n * 2 * stats.norm.sf(5.0)
    lo, hi = stats.poisson.ppf(5e-5, expected), stats.poisson.isf(5e-5, expected)
    assert lo <= count <= hi, (count, expected)


# ---------------------------------------------------------------- the float32 attack (issue: bounded Box-Muller)

OLD_RADIUS = math.sqrt(2 * math.log(2**24))  # the largest pair radius float32 Box-Muller can produce: 5.768


def _pair_radius(rows: np.ndarray) -> np.ndarray:
    """Radius of the (j, j + 8) pairs within each block of 16: how torch's vectorised CPU kernel pairs draws."""
    r = rows.reshape(rows.shape[0], -1, 2, 8)
    return np.sqrt(r[:, :, 0, :] ** 2 + r[:, :, 1, :] ** 2).max(axis=(1, 2))


def test_float32_box_muller_gives_outputs_impossible_under_the_neighbour_and_the_new_sampler_follows_the_gaussian():
    """Worst-case neighbours, fixed mode, l = N_k = 4 (every row holds the target), sigma 0.2262, 2^20 rows.

    D holds the target +c e_0, D' holds -c e_0, the other records are 0: the row means are +-0.25 e_0. The flag is
    "a pair of (row - mean under D') / sigma has radius above 5.768", impossible under D' for the old sampler.
    """
    sigma, rows, d = 0.2262, 1 << 20, 16
    mean_d, mean_dp = np.zeros(d), np.zeros(d)
    mean_d[0], mean_dp[0] = 0.25, -0.25

    def old(mean, seed):  # the old mechanism: float32 torch.randn on the CPU
        g = torch.Generator().manual_seed(seed)
        return mean + sigma * torch.randn((rows, d), generator=g, dtype=torch.float32).numpy().astype(np.float64)

    old_d = _pair_radius((old(mean_d, 1) - mean_dp) / sigma) > OLD_RADIUS
    old_dp = _pair_radius((old(mean_dp, 2) - mean_dp) / sigma) > OLD_RADIUS
    assert old_d.sum() >= 1 and old_dp.sum() == 0  # the experiment fires: D is told apart with certainty

    new = {
        name: NoiseStream(KEY, "test", "attack", name).gaussian(np.tile(m, (rows, 1)), sigma)
        for name, m in (("D", mean_d), ("D'", mean_dp))
    }
    g = grid_for(sigma)
    for out in new.values():
        assert np.all(out / g == np.rint(out / g))  # one grid for both hypotheses: no offset tells them apart
    # Flag rates match the exact Gaussian: under D, a pair shifted by 0.5 / sigma (noncentral chi-square, 2 d.o.f.);
    # under D', the central one. 4.5-sigma Poisson bands: false failure < 1e-5.
    shift = 0.5 / sigma
    p_d = 1 - (1 - stats.ncx2.sf(OLD_RADIUS**2, 2, shift**2)) * (1 - stats.chi2.sf(OLD_RADIUS**2, 2)) ** 7
    p_dp = 1 - (1 - stats.chi2.sf(OLD_RADIUS**2, 2)) ** 8
    for name, p in (("D", p_d), ("D'", p_dp)):
        count = int((_pair_radius((new[name] - mean_dp) / sigma) > OLD_RADIUS).sum())
        assert abs(count - rows * p) <= 4.5 * math.sqrt(rows * p) + 3, (name, count, rows * p)


# ---------------------------------------------------------------- streams, indices, binomials


def test_streams_reproduce_and_differ_by_path_and_key():
    a = NoiseStream(KEY, "mix-noise", 0, 1).words(8)
    np.testing.assert_array_equal(a, NoiseStream(KEY, "mix-noise", 0, 1).words(8))
    for other in (
        NoiseStream(KEY, "mix-noise", 1, 0),
        NoiseStream(KEY, "mix-index", 0, 1),
        NoiseStream(KEY, "mix-noise", 0, 10),
        NoiseStream(key_from_test_seed(12), "mix-noise", 0, 1),
    ):
        assert not np.array_equal(a, other.words(8))
    s = NoiseStream(KEY, "x")
    np.testing.assert_array_equal(np.concatenate([s.words(3), s.words(5)]), NoiseStream(KEY, "x").words(8))
    with pytest.raises(ValueError, match="32 bytes"):
        NoiseStream(b"short", "x")


def test_a_stream_cannot_be_copied_or_pickled(monkeypatch):
    """A copy would draw the same noise as the original (and a pickle would hold the stream's subkey): copying,
    deep-copying and pickling a stream raise, before or after any draw, on one thread or several, and so does
    copying anything that holds one. Workers make their streams from the key and path where they draw."""
    monkeypatch.setattr(noise_stream, "_TASK_WORDS", 1 << 10)
    monkeypatch.setattr(noise_stream, "_TASK_BLOCKS", 1)
    spread, executor = [], pool.executor
    monkeypatch.setattr(pool, "executor", lambda n: spread.append(n) or executor(n))
    fresh, drawn, threaded = (NoiseStream(KEY, "copy", i) for i in range(3))
    on_device = NoiseStream(KEY, "copy", 3, device="cpu")
    drawn.words(3)
    drawn.gaussian(np.zeros(10), 1.0)
    noise.set_threads(2)
    try:
        threaded.words(5000)
        threaded.gaussian(np.zeros(20_000), 1.0)
    finally:
        noise.set_threads(None)
    assert spread == [2, 2]  # both draws ran on the noise threads
    copiers = (
        copy.copy,
        copy.deepcopy,
        pickle.dumps,
        lambda x: pickle.dumps(x, protocol=0),
        lambda x: x.__getstate__(),
    )
    for stream in (fresh, drawn, threaded, on_device):
        for copier in copiers:
            with pytest.raises(TypeError, match="cannot be copied"):
                copier(stream)
    with pytest.raises(TypeError, match="cannot be copied"):
        copy.deepcopy({"streams": [fresh]})


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_stream_made_before_a_fork_draws_in_the_parent_only():
    """A forked child holds a copy of the stream's position: had it drawn, parent and child would have drawn the same
    words. Every kind of draw refuses in the child; the parent draws on as if nothing happened."""
    s = NoiseStream(KEY, "fork")
    first = s.words(4)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report which draws refused, then leave without running the parent's cleanup
        refused = 0
        for draw in (
            lambda: s.words(1),
            lambda: s.gaussian(np.zeros(3), 1.0),
            lambda: s.uniform_int(7, 3),
            lambda: s.distinct(10, 2, 3),
            lambda: s.binomial(10, Fraction(1, 3), 2),
        ):
            try:
                draw()
            except RuntimeError as err:
                refused += "fork" in str(err)
        os.write(write, bytes([refused]))
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert status == 0 and os.read(read, 1) == bytes([5])
    os.close(read)
    both = NoiseStream(KEY, "fork").words(8)
    np.testing.assert_array_equal(np.concatenate([first, s.words(4)]), both)


def test_streams_and_bits_made_before_a_fork_refuse_even_where_the_pid_is_the_same(monkeypatch):
    """The guard counts forks (os.register_at_fork), not pids, which the system may reuse; an exact-mechanism
    ``Bits`` reader, whose buffered words a child would hand out again, refuses too, and cannot be copied."""
    from dpcda.privacy.exponential import Bits

    monkeypatch.setattr(pool, "_FORKS", pool._FORKS)
    monkeypatch.setattr(pool, "_POOL_LOCK", pool._POOL_LOCK)
    s, bits = NoiseStream(KEY, "fork-gen"), Bits(NoiseStream(KEY, "fork-bits"))
    bits.word()
    for copier in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied"):
            copier(bits)
    pool._after_fork_in_child()  # what a forked child runs, here in the same process (same pid)
    for draw in (lambda: s.words(1), lambda: s.gaussian(np.zeros(2), 1.0), bits.word, lambda: bits.below(5)):
        with pytest.raises(RuntimeError, match="fork"):
            draw()
    assert NoiseStream(KEY, "fork-gen").words(1).shape == (1,)  # one made after the fork draws


def test_empty_draws_at_the_end_of_the_stream_return_empty_arrays():
    for device in (None, "cpu"):
        s = NoiseStream(KEY, "end", device=device)
        s._seek(noise.MAX_STREAM_WORDS)
        assert s.gaussian(np.zeros((0, 3)), 1.0).shape == (0, 3)
        assert s.words(0).shape == (0,) and s.uniform_int(5, 0).shape == (0,)
        assert s.binomial(10, Fraction(1, 3), 0).shape == (0,)
        with pytest.raises(ValueError, match="counter"):
            s.gaussian(np.zeros(1), 1.0)
        assert s.position == noise.MAX_STREAM_WORDS


def test_independent_paths_are_uncorrelated():
    """Paths differing in one component: correlation of 10^5 Gaussian draws below 4.5 / sqrt(n) (false failure 7e-6)."""
    n = 100_000
    a = NoiseStream(KEY, "mix-noise", 3, 7).gaussian(np.zeros(n), 1.0)
    for path in (("mix-noise", 3, 8), ("mix-noise", 4, 7), ("label", 3, 7)):
        b = NoiseStream(KEY, *path).gaussian(np.zeros(n), 1.0)
        assert abs(np.corrcoef(a, b)[0, 1]) < 4.5 / math.sqrt(n)


class _ScriptedStream(NoiseStream):
    """A stream whose first words are given (then the real keystream): drives the rejection branches."""

    def __init__(self, script):
        super().__init__(KEY, "scripted")
        self.script = list(script)

    def words(self, n):
        head, self.script = self.script[:n], self.script[n:]
        return np.concatenate([np.array(head, np.uint64), super().words(n - len(head))])


def test_uniform_int_rejects_the_biased_top_range():
    # bound 3: 2^64 = 1 mod 3, so the single word 2^64 - 1 must be rejected: position 0 is refilled by the next
    # word (7 -> 1) after position 1 took 5 -> 2
    s = _ScriptedStream([(1 << 64) - 1, 5, 7])
    assert s.uniform_int(3, 2).tolist() == [1, 2]
    counts = np.bincount(NoiseStream(KEY, "u").uniform_int(6, 600_000), minlength=6)
    assert stats.chisquare(counts).pvalue >= 1e-4
    assert set(NoiseStream(KEY, "u2").uniform_int(2, 64).tolist()) == {0, 1}  # a power of two: nothing rejected


def _uniform_int_by_the_definition(stream, bound: int, total: int) -> np.ndarray:
    """The rejection sampler as first written: draw a word for every open position, keep w < 2^64 - (2^64 mod
    bound) as w mod bound, redraw the others in position order until none is left."""
    excess = (1 << 64) % bound
    out, todo = np.empty(total, np.int64), np.arange(total)
    while todo.size:
        w = stream.words(todo.size)
        ok = np.array([int(v) < (1 << 64) - excess for v in w], bool)
        out[todo[ok]] = [int(v) % bound for v in w[ok]]
        todo = todo[~ok]
    return out


@pytest.mark.parametrize("bound", [1, 2, 3, 6, 200_000, 1 << 53, 1 << 62, (1 << 64) // 5 + 1, 3 << 60])
def test_uniform_int_is_the_definition_word_for_word(bound):
    """The same values and the same stream position as the definition (Python integers, no numpy arithmetic),
    with bounds that reject a fifth of the words ((1 << 64) // 5 + 1) or a sixteenth (3 << 60) and bounds that reject
    none."""
    ours, ref = NoiseStream(KEY, "def", bound), NoiseStream(KEY, "def", bound)
    for total in (1, 1000, 20_000):
        assert np.array_equal(ours.uniform_int(bound, total), _uniform_int_by_the_definition(ref, bound, total))
    assert np.array_equal(ours.words(3), ref.words(3))
    for size in (-1, (-1, 3), (2, -1), np.int64(-2)):
        with pytest.raises(ValueError, match="negative size"):
            ours.uniform_int(bound, size)


@pytest.mark.parametrize("n,l", [(50, 3), (10, 9), (6, 6), (1000, 1), (40, 30)])
def test_distinct_rows_are_uniform_subsets_in_uniform_order(n, l):
    idx = NoiseStream(KEY, "d", n, l).distinct(n, l, 20000)
    assert idx.shape == (20000, l)
    assert all(len(set(r)) == l for r in idx[:2000])
    if l < n:  # chi-square on inclusion counts and on the first column; false-failure rate 1e-4 each
        assert stats.chisquare(np.bincount(idx.ravel(), minlength=n)).pvalue >= 1e-4
        assert stats.chisquare(np.bincount(idx[:, 0], minlength=n)).pvalue >= 1e-4


def test_dense_sampler_takes_the_smallest_keys_in_key_order_and_redraws_ties():
    """n = 4, l = 3 (the dense regime): the row is the indices of the 3 smallest keys, ordered by key."""
    assert _ScriptedStream([5, 1, 2, 9]).distinct(4, 3, 1)[0].tolist() == [1, 2, 0]
    # keys 5, 1, 1, 9 tie inside the chosen set (their order would not be random): the row is redrawn from the
    # next keys, 7, 3, 8, 0 -> indices 3, 1, 0
    assert _ScriptedStream([5, 1, 1, 9, 7, 3, 8, 0]).distinct(4, 3, 1)[0].tolist() == [3, 1, 0]
    # keys 4, 2, 6, 6 with l = 2 < n tie at the cut? no: the cut is between 4 and 6. With l = 3 it is 6 | 6: redrawn
    assert _ScriptedStream([4, 2, 6, 6, 7, 3, 8, 0]).distinct(4, 3, 1)[0].tolist() == [3, 1, 0]


def test_binomial_table_matches_the_pmf_and_draws_fit_it():
    n, q = 6000, Fraction(8, 6000)
    th = binomial.binomial_thresholds(n, q.numerator, q.denominator)
    q_mp = mpmath.mpf(q.numerator) / q.denominator
    exact = mpmath.mpf(0)
    for j, (w0, w1, w2) in enumerate(th.tolist()):
        exact += mpmath.binomial(n, j) * q_mp**j * (1 - q_mp) ** (n - j)
        table = mpmath.mpf((w0 << 128) | (w1 << 64) | w2) / mpmath.mpf(2) ** 192
        assert abs(table - exact) <= mpmath.mpf(2) ** -191
    m_top = len(th)  # draws above the table's last threshold are m_top: its mass plus a tail below 2^-194
    exact += mpmath.binomial(n, m_top) * q_mp**m_top * (1 - q_mp) ** (n - m_top)
    assert 1 - exact < mpmath.mpf(2) ** -194
    m = NoiseStream(KEY, "b").binomial(n, q, 50_000)
    top = 20
    observed = np.bincount(np.minimum(m, top), minlength=top + 1)
    expected = np.append(stats.binom.pmf(np.arange(top), n, float(q)), stats.binom.sf(top - 1, n, float(q))) * len(m)
    assert stats.chisquare(observed, expected).pvalue >= 1e-4
    s = NoiseStream(KEY, "b2")
    assert s.binomial(10, Fraction(1), 3).tolist() == [10] * 3 and s.binomial(10, Fraction(0), 2).tolist() == [0, 0]


@pytest.mark.parametrize("n_hat", [5939, 5950, 5975, 6000, 6010, 6011, 6025, 6050])
def test_binomial_tables_never_wrap_at_2_to_192(n_hat):
    """Review finding: a threshold that rounded to 2^192 was packed as 0 and added 1 to every draw. Sweep the DP
    class sizes of a real release (N_k = 6000, l = 4/8/16): thresholds increase and stay below 2^192, and the draws
    have the binomial's mean and P(m = 0)."""
    for l in (4, 8, 16):
        q = Fraction(l, n_hat)
        th = binomial.binomial_thresholds(6000, q.numerator, q.denominator)
        values = [(a << 128) | (b << 64) | c for a, b, c in th.tolist()]
        assert values == sorted(values) and values[0] > 0 and values[-1] < 1 << 192
    m = NoiseStream(KEY, "sweep", n_hat).binomial(6000, Fraction(8, n_hat), 200_000)
    mean = 6000 * 8 / n_hat
    assert abs(m.mean() - mean) < 5 * math.sqrt(mean / 200_000)  # false failure < 1e-6
    p0 = stats.binom.pmf(0, 6000, 8 / n_hat)
    assert abs((m == 0).mean() - p0) < 5 * math.sqrt(p0 / 200_000) + 1e-5


def test_sampler_delta_is_negligible_at_eps_10_and_refuses_huge_eps():
    d = sampler_delta(10.0, gaussian_draws=60_000 * 784, binomial_draws=60_000)
    assert 0 < d < 1e-20
    assert sampler_delta(10.0, gaussian_draws=0) == 0.0
    assert math.isinf(sampler_delta(800.0, gaussian_draws=1))


@pytest.mark.parametrize("draw", ["fill", "binomial", "fill-short"])
def test_a_negative_or_malformed_draw_is_refused_and_never_moves_the_stream_back(draw):
    """A negative count once moved the position back, so a later draw (on other threads, or the device's) read words
    already released; a refusal now leaves the position and the next words as they were."""

    from dpcda.privacy.noise import SLACK_WORDS

    s, twin = (NoiseStream(key_from_test_seed(7), "rewind") for _ in range(2))
    s.words(8), twin.words(8)
    with pytest.raises(ValueError):
        if draw == "fill":
            s.fill(np.empty(16 + SLACK_WORDS, np.uint64), -8)
        elif draw == "binomial":
            s.binomial(100, Fraction(1, 3), -1)
        else:
            s.fill(np.empty(4, np.uint64), 8)  # no room for OpenSSL's slack
    assert s.position == twin.position == 8
    assert np.array_equal(s.words(4), twin.words(4))
