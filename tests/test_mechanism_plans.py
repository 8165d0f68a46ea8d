"""Each mechanism owns its plan (issue 52.1): the generic ReleasePlan holds what every release has, and the log line,
the manifest's noise grids, caveats and the CLI summary read the mechanism's own plan, so a release states only what
its mechanism has (issue 53.7)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest

from dpcda.mechanisms.base import SynthesisPlan
from dpcda.mechanisms.combiners import FirstPass
from dpcda.mechanisms.plan import ReleasePlan, build_plan
from dpcda.pipeline.manifest import caveat_words
from dpcda.privacy.noise import key_from_test_seed
from dpcda.schemas.config import load_config
from tests.plan_record import TABLE

BASE = {"input": "in/*.parquet", "output": "out/r", "num_classes": 3, "epsilon": 4.0}


def _plan(**fields) -> ReleasePlan:
    dim = 6 if fields.get("mechanism") == "marginals" else 4
    first = FirstPass(
        count=120,
        sum_qu=np.zeros(dim, np.int64),
        sum_qv=np.zeros(dim, np.int64),
        class_counts=np.array([40, 40, 40], np.int64),
    )
    return build_plan(first, load_config(None, {**BASE, **fields}).core, key_from_test_seed(2))


def test_the_generic_plan_has_no_member_of_one_mechanism():
    """No optional per-mechanism field: the mechanism's plan is one member, its own type."""
    names = {f.name for f in dataclasses.fields(ReleasePlan)}
    gone = {"sigma_x", "sigma_y", "mixing_order", "p3gm", "marginals", "lowpass", "projection", "mixing_paths"}
    gone |= {"pca_components", "pca_noise_std", "samples_per_class", "label_noise_ratio", "join_block_rows"}
    assert not names & gone, names & gone
    assert dataclasses.fields(ReleasePlan)[-1].name == "synthesis"


@pytest.mark.parametrize(
    "fields,has,lacks",
    [
        ({}, "sigma_x=", "rho="),
        ({"mechanism": "marginals", "table": TABLE}, "rho=", "sigma_x"),
    ],
)
def test_the_calibrate_log_line_names_only_the_mechanisms_noise(caplog, fields, has, lacks):
    from dpcda.mechanisms.inprocess import first_pass
    from dpcda.transforms.calibrate import _plan as calibrate

    cfg = load_config(None, {**BASE, **fields})
    plan = _plan(**fields)
    assert isinstance(plan.synthesis, SynthesisPlan)
    x = np.random.default_rng(0).uniform(size=(120, plan.feature_dim))
    with caplog.at_level(logging.INFO, logger="dpcda.transforms.calibrate"):
        calibrate(first_pass(x, np.repeat(np.arange(3), 40)), cfg.core, key_from_test_seed(2))
    (line,) = [r.getMessage() for r in caplog.records if "stage=calibrate" in r.getMessage()]
    assert has in line and lacks not in line, line


def test_only_mixing_releases_state_the_adaptive_caveat_about_q_k_and_sigma_x():
    mixing = " ".join(caveat_words(c) for c in _plan(mode="poisson").caveats)
    marginals = " ".join(caveat_words(c) for c in _plan(mechanism="marginals", table=TABLE).caveats)
    assert "q_k, T_k and sigma_x" in mixing
    assert "q_k" not in marginals and "sigma_x" not in marginals


def test_only_a_z_scoring_release_has_a_statistics_file():
    assert _plan().z_scored and _plan(mechanism="p3gm", p3gm_latent_dim=2, p3gm_hidden=8).z_scored
    assert not _plan(mechanism="marginals", table=TABLE).z_scored


@pytest.mark.parametrize(
    "fields,headline",
    [({}, "sigma_x"), ({"mechanism": "p3gm", "p3gm_latent_dim": 2, "p3gm_hidden": 8}, "noise_multiplier"),
     ({"mechanism": "marginals", "table": TABLE}, "rho")],
)  # fmt: skip
def test_the_manifest_section_is_the_plans_and_says_its_headline(fields, headline):
    plan = _plan(**fields)
    if plan.synthesis.samples_total is None:  # marginals: its rows are set by its fit, as the synthesis states them
        stated = dataclasses.replace(plan.synthesis, samples_total=118, rows_from_model=True)
        plan = dataclasses.replace(plan, synthesis=stated)
    section = plan.synthesis.manifest_section(plan, chunk_rows=64)
    assert list(section.headline()) == [headline]
    grids = set(plan.synthesis.noise_stds())
    assert ("features" in grids) == (headline == "sigma_x")
