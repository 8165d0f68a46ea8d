"""Local perturbation (the baseline of seed 001 and seed 000 Table 3): every record, plus Gaussian noise, once.

Each normalised, clipped record x is released as ``x + N(0, sigma_x^2 I)`` with its label; the random-projection
baseline (``mechanisms.randproj``) releases ``x R + N(0, sigma_x^2 I_p)`` instead. A record appears in exactly one
row, so the release is one Gaussian mechanism per record (``privacy.events.PerturbEvent``), under replace-one within
class. The noise of a block of records comes from the stream ("perturb", its shard, its first row): a retried block
redraws the same rows.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, Public, noise_for
from dpcda.mechanisms.rows import RowsPlan
from dpcda.privacy.events import PerturbEvent
from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.mechanism_params import LocalParams


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


# ---------------------------------------------------------------- the plan and the registry entry

BLOCK_ROWS = 16384  # records per block of an in-process release


@dataclasses.dataclass(frozen=True)
class PerturbPlan(RowsPlan):
    """Every record once, plus N(0, sigma_x^2 I): one Gaussian per record (the event stands for every record's)."""

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.schemas.manifest import LocalMechanism

        return LocalMechanism(
            name="local",
            class_sizes=list(plan.public_class_sizes),
            postprocessing=self.postprocessing(),
            **self.common(plan),
        )


class Local(Mechanism):
    """Every record once, plus Gaussian noise (the baseline of seeds 000 and 001)."""

    name = "local"
    composition = "parallel over records (each record makes its own row); sequential with the statistics releases"
    params = LocalParams
    grouping = Grouping.RECORD
    graph = "dpcda.transforms.synthesize:PerturbEveryRecord"
    audit_game = "dpcda.evaluation.audit.games:Perturbation"

    def synthesis_events(self, mode, *, clip, sigma_x, gain=1.0, **_) -> list:
        return [PerturbEvent(clip, sigma_x, gain)]

    def plan(self, public: Public) -> PerturbPlan:
        clip = public.privacy.clip

        def events(sigma: float) -> list:
            return self.synthesis_events(public.mode, clip=clip, sigma_x=sigma)

        sigma_x = noise_for(events, public.budget, public.privacy, clip)
        return PerturbPlan(
            events=tuple(events(sigma_x)), samples_total=public.samples, sigma_x=sigma_x, post=public.post
        )

    def label_caveat(self) -> str:
        return (
            f"{self.name}: every record is released once, with its label and class sizes as they are (both public "
            f"under the replace-one-within-class relation)."
        )

    def synthesize(self, ctx: InProcess):
        plan = ctx.plan
        rows_plan: PerturbPlan = plan.synthesis
        projection = rows_plan.projection_matrix(plan.feature_dim)
        post = rows_plan.post.make() if rows_plan.post is not None else None
        for start in range(0, len(ctx.y), BLOCK_ROWS):
            rows = ctx.normalized(ctx.x[start : start + BLOCK_ROWS])
            feats = perturb_block(
                rows,
                key=ctx.key,
                block=("in-process", start),
                sigma_x=rows_plan.sigma_x,
                projection=projection,
                post=post,
            )
            yield feats, ctx.y[start : start + BLOCK_ROWS], None
