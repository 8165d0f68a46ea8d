"""The host's compiled Gaussian sampler (privacy/noise/native.py): the numpy sampler's output, bit for bit, whatever
the thread count, the span and group sizes, and the cells (near a boundary, p's low-precision case, both tails); and
the numpy sampler where no kernel can be built.

Every key is a fixed test key; the near-boundary cells are forced through the centres (or, with scripted words,
through the uniforms themselves), so every run decides some cells exactly.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import time

import mpmath
import numpy as np
import pytest

from dpcda.privacy import noise
from dpcda.privacy.noise import (
    NoiseStream,
    exact,
    gaussian,
    grid_for,
    host_draw,
    key_from_test_seed,
    keystream,
    native_sampler,
    public_key,
)
from dpcda.privacy.noise import native as noise_native
from dpcda.privacy.noise import stream as noise_stream
from dpcda.privacy.noise.constants import BLOCK, SLACK_WORDS, STATS_PER_BLOCK

KEY = key_from_test_seed(56)
BLK = BLOCK
HAS_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.fixture(autouse=True)
def _defaults():
    yield
    noise.set_threads(None)


def _same_bits(got, want) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


def _numpy_only(monkeypatch) -> None:
    monkeypatch.setattr(noise_native, "_LIB", False)
    assert noise.native_kernel() is None  # the draws' own way to the kernel finds none: numpy samples


def _layout_z(words: np.ndarray, total: int) -> np.ndarray:
    """The numpy sampler's float z of every element of a draw of ``total`` from its 3 total words (block layout)."""
    z = np.empty(total)
    for s in range(0, total, BLK):
        n = min(BLK, total - s)
        u = words[3 * s : 3 * s + 3 * n].reshape(3, n)
        flip, p = gaussian.tail_p(u)
        t = noise.upper_quantile(p)
        z[s : s + n] = np.where(flip, t, -t)
    return z


def _boundary_centres(path: tuple, total: int, sigma: float, cells: int, seed: int) -> tuple:
    """Centres for a draw of ``total`` on ``path``: random, but ``cells`` elements put within float error of a cell
    boundary (c = (k + 1/2) g - sigma z, from the element's own words), so those are decided exactly."""
    g = grid_for(sigma)
    rng = np.random.default_rng(seed)
    c = rng.normal(size=total) * 0.3
    z = _layout_z(NoiseStream(KEY, *path).words(3 * total), total)
    idx = rng.choice(total, cells, replace=False)
    k = rng.integers(-40, 40, cells)
    c[idx] = (k + 0.5) * g - sigma * z[idx]
    return c, idx


def _counting_kernel_calls(monkeypatch) -> list:
    """Every span on the kernel (none left to numpy for being short), and a record of the calls."""
    calls = []
    kernel = native_sampler.call_kernel

    def counted(*args):
        calls.append(args[1])
        return kernel(*args)

    monkeypatch.setattr(native_sampler, "call_kernel", counted)
    monkeypatch.setattr(host_draw, "_NATIVE_MIN", 0)
    return calls


