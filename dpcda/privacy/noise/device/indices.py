"""Binomial row sizes and distinct indices on a torch device: the draws of ``NoiseStream.binomial`` and
``NoiseStream.distinct``, element for element.

Binomial row sizes and distinct indices (``binomial``, ``distinct``) are the host's samplers in exact integer
arithmetic on the same words: the same rejections, redraws and table comparisons, so the same draws.
"""

from __future__ import annotations

import torch

from dpcda.privacy.noise.binomial import binomial_thresholds
from dpcda.privacy.noise.device.chacha import M32, stream_halves
from dpcda.privacy.noise.device.kernels import const
from dpcda.privacy.noise.indices import DENSE_KEYS, sparse_distinct


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
        pieces.append(((th[:, i] & np.uint64(M32)).astype(np.int64), lo[i]))
    table = const(np.stack([t for t, _ in pieces]), torch.int64, lo.device)  # one copy, queued
    le = table[-1][None, :] <= pieces[-1][1][:, None]
    for i in range(len(pieces) - 2, -1, -1):
        t, u = table[i][None, :], pieces[i][1][:, None]
        le = (t < u) | ((t == u) & le)
    return le.sum(dim=1)


def binomial(subkey: bytes, start: int, n: int, num: int, den: int, size: int, device, *, compiled: bool = True):
    """``size`` draws of Binomial(n, num/den) from stream words start.. (3 size of them), made on ``device``:
    ``NoiseStream.binomial``'s output, element for element."""
    lo, hi = stream_halves(subkey, start, 3 * size, device, compiled=compiled)
    th = binomial_thresholds(int(n), int(num), int(den))
    return binomial_from_halves(lo.reshape(3, size), hi.reshape(3, size), th)


_SIGN = -(1 << 63)  # XOR with it maps a 64-bit pattern's unsigned order onto int64's signed order


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
    calls, so both leave the stream at the same position): the same sampler (``indices.sparse_distinct``), the same
    rejections, the same batches of keys."""
    device = torch.device(device)
    n, l, rows = int(n), int(l), int(rows)
    if not 0 <= l <= n:
        raise ValueError(f"cannot draw {l} distinct records from {n}")
    if rows == 0 or l == 0:
        return torch.zeros((rows, l), dtype=torch.int64, device=device)
    if sparse_distinct(n, l):  # rows with a repeat are redrawn, in order, until none repeats
        excess = _check_bound(n)
        out, todo = _sparse_rows(take, n, l, rows, excess)
        while todo.numel():
            again, bad = _sparse_rows(take, n, l, todo.numel(), excess)
            out[todo] = again
            todo = todo[bad]
        return out
    out = torch.empty((rows, l), dtype=torch.int64, device=device)
    step = max(1, DENSE_KEYS // n)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        out[start:stop] = _smallest_keys(take, n, l, stop - start, device)
    return out
