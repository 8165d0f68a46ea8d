"""Beam-free DP-CDA mixing (seed 000, Algorithm 1, steps 8-14) in torch, on CUDA when present.

One class at a time: ``T_k`` synthetic rows in chunks of ``chunk_rows``, each chunk with its own
generator derived from the run's secret key (``privacy.noise``), so a retried chunk reproduces its
rows. Rows are gathered and summed with ``embedding_bag`` (no (rows, l, d) intermediate) and batched:
there is no Python loop per row.

fixed: each row averages exactly ``l`` distinct records, uniformly.
poisson: each record joins a row independently with probability q (m ~ Binomial(N_k, q), then a
uniform m-subset); the sum is divided by ``l``, not m, so the sensitivity stays c / l.
"""
from __future__ import annotations

import logging
from typing import Iterator

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


def noisy_labels(class_index: int, num_classes: int, sigma_y: float, rows: int,
                 gen: torch.Generator, device) -> torch.Tensor:
    """argmax(e_k + N(0, sigma_y^2 I_K)); exactly k when sigma_y is 0 (the one-hot mean is e_k)."""
    labels = torch.full((rows,), class_index, dtype=torch.long, device=device)
    if sigma_y > 0:
        scores = sigma_y * torch.randn((rows, num_classes), generator=gen, device=device)
        scores[:, class_index] += 1.0
        labels = scores.argmax(dim=1)
    return labels


def mix_class(features: np.ndarray, *, key: bytes, class_index: int, num_classes: int, mode: str,
              mixing_order: int, sigma_x: float, samples: int, chunk_rows: int,
              sampling_rate: float = 0.0, sigma_y: float = 0.0, device: str | torch.device = "cpu",
              chunks=None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (chunk, features, labels) for class ``class_index``; ``chunks`` limits which chunks."""
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    ordered = features[canonical_order(features)]
    x = torch.from_numpy(np.ascontiguousarray(ordered, np.float32)).to(dev)
    n_chunks = -(-samples // chunk_rows)
    for chunk in (range(n_chunks) if chunks is None else chunks):
        rows = min(chunk_rows, samples - chunk * chunk_rows)
        gen = torch_generator(key, "mix", class_index, chunk, device=dev)
        out = mix_chunk(x, mode=mode, mixing_order=mixing_order, sigma_x=sigma_x, rows=rows, gen=gen,
                        sampling_rate=sampling_rate)
        labels = noisy_labels(class_index, num_classes, sigma_y, rows, gen, dev)
        yield chunk, out.cpu().numpy(), labels.cpu().numpy()
