"""The Gaussian sampler on a torch device: ``NoiseStream.gaussian``'s output, element for element.

Gaussian. For each element the device reads the same two top words of the 192-bit uniform U that the host reads
(word layout of ``NoiseStream._uniform_words``, blocks of ``BLOCK`` elements; only those words are made in
bulk, a third of the keystream fewer), forms the same float64 p, evaluates Wichura's AS 241 in float64 and rounds
to the grid. Its float error obeys the bound the host assumes (``Z_ERROR``; tested against mpmath), so
wherever the float value lies farther than (twice) that bound from a cell boundary, its cell is the exact cell at
u, the host's output. Every other element (a near-boundary cell, p's rare low-precision case w0 < 2^11, a
non-finite value) is handed back to the host, which decides it with its own code from the full U (its three words
taken from the host's words or, where the device made them, made again at their positions; block by block; a
block's largest t includes the host's t of these elements, so the device refuses exactly where the host does). The
output is therefore the exact rounded Gaussian at U, element for element the host's, every zero +0.0; the tests
check that identity, in the bits, on CPU tensors and, where present, on CUDA.

Waiting. On a card every read of a value back to the host, and every blocking copy to it, waits for all the work
queued before it, so the card idles while the host catches up. The draws read back only what the host must know:
a Gaussian once where the host decides no element (how many it decides, whether a block is refused) and three
times where it does (a mixing chunk of 65,536 rows of 784 usually has a few such elements), the index sampler once
per round of redraws (which rows are drawn again: the next round's word count). Keys, scalars and tables go to the
card from page-locked memory without a wait (``const``).
"""

from __future__ import annotations

import math

import torch

import dpcda.privacy.noise.device.chacha as chacha
from dpcda.privacy.noise.constants import BLOCK, Z_ERROR
from dpcda.privacy.noise.device.chacha import M32
from dpcda.privacy.noise.device.kernels import BATCH_ELEMS, batch, compile_enabled, const, run
from dpcda.privacy.noise.gaussian import grid_for, tail_p
from dpcda.privacy.noise.gaussian import rounded_gaussian as host_rounded_gaussian
from dpcda.privacy.noise.inverse_normal import A, B, C, D, E, F
from dpcda.privacy.noise.inverse_normal import upper_quantile as host_upper_quantile


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

    num = _poly([pick(i, A, C, E) for i in range(8)], x)
    den = _poly([pick(i, B, D, F) for i in range(8)], x)
    ratio = num / den
    return torch.where(tail, ratio, -(ratio * q))


def _sampler(lo0, hi0, lo1, hi1, center, sigma_over_g, inv_g, g, err_t, err_c):
    """The rounded Gaussian k g per element (0 where the host must decide), a flag for elements the host must
    decide, and t, for ``_block_stats`` (0 where p is imprecise: ``rounded_gaussian`` adds the host's t there).

    (lo, hi) are the 32-bit halves of the uniform's two top words; the arithmetic is the host's
    (``gaussian.rounded_gaussian``).
    err_t, err_c: the host's error bound per element, err = err_t (1 + t) + err_c (|c| + sigma t) in grid units.
    """
    flip = hi0 >> 31  # U >= 2^191: z = +t, and U' = 2^192 - 1 - U
    mask = (-flip) & M32
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
    """Per block of ``BLOCK`` elements: max |c|, max t and whether every value is finite (the host's
    refusal test); padding (U = 0, c = 0) changes none of them."""
    blk = BLOCK
    return (
        values,
        host,
        center.abs().reshape(-1, blk).amax(dim=1),
        t.reshape(-1, blk).amax(dim=1),
        torch.isfinite(values).reshape(-1, blk).all(dim=1),
    )


def _sampler64(w0, w1, center, *scalars):
    """``_sampler`` on 64-bit words (int64 bit patterns), as read on the host."""
    return _sampler(w0 & M32, (w0 >> 32) & M32, w1 & M32, (w1 >> 32) & M32, center, *scalars)


