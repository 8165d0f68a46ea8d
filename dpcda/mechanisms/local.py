"""Local perturbation (the baseline of seed 001 and seed 000 Table 3): every record, plus Gaussian noise, once.

Each normalised, clipped record x is released as ``x + N(0, sigma_x^2 I)`` with its label; the random-projection
baseline (``mechanisms.randproj``) releases ``x R + N(0, sigma_x^2 I_p)`` instead. A record appears in exactly one
row, so the release is one Gaussian mechanism per record (``privacy.events.PerturbEvent``), under replace-one within
class. The noise of a block of records comes from the stream ("perturb", its shard, its first row): a retried block
redraws the same rows.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from dpcda.privacy.noise import NoiseStream


def perturb_block(
    x: np.ndarray,
    *,
    key: bytes,
    block: tuple,
    sigma_x: float,
    projection: Optional[np.ndarray] = None,
    post: Optional[Callable[[np.ndarray], np.ndarray]] = None,
) -> np.ndarray:
    """float32 rows: ``x`` (float64, clipped), projected by ``projection`` (d, p) when given, plus noise."""
    y = np.asarray(x, np.float64)
    if projection is not None:
        y = y @ projection
    out = NoiseStream(key, "perturb", *block).gaussian(y, sigma_x).astype(np.float32)
    return post(out) if post is not None else out
