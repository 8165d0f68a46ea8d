"""Fitting and sampling (post-processing of the noisy counts): mbi's mirror descent, its sampler, MST's
decompression.

mbi's columns are named by their index in the code domain (``columns``), never by their names: mbi's sampler walks
sets of column names (a column's parents, in set order), so the order of the parents, and with it which uniform goes
to which row, followed Python's string hashes, salted per process (PYTHONHASHSEED). Integers hash to themselves: a
seeded release draws the same rows in every process."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from dpcda.mechanisms import pgm
from dpcda.mechanisms.marginals.counting import compressed_domain
from dpcda.mechanisms.marginals.domain import Domain
from dpcda.mechanisms.marginals.limits import SAMPLE_ROWS
from dpcda.mechanisms.marginals.plan import MarginalsPlan, Measurements
from dpcda.privacy.noise import NoiseStream


def _mbi():
    return pgm.load_mbi()


def merged(mbi, ms: list) -> list:
    """Measurements of one clique merged into one by inverse-variance weighting (their L2 loss is the same up to a
    constant, so is the fit; so is mbi's minimum-variance total): the fit's program is the same while no new clique
    is measured, and mbi compiles it once."""
    groups: dict = {}
    for m in ms:
        groups.setdefault(m.clique, []).append(m)
    out = []
    for clique, group in groups.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        w = [1.0 / float(m.stddev) ** 2 for m in group]
        y = sum(wi * np.asarray(m.noisy_measurement, np.float64) for wi, m in zip(w, group)) / sum(w)
        out.append(mbi.LinearMeasurement(y, clique, stddev=1.0 / math.sqrt(sum(w))))
    return out


def columns(dom: Domain) -> list[int]:
    """mbi's names of ``dom``'s columns: their indices (module docstring)."""
    return list(range(len(dom.names)))


def fit(measured: Measurements, plan: MarginalsPlan, rules=None):
    """mbi's graphical model fitted to the noisy counts by mirror descent (``plan.iterations`` steps), its columns
    named by index (``columns``); with ``rules`` (``rules.KeptRules``), fitted and sampled under their constraints."""
    mbi = _mbi()
    dom = plan.domain
    full = mbi.Domain(columns(dom), list(dom.sizes))
    small = compressed_domain(dom, measured.mapping)
    domain = mbi.Domain(columns(dom), list(small.sizes))
    ms = [  # a compressed one-way count: the merged cell's sum, weighted by mbi (WeightedQuery) for its larger std
        mbi.LinearMeasurement(np.asarray(y, np.float64).ravel(), (i,), stddev=measured.one_way_std).compress(
            dict(measured.mapping), full
        )
        for i, y in enumerate(measured.one_way)
    ]
    ms += [
        mbi.LinearMeasurement(np.asarray(y, np.float64).ravel(), tuple(int(i) for i in cl), stddev=std)
        for cl, y, std in zip(measured.pairs, measured.two_way, measured.stds)
    ]
    ms = merged(mbi, ms)
    constraints = rules.constrain(mbi, domain, measured.mapping, [m.clique for m in ms]) if rules else ()
    model = mbi.estimation.MirrorDescent().estimate(
        domain, ms, iters=plan.iterations, warm_start=measured.model, constraints=constraints
    )
    return rules.sampled_under(model, constraints) if constraints else model


def warm_start(model, dom: Domain):
    """The rounds' last model (``pgm.Model``) as mbi's potentials (columns named by index), the last fit's starting
    point."""
    mbi = _mbi()
    import jax.numpy as jnp

    domain = mbi.Domain(columns(dom), list(dom.sizes))
    theta = model.potentials_for(columns(dom))
    tables = {cl: mbi.Factor(domain.project(cl), jnp.asarray(v)) for cl, v in theta.items()}
    return mbi.CliqueVector(domain, list(tables), tables)


def sample_codes(model, rows: int, plan: MarginalsPlan, key: bytes, block_rows: int = SAMPLE_ROWS):
    """(<= block_rows, columns) blocks of codes, ``rows`` in all, drawn from the fitted model by mbi (its columns named
    by index: ``columns``), one call per
    block (each block its own randomized rounding of the model's marginals), so memory does not grow with ``rows``.
    mbi draws from numpy's global generator: ``privacy.noise.NumpyGlobalState`` seeds it from the noise stream for the
    first block, carries it from block to block and restores the caller's state around each call (post-processing)."""
    from dpcda.privacy.noise import NumpyGlobalState

    generator = NumpyGlobalState(NoiseStream(key, "marginals", "sample"))
    for lo in range(0, rows, block_rows):
        with generator:
            data = model.synthetic_data(rows=min(block_rows, rows - lo))
        cols = data.to_dict()
        yield np.stack([np.asarray(cols[i], np.int64) for i in columns(plan.domain)], axis=1)


def code_weights(one_way, absent: Optional[dict] = None) -> list[np.ndarray]:
    """Per column, the weight of each code in a merged draw (``decompress``): its noisy one-way count clamped at zero
    (post-processing of DP outputs), zero for an absent residual code (``residual.absent_codes``)."""
    out = [np.maximum(np.asarray(y, np.float64).ravel(), 0.0) for y in one_way]
    for col, codes in (absent or {}).items():
        out[col][list(codes)] = 0.0
    return out


def decompress(codes: np.ndarray, mapping: dict, stream: NoiseStream, weights=None) -> np.ndarray:
    """Codes of the compressed domain back to the column's own: a kept code to its code, the merged code to one of the
    codes merged into it. With ``weights`` (``code_weights``), in proportion to the merged codes' weights (``stream``'s
    uniforms; a code the data never holds gets only its noise's positive part, where a uniform choice gives it as
    much as a real rare cell), uniformly where they are all zero; without, uniformly (``stream``'s uniform integers),
    as private-pgm's ``reverse_data`` does."""
    out = np.array(codes, np.int64, copy=True)
    for col, m in sorted(mapping.items()):
        kept, merged_codes = np.flatnonzero(m < m.max()), np.flatnonzero(m == m.max())  # kept: in compressed order
        c = codes[:, col]
        rare = np.flatnonzero(c == m.max())
        out[c < m.max(), col] = kept[c[c < m.max()]]
        w = None if weights is None else weights[col][merged_codes]
        if w is None or not w.sum() > 0:
            out[rare, col] = merged_codes[stream.uniform_int(len(merged_codes), rare.size)]
        else:
            cdf = np.cumsum(w) / w.sum()
            pick = np.searchsorted(cdf, stream.uniform(rare.size), side="right")
            out[rare, col] = merged_codes[np.minimum(pick, len(merged_codes) - 1)]
    return out
