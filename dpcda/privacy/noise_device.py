"""The noise module's streams and Gaussian sampler on a torch device: the same words, the same sampler, bit for bit.

Relation-agnostic, like ``privacy.noise`` (whose docstring states the mechanism): nothing here decides what is
sampled, only where the arithmetic runs. The only module of ``privacy/`` that imports torch; ``privacy.noise`` loads
it lazily, when a caller asks for a device.

Words. The ChaCha20 block function of RFC 8439 in vectorised torch integer operations (int64 tensors holding
32-bit values, masked after every addition), one block per lane, keyed by the same host-side subkey
BLAKE2b-256(run key, path) and with the same (counter, nonce) layout as the OpenSSL stream that ``NoiseStream``
reads: block B of a path has counter B and a zero nonce, word w of the stream is bytes 8w..8w+7 of the keystream
(little-endian). A stream ends after 2^32 blocks, where OpenSSL refuses to go on; so does this one. Where
``torch.compile`` works, the block function and the sampler run as fused kernels (inductor: C++ on the CPU, Triton
on CUDA); otherwise eagerly. Both are the same integer arithmetic, so both give the same words.

Gaussian. For each element the device reads the same two top words of the 192-bit uniform U that the host reads
(word layout of ``NoiseStream._uniform_words``, blocks of ``noise._BLOCK`` elements; only those words are made in
bulk, a third of the keystream fewer), forms the same float64 p, evaluates Wichura's AS 241 in float64 and rounds
to the grid. Its float error obeys the bound the host assumes (``noise.Z_ERROR``; tested against mpmath), so
wherever the float value lies farther than (twice) that bound from a cell boundary, its cell is the exact cell at
u, the host's output. Every other element (a near-boundary cell, p's rare low-precision case w0 < 2^11, a
non-finite value) is handed back to the host, which decides it with its own code from the full U (its three words
taken from the host's words or, where the device made them, made again at their positions; block by block; a
block's largest t includes the host's t of these elements, so the device refuses exactly where the host does). The
output is therefore the exact rounded Gaussian at U, element for element the host's, every zero +0.0; the tests
check that identity, in the bits, on CPU tensors and, where present, on CUDA.

Binomial row sizes and distinct indices (``binomial``, ``distinct``) are the host's samplers in exact integer
arithmetic on the same words: the same rejections, redraws and table comparisons, so the same draws.

Waiting. On a card every read of a value back to the host, and every blocking copy to it, waits for all the work
queued before it, so the card idles while the host catches up. The draws read back only what the host must know:
a Gaussian once where the host decides no element (how many it decides, whether a block is refused) and three
times where it does (a mixing chunk of 65,536 rows of 784 usually has a few such elements), the index sampler once
per round of redraws (which rows are drawn again: the next round's word count). Keys, scalars and tables go to the
card from page-locked memory without a wait (``_const``).
"""

from __future__ import annotations

import logging
import math
import os

import torch

from dpcda.privacy import noise as _host

_M32 = 0xFFFFFFFF
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
MAX_BLOCKS = 1 << 32  # OpenSSL (through ``cryptography``) refuses to wrap the 32-bit block counter
MAX_WORDS = 8 * MAX_BLOCKS
# Work per kernel call: ChaCha20 blocks (CPU: 1 MiB of keystream) and Gaussian elements (a multiple of
# noise._BLOCK). The compiled kernels take any batch size (``_BATCH_ARGS``: one compile, no padding). A card takes far
# larger calls, so that launching them costs the host less time than running them costs the card: a mixing chunk of
# 65,536 rows of 784 is one ChaCha20 call and four sampler calls.
_BATCH_BLOCKS = {"cpu": 1 << 14, "cuda": 1 << 24}
_BATCH_ELEMS = {"cpu": 1 << 17, "cuda": 1 << 24}


def _batch(table: dict, device: torch.device) -> int:
    return table.get(device.type, table["cpu"])


def _const(values, dtype, device) -> torch.Tensor:
    """A small host array (key words, the sampler's scalars, a Binomial table) as a tensor on ``device``, copied
    without waiting for it: a blocking copy to a card waits for every kernel queued before it (torch's
    ``copy_``: ``memcpy_and_sync``), so each one stalled the card's queue. From page-locked memory the copy is queued
    like a kernel, and torch's caching host allocator keeps the buffer until it is done."""
    t = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


_COMPILE_ENV = "DPCDA_NOISE_COMPILE"  # "0": run eagerly


