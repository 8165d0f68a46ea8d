"""Counting: every one- and two-way count array as one flat accumulator (the core of a Beam combiner), and MST's
domain compression of it (post-processing of the noisy one-way counts)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dpcda.mechanisms.marginals.domain import Domain


class MarginalCounter:
    """Every one-way and two-way count array of a ``Domain``, as one flat int64 accumulator (merged by addition)."""

    def __init__(self, domain: Domain):
        self.domain = domain
        cliques = [(i,) for i in range(len(domain.sizes))] + list(domain.pairs)
        self.cliques = tuple(cliques)
        sizes = [math.prod(domain.sizes[i] for i in cl) for cl in cliques]
        self.offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(sizes)]))

    def create(self) -> np.ndarray:
        return np.zeros(self.offsets[-1], np.int64)

    def add(self, acc: np.ndarray, codes: np.ndarray) -> np.ndarray:
        sizes = self.domain.sizes
        for k, cl in enumerate(self.cliques):
            lo, hi = self.offsets[k], self.offsets[k + 1]
            flat = codes[:, cl[0]] if len(cl) == 1 else codes[:, cl[0]] * sizes[cl[1]] + codes[:, cl[1]]
            acc[lo:hi] += np.bincount(flat, minlength=hi - lo)
        return acc

    def merge(self, accs) -> np.ndarray:
        accs = iter(accs)
        out = np.array(next(accs), np.int64, copy=True)
        for a in accs:
            out += a
        return out

    def marginal(self, acc: np.ndarray, clique: tuple[int, ...]) -> np.ndarray:
        """The counts of ``clique`` (a column index, or a pair i < j), shaped by its columns' sizes."""
        k = self.cliques.index(tuple(clique))
        shape = tuple(self.domain.sizes[i] for i in clique)
        return acc[self.offsets[k] : self.offsets[k + 1]].reshape(shape)


COMPRESS_SIGMAS = 3.0  # MST's domain compression: a one-way cell whose noisy count is below 3 stds is merged


def compression(one_way: list, std: float) -> dict:
    """MST's domain compression (McKenna, Miklau and Sheldon 2021, Section 4; private-pgm's ``compress_domain``),
    post-processing of the noisy one-way counts: column index -> (its codes -> compressed codes), the codes whose
    noisy count is at least ``COMPRESS_SIGMAS`` stds kept in order and the others merged into one last code. A column
    with every code kept is left out. The pairs are then selected and measured on the compressed codes: cells a noisy
    count cannot tell from empty stop taking noise of their own (and mass in the fit)."""
    out = {}
    for i, y in enumerate(one_way):
        keep = np.asarray(y, np.float64) >= COMPRESS_SIGMAS * std
        if keep.all():
            continue
        m = np.full(len(keep), int(keep.sum()), np.int64)
        m[keep] = np.arange(int(keep.sum()))
        out[i] = m
    return out


class CompressedCounter:
    """A ``MarginalCounter``'s exact marginals on compressed codes (``compression``): each count summed into its
    compressed cell (a record still adds 1 to one cell of each marginal: the sensitivities are the uncompressed
    ones)."""

    def __init__(self, counter: "MarginalCounter", mapping: dict):
        self.counter, self.mapping = counter, mapping
        self.domain = compressed_domain(counter.domain, mapping)

    def _compress(self, table: np.ndarray, clique: tuple) -> np.ndarray:
        for axis, col in enumerate(clique):
            if col in self.mapping:
                m = self.mapping[col]
                moved = np.moveaxis(table, axis, 0)
                out = np.zeros((int(m.max()) + 1, *moved.shape[1:]), table.dtype)
                np.add.at(out, m, moved)
                table = np.moveaxis(out, 0, axis)
        return table

    def marginal(self, acc: np.ndarray, clique: tuple) -> np.ndarray:
        return self._compress(self.counter.marginal(acc, clique), clique)

    def one_way(self, col: int, noisy: np.ndarray) -> np.ndarray:
        """A noisy one-way count vector summed into the compressed cells (the merged cell's noise std grows)."""
        return self._compress(np.asarray(noisy, np.float64), (col,))


def compressed_domain(dom: Domain, mapping: dict) -> Domain:
    """``dom`` with each compressed column's size its compressed one (``compression``)."""
    return dataclasses.replace(
        dom, sizes=tuple(int(mapping[i].max()) + 1 if i in mapping else s for i, s in enumerate(dom.sizes))
    )
