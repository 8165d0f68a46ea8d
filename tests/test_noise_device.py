"""The noise package on a torch device (privacy/noise/device/) and on several host threads: the same words and the
same outputs as the host reference, element for element.

The identity is the contract: CPU tensors here, CUDA under the ``gpu`` marker. Compiled kernels (``torch.compile``)
are checked under ``slow`` (compiling takes minutes on a small CPU); the default tier runs the same arithmetic
eagerly. Every key is a fixed test key.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from dpcda.privacy import noise
from dpcda.privacy.noise import NoiseStream, binomial, gaussian, grid_for, key_from_test_seed, keystream, pool
from dpcda.privacy.noise import device as noise_device
from dpcda.privacy.noise import stream as noise_stream
from dpcda.privacy.noise.constants import BLOCK
from dpcda.privacy.noise.device import chacha, kernels
from dpcda.privacy.noise.device import gaussian as device_gaussian

KEY = key_from_test_seed(34)
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")])
DEVICES = ["cpu", CUDA]


@pytest.fixture(autouse=True)
def _eager_and_default_threads(monkeypatch):
    """Eager kernels unless a test asks for compiled ones (compiling takes minutes on a small CPU)."""
    monkeypatch.setenv("DPCDA_NOISE_COMPILE", "0")
    yield
    noise.set_threads(None)


def _openssl(key: bytes, counter: int, nonce: bytes, nbytes: int) -> bytes:
    enc = Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce), mode=None).encryptor()
    return enc.update(bytes(nbytes))


def _words32(b: bytes) -> list:
    return [int.from_bytes(b[4 * i : 4 * i + 4], "little") for i in range(len(b) // 4)]


def _same_bits(got, want) -> None:
    """The identity is in the bits: ``assert_array_equal`` calls -0.0 and +0.0 equal, this does not."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    bits = {8: np.uint64, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(bits), np.ascontiguousarray(want).view(bits))


def _block_bytes(key: bytes, nonce: bytes, counter: int, device: str, compiled: bool = False) -> bytes:
    fn = kernels.kernel("chacha", noise_device.chacha20_blocks, compiled)
    out = fn(
        torch.tensor(_words32(key), dtype=torch.int64, device=device),
        torch.tensor(_words32(nonce), dtype=torch.int64, device=device),
        torch.tensor([counter], dtype=torch.int64, device=device),
    )
    return b"".join(int(w).to_bytes(4, "little") for w in out[0].cpu().tolist())


# ---------------------------------------------------------------- the block function and the words


