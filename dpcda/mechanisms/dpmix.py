"""DPMix (seed 001): each synthetic row mixes ``l`` records of the WHOLE dataset, features and one-hot labels.

Row t: (mean of the l records' features + N(0, sigma_x^2 I), mean of their one-hot labels + N(0, sigma_y^2 I_K)),
released as features, the K label scores (``LABEL_soft``) and their argmax (``LABEL``). The indices come from the
stream ("dpmix-index", chunk), the feature noise from ("dpmix-noise", chunk), the label noise from ("dpmix-label",
chunk) (``privacy.noise``). fixed: l distinct records of the N, uniformly; poisson: each record joins with
probability q = l / N_hat, the sums divided by l. Sensitivity and accounting: ``privacy.events.DpmixEvent`` (the
records are clipped and summed exactly as in ``mechanisms.dpcda``, whose docstring states the float bound). Seed 001's
denoising (a Gaussian blur) is post-processing (``mechanisms.postprocess``).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

from dpcda.mechanisms.dpcda import canonical_order, sample_rows
from dpcda.mechanisms.postprocess import make_postprocess
from dpcda.privacy.noise import NoiseStream


def mix_dataset(
    features: np.ndarray,
    labels: np.ndarray,
    *,
    key: bytes,
    num_classes: int,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    sigma_y: float,
    samples: int,
    chunk_rows: int,
    sampling_rate: Fraction | float = Fraction(0),
    device: str | torch.device = "cpu",
    chunks=None,
    lowpass: Optional[tuple[Sequence[int], int]] = None,
    denoise: Optional[tuple[Sequence[int], float]] = None,
    basis: Optional[np.ndarray] = None,
    clip: float = 1.0,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield (chunk, float32 features (rows, d), float32 label scores (rows, K)) for the whole dataset.

    ``basis``: a DP-PCA basis, as in ``mechanisms.dpcda.mix_class``."""
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if basis is not None:
        from dpcda.mechanisms.dppca import project_rows

        features = project_rows(features, basis, clip)
    labels = np.asarray(labels, np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    order = canonical_order(features, labels)
    x = torch.from_numpy(np.ascontiguousarray(features, np.float64)).to(dev)
    order_t = torch.from_numpy(order).to(dev)
    y = labels[order]  # labels in the canonical order the indices refer to
    rate = Fraction(sampling_rate)
    post = make_postprocess(lowpass=lowpass, denoise=denoise, device=dev)
    n_chunks = -(-samples // chunk_rows)
    for chunk in range(n_chunks) if chunks is None else chunks:
        rows = min(chunk_rows, samples - chunk * chunk_rows)
        flat, offsets = sample_rows(
            x.shape[0],
            mode=mode,
            mixing_order=mixing_order,
            rows=rows,
            stream=NoiseStream(key, "dpmix-index", chunk),
            sampling_rate=rate,
        )
        if flat.size:
            idx = order_t[torch.from_numpy(flat).to(dev)]
            sums = torch.nn.functional.embedding_bag(idx, x, torch.from_numpy(offsets).to(dev), mode="sum")
            means = (sums / mixing_order).cpu().numpy()
        else:
            means = np.zeros((rows, x.shape[1]), np.float64)
        counts = np.zeros((rows, num_classes), np.float64)
        row_of = np.repeat(np.arange(rows), np.diff(np.append(offsets, len(flat))))
        np.add.at(counts, (row_of, y[flat]), 1.0)
        feats = NoiseStream(key, "dpmix-noise", chunk).gaussian(means, sigma_x)
        feats = (feats @ basis.T if basis is not None else feats).astype(np.float32)
        scores = NoiseStream(key, "dpmix-label", chunk).gaussian(counts / mixing_order, sigma_y)
        if post is not None:
            feats = post(feats)
        yield chunk, feats, scores.astype(np.float32)