def _rotl(x: torch.Tensor, n: int) -> torch.Tensor:
    return ((x << n) & _M32) | (x >> (32 - n))


def _quarter(x: list, a: int, b: int, c: int, d: int) -> None:
    x[a] = (x[a] + x[b]) & _M32
    x[d] = _rotl(x[d] ^ x[a], 16)
    x[c] = (x[c] + x[d]) & _M32
    x[b] = _rotl(x[b] ^ x[c], 12)
    x[a] = (x[a] + x[b]) & _M32
    x[d] = _rotl(x[d] ^ x[a], 8)
    x[c] = (x[c] + x[d]) & _M32
    x[b] = _rotl(x[b] ^ x[c], 7)


def chacha20_blocks(key_words: torch.Tensor, nonce_words: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """(M, 16) int64 holding the 32-bit output words of the RFC 8439 block function (section 2.3).

    ``key_words`` (8,) and ``nonce_words`` (3,) int64 hold the key and nonce as little-endian 32-bit words,
    ``counters`` (M,) int64 the 32-bit block counters.
    """
    ones = torch.ones_like(counters)
    init = [ones * c for c in _CONSTANTS]
    init += [ones * key_words[i] for i in range(8)]
    init += [counters & _M32] + [ones * nonce_words[i] for i in range(3)]
    x = list(init)
    for _ in range(10):  # 20 rounds: column rounds, then diagonal rounds
        _quarter(x, 0, 4, 8, 12)
        _quarter(x, 1, 5, 9, 13)
        _quarter(x, 2, 6, 10, 14)
        _quarter(x, 3, 7, 11, 15)
        _quarter(x, 0, 5, 10, 15)
        _quarter(x, 1, 6, 11, 12)
        _quarter(x, 2, 7, 8, 13)
        _quarter(x, 3, 4, 9, 14)
    return torch.stack([(x[i] + init[i]) & _M32 for i in range(16)], dim=1)


# ---------------------------------------------------------------- AS 241 and the grid, elementwise


def _poly(coef, x):
    """Horner's rule as the host evaluates it; ``coef`` may hold tensors (coefficients chosen per element)."""
    acc = x * coef[-1]
    acc = acc + coef[-2]
    for a in coef[-3::-1]:
        acc = acc * x
        acc = acc + a
    return acc


def upper_quantile(p: torch.Tensor) -> torch.Tensor:
    """t >= 0 with P(Z > t) = p for float64 p in (0, 1/2]: ``noise.upper_quantile`` (AS 241), branch-free.

    AS 241's three rational approximations share one pair of degree-7 polynomials whose coefficients and argument
    are chosen per element (central: A/B at 0.180625 - q^2; tail: C/D at r - 1.6, or E/F at r - 5 where r > 5),
    so each element evaluates the operations the host evaluates for it, once.
    """
    q = p - 0.5
    tail = p < 0.075
    rt = torch.sqrt(-torch.log(torch.where(tail, p, 0.25)))
    far = tail & (rt > 5.0)
    r1 = rt - 1.6
    x = torch.where(tail, torch.where(far, r1 - 3.4, r1), 0.180625 - q * q)

    def pick(i, central, near, far_c):  # float64 coefficients (torch.where on two Python floats gives float32)
        c0, c1, c2 = (torch.full((), v[i], dtype=torch.float64, device=p.device) for v in (central, near, far_c))
        return torch.where(tail, torch.where(far, c2, c1), c0)

    num = _poly([pick(i, _host._A, _host._C, _host._E) for i in range(8)], x)
    den = _poly([pick(i, _host._B, _host._D, _host._F) for i in range(8)], x)
    ratio = num / den
    return torch.where(tail, ratio, -(ratio * q))


def _sampler(lo0, hi0, lo1, hi1, center, sigma_over_g, inv_g, g, err_t, err_c):
    """The rounded Gaussian k g per element (0 where the host must decide), a flag for elements the host must
    decide, and t, for ``_block_stats`` (0 where p is imprecise: ``rounded_gaussian`` adds the host's t there).

    (lo, hi) are the 32-bit halves of the uniform's two top words; the arithmetic is ``noise._rounded_gaussian``'s.
    err_t, err_c: the host's error bound per element, err = err_t (1 + t) + err_c (|c| + sigma t) in grid units.
    """
    flip = hi0 >> 31  # U >= 2^191: z = +t, and U' = 2^192 - 1 - U
    mask = (-flip) & _M32
    a_hi = (hi0 ^ mask) & 0x7FFFFFFF
    a_lo = lo0 ^ mask
    b_hi = hi1 ^ mask
    b_lo = lo1 ^ mask
    w0 = (a_hi << 32) | a_lo  # < 2^63: the host's w0
    w1 = ((b_hi << 21) | (b_lo >> 11)).to(torch.float64)  # < 2^53, exact
    p = w0.to(torch.float64) * 2.0**-64 + w1 * 2.0**-117
    t = upper_quantile(p)
    scaled = torch.where(flip == 1, t, -t) * sigma_over_g + center * inv_g
    k = torch.round(scaled)  # half to even, as numpy's rint
    err = err_t * (1.0 + t) + err_c * (center.abs() * inv_g + sigma_over_g * t)
    small = w0 < 2048  # p from 116 bits is not precise enough (probability 2^-52): the host recomputes it
    host = small | ~((scaled - k).abs() < 0.5 - 2.0 * err)  # also catches non-finite values
    # k == 0 also matches -0.0 (round of a value in (-1/2, 0)): every zero is released as +0.0, as the host does
    return torch.where(small | (k == 0), 0.0, k) * g, host, torch.where(small, 0.0, t)


def _block_stats(values, host, t, center):
    """Per block of ``noise._BLOCK`` elements: max |c|, max t and whether every value is finite (the host's
    refusal test); padding (U = 0, c = 0) changes none of them."""
    blk = _host._BLOCK
    return (
        values,
        host,
        center.abs().reshape(-1, blk).amax(dim=1),
        t.reshape(-1, blk).amax(dim=1),
        torch.isfinite(values).reshape(-1, blk).all(dim=1),
    )


# ---------------------------------------------------------------- compiled or eager


_KERNELS: dict = {}


def compile_enabled() -> bool:
    return os.environ.get(_COMPILE_ENV, "1") != "0"


def _kernel(name: str, fn, compiled: bool):
    if not compiled:
        return fn
    if name not in _KERNELS:
        try:
            _KERNELS[name] = torch.compile(fn, fullgraph=True)
        except Exception:  # noqa: BLE001 - no compiler: the eager function is the same arithmetic
            _KERNELS[name] = fn
    return _KERNELS[name]


# Per kernel, the arguments whose first dimension is the batch: the one size the compiled kernels leave symbolic, so
# that one compile serves every call without padding. Every other size stays fixed (a block's 8192 elements, its
# rows of words): with every size symbolic the CPU sampler ran slower (benchmarks/results/README.md).
_BATCH_ARGS = {"chacha": (2,), "sampler": (0, 1, 2), "sampler64": (0, 1)}


def _run(name: str, fn, compiled: bool, *args):
    k = _kernel(name, fn, compiled)
    if k is fn:
        return fn(*args)
    mark = getattr(torch._dynamo, "maybe_mark_dynamic", None)  # without it: one recompile, at the second size
    for i in _BATCH_ARGS[name] if mark is not None else ():
        if args[i].shape[0] > 1:  # sizes 0 and 1 are always specialised
            mark(args[i], 0)  # "maybe": a size tied to another's (the centres' 8192 m) is no error
    try:
        return k(*args)
    except torch.OutOfMemoryError:
        raise  # the card's memory, not the compiler: the eager kernel would need more
    except Exception as err:  # noqa: BLE001 - compilation failed at first call (no C++ compiler, no Triton)
        logging.getLogger(__name__).warning(
            "torch.compile failed for the noise kernel %r (%s: %s); running it eagerly, the same arithmetic",
            name,
            type(err).__name__,
            err,
        )
        _KERNELS[name] = fn
        return fn(*args)


def backend(compiled: bool = True) -> str:
    """'compiled' where torch.compile produced the kernels, else 'eager'."""
    if not (compiled and compile_enabled()):
        return "eager"
    return "compiled" if any(k is not _FUNCS[n] for n, k in _KERNELS.items()) else "eager"


def _sampler64(w0, w1, center, *scalars):
    """``_sampler`` on 64-bit words (int64 bit patterns), as read on the host."""
    return _sampler(w0 & _M32, (w0 >> 32) & _M32, w1 & _M32, (w1 >> 32) & _M32, center, *scalars)


_FUNCS: dict = {}  # name -> eager function (filled below)


# ---------------------------------------------------------------- streams


def _words32(key: bytes, n: int, base: int = 0) -> list:
    return [int.from_bytes(key[4 * i : 4 * i + 4], "little") + base for i in range(n)]


def stream_halves(subkey: bytes, start: int, n: int, device, *, compiled: bool = True):
    """(lo, hi) int64 tensors (n,): the 32-bit halves of words start..start+n-1 of the stream keyed by ``subkey``."""
    _check_range(start, n)
    device = torch.device(device)
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return empty, empty
    first, last = start // 8, (start + n - 1) // 8
    counters = torch.arange(first, last + 1, dtype=torch.int64, device=device)
    words = _blocks(subkey, counters, compiled).reshape(-1, 2)[start % 8 : start % 8 + n]
    return words[:, 0].contiguous(), words[:, 1].contiguous()


def _check_range(start: int, n: int) -> None:
    if start < 0 or n < 0 or start + n > MAX_WORDS:
        raise ValueError(
            "Exceeded the maximum number of bytes that can be encrypted with ChaCha20 for this nonce. The 32-bit "
            "counter portion of the nonce would overflow."
        )


def _blocks(subkey: bytes, counters: torch.Tensor, compiled: bool) -> torch.Tensor:
    """(M, 16) int64: the ChaCha20 blocks of the stream keyed by ``subkey`` at ``counters`` (M,) (each < 2^32), in
    kernel calls of at most ``_BATCH_BLOCKS`` blocks."""
    device = counters.device
    key_t = _const(_words32(subkey, 8), torch.int64, device)
    nonce_t = torch.zeros(3, dtype=torch.int64, device=device)
    use = compiled and compile_enabled()
    per = _batch(_BATCH_BLOCKS, device)
    parts = [
        _run("chacha", chacha20_blocks, use, key_t, nonce_t, counters[b : b + per])
        for b in range(0, len(counters), per)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def stream_words(subkey: bytes, start: int, n: int, device, *, compiled: bool = True) -> torch.Tensor:
    """int64 tensor (n,): words start..start+n-1 of the stream as 64-bit patterns (view as uint64 on the host)."""
    lo, hi = stream_halves(subkey, start, n, device, compiled=compiled)
    signed_hi = hi - ((hi >> 31) << 32)  # the top half as a signed 32-bit value: no int64 overflow below
    return signed_hi * (1 << 32) + lo


def _word_offsets(elements: torch.Tensor, total: int) -> list:
    """Offsets (from the draw's first word) of the top, middle and low 64-bit words of ``elements``.

    The host reads each block of ``noise._BLOCK`` elements as 3n words: n top words, n middle, n low.
    """
    blk = _host._BLOCK
    b, j = elements // blk, elements % blk
    n_b = torch.where(b == total // blk, total % blk, blk)
    first = 3 * blk * b + j
    return [first, first + n_b, first + 2 * n_b]


def _top_and_middle(subkey: bytes, start: int, total: int, device, compiled: bool):
    """(full, tail): the 32-bit halves (lo, hi) of the top and middle words of each of ``total`` elements whose words
    start at stream word ``start``, in the host's block layout: ``full`` two (F, 2, blk) tensors for the F whole
    blocks of ``noise._BLOCK`` elements, ``tail`` two (2, rest) tensors for the last, shorter block (None without
    one). The low words, a third of the stream, are not made: only the elements the host decides read them."""
    _check_range(start, 3 * total)
    blk = _host._BLOCK
    assert 3 * blk % 8 == 0, "an element block's words must start at the same offset in a ChaCha20 block"
    full, rest = divmod(total, blk)
    if full:
        s8 = start % 8
        per_block = (s8 + 2 * blk + 7) // 8  # the ChaCha20 blocks holding one element block's 2 blk top/middle words
        counters = (
            (start - s8) // 8  # element block b's words start at start + 3 blk b (3 blk: a multiple of 8 words)
            + torch.arange(full, dtype=torch.int64, device=device)[:, None] * (3 * blk // 8)
            + torch.arange(per_block, dtype=torch.int64, device=device)
        ).reshape(-1)
        w = _blocks(subkey, counters, compiled).reshape(full, 8 * per_block, 2)[:, s8 : s8 + 2 * blk]
        halves = [w[..., i].reshape(full, 2, blk).contiguous() for i in (0, 1)]  # one layout for the sampler
    else:
        halves = [torch.zeros((0, 2, blk), dtype=torch.int64, device=device)] * 2
    tail = None
    if rest:
        tail = [
            x.reshape(2, rest)
            for x in stream_halves(subkey, start + 3 * blk * full, 2 * rest, device, compiled=compiled)
        ]
    return halves, tail


def _words_at(subkey: bytes, positions):
    """uint64 words of the stream keyed by ``subkey`` at ``positions`` (numpy int64), made on the host's CPU by the
    same torch block function (a few, for the elements the host decides)."""
    import numpy as np

    pos = torch.from_numpy(np.asarray(positions, np.int64))
    blocks = _blocks(subkey, pos // 8, compiled=False)
    j = 2 * (pos % 8)
    rows = torch.arange(len(pos))
    lo, hi = (blocks[rows, j + i].numpy().astype(np.uint64) for i in (0, 1))
    return (hi << np.uint64(32)) | lo


def _batches(full: list, tail, c: torch.Tensor, total: int):
    """Per batch of at most ``_batch(_BATCH_ELEMS)`` elements: the words as (blocks, rows, blk) tensors in the host's
    block layout, the centres, and how many elements are real. The last, shorter block is zero-padded to a whole one
    (the sampler's statistics are per block) and joins the last batch where it has room, so that a batch of one
    block (a shape the compiled kernels specialise on) comes only from a draw of one block."""
    blk = _host._BLOCK
    per = max(1, _batch(_BATCH_ELEMS, c.device) // blk)
    nfull = full[0].shape[0]
    rest = total - nfull * blk
    for b0 in range(0, nfull + (1 if rest else 0), per):
        m = min(per, nfull - b0) if b0 < nfull else 0
        if not rest or b0 + m < nfull or m == per:  # whole blocks only
            yield b0 * blk, ([w[b0 : b0 + m] for w in full], c[b0 * blk : (b0 + m) * blk], m * blk)
            continue
        padded = []
        for w, t in zip(full, tail):
            x = w.new_zeros((m + 1,) + tuple(w.shape[1:]))
            x[:m] = w[b0 : b0 + m]
            x[m, :, :rest] = t
            padded.append(x)
        cc = c.new_zeros((m + 1) * blk)
        cc[: m * blk + rest] = c[b0 * blk :]
        yield b0 * blk, (padded, cc, m * blk + rest)


def _sampler_blocks(lo, hi, center, scalars):
    """``_sampler`` and ``_block_stats`` on (blocks, rows, blk) halves in the host's block layout (rows 0 and 1: the
    top and middle words); ``scalars`` the (5,) float64 tensor of ``_sampler``'s scalars."""
    lo0, hi0, lo1, hi1 = (x[:, i].reshape(-1) for i in (0, 1) for x in (lo, hi))
    return _block_stats(*_sampler(lo0, hi0, lo1, hi1, center, *(scalars[i] for i in range(5))), center)


def _sampler_blocks64(w, center, scalars):
    """The same on (blocks, 3, blk) 64-bit words (int64 bit patterns), as read on the host."""
    w0, w1 = w[:, 0].reshape(-1), w[:, 1].reshape(-1)
    return _block_stats(*_sampler64(w0, w1, center, *(scalars[i] for i in range(5))), center)


def rounded_gaussian(
    center: torch.Tensor,
    sigma: float,
    *,
    subkey: bytes,
    start: int,
    host_words=None,
    compiled: bool = True,
) -> tuple[torch.Tensor, int]:
    """float64 tensor like ``center``: ``g * round((center + sigma Z) / g)`` at the uniforms of stream words
    ``start``.., exactly ``NoiseStream.gaussian``'s output; and how many elements the host decided.

    ``host_words``: the 3n stream words as a numpy uint64 array already read on the host (OpenSSL), or None to
    make them on ``center``'s device with the torch block function.
    """
    import numpy as np

    device = center.device
    c = center.reshape(-1).to(torch.float64)
    total = c.numel()
    g = _host.grid_for(sigma)
    scalars = [sigma / g, 1.0 / g, g, sigma * _host.Z_ERROR / g, 2.0**-50]  # a tensor: one compiled kernel
    sc = _const(scalars, torch.float64, device)
    blk = _host._BLOCK
    if host_words is None:
        full, tail = _top_and_middle(subkey, start, total, device, compiled)
        name, fn = "sampler", _sampler_blocks
    else:
        words = torch.from_numpy(np.ascontiguousarray(host_words[: 3 * total]).view(np.int64)).to(device)
        nfull, rest = divmod(total, blk)
        full, tail = [words[: 3 * blk * nfull].reshape(nfull, 3, blk)], [words[3 * blk * nfull :].reshape(3, rest)]
        tail = tail if rest else None
        name, fn = "sampler64", _sampler_blocks64
    use = compiled and compile_enabled()
    out = torch.empty(total, dtype=torch.float64, device=device)
    flags = torch.empty(total, dtype=torch.bool, device=device)
    stats = []
    for s, (w, cc, real) in _batches(full, tail, c, total):
        values, host, cmax, tmax, finite = _run(name, fn, use, *w, cc, sc)
        out[s : s + real] = values[:real]
        flags[s : s + real] = host[:real]
        stats.append((cmax, tmax, finite))
    if not stats:
        return out.reshape(center.shape), 0
    cmax, tmax, finite = (torch.cat(x) for x in zip(*stats))
    # The one wait for the device: how many elements the host decides (a few in a large draw), any block refused?
    decided, refused = torch.stack([flags.sum(), _refused(cmax, tmax, finite, sigma, g).any().long()]).tolist()
    if not decided:
        if refused:
            _refuse_like_the_host(cmax, tmax, finite, sigma, g)
        return out.reshape(center.shape), 0
    # The host decides these from the full 192-bit U, with its code. Two more reads: which elements, then (one copy)
    # the elements, their centres and every block's statistics; the rest runs on the host's CPU.
    todo = torch.nonzero(flags).reshape(-1)
    k, nb = todo.numel(), cmax.numel()
    bits = lambda x: x.to(torch.float64).view(torch.int64)  # noqa: E731 - exact: a float64's bits
    back = torch.cat([todo, bits(c[todo]), bits(cmax), bits(tmax), bits(finite)]).cpu()
    idx, c_todo = back[:k], back[k : 2 * k].view(torch.float64).numpy()
    cmax, tmax, finite = (back[2 * k + i * nb : 2 * k + (i + 1) * nb].view(torch.float64) for i in range(3))
    offsets = np.stack([o.numpy() for o in _word_offsets(idx, total)])  # (3, k): top, middle, low words
    u = host_words[offsets] if host_words is not None else _words_at(subkey, start + offsets.reshape(-1)).reshape(3, -1)
    # The host's block statistics include these elements, from their exact p (w0 < 2^11 included, whose value the
    # device left at 0): their t counts in the block's largest t, a value that is not finite makes the block's so.
    flip, p = _host._tail_p(u)
    t_exact = _host.upper_quantile(p)
    scaled = np.where(flip, t_exact, -t_exact) * (sigma / g) + c_todo / g  # the host's arithmetic
    tmax = tmax.scatter_reduce(0, idx // blk, torch.from_numpy(t_exact), reduce="amax")
    finite = finite.scatter_reduce(0, idx // blk, torch.from_numpy(np.isfinite(scaled) * 1.0), reduce="amin")
    _refuse_like_the_host(cmax, tmax, finite != 0, sigma, g)
    # Block by block, as the host draws: a block's maxima bound its elements' error, so no refusal.
    blocks = (idx // blk).numpy()
    cuts = np.flatnonzero(np.diff(blocks)) + 1
    values = np.empty(k, np.float64)
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(blocks)]):
        values[a:b] = _host._rounded_gaussian(c_todo[a:b], float(sigma), g, np.ascontiguousarray(u[:, a:b]))
    out[todo] = _const(values, torch.float64, device)  # queued: no wait
    return out.reshape(center.shape), k


_FUNCS.update(chacha=chacha20_blocks, sampler=_sampler_blocks, sampler64=_sampler_blocks64)


def _block_error(cmax: torch.Tensor, tmax: torch.Tensor, sigma: float, g: float) -> torch.Tensor:
    """The host's error bound per block of noise._BLOCK elements, in grid units."""
    return (sigma * _host.Z_ERROR * (1.0 + tmax) + 2.0**-50 * (cmax + sigma * tmax)) / g


def _refused(cmax: torch.Tensor, tmax: torch.Tensor, finite: torch.Tensor, sigma: float, g: float) -> torch.Tensor:
    """bool per block: the host refuses it (a non-finite value, or too large an error)."""
    err = _block_error(cmax, tmax, sigma, g)
    return ~finite | ~torch.isfinite(err) | (err > 0.125)


def _refuse_like_the_host(cmax: torch.Tensor, tmax: torch.Tensor, finite: torch.Tensor, sigma: float, g: float) -> None:
    """Raise where the host would: per block of noise._BLOCK elements, a non-finite value or too large an error."""
    bad = _refused(cmax, tmax, finite, sigma, g)
    if bool(bad.any()):
        err = _block_error(cmax, tmax, sigma, g)
        b = int(torch.nonzero(bad)[0])
        if not bool(finite[b]) or not math.isfinite(float(err[b])):
            raise ArithmeticError(f"noise sampler: values overflow at sigma={sigma:g} (too large for the grid)")
        raise ArithmeticError(f"noise sampler: sigma={sigma:g} is too small for the values' size")


# ---------------------------------------------------------------- Binomial row sizes


def binomial_from_halves(lo: torch.Tensor, hi: torch.Tensor, thresholds) -> torch.Tensor:
    """int64 m per draw: how many table thresholds C_j are <= U (``NoiseStream.binomial``'s inversion).

    ``lo``, ``hi``: (3, n) halves of the 192-bit uniforms, row 0 the most significant word (the host's layout);
    ``thresholds``: the host's (M, 3) uint64 table. The comparison is exact integer arithmetic on 32-bit pieces.
    """
    import numpy as np

    th = np.asarray(thresholds, np.uint64)
    if th.shape[0] == 0:
        return torch.zeros(lo.shape[1], dtype=torch.int64, device=lo.device)
    pieces = []
    for i in range(3):  # most significant first: hi then lo of each word
        pieces.append(((th[:, i] >> np.uint64(32)).astype(np.int64), hi[i]))
        pieces.append(((th[:, i] & np.uint64(_M32)).astype(np.int64), lo[i]))
    table = _const(np.stack([t for t, _ in pieces]), torch.int64, lo.device)  # one copy, queued
    le = table[-1][None, :] <= pieces[-1][1][:, None]
    for i in range(len(pieces) - 2, -1, -1):
        t, u = table[i][None, :], pieces[i][1][:, None]
        le = (t < u) | ((t == u) & le)
    return le.sum(dim=1)


def binomial(subkey: bytes, start: int, n: int, num: int, den: int, size: int, device, *, compiled: bool = True):
    """``size`` draws of Binomial(n, num/den) from stream words start.. (3 size of them), made on ``device``:
    ``NoiseStream.binomial``'s output, element for element."""
    lo, hi = stream_halves(subkey, start, 3 * size, device, compiled=compiled)
    th = _host._binomial_thresholds(int(n), int(num), int(den))
    return binomial_from_halves(lo.reshape(3, size), hi.reshape(3, size), th)


# ---------------------------------------------------------------- distinct indices

_SIGN = -(1 << 63)  # XOR with it maps a 64-bit pattern's unsigned order onto int64's signed order


class StreamWords:
    """``take(n)``: the next ``n`` words of the stream keyed by ``subkey`` from word ``start`` on, as int64 tensors on
    ``device`` (``stream_words``); ``position`` is the next word. For drawing outside a ``NoiseStream`` (tests)."""

    def __init__(self, subkey: bytes, start: int, device, *, compiled: bool = True):
        self.subkey, self.position, self.device, self.compiled = subkey, int(start), torch.device(device), compiled

    def __call__(self, n: int) -> torch.Tensor:
        words = stream_words(self.subkey, self.position, int(n), self.device, compiled=self.compiled)
        self.position += int(n)
        return words


def _below(s: torch.Tensor, bound: int, excess: int):
    """(residues, rejected): ``NoiseStream.uniform_int``'s arithmetic on the int64 words ``s``, ``excess`` = 2^64 mod
    ``bound``; ``rejected`` is None where no word can be (``bound`` divides 2^64).

    The host accepts a word w (unsigned) when w < 2^64 - e, e = 2^64 mod bound, and returns w mod bound. Here w is
    held as the int64 s = w - 2^64 [w >= 2^63]: since e < bound <= 2^62, w is accepted iff s >= 0 or s < -e, and
    w mod bound = (s mod bound + [s < 0] e) mod bound (``remainder`` is the non-negative residue; no sum reaches
    2^63): exact integer arithmetic. Rejected words are redrawn, in order, from the next words (``_redraw``)."""
    r = torch.remainder(s, bound)
    if not excess:
        return r, None
    return torch.where(s < 0, torch.remainder(r + excess, bound), r), (s < 0) & (s >= -excess)


def _check_bound(bound: int) -> int:
    """2^64 mod ``bound``, after checking the bound."""
    if not 1 <= bound <= 1 << 62:
        raise ValueError(f"bound must be in [1, 2^62], got {bound}")
    return (1 << 64) % bound


def _redraw(take, out: torch.Tensor, todo: torch.Tensor, bound: int, excess: int) -> None:
    """Redraw the rejected elements ``out[todo]`` (ascending), in order, from the next words, as the host does."""
    while todo.numel():
        r, rejected = _below(take(todo.numel()), bound, excess)
        ok = ~rejected
        out[todo[ok]] = r[ok]
        todo = todo[rejected]


def _sparse_rows(take, n: int, l: int, rows: int, excess: int):
    """``rows`` rows of ``l`` uniform indices below ``n`` and the rows (ascending) that repeat an index: the host's
    ``uniform_int(n, (rows, l))`` then ``_has_repeat``. One wait for the device, unless a word was rejected (rare
    unless n is near 2^62: then the host's redraws, a few waits each round, and one more)."""
    out, rejected = _below(take(rows * l), n, excess)
    repeats = _has_repeat(out.reshape(rows, l))
    if rejected is None:
        return out.reshape(rows, l), torch.nonzero(repeats).reshape(-1)
    # The one wait, for both answers: a rejected word adds rows + 1 flags, more than the repeats can number.
    found = torch.nonzero(torch.cat([repeats, rejected.any().expand(rows + 1)])).reshape(-1)
    if found.numel() <= rows:  # no word rejected: these repeats are final
        return out.reshape(rows, l), found
    _redraw(take, out, torch.nonzero(rejected).reshape(-1), n, excess)
    out = out.reshape(rows, l)
    return out, torch.nonzero(_has_repeat(out)).reshape(-1)


def _has_repeat(idx: torch.Tensor) -> torch.Tensor:
    if idx.shape[1] < 2:
        return torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    s = torch.sort(idx, dim=1).values
    return (s[:, 1:] == s[:, :-1]).any(dim=1)


def _smallest_keys(take, n: int, l: int, rows: int, device) -> torch.Tensor:
    """``NoiseStream._smallest_keys`` on the device: the l smallest of n keys per row (unsigned order), ordered by
    key; rows with a tie at the cut or inside it are redrawn. Without ties the chosen indices and their order are a
    function of the keys alone, so whichever selection algorithm finds them gives the host's."""
    out = torch.empty((rows, l), dtype=torch.int64, device=device)
    todo = torch.arange(rows, device=device)
    while todo.numel():
        keys = take(todo.numel() * n).reshape(todo.numel(), n) ^ _SIGN
        if l < n:
            pk, part = torch.topk(keys, l + 1, dim=1, largest=False, sorted=True)
            tied = pk[:, l - 1] == pk[:, l]
            chosen, sel = part[:, :l], pk[:, :l]
        else:
            sel, chosen = torch.sort(keys, dim=1, stable=True)
            tied = torch.zeros(todo.numel(), dtype=torch.bool, device=device)
        tied |= (sel[:, 1:] == sel[:, :-1]).any(dim=1)  # order inside the row must be random too
        out[todo] = torch.where(tied[:, None], out[todo], chosen)
        todo = todo[torch.nonzero(tied).reshape(-1)]  # the round's one read: which rows are drawn again
    return out


def distinct(take, n: int, l: int, rows: int, device) -> torch.Tensor:
    """int64 (rows, l) on ``device``: ``NoiseStream.distinct``'s indices, element for element, from the words that
    ``take(k)`` returns (the next k words of the stream as int64 tensors; the host reads the same words in the same
    calls, so both leave the stream at the same position): the same sampler (``noise.sparse_distinct``), the same
    rejections, the same batches of keys."""
    device = torch.device(device)
    n, l, rows = int(n), int(l), int(rows)
    if not 0 <= l <= n:
        raise ValueError(f"cannot draw {l} distinct records from {n}")
    if rows == 0 or l == 0:
        return torch.zeros((rows, l), dtype=torch.int64, device=device)
    if _host.sparse_distinct(n, l):  # rows with a repeat are redrawn, in order, until none repeats
        excess = _check_bound(n)
        out, todo = _sparse_rows(take, n, l, rows, excess)
        while todo.numel():
            again, bad = _sparse_rows(take, n, l, todo.numel(), excess)
            out[todo] = again
            todo = todo[bad]
        return out
    out = torch.empty((rows, l), dtype=torch.int64, device=device)
    step = max(1, _host._DENSE_KEYS // n)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        out[start:stop] = _smallest_keys(take, n, l, stop - start, device)
    return out
