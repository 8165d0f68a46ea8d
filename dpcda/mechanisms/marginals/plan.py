"""The marginals mechanism's plan (what the fit needs, public or DP) and its measurements (the noisy counts)."""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from dpcda.mechanisms.base import Caveat, CaveatCode, SynthesisPlan
from dpcda.mechanisms.marginals.domain import Domain
from dpcda.privacy.events import AimEvent, MarginalsEvent

SCORE_BITS = 10  # the one-way model's predicted counts are rounded to multiples of 2^-10 (post-processing)

SELECTIONS = ("mst", "mst-label", "aim")  # mst-label: MST's tree, and the label's pair with every column (public)

AIM = "aim"  # AIM's adaptive rounds (McKenna, Mullins, Sheldon, Miklau 2022), budget in privacy.aim

AIM_MAX_MODEL_SIZE = 80 * (1 << 20) // 8  # cells: AIM's default max_model_size, 80 MB of float64


@dataclasses.dataclass(frozen=True)
class MarginalsPlan(SynthesisPlan):
    """What the fit needs (public or DP): the domain, the budget's split, the fit's settings; ``selected`` (the
    measured pairs) and the fit's figures are filled in once the synthesis has run (the plan the manifest states).
    Its manifest section is ``mechanisms.marginals.mechanism.manifest_section``'s."""

    selection: str
    domain: Domain
    iterations: int
    rho: float
    event: MarginalsEvent | AimEvent
    selected: tuple[tuple[str, ...], ...] = ()
    estimated_total: Optional[float] = None
    fit_seconds: Optional[float] = None
    max_model_size: Optional[int] = None  # aim: the model's size cap in cells
    aim: Optional[dict] = None  # aim: the rounds as run (DP: chosen from public inputs and DP outputs)
    samples_total: int = 0  # T, the rows sampled from the fitted model

    @property
    def events(self) -> tuple:
        return (self.event,)

    def summary(self) -> str:
        return f"selection={self.selection} rho={self.rho:.6g}"

    def caveats(self, epsilon: float, mechanism: str) -> tuple[Caveat, ...]:
        return () if math.isfinite(epsilon) else (Caveat(CaveatCode.MODEL_WITHOUT_NOISE, mechanism=mechanism),)

    def account_figures(self, clip: float) -> dict:
        return {"rho": self.rho}

    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        """Every one-way cell, and at most the largest two-way arrays the picks can reach."""
        from dpcda.mechanisms.marginals.selection import label_pairs

        dom = self.domain
        n = len(dom.sizes)
        if self.selection == AIM:  # at most planned_rounds rounds (privacy.aim.AimSchedule)
            from dpcda.privacy.aim import ROUNDS_PER_COLUMN

            largest = max(dom.sizes[a] * dom.sizes[b] for a, b in dom.pairs) if n > 1 else max(dom.sizes)
            return sum(dom.sizes) + ROUNDS_PER_COLUMN * n * largest
        pair_cells = sorted((dom.sizes[a] * dom.sizes[b] for a, b in dom.pairs), reverse=True)
        label = sum(dom.sizes[a] * dom.sizes[-1] for a in range(n - 1))
        return sum(dom.sizes) + sum(pair_cells[: n - 1]) + label * (label_pairs(self.selection, n) > 0)

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.mechanisms.marginals.mechanism import manifest_section

        return manifest_section(plan, self)

    def noise_stds(self) -> dict:
        """Name -> Gaussian noise std of the counts (the manifest states each one's grid); aim: each distinct std its
        rounds used, once they have run."""
        if self.selection != AIM:
            return {"marginals_one_way": self.event.one_way_std, "marginals_two_way": self.event.two_way_std}
        rec = self.aim or {}
        stds = sorted({r["noise_std"] for r in rec.get("rounds", [])}, reverse=True)
        one = {"marginals_one_way": rec["one_way_noise_std"]} if "one_way_noise_std" in rec else {}
        return {**one, **{f"marginals_aim_std_{k}": s for k, s in enumerate(stds)}}


@dataclasses.dataclass
class Measurements:
    """The noisy counts (DP) and the picked pairs: everything the fit may see."""

    one_way: list  # noisy count vectors, one per column
    pairs: list  # (i, j) measured: the picked ones in order, then the label's (mst-label); aim: its cliques in order
    two_way: list  # noisy count arrays of those pairs, (size_i, size_j) on the compressed codes (mst: ``mapping``)
    one_way_std: float = 0.0
    stds: list = dataclasses.field(default_factory=list)  # per entry of two_way
    model: object = None  # aim: the model fitted between rounds (the last fit starts from it)
    record: Optional[dict] = None  # aim: the rounds as run
    # mst: the compression (``compression``), the codes the pairs were measured on
    mapping: dict = dataclasses.field(default_factory=dict)
