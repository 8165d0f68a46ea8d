"""Beam-free DP-CDA mixing (seed 000, Algorithm 1, steps 8-14): indices and noise from ``privacy.noise``.

One class at a time: ``T_k`` synthetic rows in chunks of ``chunk_rows``. Each chunk draws its indices from the
stream ("mix-index", k, chunk) and its noise from ("mix-noise", k, chunk), so a retried chunk reproduces its rows.
Rows are gathered and summed with ``embedding_bag`` in float64 (CUDA when present, the same code on the CPU; no
(rows, l, d) intermediate), then the noise is drawn on the CPU: every released value is
``g * round((mean + sigma_x Z) / g)`` (``NoiseStream.gaussian``).

fixed: each row averages exactly ``l`` distinct records, a uniform l-subset (exact).
poisson: each record joins a row independently with probability q (m ~ Binomial(N_k, q) by exact inversion, then a
uniform m-subset); the sum is divided by ``l``, not m, so the sensitivity stays c / l.

Sensitivity in the bits. Records reach the mixer clipped to ``c (1 - CLIP_MARGIN)`` (``plan.normalize``; float32
rounding keeps them below ``c (1 - 2^-21)``). The mean is computed as fl(fl(sum)/l) in float64, whose error is at
most gamma_{m-1} m c / l + 2^-53 m c / l in L2 (m <= MAX_ROW_RECORDS records per row, gamma_j = j 2^-53 / (1 - j
2^-53)); two neighbouring outputs therefore differ by at most (2c/l) (1 - 2^-21 + m^2 2^-52) <= 2c/l (fixed) and
c/l (poisson) in L2, the sensitivities the accountant assumes.

Optional low-pass post-processing (``lowpass``): every finished noisy row is projected onto the span of its
low-frequency 2-D DCT basis images (frequencies u + v < K on the feature image's (H, W) grid, per channel).
The projection is public and fixed before any data is seen, and it acts on the DP output only, so it is
post-processing: the privacy guarantee is unchanged. It keeps most of an image's energy and removes the
noise outside the kept subspace (on Fashion-MNIST, K = 16 keeps 136 of 784 coefficients).
"""
from __future__ import annotations

import logging
from fractions import Fraction
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from privacy.events import MAX_ROW_RECORDS
from privacy.noise import NoiseStream

log = logging.getLogger(__name__)


def pick_device(preference: str = "auto") -> torch.device:
    """CUDA when present and asked for ('auto', 'cuda', 'cuda:N'), else the CPU, with a warning if CUDA was named."""
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(preference)
    if dev.type == "cuda" and not torch.cuda.is_available():
        log.warning("device=%s asked for but CUDA is not available; using the CPU", preference)
        return torch.device("cpu")
    return dev


def canonical_order(features: np.ndarray) -> np.ndarray:
    """A permutation sorting rows by their bytes: the order rows arrive in never changes the output."""
    rows = np.ascontiguousarray(features)
    return np.argsort(rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel(), kind="stable")


def sample_rows(n: int, *, mode: str, mixing_order: int, rows: int, stream: NoiseStream,
                sampling_rate: Fraction = Fraction(0)) -> tuple[np.ndarray, np.ndarray]:
    """(flat indices, offsets): row i holds indices flat[offsets[i]:offsets[i+1]] into range(n)."""
    if mode == "fixed":
        idx = stream.distinct(n, mixing_order, rows)
        return idx.reshape(-1), np.arange(rows, dtype=np.int64) * mixing_order
    m = stream.binomial(n, sampling_rate, rows)
    width = int(m.max()) if rows else 0
    if width > MAX_ROW_RECORDS:
        raise ValueError(f"a poisson row drew {width} records, above {MAX_ROW_RECORDS}")
    idx = stream.distinct(n, width, rows)  # uniform order, so each row's first m_i form a uniform m_i-subset
    keep = np.arange(width)[None, :] < m[:, None]
    offsets = np.zeros(rows, np.int64)
    offsets[1:] = np.cumsum(m)[:-1]
    return idx[keep], offsets


