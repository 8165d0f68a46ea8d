"""Beam-free core of the plan-and-join mixing path: groups of any size, no group ever on one worker.

The in-memory path (``mechanisms.dpcda.mix_class``, ``mechanisms.dpmix.mix_dataset``) holds a whole group (a class
for DP-CDA, the dataset for DPMix) as one matrix. This path never does:

1. Every record gets a deterministic index within its group: groups are numbered in the order of the input blocks,
   sorted by (shard path, first row), from the first pass's per-block counts (``record_offsets``).
2. The records are cut into join blocks of ``R`` consecutive indices: ((group, j), piece of normalised rows)
   (``record_pieces``).
3. Each chunk of synthetic rows draws its index sets from the same key-derived stream as the in-memory path
   (("mix-index", k, chunk) or ("dpmix-index", chunk); ``privacy.noise``) and sends each sampled index to its join
   block: ((group, j), (chunk, positions, row ids)) (``chunk_requests``). T l index pairs in all.
4. A join block gathers its records and sums, per requested row, the records it holds: ((group, chunk), partial
   sums) (``block_partials``).
5. A chunk adds its partial sums in the order of the join blocks (so the float result does not depend on the
   order the runner delivers them), divides by l and adds noise from the chunk's stream (``finish_chunk``): the
   same draws as the in-memory path's chunk.

Given the same index order the two paths draw the same index sets and the same noise; they differ only in the order
the float64 sums are formed. The sensitivity argument of ``mechanisms.dpcda`` bounds the rounding of a sum of at most
``MAX_ROW_RECORDS`` records clipped below ``c (1 - 2^-21)`` in ANY order, so it holds here unchanged, and the privacy
events are the same (the manifest says which path mixed each group; no privacy number depends on it).

Memory of a worker, whatever the group size: a join block's records (R d 8 bytes) plus its requests (16 bytes per
sampled index that falls in it), and a chunk's partial sums (at most chunk_rows min(l, blocks) (d + K) 8 bytes).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Iterable, Iterator, Optional

import numpy as np

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Grouping
from dpcda.mechanisms.dpcda import label_scores, noisy_labels, sample_rows
from dpcda.mechanisms.normalization import normalize_into
from dpcda.mechanisms.postprocess import make_postprocess
from dpcda.privacy.noise import NoiseStream


@dataclasses.dataclass(frozen=True)
class Streams:
    """The key-derived streams of a group's chunk: the in-memory path's names, so both paths draw the same bits."""

    mechanism: str

    @property
    def one_group(self) -> bool:
        """The whole dataset is one group (DPMix's streams), not one group per class."""
        return _one_group(self.mechanism)

    def index(self, key: bytes, group: int, chunk: int) -> NoiseStream:
        if self.one_group:
            return NoiseStream(key, "dpmix-index", chunk)
        return NoiseStream(key, "mix-index", group, chunk)

    def noise(self, key: bytes, group: int, chunk: int) -> NoiseStream:
        if self.one_group:
            return NoiseStream(key, "dpmix-noise", chunk)
        return NoiseStream(key, "mix-noise", group, chunk)

    def label(self, key: bytes, group: int, chunk: int) -> NoiseStream:
        if self.one_group:
            return NoiseStream(key, "dpmix-label", chunk)
        return NoiseStream(key, "label", group, chunk)


def _one_group(mechanism: str) -> bool:
    return registry.get(mechanism).grouping is Grouping.DATASET


def groups_of(mechanism: str, labels: np.ndarray) -> np.ndarray:
    """The group of each record: its class (dpcda) or 0, the whole dataset (dpmix)."""
    labels = np.asarray(labels, np.int64)
    return np.zeros_like(labels) if _one_group(mechanism) else labels


def block_counts(mechanism: str, labels: np.ndarray, num_groups: int) -> np.ndarray:
    return np.bincount(groups_of(mechanism, labels), minlength=num_groups).astype(np.int64)


def record_offsets(counts: Iterable[tuple[tuple[str, int], np.ndarray]], num_groups: int) -> dict:
    """{(source, first_row): int64 (G,) index of the block's first record of each group}, blocks in sorted order."""
    items = sorted(((tuple(k), np.asarray(v, np.int64)) for k, v in counts), key=lambda kv: kv[0])
    running = np.zeros(num_groups, np.int64)
    out = {}
    for k, v in items:
        out[k] = running.copy()
        running[: len(v)] += v[:num_groups]
    return out


def record_pieces(
    features: np.ndarray,
    labels: np.ndarray,
    offsets: np.ndarray,
    *,
    mechanism: str,
    groups: Iterable[int],
    block_rows: int,
    mean,
    std,
    clip: float,
    bounds,
) -> Iterator[tuple[tuple[int, int], tuple[int, np.ndarray, np.ndarray]]]:
    """((group, j), (first position in join block j, float64 normalised rows, int64 labels)) for the block's records
    of ``groups``; a group's records keep the block's row order, so their indices are offsets[g], offsets[g] + 1, ..."""
    grp = groups_of(mechanism, labels)
    labels = np.asarray(labels, np.int64)
    for g in groups:
        mask = grp == g
        m = int(mask.sum())
        if m == 0:
            continue
        x = np.empty((m, features.shape[1]), np.float64)
        normalize_into(x, features[mask], mean, std, clip, bounds)
        y = labels[mask]
        start = int(offsets[g])
        pos = 0
        while pos < m:
            j, at = divmod(start + pos, block_rows)
            take = min(m - pos, block_rows - at)
            yield (int(g), int(j)), (at, x[pos : pos + take], y[pos : pos + take])
            pos += take


def chunk_requests(
    *,
    streams: Streams,
    key: bytes,
    group: int,
    chunk: int,
    records: int,
    mode: str,
    mixing_order: int,
    rows: int,
    sampling_rate: Fraction,
    block_rows: int,
) -> Iterator[tuple[tuple[int, int], tuple[int, np.ndarray, np.ndarray]]]:
    """((group, j), (chunk, positions within join block j, row ids within the chunk)) for the chunk's index sets."""
    flat, offsets = sample_rows(
        records,
        mode=mode,
        mixing_order=mixing_order,
        rows=rows,
        stream=streams.index(key, group, chunk),
        sampling_rate=sampling_rate,
    )
    if not flat.size:
        return
    row_of = np.repeat(np.arange(rows, dtype=np.int32), np.diff(np.append(offsets, len(flat))))
    j = flat // block_rows
    order = np.argsort(j, kind="stable")
    j, flat, row_of = j[order], flat[order], row_of[order]
    cuts = np.flatnonzero(np.diff(j)) + 1
    for part_j, part_pos, part_rows in zip(np.split(j, cuts), np.split(flat, cuts), np.split(row_of, cuts)):
        yield (int(group), int(part_j[0])), (int(chunk), part_pos - int(part_j[0]) * block_rows, part_rows)


def block_partials(
    group: int,
    j: int,
    values: Iterable[tuple[str, tuple]],
    *,
    dim: int,
    num_classes: int,
    with_labels: bool,
) -> Iterator[tuple[tuple[int, int], tuple[int, np.ndarray, np.ndarray, Optional[np.ndarray]]]]:
    """Join block (group, j): ``values`` are ('rec', piece) and ('req', request) in any order. Yields ((group,
    chunk), (j, row ids, float64 sums of the rows' records held here, label counts or None)), one per chunk."""
    pieces, requests = [], []
    for tag, value in values:
        (pieces if tag == "rec" else requests).append(value)
    if not requests:
        return
    size = max((at + len(x) for at, x, _ in pieces), default=0)
    x = np.zeros((size, dim), np.float64)
    y = np.zeros(size, np.int64)
    for at, part, lab in pieces:
        x[at : at + len(part)] = part
        y[at : at + len(part)] = lab
    for chunk, positions, row_ids in sorted(requests, key=lambda r: r[0]):
        if positions.size and int(positions.max()) >= size:
            raise RuntimeError(f"join block ({group}, {j}): a sampled index has no record")  # never expected
        order = np.lexsort((positions, row_ids))  # per row, its records in index order: a fixed summation order
        pos, rid = positions[order], row_ids[order]
        starts = np.flatnonzero(np.concatenate([[True], rid[1:] != rid[:-1]]))
        sums = np.add.reduceat(x[pos], starts, axis=0)
        counts = None
        if with_labels:
            onehot = np.zeros((len(pos), num_classes), np.float64)
            onehot[np.arange(len(pos)), y[pos]] = 1.0
            counts = np.add.reduceat(onehot, starts, axis=0)
        yield (int(group), int(chunk)), (int(j), rid[starts], sums, counts)


def finish_chunk(
    partials: Iterable,
    *,
    streams: Streams,
    key: bytes,
    group: int,
    chunk: int,
    rows: int,
    dim: int,
    num_classes: int,
    mixing_order: int,
    sigma_x: float,
    sigma_y: float,
    soft_labels: bool,
    lowpass=None,
    denoise=None,
) -> tuple[np.ndarray, np.ndarray]:
    """(float32 features (rows, d), labels) of one chunk: its partial sums added in join-block order, / l, noised.

    ``partials`` may hold None markers (a chunk whose rows drew no record still gets its rows of noise)."""
    parts = sorted((p for p in partials if p is not None), key=lambda p: p[0])
    sums = np.zeros((rows, dim), np.float64)
    counts = np.zeros((rows, num_classes), np.float64) if streams.one_group else None
    for _, rid, s, c in parts:
        sums[rid] += s
        if counts is not None:
            counts[rid] += c
    feats = streams.noise(key, group, chunk).gaussian(sums / mixing_order, sigma_x).astype(np.float32)
    post = make_postprocess(lowpass=lowpass, denoise=denoise)
    if post is not None:
        feats = post(feats)
    if streams.one_group:
        scores = streams.label(key, group, chunk).gaussian(counts / mixing_order, sigma_y)
        return feats, scores.astype(np.float32)
    label_stream = streams.label(key, group, chunk) if sigma_y > 0 else None
    if soft_labels:
        return feats, label_scores(group, num_classes, sigma_y, rows, label_stream).astype(np.float32)
    return feats, noisy_labels(group, num_classes, sigma_y, rows, label_stream)
