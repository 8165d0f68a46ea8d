"""The marginals mechanism's plan (what the fit needs, public or DP) and its measurements (the noisy counts)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from dpcda.mechanisms.marginals.domain import Domain
from dpcda.privacy.events import AimEvent, MarginalsEvent

SCORE_BITS = 10  # the one-way model's predicted counts are rounded to multiples of 2^-10 (post-processing)

SELECTIONS = ("mst", "mst-label", "aim")  # mst-label: MST's tree, and the label's pair with every column (public)

AIM = "aim"  # AIM's adaptive rounds (McKenna, Mullins, Sheldon, Miklau 2022), budget in privacy.aim

# cells: the model's size cap of AIM's rounds. AIM's paper takes 80 MB of float64 (10,485,760 cells); a refit's step
# costs about one pass over the model's cells, and on wa_churn at eps 10 a cap of 65,536 ran 99 rounds in 91 CPU s with
# all-pair TVD 0.0140 where 262,144 ran 120 rounds in 224 s (0.0126); at the paper's cap the rounds ran for hours
# (benchmarks/results/README.md). --marginals-max-model-size raises it; the manifest states it.
AIM_MAX_MODEL_SIZE = 1 << 16


@dataclasses.dataclass(frozen=True)
class MarginalsPlan:
    """What the fit needs (public or DP): the domain, the budget's split, the fit's settings; ``selected`` (the
    measured pairs) and the fit's figures are filled in once the synthesis has run (the plan the manifest states)."""

    selection: str
    domain: Domain
    iterations: int
    rho: float
    event: MarginalsEvent | AimEvent
    selected: tuple[tuple[str, ...], ...] = ()
    estimated_total: Optional[float] = None
    fit_seconds: Optional[float] = None
    max_model_size: Optional[int] = None  # aim: the model's size cap in cells
    rows: Optional[int] = None  # rows to sample: the config's samples (public), or None: the fitted model's total
    rows_from_model: Optional[bool] = None  # stated once sampled: whether ``rows`` is the model's total, rounded
    aim: Optional[dict] = None  # aim: the rounds as run (DP: chosen from public inputs and DP outputs)

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