def mix_chunk(x: torch.Tensor, *, mode: str, mixing_order: int, sigma_x: float, rows: int,
              index_stream: NoiseStream, noise_stream: NoiseStream,
              sampling_rate: Fraction = Fraction(0), order: Optional[torch.Tensor] = None) -> np.ndarray:
    """``rows`` synthetic float64 feature rows from the float64 class matrix ``x`` (on its device).

    ``order`` (optional) maps sampled positions to rows of ``x`` (the canonical order of the class).
    """
    if mode == "fixed" and mixing_order > MAX_ROW_RECORDS:
        raise ValueError(f"mixing_order {mixing_order} is above {MAX_ROW_RECORDS}")
    flat, offsets = sample_rows(x.shape[0], mode=mode, mixing_order=mixing_order, rows=rows, stream=index_stream,
                                sampling_rate=sampling_rate)
    if flat.size:
        idx = torch.from_numpy(flat).to(x.device)
        if order is not None:
            idx = order[idx]
        sums = torch.nn.functional.embedding_bag(idx, x, torch.from_numpy(offsets).to(x.device), mode="sum")
        means = (sums / mixing_order).cpu().numpy()
    else:  # every row empty (an empty poisson class, or q small): the sums are 0
        means = np.zeros((rows, x.shape[1]), np.float64)
    return noise_stream.gaussian(means, sigma_x)


def dct_matrix(n: int) -> np.ndarray:
    """Orthonormal DCT-II matrix (n, n): row u is the u-th cosine basis vector."""
    i = np.arange(n)
    c = np.cos(np.pi * (2 * i[None, :] + 1) * i[:, None] / (2 * n)) * np.sqrt(2.0 / n)
    c[0] /= np.sqrt(2.0)
    return c


def lowpass_kept(image_shape: Sequence[int], k: int) -> tuple[tuple[int, int, int], int]:
    """((C, H, W), coefficients kept) for a low-pass with frequencies u + v < k; checks both arguments."""
    shape = tuple(int(s) for s in image_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"image_shape must be (H, W) or (C, H, W), got {image_shape}")
    if k < 1:
        raise ValueError(f"lowpass K must be >= 1, got {k}")
    _, h, w = shape
    return shape, shape[0] * sum(1 for u in range(h) for v in range(w) if u + v < k)


def lowpass_basis(image_shape: Sequence[int], k: int) -> np.ndarray:
    """(kept, d) orthonormal rows spanning the 2-D DCT images with u + v < k, per channel.

    ``image_shape`` is (H, W) or (C, H, W) with d = prod(image_shape), features in C-major (channels-first)
    order. ``rows @ B.T @ B`` is then the orthogonal projection of each row onto the low frequencies.
    """
    shape, _ = lowpass_kept(image_shape, k)
    ch, h, w = shape
    ch_h, ch_w = dct_matrix(h), dct_matrix(w)
    freqs = [(u, v) for u in range(h) for v in range(w) if u + v < k]
    plane = np.stack([np.outer(ch_h[u], ch_w[v]).ravel() for u, v in freqs])  # (kept per channel, H*W)
    basis = np.zeros((ch * len(freqs), ch * h * w))
    for c in range(ch):
        basis[c * len(freqs):(c + 1) * len(freqs), c * h * w:(c + 1) * h * w] = plane
    return basis.astype(np.float32)


class LowPass:
    """The projection of ``lowpass_basis`` applied separably: DCT along H and W, keep u + v < k, inverse DCT.

    O(rows * C * H * W * (H + W)) work and no (kept, d) matrix, so it scales to large images.
    """

    def __init__(self, image_shape: Sequence[int], k: int, device):
        shape, _ = lowpass_kept(image_shape, k)
        self.shape, self.dim = shape, int(np.prod(shape))
        _, h, w = shape
        self.ch = torch.from_numpy(dct_matrix(h).astype(np.float32)).to(device)
        self.cw = torch.from_numpy(dct_matrix(w).astype(np.float32)).to(device)
        u, v = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        self.mask = torch.from_numpy(((u + v) < k).astype(np.float32)).to(device)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        x = rows.reshape(rows.shape[0], *self.shape)
        coef = self.ch @ x @ self.cw.T * self.mask
        return (self.ch.T @ coef @ self.cw).reshape(rows.shape[0], self.dim)


