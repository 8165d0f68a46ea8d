"""Beam-free DP-CDA mixing (seed 000, Algorithm 1, steps 8-14) in torch, on CUDA when present.

One class at a time: ``T_k`` synthetic rows in chunks of ``chunk_rows``, each chunk with its own
generator derived from the run's secret key (``privacy.noise``), so a retried chunk reproduces its
rows. Rows are gathered and summed with ``embedding_bag`` (no (rows, l, d) intermediate) and batched:
there is no Python loop per row.

fixed: each row averages exactly ``l`` distinct records, uniformly.
poisson: each record joins a row independently with probability q (m ~ Binomial(N_k, q), then a
uniform m-subset); the sum is divided by ``l``, not m, so the sensitivity stays c / l.

Optional low-pass post-processing (``lowpass``): every finished noisy row is projected onto the span of its
low-frequency 2-D DCT basis images (frequencies u + v < K on the feature image's (H, W) grid, per channel).
The projection is public and fixed before any data is seen, and it acts on the DP output only, so it is
post-processing: the privacy guarantee is unchanged. It keeps most of an image's energy and removes the
noise outside the kept subspace (on Fashion-MNIST, K = 16 keeps 136 of 784 coefficients).
"""
from __future__ import annotations

import logging
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from privacy.noise import torch_generator

log = logging.getLogger(__name__)
# Rejection sampling of distinct indices while a row's collision chance is small; beyond that,
# the l smallest of N_k random keys per row (exact, O(N_k) per row).
REJECTION_LIMIT = 0.5
KEYS_PER_STEP = 1 << 24


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


def sample_distinct(n: int, l: int, rows: int, gen: torch.Generator, device) -> torch.Tensor:
    """(rows, l) indices into range(n), distinct within each row, in uniformly random order."""
    if l > n:
        raise ValueError(f"cannot draw {l} distinct records from {n}")
    if l * (l - 1) / (2.0 * n) <= REJECTION_LIMIT:
        idx = torch.randint(n, (rows, l), generator=gen, device=device)
        while l > 1:
            s = idx.sort(dim=1).values
            dup = (s[:, 1:] == s[:, :-1]).any(dim=1)
            count = int(dup.sum())
            if count == 0:
                break
            idx[dup] = torch.randint(n, (count, l), generator=gen, device=device)
        return idx
    step = max(1, KEYS_PER_STEP // n)
    parts = []
    for start in range(0, rows, step):
        keys = torch.rand((min(step, rows - start), n), generator=gen, device=device)
        parts.append(keys.topk(l, dim=1, largest=False).indices)  # ordered by key: random order
    return torch.cat(parts)


def sample_poisson(n: int, q: float, rows: int, gen: torch.Generator, device):
    """Flat indices and offsets: row i holds m_i ~ Binomial(n, q) distinct records."""
    m = torch.binomial(torch.full((rows,), float(n), device=device),
                       torch.full((rows,), float(q), device=device), generator=gen).long()
    width = int(m.max()) if rows else 0
    if width == 0:
        return torch.zeros(0, dtype=torch.long, device=device), torch.zeros(rows, dtype=torch.long, device=device)
    idx = sample_distinct(n, width, rows, gen, device)
    keep = torch.arange(width, device=device)[None, :] < m[:, None]
    offsets = torch.zeros(rows, dtype=torch.long, device=device)
    offsets[1:] = torch.cumsum(m, 0)[:-1]
    return idx[keep], offsets


def mix_chunk(x: torch.Tensor, *, mode: str, mixing_order: int, sigma_x: float, rows: int,
              gen: torch.Generator, sampling_rate: float = 0.0) -> torch.Tensor:
    """``rows`` synthetic feature rows from the class matrix ``x`` (on its device)."""
    n = x.shape[0]
    if mode == "fixed":
        idx = sample_distinct(n, mixing_order, rows, gen, x.device)
        out = torch.nn.functional.embedding_bag(idx, x, mode="sum")
    else:
        flat, offsets = sample_poisson(n, sampling_rate, rows, gen, x.device)
        out = torch.nn.functional.embedding_bag(flat, x, offsets, mode="sum")  # one bag per offset, empty bags 0
    out = out / mixing_order
    if sigma_x > 0:
        out += sigma_x * torch.randn(out.shape, generator=gen, device=x.device, dtype=out.dtype)
    return out


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
                 gen: torch.Generator, device) -> torch.Tensor:
    """(rows, K) scores e_k + N(0, sigma_y^2 I_K): the one-hot mean of a same-class mix plus label noise."""
    scores = torch.zeros((rows, num_classes), device=device)
    if sigma_y > 0:
        scores = sigma_y * torch.randn((rows, num_classes), generator=gen, device=device)
    scores[:, class_index] += 1.0
    return scores


def noisy_labels(class_index: int, num_classes: int, sigma_y: float, rows: int,
                 gen: torch.Generator, device) -> torch.Tensor:
    """argmax(e_k + N(0, sigma_y^2 I_K)); exactly k when sigma_y is 0 (the one-hot mean is e_k)."""
    if sigma_y > 0:
        return label_scores(class_index, num_classes, sigma_y, rows, gen, device).argmax(dim=1)
    return torch.full((rows,), class_index, dtype=torch.long, device=device)


def mix_class(features: np.ndarray, *, key: bytes, class_index: int, num_classes: int, mode: str,
              mixing_order: int, sigma_x: float, samples: int, chunk_rows: int,
              sampling_rate: float = 0.0, sigma_y: float = 0.0, device: str | torch.device = "cpu",
              chunks=None, lowpass: Optional[tuple[Sequence[int], int]] = None, soft_labels: bool = False,
              ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (chunk, features, labels) for class ``class_index``; ``chunks`` limits which chunks.

    ``lowpass=(image_shape, K)`` projects every finished row onto its low DCT frequencies (post-processing).
    ``soft_labels``: labels are the float32 (rows, K) scores e_k + N(0, sigma_y^2 I) instead of their argmax
    (the same draws: the argmax of the scores is the hard label the same key gives).
    """
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    ordered = features[canonical_order(features)]
    x = torch.from_numpy(np.ascontiguousarray(ordered, np.float32)).to(dev)
    project = None
    if lowpass is not None:
        project = LowPass(lowpass[0], lowpass[1], dev)
        if project.dim != x.shape[1]:
            raise ValueError(f"lowpass image_shape {tuple(lowpass[0])} has {project.dim} features, rows have "
                             f"{x.shape[1]}")
    n_chunks = -(-samples // chunk_rows)
    for chunk in (range(n_chunks) if chunks is None else chunks):
        rows = min(chunk_rows, samples - chunk * chunk_rows)
        gen = torch_generator(key, "mix", class_index, chunk, device=dev)
        out = mix_chunk(x, mode=mode, mixing_order=mixing_order, sigma_x=sigma_x, rows=rows, gen=gen,
                        sampling_rate=sampling_rate)
        if project is not None:
            out = project(out)
        # Labels draw from their own stream: soft scores publish their noise almost verbatim, and must reveal
        # nothing about the generator behind the feature noise.
        label_gen = torch_generator(key, "label", class_index, chunk, device=dev) if sigma_y > 0 else None
        if soft_labels:
            labels = label_scores(class_index, num_classes, sigma_y, rows, label_gen, dev)
        else:
            labels = noisy_labels(class_index, num_classes, sigma_y, rows, label_gen, dev)
        yield chunk, out.cpu().numpy(), labels.cpu().numpy()
