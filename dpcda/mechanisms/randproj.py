"""Random projection (seed 001's baseline, after DPPro): records projected by a public random R, then noised.

R (d x p) has i.i.d. N(0, 1/p) entries drawn from a PUBLIC seed (``--projection-seed``, in the manifest): it depends
on no data, and anyone can rebuild it to project their own rows (the evaluation does, for the real test rows). Like
every draw of the product it comes from privacy/'s noise module: a stream keyed by the public seed alone. A record's
row moves by at most 2 c ||R||_2; the manifest's ``projection_norm`` is an upper bound on ||R||_2 with the same
bits on every CPU (``privacy.events.projection_gain``), and 2 c times it is the sensitivity
``privacy.events.PerturbEvent`` uses. The released rows live in R^p: they are projections, not images, so the
evaluation trains its MLP on them, as seed 001 did.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dpcda.mechanisms.base import PlanError, Public, noise_for
from dpcda.mechanisms.local import Local, PerturbPlan
from dpcda.privacy.events import MAX_PROJECTION_ENTRIES, projection_gain
from dpcda.privacy.noise import NoiseStream, public_key
from dpcda.schemas.mechanism_params import RandprojParams


def projection_matrix(dim: int, p: int, seed: int) -> np.ndarray:
    """The public (d, p) projection: N(0, 1/p) entries from ``seed``. p above d is refused (an expansion, not a
    projection: privacy would hold, since the sensitivity uses ||R||_2, but the rows only grow), which also bounds R."""
    if p < 1 or dim < 1:
        raise PlanError(f"projection_dim: need d >= 1 and p >= 1, got d={dim}, p={p}")
    if p > dim:
        raise PlanError(
            f"projection_dim: p={p} is more than the feature dimension d={dim}; randproj would expand the rows, not "
            f"project them: give p <= {dim}"
        )
    if dim * p > MAX_PROJECTION_ENTRIES:
        raise PlanError(
            f"projection_dim: a {dim} x {p} projection has more than {MAX_PROJECTION_ENTRIES} entries, beyond the "
            "shapes whose spectral-norm bound is argued (privacy.events.SVD_ALLOWANCE): give a smaller p"
        )
    stream = NoiseStream(public_key("projection", seed), dim, p)
    return stream.gaussian(np.zeros((dim, p)), 1.0) / np.sqrt(p)


def matrix_gain(R: np.ndarray) -> float:
    """The sensitivity's gain for the projection ``R``: an upper bound on ||R||_2 with the same bits on every CPU
    (``privacy.events.projection_gain`` of LAPACK's estimate)."""
    return projection_gain(np.linalg.norm(R, 2))


# ---------------------------------------------------------------- the plan and the registry entry


@dataclasses.dataclass(frozen=True)
class RandprojPlan(PerturbPlan):
    """Every record times the public R (d x p), plus N(0, sigma_x^2 I_p)."""

    projection_dim: int = 1
    projection_seed: int = 0
    projection_norm: float = 1.0  # an upper bound on ||R||_2: the sensitivity's gain

    def projection_matrix(self, dim: int) -> np.ndarray:
        return projection_matrix(dim, self.projection_dim, self.projection_seed)

    def noised_dim(self, dim: int) -> int:
        return self.projection_dim

    def own_figures(self) -> dict:
        return {"projection_norm": self.projection_norm}

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.schemas.manifest import RandprojMechanism

        return RandprojMechanism(
            name="randproj",
            projection_dim=self.projection_dim,
            projection_seed=self.projection_seed,
            projection_norm=self.projection_norm,
            class_sizes=list(plan.public_class_sizes),
            **self.common(plan),
        )


class Randproj(Local):
    """Every record projected by the public R, plus Gaussian noise (DPPro, seed 001's baseline)."""

    name = "randproj"
    params = RandprojParams
    audit_game = "dpcda.evaluation.audit.games:Projection"
    needs_width = "the projection's norm depends on it"

    def plan(self, public: Public) -> RandprojPlan:
        params, clip = public.params, public.privacy.clip
        gain = matrix_gain(projection_matrix(public.dim, params.projection_dim, params.projection_seed))

        def events(sigma: float) -> list:
            return self.synthesis_events(public.mode, clip=clip, sigma_x=sigma, gain=gain)

        sigma_x = noise_for(events, public.budget, public.privacy, clip)
        return RandprojPlan(
            events=tuple(events(sigma_x)),
            samples_total=public.samples,
            sigma_x=sigma_x,
            post=public.post,
            projection_dim=params.projection_dim,
            projection_seed=params.projection_seed,
            projection_norm=gain,
        )

    def output_dim(self, params, dim: int) -> int:
        return params.projection_dim

    def test_projection(self, manifest: dict) -> np.ndarray:
        mech = manifest["mechanism"]
        return projection_matrix(
            int(manifest["input"]["feature_dim"]), int(mech["projection_dim"]), int(mech["projection_seed"])
        )
