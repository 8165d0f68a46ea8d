"""Adding a mechanism takes its own module, its parameter model and one registry line (issue 52's target): the toy
mechanism below, defined in this file alone, is configured by its flags, planned and accounted by the one planner,
released in process, planned by ``dpcda account`` and audited by the game it names, with no other file changed."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import numpy as np
import pytest
from pydantic import Field

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, Public, SynthesisPlan, noise_for
from dpcda.privacy.events import PerturbEvent
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.schemas import mechanism_params
from dpcda.schemas.config import ConfigError, load_config
from dpcda.schemas.mechanism_params import MechanismParams

# ---------------------------------------------------------------- the toy mechanism: its parameters, plan and entry


class ToyParams(MechanismParams):
    name: Literal["toy"] = "toy"
    summary: ClassVar[str] = "toy: every record, shrunk, plus noise"
    prefix: ClassVar[str] = "toy_"
    modes: ClassVar[tuple[str, ...]] = ("fixed",)
    mode_reason: ClassVar[str] = "one row per record publishes the count"
    mixes: ClassVar[bool] = False

    shrink: float = Field(1.0, gt=0, le=1, description="toy: every row is scaled by this before its noise (public)")


@dataclasses.dataclass(frozen=True)
class ToyPlan(SynthesisPlan):
    events: tuple
    samples_total: int
    sigma_x: float
    shrink: float

    def summary(self) -> str:
        return f"sigma_x={self.sigma_x:.6g} shrink={self.shrink:g}"

    def noise_stds(self) -> dict:
        return {"features": self.sigma_x}

    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        return self.samples_total * dim

    def manifest_section(self, plan, *, chunk_rows: int):
        return {"name": "toy", "sigma_x": self.sigma_x, "shrink": self.shrink}

    def account_figures(self, clip: float) -> dict:
        return {"sigma_x": self.sigma_x, "noise_multiplier": self.events[0].noise_multiplier}


class Toy(Mechanism):
    name = "toy"
    params = ToyParams
    grouping = Grouping.RECORD
    graph = "dpcda.transforms.synthesize:PerturbEveryRecord"
    audit_game = "dpcda.evaluation.audit.games:Perturbation"
    composition = "parallel over records; sequential with the statistics releases"

    def synthesis_events(self, mode, *, clip, sigma_x, **_) -> list:
        return [PerturbEvent(clip, sigma_x, 1.0)]  # a row moves by at most 2 c shrink <= 2 c

    def plan(self, public: Public) -> ToyPlan:
        clip = public.privacy.clip

        def events(sigma: float) -> list:
            return self.synthesis_events(public.mode, clip=clip, sigma_x=sigma)

        sigma_x = noise_for(events, public.budget, public.privacy, clip)
        return ToyPlan(events(sigma_x), public.samples, sigma_x, public.params.shrink)

    def synthesize(self, ctx: InProcess):
        toy: ToyPlan = ctx.plan.synthesis
        rows = ctx.normalized(ctx.x) * toy.shrink
        yield NoiseStream(ctx.key, "toy").gaussian(rows, toy.sigma_x).astype(np.float32), ctx.y, None

    def label_caveat(self) -> str:
        return "toy: every record is released once, with its label."


@pytest.fixture
def toy():
    entry = registry.register(Toy())  # the one line
    yield entry
    registry.MECHANISMS.pop("toy")
    mechanism_params.PARAMS.pop("toy")


BASE = {"input": "in/*.parquet", "output": "out/r", "num_classes": 3, "epsilon": 3.0}


# ---------------------------------------------------------------- what the rest of the product does with it


def test_its_flags_and_its_section_reach_its_model(toy):
    cfg = load_config(None, {**BASE, "mechanism": "toy", "toy_shrink": "0.5"})
    assert isinstance(cfg.mechanism, ToyParams) and cfg.mechanism.shrink == 0.5 and cfg.mode == "fixed"
    assert load_config(None, {**BASE, "mechanism": {"name": "toy", "shrink": 0.5}}) == cfg
    with pytest.raises(ConfigError, match=r"^mode: toy offers mode fixed only \(one row per record"):
        load_config(None, {**BASE, "mechanism": "toy", "mode": "poisson"})
    with pytest.raises(ConfigError, match=r"^toy_shrink: a toy parameter; this release's mechanism is dpcda$"):
        load_config(None, {**BASE, "toy_shrink": 0.5})
    with pytest.raises(ConfigError, match=r"^toy_shrink: Input should be less than or equal to 1"):
        load_config(None, {**BASE, "mechanism": "toy", "toy_shrink": 2})


def test_it_is_planned_accounted_and_released_in_process(toy):
    from dpcda.mechanisms.inprocess import release_in_process
    from dpcda.pipeline.manifest import caveat_words
    from tests.conftest import make_dataset

    x, y = make_dataset(n_per_class=30, num_classes=3, dim=8)
    cfg = load_config(None, {**BASE, "mechanism": "toy", "toy_shrink": 0.5, "seed": 1})
    feats, labels, plan, scores = release_in_process(x, y, cfg.core, key_from_test_seed(1))
    assert plan.mechanism == "toy" and isinstance(plan.synthesis, ToyPlan) and plan.synthesis.shrink == 0.5
    assert feats.shape == x.shape and np.array_equal(labels, y) and scores is None
    assert 0 < plan.accounting.epsilon <= 3.0 and list(plan.accounting.components) == ["normalization", "perturbation"]
    assert "toy: every record is released once" in " ".join(caveat_words(c) for c in plan.caveats)


def test_account_plans_it_and_the_audit_plays_the_game_it_names(toy):
    from dpcda.evaluation.audit import run_audit
    from dpcda.pipeline.accounting import account

    out = account("toy", class_size=100, epsilon=3.0, toy_shrink=0.5)
    assert out["mechanism"] == "toy" and out["sigma_x"] > 0 and out["epsilon"] <= 3.0
    audit = run_audit(mechanism="toy", mode="fixed", mixing_order=1, epsilon=3.0, trials=400, seed=0, device="cpu")
    assert audit["sigma_x"] == out["sigma_x"] and not audit["violation"]


def test_a_name_or_flat_key_already_taken_is_refused(toy):
    with pytest.raises(ValueError, match="taken"):
        registry.register(Toy())
