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

# cells: the model's size cap of AIM's rounds. AIM's paper takes 80 MB of float64 (10,485,760 cells); a refit's step
# costs about one pass over the model's cells, and on wa_churn at eps 10 a cap of 65,536 ran 99 rounds in 91 CPU s with
# all-pair TVD 0.0140 where 262,144 ran 120 rounds in 224 s (0.0126); at the paper's cap the rounds ran for hours
# (benchmarks/results/README.md). --marginals-max-model-size raises it; the manifest states it.
AIM_MAX_MODEL_SIZE = 1 << 16


def label_pairs(selection: str, columns: int) -> int:
    """Two-way marginals measured without selection: the label's pair with every other column (``mst-label``)."""
    return columns - 1 if selection == "mst-label" else 0


@dataclasses.dataclass(frozen=True)
class MarginalsPlan(SynthesisPlan):
    """What the fit needs (public or DP): the domain, the budget's split, the fit's settings; ``selected`` (the
    measured pairs) and the fit's figures are filled in once the synthesis has run (the plan the manifest states).
    Its manifest section is ``manifest_section``'s."""

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
    # T, the rows sampled from the fitted model: the config's samples (public), else None until the fit has run, then
    # the model's total, rounded (``synthesis.rows_of_total``: post-processing of the noisy counts)
    samples_total: Optional[int] = None
    rows_from_model: Optional[bool] = None  # stated once sampled: whether ``samples_total`` is the model's total
    noisy: Optional[dict] = None  # the measurements a quality report reads (``marginals.noisy``: DP, JSON)
    absent: Optional[dict] = None  # residual codes not drawn (``residual``): column -> 'null'/'other'; once sampled

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
        return manifest_section(plan, self)

    def noisy_measurements(self) -> Optional[dict]:
        return self.noisy

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


def manifest_section(plan, mp: "MarginalsPlan"):
    """The manifest's ``mechanism`` of a marginals release ``plan`` whose synthesis ran (``mp``: the stated plan)."""
    from dpcda.schemas.manifest import MarginalsMechanism

    ev = mp.event
    if mp.selection == AIM:
        return _aim_section(plan, mp)
    return MarginalsMechanism(
        **_shared_fields(plan, mp),
        rho_split={
            "one_way": ev.one_way / (2 * ev.one_way_std**2),
            "selection": ev.rounds * ev.round_rho,
            "two_way": ev.two_way / (2 * ev.two_way_std**2),
        },
        one_way_noise_std=ev.one_way_std,
        two_way_noise_std=ev.two_way_std,
        selection_rounds=ev.rounds,
        round_epsilon=ev.round_epsilon,
        cliques=[list(p) for p in mp.selected],
        fit={"estimator": "mbi MirrorDescent", "iterations": mp.iterations, "total": mp.estimated_total},
        sampling="mbi's synthetic_data (randomized rounding of the model's marginals) on the compressed codes (a "
        "column's cells whose noisy one-way count is below 3 stds merged into one); a merged code becomes one of "
        "its codes in proportion to their noisy one-way counts clamped at zero (an absent residual code never: "
        "absent_codes); a numeric code becomes a value uniform inside its bin",
    )


def _shared_fields(plan, mp: "MarginalsPlan") -> dict:
    """The manifest fields every selection states alike."""
    return dict(
        name="marginals",
        mode=plan.mode,
        selection=mp.selection,
        num_classes=plan.num_classes,
        samples_total=mp.samples_total,
        dataset_size_dp=plan.dp_dataset_size,
        row_count=None if mp.rows_from_model is None else "model_total" if mp.rows_from_model else "samples",
        bins=mp.domain.bins,
        columns={n: s for n, s in zip(mp.domain.names, mp.domain.sizes)},
        rho=mp.rho,
        absent_codes=mp.absent,
    )


def _aim_section(plan, mp: "MarginalsPlan"):
    from dpcda.schemas.manifest import MarginalsMechanism

    rec = mp.aim or {}
    rounds = rec.get("rounds", [])
    first = rounds[0] if rounds else {}
    return MarginalsMechanism(
        **_shared_fields(plan, mp),
        rho_split={
            "one_way": rec.get("rho_one_way", 0.0),
            "selection": rec.get("rho_selection", 0.0),
            "two_way": rec.get("rho_measurement", 0.0),
            "unspent": mp.rho - rec.get("rho_spent", 0.0),
        },
        one_way_noise_std=rec.get("one_way_noise_std", 0.0),
        two_way_noise_std=first.get("noise_std", 0.0),
        selection_rounds=len(rounds),
        round_epsilon=first.get("epsilon", 0.0),
        cliques=[list(c) for c in mp.selected],
        fit={
            "estimator": "mbi MirrorDescent",
            "iterations": mp.iterations,
            "round_estimator": "dpcda.mechanisms.pgm (accelerated mirror descent with restarts on mbi's "
            "junction tree, warm-started; mbi's model size; in numpy)",
            "round_iterations": rec.get("round_iterations"),
            "round_tolerance": rec.get("round_tolerance"),
            "round_watch": rec.get("round_watch"),
            "total": mp.estimated_total,
        },
        sampling="mbi's synthetic_data (randomized rounding of the model's marginals; an absent residual code "
        "never: absent_codes); a numeric code becomes a value uniform inside its bin",
        aim={
            "workload": "every pair of columns (the label's pair with every column among them), weighted as AIM's "
            "compile_workload; candidates: those pairs and every column (the workload's downward closure; no "
            "clique larger than a pair)",
            "max_model_size_cells": mp.max_model_size,
            **{k: v for k, v in rec.items() if k != "max_model_size_cells"},
        },
    )