def _counting_exact_cells(monkeypatch) -> list:
    calls = []
    real = exact.exact_cell

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(exact, "exact_cell", counted)
    return calls


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_the_kernel_builds_and_passes_its_check_where_a_compiler_is_present():
    assert noise.native_kernel() is not None, noise_native.status()
    assert noise_native.status() == "compiled"


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_a_million_draws_are_identical_across_backends_threads_and_span_sizes(monkeypatch):
    """10^6 + 3 draws (a short last block), 150 of them forced onto cell boundaries: the numpy sampler on one thread
    is the reference; the kernel on 1 and 2 threads, with groups of 1, 3 and 4 blocks, tasks of 1, 3 and 16 blocks,
    low words skipped or read, gives the same bits and decides the same boundary cells exactly."""
    assert noise.native_kernel() is not None, noise_native.status()  # built and checked before calls are counted
    sigma, total = 0.0695, 1_000_003
    path = ("native", "million")
    c, forced = _boundary_centres(path, total, sigma, 150, 1)
    calls = _counting_exact_cells(monkeypatch)
    with monkeypatch.context() as m:
        _numpy_only(m)
        noise.set_threads(1)
        s = NoiseStream(KEY, *path)
        ref = s.gaussian(c, sigma)
        after = s.words(5)
    decided = {round(a[0], 12) for a in calls}
    kernel_calls = _counting_kernel_calls(monkeypatch)
    opened = []  # the OpenSSL streams the draw opens
    encryptor = keystream.encryptor
    monkeypatch.setattr(keystream, "encryptor", lambda key, word: opened.append(word) or encryptor(key, word))
    assert len(calls) >= 150 and {round(x, 12) for x in c[forced]} <= decided  # every forced cell decided exactly
    blocks = -(-total // BLK)
    for threads, group, task, skip in (
        (1, 4, 16, True),
        (2, 4, 16, True),
        (2, 1, 3, False),
        (1, 1, 16, False),
        (2, 3, 1, True),
    ):
        monkeypatch.setattr(host_draw, "_SKIP_LOW_WORDS", skip)
        monkeypatch.setattr(host_draw, "_NATIVE_GROUP", group)
        monkeypatch.setattr(noise_stream, "_TASK_BLOCKS", task)
        noise.set_threads(threads)
        calls.clear()
        kernel_calls.clear()
        opened.clear()
        s = NoiseStream(KEY, *path)
        _same_bits(s.gaussian(c, sigma), ref)
        assert sum(kernel_calls) == blocks  # every block through the kernel
        # the settings reached the draw: blocks per kernel call (a thread's task caps them), a stream per block
        # where the low words are skipped, one per task where they are read
        assert max(kernel_calls) == (group if threads == 1 else min(group, task))
        assert (len(opened) >= blocks) == skip
        assert {round(a[0], 12) for a in calls} >= {round(x, 12) for x in c[forced]}
        assert s.position == 3 * total
        np.testing.assert_array_equal(s.words(5), after)  # the next draw reads the words after the draw's


class _Scripted:
    """An OpenSSL stream stand-in over fixed words (``keystream.encryptor`` replaced): drives chosen uniforms through
    both samplers, in the stream layout, with the real code around them."""

    def __init__(self, words: np.ndarray, word: int):
        self.data, self.at = words.view(np.uint8), 8 * word

    def update_into(self, data, out) -> int:
        n = len(data)
        out[:n] = self.data[self.at : self.at + n]
        self.at += n
        return n


def _boundary_uniforms(center: float, sigma: float, ks) -> tuple:
    """192-bit U on either side of the boundaries (k + 1/2) g and the cell each must give (as the device tests)."""
    g = grid_for(sigma)
    mpmath.mp.prec = 320
    u_ints, cells = [], []
    for k in ks:
        b = (k + mpmath.mpf(0.5)) * g
        u_b = mpmath.ncdf((b - mpmath.mpf(center)) / mpmath.mpf(sigma))
        base = int(mpmath.floor(u_b * mpmath.mpf(2) ** 192 - mpmath.mpf(0.5)))
        for off in (-2, -1, 0, 1, 2, 3):
            u_ints.append(base + off)
            cells.append(k if off <= 0 else k + 1)
    return u_ints, cells


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("threads,skip", [(1, True), (2, True), (1, False)])
def test_chosen_uniforms_near_boundaries_in_the_tails_and_with_low_precision_p(monkeypatch, threads, skip):
    """Blocks holding U beside cell boundaries (decided exactly, the low word read only for them), U = 0 and other
    top words below 2^11 (the block goes through the numpy sampler whole), U at both ends and at 1/2: the kernel's
    output is the numpy sampler's, and the boundary cells are the exact ones."""
    assert noise.native_kernel() is not None, noise_native.status()  # built on real words, before calls are counted
    sigma, center = 0.0695, 0.123456789
    g = grid_for(sigma)
    total = 3 * BLK + 777
    rng = np.random.default_rng(2)
    words = rng.integers(0, 2**64, size=3 * total + 64, dtype=np.uint64)
    u_ints, cells = _boundary_uniforms(center, sigma, (-3, 0, 5, 40, -47))
    mask = (1 << 64) - 1

    def put(element: int, u: int) -> None:
        b0 = element // BLK * BLK
        n = min(BLK, total - b0)
        j = element - b0
        for row, shift in enumerate((128, 64, 0)):
            words[3 * b0 + row * n + j] = (u >> shift) & mask

    boundary = [5, BLK + 100, BLK + 4000, 3 * BLK + 700]  # blocks 0, 1 and the short last one
    spots = [(e + 13 * i) for e in boundary for i in range(len(u_ints) // len(boundary) + 1)][: len(u_ints)]
    for e, u in zip(spots, u_ints):
        put(e, u)
    put(2 * BLK + 1, 0)  # block 2: p's low-precision case, and the far tail
    put(2 * BLK + 2, 5 << 64)
    put(3 * BLK + 1, (1 << 192) - 1)
    put(3 * BLK + 2, 1 << 191)
    put(3 * BLK + 3, (1 << 191) - 1)
    opened = []  # the word each OpenSSL stream is opened at
    monkeypatch.setattr(keystream, "encryptor", lambda key, word: opened.append(word) or _Scripted(words, word))
    c = np.full(total, center)
    with monkeypatch.context() as m:
        _numpy_only(m)
        ref = NoiseStream(KEY, "scripted").gaussian(c, sigma)
    np.testing.assert_array_equal(np.rint(ref[spots] / g).astype(int), cells)
    monkeypatch.setattr(noise_stream, "_TASK_BLOCKS", 1)
    monkeypatch.setattr(host_draw, "_SKIP_LOW_WORDS", skip)
    noise.set_threads(threads)
    calls = _counting_exact_cells(monkeypatch)
    kernel_calls = _counting_kernel_calls(monkeypatch)
    opened.clear()
    _same_bits(NoiseStream(KEY, "scripted").gaussian(c, sigma), ref)
    assert sum(kernel_calls) == 4
    assert len(calls) >= 20  # at least the 2 x 2 nearest U of each boundary
    # skipping, every block and every low word an exact decision reads opens its own stream; else one per task
    assert (len(opened) > 20) == skip and (max(kernel_calls) == 1 or threads == 1)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_the_kernel_refuses_where_the_numpy_sampler_refuses(monkeypatch):
    """Per block, in order: a non-finite value ('overflow') or too large an error bound ('too small')."""
    n = 4 * BLK
    cases = []
    for bad_block, value, sigma in ((1, 1e10, 1e-10), (2, 1e308, 1e-300), (3, np.inf, 1.0), (0, np.nan, 1.0)):
        c = np.zeros(n)
        c[bad_block * BLK + 17] = value
        cases.append((c, sigma))
    c = np.zeros(n)
    c[BLK + 1], c[2 * BLK + 1] = 1e10, 1e308  # 'too small' in block 1 comes before 'overflow' in block 2
    cases.append((c, 1e-10))
    for c, sigma in cases:
        with monkeypatch.context() as m:
            _numpy_only(m)
            with pytest.raises(ArithmeticError) as want:
                NoiseStream(KEY, "refuse").gaussian(c, sigma)
        with pytest.raises(ArithmeticError) as got:
            NoiseStream(KEY, "refuse").gaussian(c, sigma)
        assert str(got.value) == str(want.value)


@pytest.mark.parametrize("how", ["turned off", "no compiler", "compiler fails"])
def test_without_a_kernel_the_numpy_sampler_gives_the_same_output(monkeypatch, how):
    """A machine without a C compiler (or with one that fails) draws through the numpy sampler: no error, the same
    values."""
    c = np.random.default_rng(3).normal(size=5 * BLK + 9)
    want = NoiseStream(KEY, "fallback").gaussian(c, 0.7)
    monkeypatch.setattr(noise_native, "_LIB", None)
    if how == "turned off":
        monkeypatch.setenv("DPCDA_NOISE_NATIVE", "0")
    elif how == "no compiler":
        monkeypatch.delenv("CC", raising=False)
        monkeypatch.setattr(noise_native.shutil, "which", lambda name: None)
    else:
        monkeypatch.setenv("CC", "false")
    assert noise.native_kernel() is None
    assert noise_native.status() != "compiled"
    _same_bits(NoiseStream(KEY, "fallback").gaussian(c, 0.7), want)
    monkeypatch.setattr(noise_native, "_LIB", None)  # built again (or not) by the next test


def _compiled(monkeypatch, source: str, flags: list):
    """The kernel built from ``source`` with exactly ``flags`` (through the module's own compile step)."""
    monkeypatch.setattr(noise_native, "SOURCE", source)
    fn = noise_native._compile(shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"), flags)
    fn = fn.dpcda_rounded_gaussian
    fn.restype = None
    fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    fn.argtypes += [ctypes.c_void_p] * 4 + [ctypes.c_double, ctypes.c_double, ctypes.c_void_p]
    return fn


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize(
    "what,old,new,flags",
    [
        ("far tail off by 0.1", "double rf = r - 3.4;", "double rf = r - 3.3;", []),
        ("zeros not made +0.0", "o[i] = (k + 0.0) * g;", "o[i] = k * g;", []),
        ("-ffast-math", "", "", ["-ffast-math"]),
        ("-fno-signed-zeros", "", "", ["-march=native", "-fno-signed-zeros"]),
    ],
)
def test_the_load_check_fails_a_kernel_that_differs_in_the_far_tail_or_the_sign_of_zero(
    monkeypatch, what, old, new, flags
):
    """A far-tail branch off by 0.1 in r, or zeros left as rint's -0.0 (by the source, or by a value-unsafe build):
    the load check names a difference (it compares a far-tail block, and zeros reached from below)."""
    source = noise_native.SOURCE.replace(old, new) if old else noise_native.SOURCE
    assert source != noise_native.SOURCE or flags
    assert native_sampler.check_native(_compiled(monkeypatch, source, noise_native._FLAGS + flags)) != "", what


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_the_value_safety_flags_come_last_and_undo_a_value_unsafe_flag_before_them(monkeypatch):
    """The build's command ends with the value-safety flags (the system's compiler takes them), so a -ffast-math
    earlier in it changes no value: the check passes."""
    commands = []
    run = noise_native.subprocess.run
    monkeypatch.setattr(noise_native.subprocess, "run", lambda cmd, **kw: (commands.append(cmd), run(cmd, **kw))[1])
    monkeypatch.setattr(noise_native, "_LIB", None)
    assert noise.native_kernel() is not None, noise_native.status()
    cmd = commands[0]
    tail = cmd[cmd.index("-o") - len(noise_native.SAFE_FLAGS) : cmd.index("-o")]
    assert tail == noise_native.SAFE_FLAGS and "-fsigned-zeros" in tail and "-fno-fast-math" in tail
    unsafe = noise_native._FLAGS + ["-ffast-math", "-fno-signed-zeros"] + noise_native.SAFE_FLAGS
    assert native_sampler.check_native(_compiled(monkeypatch, noise_native.SOURCE, unsafe)) == ""


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_the_load_check_makes_exact_decisions_and_reaches_the_far_tail(monkeypatch):
    """The check decides cells exactly at every sigma, and compares a block whose uniforms are in the far tail."""
    calls = _counting_exact_cells(monkeypatch)
    words, sizes = native_sampler.check_words()
    u = words[3 * BLK : 6 * BLK].reshape(3, BLK)
    _, p = gaussian.tail_p(u)
    assert (np.sqrt(-np.log(p)) > 5.0).mean() > 0.9 and p.min() >= 2.0**-53  # far tail, none with w0 < 2^11
    assert native_sampler.check_native(noise.native_kernel()) == ""
    assert len({a[1] for a in calls}) == 3 and len(calls) >= 30


def test_the_load_checks_words_are_the_public_check_streams():
    """The load check reads its uniforms from the keystream itself (the kernel's glue holds no stream): the words of
    ``NoiseStream(public_key("native-check", 0), "words")`` from its start, but for block 1's top words (set to the far
    tail) and the short block of extremes after them."""
    flat, sizes = native_sampler.check_words()
    want = NoiseStream(public_key("native-check", 0), "words").words(9 * BLK).reshape(3, 3, BLK)
    got = flat[: 9 * BLK].reshape(3, 3, BLK)
    assert sizes == [BLK, BLK, BLK, 8] and flat.size == 9 * BLK + 3 * 8 + SLACK_WORDS
    for block, row in ((b, r) for b in range(3) for r in range(3) if (b, r) != (1, 0)):
        np.testing.assert_array_equal(got[block, row], want[block, row])
    assert (got[1, 0] != want[1, 0]).mean() > 0.99


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
@pytest.mark.parametrize("sigma", [0.7, 1e-3, 123.0])
def test_far_tail_uniforms_in_a_block_without_low_precision_p_kernel_equals_numpy(sigma):
    """A block of U in the far tail (top words from 2^11 to 2^28, both signs): the kernel finishes the block itself
    and gives the numpy sampler's output."""
    fn = noise.native_kernel()
    assert fn is not None, noise_native.status()
    rng = np.random.default_rng(11)
    u = rng.integers(0, 2**64, size=(3, BLK), dtype=np.uint64)
    w0 = np.exp2(rng.uniform(11.0, 28.0, BLK)).astype(np.uint64)
    u[0] = np.where(rng.integers(0, 2, BLK).astype(bool), ~w0, w0)
    g = grid_for(sigma)
    c = rng.normal(size=BLK) * 5
    want = gaussian.rounded_gaussian(c, sigma, g, u)
    top = np.ascontiguousarray(u[:2]).reshape(-1)
    out, dist, st = np.empty(BLK), np.empty(BLK), np.empty((1, STATS_PER_BLOCK))
    native_sampler.call_kernel(fn, 1, BLK, u.reshape(-1).copy(), 0, 3 * BLK, c, out, dist, st, sigma, g)
    assert st[0, 0] > 7.0 and st[0, 4] == 0  # far tail reached, no w0 < 2^11
    assert native_sampler.finish_block(st[0], dist, c, out, top, lambda i: int(u[2, i]), sigma, g)
    _same_bits(out, want)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_a_float32_sigma_gives_the_numpy_samplers_output(monkeypatch):
    """sigma as np.float32 (its float64 value, as the numpy sampler takes it), with cells decided exactly."""
    assert noise.native_kernel() is not None, noise_native.status()  # built (and checked) before counting calls
    sigma = np.float32(0.0695)
    total = 3 * BLK
    c, _ = _boundary_centres(("f32",), total, float(sigma), 20, 4)
    calls = _counting_exact_cells(monkeypatch)
    with monkeypatch.context() as m:
        _numpy_only(m)
        want = NoiseStream(KEY, "f32").gaussian(c, sigma)
    calls.clear()
    kernel_calls = _counting_kernel_calls(monkeypatch)
    _same_bits(NoiseStream(KEY, "f32").gaussian(c, sigma), want)
    assert sum(kernel_calls) == 3 and len(calls) >= 20


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_a_kernel_whose_check_raises_is_turned_off_once_and_numpy_runs(monkeypatch, caplog):
    """A kernel that overflows inside the load check: one warning, the numpy sampler's output, no build per draw."""
    monkeypatch.setattr(
        noise_native, "SOURCE", noise_native.SOURCE.replace("s = s * sigma_over_g;", "s = s * sigma_over_g * 1e308;")
    )
    builds = []
    build = noise_native._build
    monkeypatch.setattr(noise_native, "_build", lambda: (builds.append(1), build())[1])
    monkeypatch.setattr(noise_native, "_LIB", None)
    c = np.zeros(3 * BLK)
    with monkeypatch.context() as m:
        _numpy_only(m)
        want = [NoiseStream(KEY, "raises", i).gaussian(c, 1.0) for i in range(2)]
    with caplog.at_level(logging.WARNING, logger=noise_native.__name__):
        got = [NoiseStream(KEY, "raises", i).gaussian(c, 1.0) for i in range(2)]
    for a, b in zip(got, want):
        _same_bits(a, b)
    assert len(builds) == 1 and noise_native._LIB is False and "raised ArithmeticError" in noise_native.status()
    assert len([r for r in caplog.records if "not used" in r.getMessage()]) == 1
    monkeypatch.setattr(noise_native, "_LIB", None)  # built again by the next test


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_fork_while_the_build_holds_the_lock_does_not_hang_the_child(monkeypatch):
    """The lock held (as by another thread building) at fork: the child builds for itself instead of waiting on a
    lock no thread of it holds."""
    monkeypatch.setattr(noise_native, "_LIB", None)
    noise.set_threads(1)
    with noise_native._LOCK:
        pid = os.fork()
        if pid == 0:  # the child: a large draw needs the kernel (or numpy), then exits
            try:
                signal.alarm(30)
                NoiseStream(KEY, "fork").gaussian(np.zeros(3 * BLK), 1.0)
                os._exit(0)
            finally:
                os._exit(1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child hung on the build lock")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    monkeypatch.setattr(noise_native, "_LIB", None)