def label_scores(class_index: int, num_classes: int, sigma_y: float, rows: int,
                 stream: Optional[NoiseStream]) -> np.ndarray:
    """(rows, K) float64 scores e_k + N(0, sigma_y^2 I_K) on sigma_y's grid: the one-hot mean of a same-class mix."""
    scores = np.zeros((rows, num_classes), np.float64)
    scores[:, class_index] = 1.0
    return stream.gaussian(scores, sigma_y) if sigma_y > 0 else scores


def noisy_labels(class_index: int, num_classes: int, sigma_y: float, rows: int,
                 stream: Optional[NoiseStream]) -> np.ndarray:
    """argmax(e_k + N(0, sigma_y^2 I_K)); exactly k when sigma_y is 0 (the one-hot mean is e_k)."""
    if sigma_y > 0:
        return label_scores(class_index, num_classes, sigma_y, rows, stream).argmax(axis=1)
    return np.full(rows, class_index, dtype=np.int64)


def mix_class(features: np.ndarray, *, key: bytes, class_index: int, num_classes: int, mode: str,
              mixing_order: int, sigma_x: float, samples: int, chunk_rows: int,
              sampling_rate: Fraction | float = Fraction(0), sigma_y: float = 0.0,
              device: str | torch.device = "cpu", chunks=None, lowpass: Optional[tuple[Sequence[int], int]] = None,
              soft_labels: bool = False) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (chunk, float32 features, labels) for class ``class_index``; ``chunks`` limits which chunks.

    ``lowpass=(image_shape, K)`` projects every finished row onto its low DCT frequencies (post-processing).
    ``soft_labels``: labels are the float32 (rows, K) scores e_k + N(0, sigma_y^2 I) instead of their argmax
    (the same draws: the argmax of the scores is the hard label the same key gives).
    """
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    order = canonical_order(features)  # sampled positions refer to this order: the input's row order is irrelevant
    x = torch.from_numpy(np.ascontiguousarray(features, np.float64)).to(dev)  # no copy for float64 input on the CPU
    order_t = torch.from_numpy(order).to(dev)
    rate = Fraction(sampling_rate)
    project = None
    if lowpass is not None:
        project = LowPass(lowpass[0], lowpass[1], dev)
        if project.dim != x.shape[1]:
            raise ValueError(f"lowpass image_shape {tuple(lowpass[0])} has {project.dim} features, rows have "
                             f"{x.shape[1]}")
    n_chunks = -(-samples // chunk_rows)
    for chunk in (range(n_chunks) if chunks is None else chunks):
        rows = min(chunk_rows, samples - chunk * chunk_rows)
        out = mix_chunk(x, mode=mode, mixing_order=mixing_order, sigma_x=sigma_x, rows=rows,
                        index_stream=NoiseStream(key, "mix-index", class_index, chunk),
                        noise_stream=NoiseStream(key, "mix-noise", class_index, chunk), sampling_rate=rate,
                        order=order_t)
        feats = out.astype(np.float32)
        if project is not None:
            feats = project(torch.from_numpy(feats).to(dev)).cpu().numpy()
        # Labels draw from their own stream: soft scores publish their noise almost verbatim.
        label_stream = NoiseStream(key, "label", class_index, chunk) if sigma_y > 0 else None
        if soft_labels:
            labels = label_scores(class_index, num_classes, sigma_y, rows, label_stream).astype(np.float32)
        else:
            labels = noisy_labels(class_index, num_classes, sigma_y, rows, label_stream)
        yield chunk, feats, labels
