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

from dpcda.mechanisms.base import InProcess, Mechanism
from dpcda.privacy.events import PerturbEvent
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


# ---------------------------------------------------------------- the registry entry

BLOCK_ROWS = 16384  # records per block of an in-process release


class Local(Mechanism):
    """Every record once, plus Gaussian noise (the baseline of seeds 000 and 001)."""

    name = "local"
    composition = "parallel over records (each record makes its own row); sequential with the statistics releases"
    summary = "local perturbation: every record once, plus Gaussian noise"
    modes = ("fixed",)
    groups = "record"
    graph = "dpcda.transforms.synthesize:PerturbEveryRecord"
    audit_game = "perturbation"

    def synthesis_events(self, mode, *, clip, sigma_x, gain=1.0, **_) -> list:
        return [PerturbEvent(clip, sigma_x, gain)]

    def label_caveat(self) -> str:
        return (
            f"{self.name}: every record is released once, with its label and class sizes as they are (both public "
            f"under the replace-one-within-class relation)."
        )

    def projection_matrix(self, plan) -> Optional[np.ndarray]:
        return None

    def synthesize(self, ctx: InProcess):
        from dpcda.mechanisms.postprocess import make_postprocess

        plan = ctx.plan
        projection = self.projection_matrix(plan)
        post = make_postprocess(lowpass=plan.lowpass, denoise=plan.denoise_spec)
        for start in range(0, len(ctx.y), BLOCK_ROWS):
            rows = ctx.normalized(ctx.x[start : start + BLOCK_ROWS])
            feats = perturb_block(
                rows, key=ctx.key, block=("in-process", start), sigma_x=plan.sigma_x, projection=projection, post=post
            )
            yield feats, ctx.y[start : start + BLOCK_ROWS], None

    def manifest_section(self, plan, *, chunk_rows, common, postprocessing, projection):
        from dpcda.schemas.manifest import LocalMechanism

        return LocalMechanism(
            name="local", class_sizes=list(plan.public_class_sizes), postprocessing=postprocessing, **common
        )
