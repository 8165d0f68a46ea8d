"""DP-SGD's private draws, shared by every model trained on private rows (P3GM's VAE, the DP-SGD classifier reference).

A step of DP-SGD (``privacy.events.DpSgdEvent`` accounts it, add/remove-one):
1. ``poisson_batch``: every record joins the batch independently with probability q (an exact fraction): a uniform
   integer below q's denominator is compared with its numerator (``privacy.noise``'s exact uniform draws), so the
   batch is Poisson-sampled exactly as the accountant assumes; no shuffling, no fixed batch size.
2. The caller computes per-example gradients and their float64 norms, and scales each example's gradient by
   ``clip_factors``: min(1, C (1 - CLIP_MARGIN) / norm), so a clipped gradient's norm stays below C with room for
   the float64 summation of the batch (the margin argument of ``privacy.events.CLIP_MARGIN``).
3. ``noisy_sum``: the float64 sum of the clipped gradients plus N(0, (z C)^2) per coordinate from the stream
   (``NoiseStream.gaussian``: exact, rounded to its public grid, so no low bits of the sum survive).
Turning the noisy sum into float32 and taking an optimiser step is post-processing.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream


def poisson_batch(stream: NoiseStream, n: int, rate: Fraction) -> np.ndarray:
    """int64 indices of the records in one Poisson-sampled batch (each of ``n`` independently with prob. ``rate``)."""
    rate = Fraction(rate)
    if not 0 <= rate <= 1:
        raise ValueError(f"sampling rate must lie in [0, 1], got {rate}")
    if n == 0 or rate == 0:
        return np.zeros(0, np.int64)
    if rate == 1:
        return np.arange(n, dtype=np.int64)
    u = stream.uniform_int(rate.denominator, n)
    return np.flatnonzero(u < rate.numerator).astype(np.int64)


def clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """float64 per-example factors min(1, C (1 - CLIP_MARGIN) / norm) for float64 per-example gradient norms; 0 for
    a norm that is not finite (the caller must then zero that example's gradient, since inf * 0 is NaN)."""
    norms = norms.to(torch.float64)
    limit = float(clip) * (1.0 - CLIP_MARGIN)
    factors = torch.clamp(limit / torch.clamp(norms, min=1e-300), max=1.0)
    return torch.where(torch.isfinite(norms), factors, 0.0)  # a non-finite gradient is dropped (caller zeroes it)


def noisy_sum(grad_sum: torch.Tensor, noise_std: float, stream: NoiseStream) -> torch.Tensor:
    """``grad_sum`` (the float64 sum of clipped gradients, any shape) plus N(0, noise_std^2) per coordinate, as
    float32 on the input's device. ``noise_std`` = 0: no noise (no privacy)."""
    center = grad_sum.detach().to("cpu", torch.float64).numpy()
    noisy = stream.gaussian(center, float(noise_std))
    return torch.from_numpy(noisy).to(device=grad_sum.device, dtype=torch.float32)