def _word_offsets(elements: torch.Tensor, total: int) -> list:
    """Offsets (from the draw's first word) of the top, middle and low 64-bit words of ``elements``.

    The host reads each block of ``BLOCK`` elements as 3n words: n top words, n middle, n low.
    """
    blk = BLOCK
    b, j = elements // blk, elements % blk
    n_b = torch.where(b == total // blk, total % blk, blk)
    first = 3 * blk * b + j
    return [first, first + n_b, first + 2 * n_b]


def _top_and_middle(subkey: bytes, start: int, total: int, device, compiled: bool):
    """(full, tail): the 32-bit halves (lo, hi) of the top and middle words of each of ``total`` elements whose words
    start at stream word ``start``, in the host's block layout: ``full`` two (F, 2, blk) tensors for the F whole
    blocks of ``BLOCK`` elements, ``tail`` two (2, rest) tensors for the last, shorter block (None without
    one). The low words, a third of the stream, are not made: only the elements the host decides read them."""
    chacha.check_range(start, 3 * total)
    blk = BLOCK
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
        w = chacha.stream_blocks(subkey, counters, compiled).reshape(full, 8 * per_block, 2)[:, s8 : s8 + 2 * blk]
        halves = [w[..., i].reshape(full, 2, blk).contiguous() for i in (0, 1)]  # one layout for the sampler
    else:
        halves = [torch.zeros((0, 2, blk), dtype=torch.int64, device=device)] * 2
    tail = None
    if rest:
        tail = [
            x.reshape(2, rest)
            for x in chacha.stream_halves(subkey, start + 3 * blk * full, 2 * rest, device, compiled=compiled)
        ]
    return halves, tail


def _batches(full: list, tail, c: torch.Tensor, total: int):
    """Per batch of at most ``batch(BATCH_ELEMS)`` elements: the words as (blocks, rows, blk) tensors in the host's
    block layout, the centres, and how many elements are real. The last, shorter block is zero-padded to a whole one
    (the sampler's statistics are per block) and joins the last batch where it has room, so that a batch of one
    block (a shape the compiled kernels specialise on) comes only from a draw of one block."""
    blk = BLOCK
    per = max(1, batch(BATCH_ELEMS, c.device) // blk)
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
    g = grid_for(sigma)
    scalars = [sigma / g, 1.0 / g, g, sigma * Z_ERROR / g, 2.0**-50]  # a tensor: one compiled kernel
    sc = const(scalars, torch.float64, device)
    blk = BLOCK
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
        values, host, cmax, tmax, finite = run(name, fn, use, *w, cc, sc)
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
    u = (
        host_words[offsets]
        if host_words is not None
        else chacha.words_at(subkey, start + offsets.reshape(-1)).reshape(3, -1)
    )
    # The host's block statistics include these elements, from their exact p (w0 < 2^11 included, whose value the
    # device left at 0): their t counts in the block's largest t, a value that is not finite makes the block's so.
    flip, p = tail_p(u)
    t_exact = host_upper_quantile(p)
    scaled = np.where(flip, t_exact, -t_exact) * (sigma / g) + c_todo / g  # the host's arithmetic
    tmax = tmax.scatter_reduce(0, idx // blk, torch.from_numpy(t_exact), reduce="amax")
    finite = finite.scatter_reduce(0, idx // blk, torch.from_numpy(np.isfinite(scaled) * 1.0), reduce="amin")
    _refuse_like_the_host(cmax, tmax, finite != 0, sigma, g)
    # Block by block, as the host draws: a block's maxima bound its elements' error, so no refusal.
    blocks = (idx // blk).numpy()
    cuts = np.flatnonzero(np.diff(blocks)) + 1
    values = np.empty(k, np.float64)
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(blocks)]):
        values[a:b] = host_rounded_gaussian(c_todo[a:b], float(sigma), g, np.ascontiguousarray(u[:, a:b]))
    out[todo] = const(values, torch.float64, device)  # queued: no wait
    return out.reshape(center.shape), k


def _block_error(cmax: torch.Tensor, tmax: torch.Tensor, sigma: float, g: float) -> torch.Tensor:
    """The host's error bound per block of BLOCK elements, in grid units."""
    return (sigma * Z_ERROR * (1.0 + tmax) + 2.0**-50 * (cmax + sigma * tmax)) / g


def _refused(cmax: torch.Tensor, tmax: torch.Tensor, finite: torch.Tensor, sigma: float, g: float) -> torch.Tensor:
    """bool per block: the host refuses it (a non-finite value, or too large an error)."""
    err = _block_error(cmax, tmax, sigma, g)
    return ~finite | ~torch.isfinite(err) | (err > 0.125)


def _refuse_like_the_host(cmax: torch.Tensor, tmax: torch.Tensor, finite: torch.Tensor, sigma: float, g: float) -> None:
    """Raise where the host would: per block of BLOCK elements, a non-finite value or too large an error."""
    bad = _refused(cmax, tmax, finite, sigma, g)
    if bool(bad.any()):
        err = _block_error(cmax, tmax, sigma, g)
        b = int(torch.nonzero(bad)[0])
        if not bool(finite[b]) or not math.isfinite(float(err[b])):
            raise ArithmeticError(f"noise sampler: values overflow at sigma={sigma:g} (too large for the grid)")
        raise ArithmeticError(f"noise sampler: sigma={sigma:g} is too small for the values' size")