@pytest.mark.parametrize("device", DEVICES)
def test_rfc8439_block_function_vectors(device):
    """RFC 8439 section 2.3.2 (key 00..1f, nonce 00 00 00 09 00 00 00 4a 00 00 00 00, counter 1) and appendix A.1
    test vector 1 (zero key, zero nonce, counter 0): the serialised blocks."""
    v232 = bytes.fromhex(
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    assert _block_bytes(bytes(range(32)), bytes.fromhex("000000090000004a00000000"), 1, device) == v232
    a1 = bytes.fromhex(
        "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
        "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
    )
    assert _block_bytes(bytes(32), bytes(12), 0, device) == a1


@pytest.mark.parametrize("device", DEVICES)
def test_random_keys_nonces_and_counters_match_openssl(device):
    rng = np.random.default_rng(0)
    for _ in range(20):
        key, nonce = rng.bytes(32), rng.bytes(12)
        counter = int(rng.integers(0, 1 << 32))
        assert _block_bytes(key, nonce, counter, device) == _openssl(key, counter, nonce, 64)


@pytest.mark.parametrize("device", DEVICES)
def test_stream_words_match_the_host_stream_across_block_boundaries(device):
    rng = np.random.default_rng(1)
    for trial in range(12):
        key = rng.bytes(32)
        path = ("words", trial)
        ref = NoiseStream(key, *path).words(3000)
        start = int(rng.integers(0, 2000))
        n = int(rng.integers(1, 1000))
        got = noise_device.stream_words(noise.subkey(key, path), start, n, device, compiled=False)
        np.testing.assert_array_equal(got.cpu().numpy().view(np.uint64), ref[start : start + n])


@pytest.mark.parametrize("device", DEVICES)
def test_words_at_the_end_of_the_32_bit_counter_match_openssl_and_both_refuse_to_wrap(device):
    """The stream's last blocks (counter up to 2^32 - 1): equal to OpenSSL started at that counter; one word more
    and both the host (OpenSSL refuses to wrap the counter) and the device raise."""
    sk = noise.subkey(KEY, ("end",))
    for start_block, skip in ((2**32 - 3, 0), (2**32 - 2, 5), (2**32 - 1, 7)):
        start = 8 * start_block + skip
        n = noise.MAX_STREAM_WORDS - start
        want = np.frombuffer(_openssl(sk, start_block, bytes(12), 8 * (n + skip))[8 * skip :], np.uint64)
        got = noise_device.stream_words(sk, start, n, device, compiled=False).cpu().numpy().view(np.uint64)
        np.testing.assert_array_equal(got, want)
        host = NoiseStream(KEY, "end")
        host._seek(start)
        np.testing.assert_array_equal(host.words(n), want)
        with pytest.raises(ValueError, match="counter"):
            noise_device.stream_words(sk, start, n + 1, device, compiled=False)
        with pytest.raises(ValueError, match="counter"):
            host.words(1)
    with pytest.raises(ValueError, match="counter"):  # the cipher library itself refuses, the reference we follow
        Cipher(algorithms.ChaCha20(sk, (2**32 - 1).to_bytes(4, "little") + bytes(12)), mode=None).encryptor().update(
            bytes(65)
        )


def test_words_at_single_positions_match_openssl():
    """``_words_at`` (the words of the elements the host decides, made one by one): every offset within a block,
    random positions and the stream's last words, against OpenSSL started at each word's block."""
    sk = noise.subkey(KEY, ("at",))
    rng = np.random.default_rng(3)
    last = noise.MAX_STREAM_WORDS - 1
    pos = np.r_[np.arange(24), rng.integers(0, last, 200), last - np.arange(17)]
    want = [np.frombuffer(_openssl(sk, p // 8, bytes(12), 64), np.uint64)[p % 8] for p in pos.tolist()]
    np.testing.assert_array_equal(chacha.words_at(sk, pos), np.array(want, np.uint64))


def test_host_seek_equals_reading_through():
    s = NoiseStream(KEY, "seek")
    ref = s.words(5000)
    for pos in (0, 1, 7, 8, 9, 1234, 4999):
        t = NoiseStream(KEY, "seek")
        t._seek(pos)
        np.testing.assert_array_equal(t.words(5000 - pos), ref[pos:])


# ---------------------------------------------------------------- the Gaussian sampler


def test_device_as241_error_is_far_below_the_assumed_bound():
    rng = np.random.default_rng(0)
    p = np.concatenate(
        [
            np.exp(rng.uniform(math.log(2.0**-193), math.log(0.5), 250)),
            rng.uniform(0.02, 0.5, 100),
            [2.0**-193, 1e-30, 0.075, 0.0749999, 0.5],
        ]
    )
    t = noise_device.upper_quantile(torch.from_numpy(p)).numpy()
    mpmath.mp.prec = 320
    worst = max(
        float(abs(mpmath.mpf(tt) - mpmath.sqrt(2) * mpmath.erfinv(1 - 2 * mpmath.mpf(pp))) / (1 + abs(tt)))
        for pp, tt in zip(p, t)
    )
    assert worst < noise.Z_ERROR / 2**6, worst


def _centers(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=n) * 0.3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sigma", [0.2262, 1.0, 1e-3])
def test_gaussian_on_the_device_equals_the_host_element_for_element(device, sigma):
    """Words from OpenSSL (the CPU device's source) and from the torch block function: both equal the host."""
    c = _centers(200_003 if sigma == 0.2262 else 50_003, 2)  # crosses blocks of 8192 and a partial last block
    ref = NoiseStream(KEY, "gauss", sigma).gaussian(c, sigma)
    got = NoiseStream(KEY, "gauss", sigma, device=device).gaussian(c, sigma)
    _same_bits(got, ref)
    out, _ = noise_device.rounded_gaussian(
        torch.from_numpy(c[:50_000]).to(device),
        sigma,
        subkey=noise.subkey(KEY, ("gauss", sigma)),
        start=0,
        compiled=False,
    )
    _same_bits(out.cpu().numpy(), ref[:50_000])


@pytest.mark.parametrize("device", DEVICES)
def test_gaussian_on_the_device_keeps_the_stream_position_and_the_shape(device):
    c = _centers(3 * 4099, 3).reshape(3, 4099)
    host = NoiseStream(KEY, "pos")
    ref = [host.words(5), host.gaussian(c, 0.5), host.gaussian(c[0, :7], 0.5), host.words(3)]
    dev = NoiseStream(KEY, "pos", device=device)
    got = [dev.words(5), dev.gaussian(torch.from_numpy(c).to(device), 0.5), dev.gaussian(c[0, :7], 0.5), dev.words(3)]
    assert got[1].shape == c.shape and got[1].device.type == torch.device(device).type
    for a, b in zip(ref, got):
        _same_bits(b.cpu().numpy() if isinstance(b, torch.Tensor) else b, a)
    _same_bits(NoiseStream(KEY, "z", device=device).gaussian(c, 0.0), c)


def _block_words(u_ints: list) -> np.ndarray:
    mask = (1 << 64) - 1
    return np.array([[(u >> 128) & mask, (u >> 64) & mask, u & mask] for u in u_ints], np.uint64).reshape(-1)


@pytest.mark.parametrize("device", DEVICES)
def test_near_boundary_cells_are_handed_to_the_host_and_decided_exactly(device):
    """U values on either side of a cell boundary (float cannot tell them apart) and in p's low-precision range:
    the device hands them to the host, whose exact decision is the output."""
    sigma, center = 0.0695, 0.123456789
    g = grid_for(sigma)
    mpmath.mp.prec = 320
    u_ints, cells = [], []
    for k in (-3, 0, 5, 40, -47):
        b = (k + mpmath.mpf(0.5)) * g
        u_b = mpmath.ncdf((b - mpmath.mpf(center)) / mpmath.mpf(sigma))
        base = int(mpmath.floor(u_b * mpmath.mpf(2) ** 192 - mpmath.mpf(0.5)))
        for off in (-2, -1, 0, 1, 2, 3):
            u_ints.append(base + off)
            cells.append(k if off <= 0 else k + 1)
    u_ints += [0, 1, 5 << 64, (1 << 192) - 1, (1 << 192) - 2, 1 << 191, (1 << 191) - 1]  # tails, centre, w0 < 2^11
    n = len(u_ints)
    words = _block_words(u_ints).reshape(n, 3).T.reshape(-1).copy()  # the block layout: n top, n middle, n low
    centers = np.full(n, center)
    ref = gaussian.rounded_gaussian(centers, sigma, g, words.reshape(3, n))
    np.testing.assert_array_equal(np.rint(ref[: len(cells)] / g).astype(int), cells)
    for source in ("host words", "device words"):
        if source == "host words":
            out, decided = noise_device.rounded_gaussian(
                torch.from_numpy(centers).to(device), sigma, subkey=b"", start=0, host_words=words, compiled=False
            )
        else:  # the same uniforms through the torch path's halves: feed the sampler directly
            w = torch.from_numpy(words.view(np.int64)).to(device)
            k, host, _ = device_gaussian._sampler64(
                w[:n], w[n : 2 * n], torch.from_numpy(centers).to(device), *_scalars(sigma, device)
            )
            decided = int(host.sum())
            ok = ~host.cpu().numpy()
            _same_bits(k.cpu().numpy()[ok], ref[ok])
            continue
        _same_bits(out.cpu().numpy(), ref)
        assert decided >= 20  # at least the 2 x 2 nearest U of each of the 5 boundaries, and w0 < 2^11


def _scalars(sigma, device):
    g = grid_for(sigma)
    return [
        torch.tensor(v, dtype=torch.float64, device=device)
        for v in (sigma / g, 1 / g, g, sigma * noise.Z_ERROR / g, 2.0**-50)
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_device_refuses_where_the_host_refuses(device):
    for center, sigma in (
        (np.array([1e10, 0.0]), 1e-10),
        (np.array([0.0, 1e308]), 1e-300),
        (np.array([0.0, 1e308]), 1.0),
    ):
        with pytest.raises(ArithmeticError) as host_err:
            NoiseStream(KEY, "r").gaussian(center, sigma)
        with pytest.raises(ArithmeticError) as dev_err:
            NoiseStream(KEY, "r", device=device).gaussian(center, sigma)
        assert str(dev_err.value) == str(host_err.value)


@pytest.mark.parametrize("device", DEVICES)
def test_device_refuses_a_block_where_the_host_decides_no_element(device):
    """One centre so large (0.15 g 2^50) that its block's error bound passes 1/8, placed so that its scaled value is
    an integer: no element is near a cell boundary, so the device decides every element itself, and must refuse."""
    sigma, g, n = 1.0, grid_for(1.0), 1000
    flip, p = gaussian.tail_p(NoiseStream(KEY, "whole").words(3 * n).reshape(3, n))
    z0 = float(np.where(flip, 1.0, -1.0)[0] * noise.upper_quantile(p)[0])
    c = np.zeros(n)
    c[0] = g * np.round((0.15 * g * 2.0**50 + sigma * z0) / g) - sigma * z0
    with pytest.raises(ArithmeticError, match="too small") as host_err:
        NoiseStream(KEY, "whole").gaussian(c, sigma)
    flags = []  # elements the device hands to the host, among the n real ones (the padding is flagged, U = 0)
    real = device_gaussian._sampler
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(device_gaussian, "_sampler", lambda *a: (lambda r: flags.append(int(r[1][:n].sum())) or r)(real(*a)))
        with pytest.raises(ArithmeticError) as dev_err:
            noise_device.rounded_gaussian(
                torch.from_numpy(c).to(device), sigma, subkey=noise.subkey(KEY, ("whole",)), start=0, compiled=False
            )
    assert str(dev_err.value) == str(host_err.value) and flags == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_every_zero_is_plus_zero_on_the_host_and_the_device(device):
    """A value rounding to cell 0 from below is -0.0 under rint and +0.0 on the exact path, and which path an element
    takes depends on the other values of its block (their size widens the error bound): each released zero must be
    +0.0, the same bits on both paths whatever the block holds."""
    sigma = 1.0
    g = grid_for(sigma)
    mpmath.mp.prec = 320
    t = (mpmath.mpf(0.5) - mpmath.mpf(2) ** -9) * g / sigma  # z = -t: (c + sigma z) / g = -0.498 at c = 0
    u_zero = int(mpmath.floor(mpmath.ncdf(-t) * mpmath.mpf(2) ** 192))
    words = _block_words([1 << 191, u_zero]).reshape(2, 3).T.copy()
    for big in (0.0, 2.0**30):  # 2^30 beside it: the element goes to the exact path on the host, not on the device
        centers = np.array([big, 0.0])
        ref = gaussian.rounded_gaussian(centers, sigma, g, words.copy())
        assert ref[1] == 0 and not np.signbit(ref[1])
        out, _ = noise_device.rounded_gaussian(
            torch.from_numpy(centers).to(device),
            sigma,
            subkey=b"",
            start=0,
            host_words=words.reshape(-1),
            compiled=False,
        )
        _same_bits(out.cpu().numpy(), ref)
    c = np.zeros(50_000)  # about 10^-4 of these draws are 0 (here 5)
    host = NoiseStream(KEY, "zeros").gaussian(c, sigma)
    zeros = host == 0
    assert zeros.sum() >= 5 and not np.signbit(host[zeros]).any()
    _same_bits(NoiseStream(KEY, "zeros", device=device).gaussian(c, sigma), host)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("start, total", [(0, 2 * 8192 + 777), (5, 2 * 8192 + 777), (8 * 3071 + 7, 16 * 8192 + 5)])
def test_elements_the_host_decides_read_the_same_words_when_the_device_makes_them(device, start, total):
    """Centres so large that their float error bound is near its limit: a quarter of those elements lie near a cell
    boundary and are decided by the host from the full U, whose words (the low ones included, which the
    device path does not make in bulk) are made again at their positions. Start offsets within a ChaCha20 block, and
    a last, shorter block of elements (on a CPU the kernels take 16 blocks: at 16 * 8192 + 5 it is its own batch)."""
    sigma = 1.0
    g = grid_for(sigma)
    c = _centers(total, 8)
    big = np.r_[8192:8692, total - 5 : total]  # in the second block and the last (the host's exact decisions are slow)
    c[big] = (2.0**46 + big % 1000) * g  # err = 2^-50 |c| / g + ... = about 2^-4 grid units
    host = NoiseStream(KEY, "decided")
    host.words(start)
    ref = host.gaussian(c, sigma)
    out, decided = noise_device.rounded_gaussian(
        torch.from_numpy(c).to(device), sigma, subkey=noise.subkey(KEY, ("decided",)), start=start, compiled=False
    )
    _same_bits(out.cpu().numpy(), ref)
    assert decided >= 100


def _crafted_blocks(monkeypatch, crafted: dict):
    """The device's ChaCha20 blocks with some stream words replaced (``crafted``: word position -> uint64 value, read
    at each call, so the caller may change it), wherever a block holding one is made (in bulk or one by one)."""
    real = chacha.stream_blocks

    def blocks(subkey, counters, compiled):
        out = real(subkey, counters, compiled).clone()
        at = counters.cpu().numpy()
        for w, v in crafted.items():
            for r in np.flatnonzero(at == w // 8):
                out[r, 2 * (w % 8)], out[r, 2 * (w % 8) + 1] = v & 0xFFFFFFFF, v >> 32
        return out

    monkeypatch.setattr(chacha, "stream_blocks", blocks)


@pytest.mark.parametrize(
    "start, total, element",
    [(s, 8192 + 10, 8192 + 3) for s in range(9)]
    + [(3, 8192 + 10, 100), (5, 20, 7), (6, 2 * 8192, 2 * 8192 - 1), (3, 3 * 8192 + 5, 8192 + 4)],
)
def test_the_low_word_reaches_the_host_when_the_device_makes_the_words(start, total, element, monkeypatch):
    """An element whose U has its top and middle words 0 (w0 < 2^11: p needs the low word, which the device does not
    make in bulk) decides its output from the low word, and its exact t counts in its block's refusal bound: with
    crafted words the device path equals the host's sampler on the same words, output and refusal alike, at every
    start offset within a ChaCha20 block, in whole and last blocks."""
    sigma, g, sk = 1.0, grid_for(1.0), noise.subkey(KEY, ("crafted",))
    blk = BLOCK
    b, j = divmod(element, blk)
    top = start + 3 * blk * b + j
    mid, low = top + min(blk, total - b * blk), top + 2 * min(blk, total - b * blk)
    words = NoiseStream(KEY, "crafted").words(start + 3 * total)[start:].copy()

    def host(c):
        out = np.empty(total)
        for b0 in range(0, total, blk):
            n = min(blk, total - b0)
            out[b0 : b0 + n] = gaussian.rounded_gaussian(
                c[b0 : b0 + n], sigma, g, words[3 * b0 : 3 * (b0 + n)].reshape(3, n)
            )
        return out

    def device(c):
        return noise_device.rounded_gaussian(torch.from_numpy(c), sigma, subkey=sk, start=start, compiled=False)[0]

    outputs, crafted = set(), {}
    _crafted_blocks(monkeypatch, crafted)
    for low_value in (0, 5, (1 << 64) - 1):
        crafted.update({top: 0, mid: 0, low: low_value})
        for w, v in crafted.items():
            words[w - start] = v
        c = np.zeros(total)
        ref = host(c)
        _same_bits(device(c).numpy(), ref)
        outputs.add(float(ref[element]))
        c[b * blk + (1 if j == 0 else 0)] = 2.0**35 - 8000.0  # short of the bound at t = 0, past it at this t
        with pytest.raises(ArithmeticError) as host_err:
            host(c)
        with pytest.raises(ArithmeticError) as dev_err:
            device(c)
        assert str(dev_err.value) == str(host_err.value)
    assert len(outputs) == 3  # the low word decided the output
    c = np.zeros(total)
    c[element] = 1e308  # its value overflows (the device's own value for it is a placeholder 0): the host's message
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(ArithmeticError, match="overflow") as host_err:
            host(c)
        with pytest.raises(ArithmeticError) as dev_err:
            device(c)
    assert str(dev_err.value) == str(host_err.value)


@pytest.mark.parametrize("device", DEVICES)
def test_device_refusal_counts_low_precision_uniforms_like_the_host(device):
    """U = 0 (top word below 2^11: p recomputed exactly, t = 16.4) beside a value just short of the refusal bound at
    t = 0: the host's block maximum of t includes that element, so the host refuses, and so must the device."""
    sigma = 1.0
    g = grid_for(sigma)

    def err(tmax, cmax):  # the host's bound, in grid units
        return (sigma * noise.Z_ERROR * (1.0 + tmax) + 2.0**-50 * (cmax + sigma * tmax)) / g

    t_low = float(noise.upper_quantile(np.array([2.0**-193]))[0])
    big = 2.0**35 - 8000.0
    assert err(0.0, big) < 0.125 < err(t_low, big)
    centers = np.array([big, 0.0])
    words = _block_words([1 << 191, 0]).reshape(2, 3).T.copy()
    with pytest.raises(ArithmeticError) as host_err:
        gaussian.rounded_gaussian(centers, sigma, g, words.copy())
    with pytest.raises(ArithmeticError) as dev_err:
        noise_device.rounded_gaussian(
            torch.from_numpy(centers).to(device),
            sigma,
            subkey=b"",
            start=0,
            host_words=words.reshape(-1),
            compiled=False,
        )
    assert str(dev_err.value) == str(host_err.value)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_one_million_gaussians_equal_the_host_compiled_and_eager(device, monkeypatch):
    monkeypatch.delenv("DPCDA_NOISE_COMPILE")
    c = _centers(1_000_000, 4)
    ref = NoiseStream(KEY, "million").gaussian(c, 0.2262)
    sk = noise.subkey(KEY, ("million",))
    for compiled in (False, True):
        out, _ = noise_device.rounded_gaussian(
            torch.from_numpy(c).to(device), 0.2262, subkey=sk, start=0, compiled=compiled
        )
        _same_bits(out.cpu().numpy(), ref)
        words = NoiseStream(KEY, "million").words(3_000_000)
        out, _ = noise_device.rounded_gaussian(
            torch.from_numpy(c).to(device), 0.2262, subkey=sk, start=0, host_words=words, compiled=compiled
        )
        _same_bits(out.cpu().numpy(), ref)
        got = noise_device.stream_words(sk, 3, 1_000_000, device, compiled=compiled).cpu().numpy().view(np.uint64)
        np.testing.assert_array_equal(got, words[3:1_000_003])


# ---------------------------------------------------------------- threads


def test_outputs_do_not_depend_on_the_thread_count():
    c = _centers(400_000, 5)
    results = []
    for n in (1, 2, 3, 8):
        noise.set_threads(n)
        s = NoiseStream(KEY, "threads")
        results.append((s.words(3), s.gaussian(c, 0.7), s.words(2_500_001), s.binomial(100, 1 / 7, 50), s.words(4)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            _same_bits(b, a)
    with pytest.raises(ValueError):
        noise.set_threads(0)


def _meeting(fn, parties: int = 2):
    """``fn`` whose first ``parties`` calls wait for one another (10 s at most): two draws are then both under way
    before either reads a word, so a draw that took its start from the stream before the other moved it would read
    the other's words."""
    barrier, calls = threading.Barrier(parties, timeout=10), itertools.count()

    def wrapped(*args):
        wrapped.calls += 1
        if next(calls) < parties:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
        return fn(*args)

    wrapped.calls = 0  # how many calls went through it: the draws reached it
    return wrapped


_DRAWS = {  # sizes against spans of 2^10 words and 8192 Gaussians: "on threads" draws run on the noise threads
    "words": (None, lambda s: s.words(1000)),
    "words on threads": (None, lambda s: s.words(5000)),
    "gaussian": (None, lambda s: s.gaussian(_centers(3000, 6), 0.7)),
    "gaussian on threads": (None, lambda s: s.gaussian(_centers(20_000, 6), 0.7)),
    "gaussian on a cpu device": ("cpu", lambda s: s.gaussian(_centers(3000, 6), 0.7)),
    "binomial": (None, lambda s: s.binomial(100, Fraction(1, 7), 1000)),
}


@pytest.mark.parametrize("kind", list(_DRAWS))
def test_two_threads_drawing_from_one_stream_read_disjoint_words(kind, monkeypatch):
    """One stream, two threads, one draw each: the two outputs are the stream's first and second draws (in either
    order), never the same words twice."""
    monkeypatch.setattr(noise_stream, "_TASK_WORDS", 1 << 10)
    monkeypatch.setattr(noise_stream, "_TASK_BLOCKS", 1)
    noise.set_threads(2)
    device, draw = _DRAWS[kind]
    ref = NoiseStream(KEY, "shared", kind, device=device)
    first, second = draw(ref), draw(ref)
    opened, spread = _meeting(keystream.encryptor), _meeting(pool.executor)
    monkeypatch.setattr(keystream, "encryptor", opened)
    monkeypatch.setattr(pool, "executor", spread)
    s = NoiseStream(KEY, "shared", kind, device=device)
    got = {}
    workers = [threading.Thread(target=lambda name=name: got.update({name: draw(s)})) for name in "ab"]
    for w in workers:
        w.start()
    for w in workers:
        w.join()

    def bits(x):
        return np.asarray(x).view(np.uint64).tobytes()

    assert {bits(got["a"]), bits(got["b"])} == {bits(first), bits(second)}
    assert s.position == ref.position
    assert opened.calls >= 2 and (spread.calls >= 2 or not kind.endswith("on threads"))  # both draws met there


def test_a_draw_interrupted_part_way_leaves_its_words_unused(monkeypatch):
    """A draw that fails after reading part of its words (a cancellation between two pieces): the next draws start
    after the failed draw's words, on one thread or on several, so no released word is ever released again."""
    monkeypatch.setattr(keystream, "_ZEROS", memoryview(bytes(4096)))  # pieces of 512 words
    monkeypatch.setattr(noise_stream, "_TASK_WORDS", 1 << 10)
    noise.set_threads(2)
    ref = NoiseStream(KEY, "interrupted").words(20_000)
    opened = keystream.encryptor

    class _Interrupted:  # the OpenSSL stream of the first draw: its second piece fails
        def __init__(self, enc):
            self.enc, self.pieces = enc, 0

        def update(self, data):
            return self.enc.update(data)

        def update_into(self, data, buf):
            self.pieces += 1
            if self.pieces == 2:
                raise RuntimeError("cancelled")
            return self.enc.update_into(data, buf)

    monkeypatch.setattr(
        keystream, "encryptor", lambda key, word: _Interrupted(opened(key, word)) if word == 0 else opened(key, word)
    )
    s = NoiseStream(KEY, "interrupted")
    with pytest.raises(RuntimeError, match="cancelled"):
        s.words(2000)  # one thread, four pieces
    assert s.position == 2000
    a = s.words(10)  # one thread
    b = s.words(6000)  # spans on two threads, each from its own position
    c = s.uniform_int(1 << 62, 10)  # one thread again
    np.testing.assert_array_equal(a, ref[2000:2010])
    np.testing.assert_array_equal(b, ref[2010:8010])
    np.testing.assert_array_equal(c, (ref[8010:8020] % np.uint64(1 << 62)).astype(np.int64))
    assert not np.isin(a, b).any()


def test_default_threads_are_the_cores_the_process_may_use():
    noise.set_threads(None)
    assert noise.threads() == len(os.sched_getaffinity(0))


def test_noise_threads_flag_reaches_the_config():
    from dpcda.pipeline.cli import release_flags
    from dpcda.schemas.config import ConfigError, load_config

    assert release_flags()["--noise-threads"][0] == "noise_threads"
    base = {"input": "x", "output": "y", "sigma_x": 0.5, "mode": "fixed", "num_classes": 3}
    assert load_config(None, {**base, "noise_threads": "3"}).noise_threads == 3
    assert load_config(None, base).noise_threads is None  # the process's cores
    with pytest.raises(ConfigError, match="noise_threads"):
        load_config(None, {**base, "noise_threads": 0})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
@pytest.mark.parametrize("mode", ["fixed", "poisson"])
def test_mixing_on_cuda_releases_the_rows_the_cpu_releases(mode):
    """mix_chunk draws the noise on the card there: every released row equals the CPU's, bit for bit."""
    from fractions import Fraction

    from dpcda.mechanisms.dpcda import mix_class

    x = np.random.default_rng(0).normal(size=(700, 40)) * 0.05
    kw = dict(key=KEY, class_index=1, num_classes=3, mode=mode, mixing_order=8, sigma_x=0.3, samples=5000)
    kw.update(chunk_rows=2048, sampling_rate=Fraction(8, 700), sigma_y=0.5)
    cpu, cuda = list(mix_class(x, device="cpu", **kw)), list(mix_class(x, device="cuda", **kw))
    assert len(cpu) == len(cuda) == 3
    for (c1, f1, l1), (c2, f2, l2) in zip(cpu, cuda):
        assert c1 == c2
        _same_bits(f2, f1)
        _same_bits(l2, l1)


class _HostReads(torch.overrides.TorchFunctionMode):
    """Counts the calls that read a tensor's values back to the host: on a card each waits for every kernel queued
    before it (a scalar, a list, ``nonzero``, a boolean mask, a copy to the host). Works on CPU tensors too."""

    READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        index = args[1] if name in ("__getitem__", "__setitem__") and len(args) > 1 else None
        if name in self.READS or (isinstance(index, torch.Tensor) and index.dtype == torch.bool):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def test_the_device_draws_read_back_only_what_the_host_must_know():
    """The card's path, run on CPU tensors: a Gaussian with no element for the host reads back once (how many
    elements the host decides, whether a block is refused); the index draw once per round of redraws (which rows
    repeat an index: the host needs it to know how many words the next round reads)."""
    c = torch.from_numpy(_centers(3 * 8192 + 5, 7))
    with _HostReads() as reads:
        _, decided = noise_device.rounded_gaussian(
            c, 0.3, subkey=noise.subkey(KEY, ("reads",)), start=3, compiled=False
        )
    assert decided == 0 and reads.calls == ["tolist"]
    take = noise_device.StreamWords(noise.subkey(KEY, ("reads",)), 0, "cpu", compiled=False)
    rounds = []
    with _HostReads() as reads:
        noise_device.distinct(lambda k: rounds.append(k) or take(k), 200_000, 64, 4096, "cpu")
    assert len(rounds) >= 2 and reads.calls == ["nonzero"] * len(rounds)  # about 1 % of rows repeat an index
    rounds.clear()
    with _HostReads() as reads:  # the dense sampler: rows with a tie are drawn again
        noise_device.distinct(lambda k: rounds.append(k) or take(k), 12, 11, 5000, "cpu")
    assert reads.calls == ["nonzero"] * len(rounds)


def _waits_for_the_card(fn) -> list:
    from dpcda.mechanisms.device import card_waits

    return [str(w.message) for w in card_waits(fn)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA")
def test_a_chunks_draws_wait_for_the_card_only_to_learn_what_the_host_must_know(monkeypatch):
    """The Gaussian of a mixing chunk waits once when the host decides no element (how many it decides, whether a
    block is refused) and three times when it does (which elements, then their centres and the block statistics in
    one copy); the index draw once per round of redraws (which rows repeat an index: the next round's word count).
    The key words, the sampler's scalars and the tables reach the card without a wait."""
    monkeypatch.delenv("DPCDA_NOISE_COMPILE")  # the compiled kernels, as a release runs them
    sk = noise.subkey(KEY, ("waits", 1))
    for rows, seed in ((4096, 0), (64, 0)):  # the host decides one element of the first draw, none of the second
        c = torch.from_numpy(np.random.default_rng(seed).random((rows, 784)))
        ref, decided = noise_device.rounded_gaussian(c, 0.1, subkey=sk, start=0, compiled=False)
        assert (decided > 0) == (rows == 4096)  # both paths are counted
        c = c.cuda()
        noise_device.rounded_gaussian(c, 0.1, subkey=sk, start=0)  # compiled kernels, cached allocations
        got = []
        waits = _waits_for_the_card(lambda: got.extend(noise_device.rounded_gaussian(c, 0.1, subkey=sk, start=0)))
        _same_bits(got[0].cpu().numpy(), ref.numpy())
        assert got[1] == decided and len(waits) == (3 if decided else 1), (decided, waits)
    NoiseStream(KEY, "waits", 0, device="cuda").distinct(200_000, 64, 4096, tensor=True)
    stream = NoiseStream(KEY, "waits", 2, device="cuda")
    rounds, take = [], stream._device_words
    stream._device_words = lambda n: rounds.append(n) or take(n)
    waits = _waits_for_the_card(lambda: stream.distinct(200_000, 64, 4096, tensor=True))  # left on the card
    assert len(rounds) >= 2 and len(waits) == len(rounds), (rounds, waits)  # about 1 % of rows repeat an index


@pytest.mark.parametrize("mode", ["fixed", "poisson"])
@pytest.mark.parametrize("mechanism", ["dpcda", "dpmix"])
def test_mixing_with_its_indices_drawn_by_the_device_sampler_releases_the_same_rows(mode, mechanism, monkeypatch):
    """The mixers' index streams take the worker's device on CUDA (``stream_device``); on a CPU worker they stay on
    the host. Forcing the device path on CPU tensors (``distinct`` in torch), drawn one chunk ahead as on a card,
    releases the host's rows bit for bit."""
    from fractions import Fraction

    from dpcda.mechanisms import device as device_policy
    from dpcda.mechanisms import dpcda, dpmix

    assert device_policy.stream_device(torch.device("cpu")) is None
    assert device_policy.stream_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 12)) * 0.05, rng.integers(0, 3, 300)
    kw = dict(key=KEY, mode=mode, mixing_order=8, sigma_x=0.3, samples=1500, chunk_rows=600)
    kw.update(sampling_rate=Fraction(8, 300), device="cpu")
    if mechanism == "dpcda":
        run = lambda **k: list(dpcda.mix_class(x, class_index=1, num_classes=3, sigma_y=0.5, **kw, **k))  # noqa: E731
    else:
        run = lambda **k: list(dpmix.mix_dataset(x, y, num_classes=3, sigma_y=0.5, **kw, **k))  # noqa: E731
    host = run()
    calls = []
    real = noise_device.distinct
    monkeypatch.setattr(noise_device, "distinct", lambda *a: calls.append(a[1:4]) or real(*a))
    monkeypatch.setattr(dpcda if mechanism == "dpcda" else dpmix, "stream_device", lambda dev: dev)
    device = run(depth=1)  # a card's lookahead: the draws in a thread of their own, one chunk ahead
    assert len(calls) == len(host) == 3
    for (c1, f1, l1), (c2, f2, l2) in zip(host, device):
        assert c1 == c2
        _same_bits(f2, f1)
        _same_bits(l2, l1)


def test_noise_benchmark_runs_each_row_in_its_own_process_in_alternating_order(capsys, tmp_path):
    """One run: every row in a process of its own (none is this one), each timed once per repeat, forwards in even
    repeats and backwards in odd ones; the report names the CPU, its vector flags and the load before and after, and
    gives the secure sampler's ratios to numpy's default_rng and legacy generators."""
    from benchmarks.perf import bench_noise

    args = ["--n", "20000", "--repeat", "3", "--host-only", "--threads", "1", "--out", str(tmp_path / "b.md")]
    rows = []
    real = bench_noise.run_rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_noise, "run_rows", lambda r, *a: (rows.extend(r), real(r, *a)))
        bench_noise.main(args)
    text = capsys.readouterr().out
    assert not [r.error for r in rows if r.error]
    pids = {r.info["pid"] for r in rows}
    assert len(pids) == len(rows) >= 7 and os.getpid() not in pids
    assert all(len(r.times) == len(r.starts) == 3 for r in rows)
    for i, forwards in enumerate((True, False, True)):
        starts = [r.starts[i] for r in rows]
        assert starts == sorted(starts, reverse=not forwards)
    for name in (bench_noise.NUMPY, bench_noise.LEGACY, bench_noise.RANDN, bench_noise.HOST_NUMPY, "host keystream"):
        assert name in text
    host = next(line for line in text.splitlines() if line.startswith(f"| {bench_noise.HOST_NUMPY} | 1 |"))
    assert host.count("x (") == 3  # paired ratios (median and range) to default_rng, legacy and torch.randn
    for word in ("CPU:", "avx2", "avx512f", "avx512_bf16", "amx_tile", "load average", "before", "after"):
        assert word in text
    assert (tmp_path / "b.md").read_text().startswith(f"Generated by `python -m benchmarks.perf.bench_noise {args[0]}")


@pytest.mark.parametrize("kind", ["torch-host-words", "torch-device-words", "torch-keystream"])
def test_noise_benchmark_torch_rows_draw(kind, monkeypatch):
    """The torch rows' calls (run in this process here; the benchmark runs each in its own)."""
    from benchmarks.perf.noise_rows import build
    from dpcda.privacy.noise import pool

    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process's torch threads stay as they are
    monkeypatch.setattr(pool, "_THREADS", pool._THREADS)  # build() sets the noise threads: restored for later tests
    call, info = build(kind, 1, 1000, "cpu")
    out = call()
    assert info["backend"] == "eager" and (out[0] if isinstance(out, tuple) else out).numel() >= 1000


def test_the_noise_benchmark_uses_public_names_of_dpcda_only():
    """bench_noise and its row processes reach the noise package through public names: no ``_name`` imported from
    dpcda, no ``x._name`` attribute (the files use none of their own either), no module path with a ``_`` part."""
    import ast

    from tests.conftest import ROOT

    for name in ("bench_noise.py", "noise_rows.py"):
        tree = ast.parse((ROOT / "benchmarks" / "perf" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dpcda"):
                parts = node.module.split(".") + [a.name for a in node.names]
                assert not [p for p in parts if p.startswith("_")], (name, node.module, parts)
            elif isinstance(node, ast.Attribute):
                private = node.attr.startswith("_") and not node.attr.startswith("__")
                assert not private, (name, node.lineno, node.attr)


def test_noise_benchmark_speed_up_is_the_median_of_paired_ratios():
    from benchmarks.perf.bench_noise import speed_ups

    rows = [
        {"path": "host exact Gaussian", "threads": 1, "times": [1.0, 2.0, 1.0], "threaded": True},
        {"path": "host keystream (OpenSSL)", "threads": 1, "times": [1.0, 1.0, 1.0], "threaded": True},
        {"path": "host sampler alone, 1 thread (compiled)", "threads": 1, "times": [1.0, 1.0, 1.0], "threaded": False},
        {"path": "host exact Gaussian", "threads": 2, "times": [0.5, 0.5, 1.0], "threaded": True},
        {"path": "host keystream (OpenSSL)", "threads": 2, "times": [0.6, 0.5, 0.4], "threaded": True},
        {"path": "host sampler alone, 1 thread (compiled)", "threads": 2, "times": [0.1, 0.1, 0.1], "threaded": False},
    ]
    assert speed_ups(rows, 2) == [
        "- host exact Gaussian: 2.00x (per repeat 1.00x to 4.00x)",  # repeat by repeat: 2, 4, 1
        "- host keystream (OpenSSL): 2.00x (per repeat 1.67x to 2.50x)",
    ]  # the single-thread row is not a speed-up


# ---------------------------------------------------------------- Binomial row sizes


@pytest.mark.parametrize("device", DEVICES)
def test_binomial_on_the_device_equals_the_host(device):
    from fractions import Fraction

    for n, q, size in ((6000, Fraction(8, 5950), 100_000), (50, Fraction(1, 3), 20_000), (10, Fraction(9, 10), 5000)):
        host = NoiseStream(KEY, "bin", n)
        ref = [host.words(3), host.binomial(n, q, size), host.words(2)]
        sk = noise.subkey(KEY, ("bin", n))
        got = noise_device.binomial(sk, 3, n, q.numerator, q.denominator, size, device, compiled=False)
        np.testing.assert_array_equal(got.cpu().numpy(), ref[1])
        if device != "cpu":  # the stream dispatches to the card and keeps its position
            dev = NoiseStream(KEY, "bin", n, device=device)
            for a, b in zip(ref, [dev.words(3), dev.binomial(n, q, size), dev.words(2)]):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_binomial_uniforms_at_a_threshold_are_counted_exactly(device):
    """U equal to a threshold C_j, one below and one above (differing in the lowest piece or the highest): the count
    of thresholds <= U is exact."""
    th = binomial.binomial_thresholds(6000, 8, 5950)
    values = [(int(a) << 128) | (int(b) << 64) | int(c) for a, b, c in th.tolist()]
    us = [0, (1 << 192) - 1]
    for v in values[:6] + values[-3:]:
        us += [v - 1, v, v + 1, v ^ (1 << 191)]
    mask = (1 << 64) - 1
    words = np.array([[(u >> s) & mask for u in us] for s in (128, 64, 0)], np.uint64)
    lo = torch.from_numpy((words & np.uint64(0xFFFFFFFF)).astype(np.int64)).to(device)
    hi = torch.from_numpy((words >> np.uint64(32)).astype(np.int64)).to(device)
    got = noise_device.binomial_from_halves(lo, hi, th).cpu().tolist()
    assert got == [sum(v <= u for v in values) for u in us]


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_one_million_binomials_equal_the_host(device):
    from fractions import Fraction

    q = Fraction(16, 6011)
    ref = NoiseStream(KEY, "bin-million").binomial(6000, q, 1_000_000)
    sk = noise.subkey(KEY, ("bin-million",))
    got = noise_device.binomial(sk, 0, 6000, q.numerator, q.denominator, 1_000_000, device, compiled=False)
    np.testing.assert_array_equal(got.cpu().numpy(), ref)


# ---------------------------------------------------------------- distinct indices

# (n, l, rows): the sparse sampler with few and with many (~36 %) rejected rows, single indices, the dense sampler
# (l = n, l near n, several key batches), bounds around 2^32 and up to 2^62 whose residues wrap (w >= 2^63), and
# 3 2^60 + 1, where 1 word in 16 is rejected (2^64 mod n = 2^60 - 5).
_DISTINCT = [
    (700, 8, 5000),
    (100, 10, 3000),
    (5, 1, 100),
    (1, 1, 10),
    (10, 10, 300),
    (64, 40, 2000),
    (3, 2, 5000),
    (1 << 20, 2000, 3),
    ((1 << 32) - 1, 4, 1000),
    (1 << 32, 2, 1000),
    ((1 << 32) + 1, 3, 1000),
    (3 * (1 << 60) + 1, 5, 2000),
    ((1 << 62) - 1, 5, 1000),
    (1 << 62, 3, 1000),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n, l, rows", _DISTINCT)
def test_distinct_on_the_device_equals_the_host(device, n, l, rows):
    """The same indices element for element, and the stream left at the same word: through the stream (``device``
    set: OpenSSL words on a CPU device, the torch ChaCha20 on a card) and through the torch ChaCha20 directly."""
    host = NoiseStream(KEY, "distinct", n)
    ref = [host.words(3), host.distinct(n, l, rows), host.words(2)]
    dev = NoiseStream(KEY, "distinct", n, device=device)
    got = [dev.words(3), dev.distinct(n, l, rows), dev.words(2)]
    for a, b in zip(ref, got):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    take = noise_device.StreamWords(noise.subkey(KEY, ("distinct", n)), 3, device, compiled=False)
    direct = noise_device.distinct(take, n, l, rows, device)
    assert direct.device.type == torch.device(device).type
    assert np.array_equal(direct.cpu().numpy(), ref[1]) and take.position == host.position - 2


def _small_alphabet(seed: int, alphabet: int):
    """Words from a short list of values (so keys tie and rows repeat often), the same sequence for every reader."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 1 << 63, alphabet, dtype=np.uint64) * np.uint64(2)
    values[0] = np.uint64((1 << 64) - 1)  # the largest word (most values have their top bit set)
    sequence = values[rng.integers(0, alphabet, 1 << 20)]
    pos = [0]

    def words(n):
        pos[0] += n
        return sequence[pos[0] - n : pos[0]]

    return words, pos


_TIES = [(12, 5, 400, 60), (12, 12, 400, 400), (40, 9, 300, 300), (6, 2, 200, 23), (100, 10, 300, 23)]


@pytest.mark.parametrize("n, l, rows, alphabet", _TIES)
def test_distinct_ties_and_repeats_are_redrawn_like_the_host(n, l, rows, alphabet, monkeypatch):
    """Words from a small alphabet: ties at the cut, inside a row and repeated indices are frequent, and each is
    redrawn from the same next words on both sides (the host's own code reads them through ``words``)."""
    host = NoiseStream(KEY, "ties")
    words, pos = _small_alphabet(n, alphabet)
    monkeypatch.setattr(host, "words", words)
    ref = host.distinct(n, l, rows)
    used = pos[0]
    dev_words, dev_pos = _small_alphabet(n, alphabet)
    got = noise_device.distinct(lambda k: torch.from_numpy(dev_words(k).view(np.int64)), n, l, rows, "cpu")
    assert np.array_equal(got.numpy(), ref) and dev_pos[0] == used
    assert used > rows * (l if noise.sparse_distinct(n, l) else n)  # some rows were redrawn


def test_distinct_on_the_device_refuses_and_returns_empty_like_the_host():
    take = noise_device.StreamWords(noise.subkey(KEY, ("e",)), 0, "cpu", compiled=False)
    for n, l in ((3, 4), (0, 1)):
        with pytest.raises(ValueError, match="cannot draw"):
            noise_device.distinct(take, n, l, 5, "cpu")
    with pytest.raises(ValueError, match="bound must be"):
        noise_device.distinct(take, (1 << 62) + 1, 2, 5, "cpu")
    with pytest.raises(ValueError, match="bound must be"):
        NoiseStream(KEY, "e").distinct((1 << 62) + 1, 2, 5)
    assert noise_device.distinct(take, 5, 0, 4, "cpu").shape == (4, 0)
    assert noise_device.distinct(take, 5, 3, 0, "cpu").shape == (0, 3)
    assert take.position == 0
    dev = NoiseStream(KEY, "e", device="cpu")
    assert dev.distinct(5, 0, 4).shape == (4, 0) and dev.position == 0


@pytest.mark.parametrize("device", DEVICES)
def test_one_million_distinct_indices_equal_the_host(device):
    """10^6 indices from each sampler (sparse: 125,000 rows of 8 from 6,000; dense: 25,000 rows of 40 from 64),
    drawn with the torch ChaCha20 on the device."""
    for n, l, rows in ((6000, 8, 125_000), (64, 40, 25_000)):
        ref = NoiseStream(KEY, "distinct-million", n).distinct(n, l, rows)
        take = noise_device.StreamWords(noise.subkey(KEY, ("distinct-million", n)), 0, device, compiled=False)
        got = noise_device.distinct(take, n, l, rows, device)
        assert rows * l >= 1_000_000 and np.array_equal(got.cpu().numpy(), ref)
