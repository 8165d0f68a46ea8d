"""The manifest's one owner: builds the draft from a ReleasePlan (the one place that decides what is released) and
assembles the published manifest from the draft, the run, the stages' sections and the ledger's.

How a release's manifest comes together (docs/manifest.md): the pipeline writes a draft (``build_manifest``); the
launcher reads it back as the typed ``Manifest`` (``read_draft``, the one validation of the whole); each declared
``Stage`` reads a frozen copy and returns its section, checked against the manifest's field as it is added
(``run_stages``); ``assemble`` puts draft, run, sections and ledger together once; ``storage.publish`` writes it last.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import platform
from typing import Any, Callable, Optional

from pydantic import TypeAdapter, ValidationError

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Caveat, CaveatCode
from dpcda.mechanisms.normalization import NORMALIZATION_FILE
from dpcda.pipeline import __version__
from dpcda.pipeline.errors import ReleaseError
from dpcda.privacy import noise
from dpcda.privacy.composition import release_events_to_json
from dpcda.privacy.risk import risk_figures
from dpcda.schemas.manifest import (
    InputInfo,
    Manifest,
    Noise,
    Normalization,
    Output,
    Privacy,
    RunInfo,
    Software,
)

SECRET_KEY_CAVEAT = (
    "Noise and sampling draw from ChaCha20 keystreams under a fresh 256-bit secret key: the guarantee holds against "
    "adversaries who cannot tell ChaCha20 from random bits (privacy.noise says how draws are made)."
)
SEED_KEY_CAVEAT = (
    "Noise and sampling draw from ChaCha20 keystreams under a key derived from a TEST seed, which rebuilds every draw "
    "(privacy.noise says how draws are made)."
)
TEST_SEED_CAVEAT = (
    "TEST SEED: the noise key is derived from a fixed seed; anyone who knows it rebuilds every draw, so this release "
    "is reproducible and NOT private (end_to_end_dp false). privacy.epsilon is the mechanism's, under a secret key, "
    "not this release's."
)


def caveat_words(caveat: Caveat) -> str:
    """The manifest's words for one of a plan's caveats (``mechanisms.plan.Caveat``); a mechanism's own words (its
    labels, its fixed-mode relation) come from its registry entry."""
    code = caveat.code
    if code is CaveatCode.SECRET_KEY:
        return SECRET_KEY_CAVEAT
    if code is CaveatCode.SEED_KEY:
        return SEED_KEY_CAVEAT
    if code is CaveatCode.LABELS:
        return registry.get(caveat.mechanism).label_caveat()
    if code is CaveatCode.FIXED_CLASS_SIZES:
        return registry.get(caveat.mechanism).fixed_caveat
    if code is CaveatCode.REFERENCE_BUDGET:
        return (
            f"sigma_x was given explicitly: the statistics spent their shares of a reference budget "
            f"epsilon={caveat.epsilon:g}; the epsilon below is what the whole release spends."
        )
    if code is CaveatCode.POISSON_ADAPTIVE:
        return registry.get(caveat.mechanism).adaptive_caveat
    if code is CaveatCode.PUBLIC_NORMALIZATION:
        return "Normalisation statistics were supplied by the user and are assumed public."
    if code is CaveatCode.EXACT_NORMALIZATION:
        return (
            "NOT END-TO-END DP: the z-score uses exact private means and stds "
            "(--normalization exact); epsilon below covers the mixing only."
        )
    if code is CaveatCode.NO_FEATURE_NOISE:
        return "sigma_x = 0: no noise on the features; epsilon is infinite."
    if code is CaveatCode.MODEL_WITHOUT_NOISE:
        return f"sigma_x = 0: {caveat.mechanism} was fitted without noise or clipping; epsilon is infinite."
    if code is CaveatCode.REPLANNED:
        return "A changed plan (replan), not a release: no privacy claim."
    raise ValueError(f"caveat: no words for {code}")  # every code is worded above


def software() -> Software:
    from importlib.metadata import version

    import dp_accounting  # noqa: F401
    import torch

    try:
        beam = version("apache-beam")
    except Exception:  # the GPU image has no Beam
        beam = None
    return Software(
        version=__version__,
        python=platform.python_version(),
        apache_beam=beam,
        torch=torch.__version__,
        dp_accounting=version("dp-accounting"),
    )


def finite(x: float | None) -> float | None:
    """JSON has no infinity: infinite epsilons are written as null (the schema says so)."""
    return x if x is not None and math.isfinite(x) else None


def paper_epsilon(plan) -> float | None:
    """Seed 000's Theorem 1 for this release's sigmas, as written: informational, never the guarantee (where the
    mechanism's plan states its arguments: ``SynthesisPlan.paper_theorem``)."""
    from dpcda.evaluation.paper import theorem1_epsilon

    args = plan.synthesis.paper_theorem(plan)
    return theorem1_epsilon(**args) if args is not None else None


def noise_section(plan) -> Noise:
    """The generator, the sampler and the grid of every Gaussian release: the statistics' and the synthesis' own
    (``SynthesisPlan.noise_stds``)."""
    sigmas = {
        "normalization": plan.normalization_noise_std,
        "class_histogram": plan.histogram_noise_std,
        **plan.synthesis.noise_stds(),
    }
    return Noise(
        generator=noise.GENERATOR,
        sampler=noise.SAMPLER,
        words=noise.WORDS,
        grids={k: noise.grid_for(s) for k, s in sigmas.items() if s},
    )


def build_manifest(cfg, input_info: InputInfo, plan, outputs, prefix: str = "", model=None) -> Manifest:
    """The manifest draft of a release (the pipeline writes it; ``storage.publish`` writes the final manifest).

    ``prefix`` is the run directory relative to OUTPUT ('' locally, ``runs/<run>/`` on GCS): every path in the
    manifest is relative to OUTPUT. ``model``: the ``ReleaseModel`` section of a release that keeps its fitted model.
    """
    acc = plan.accounting
    return Manifest(
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        software=software(),
        input=input_info,
        mechanism=plan.synthesis.manifest_section(plan, chunk_rows=cfg.chunk_rows),
        normalization=Normalization(
            method=plan.normalization_method,
            feature_bounds=plan.bounds,
            out_of_bounds=cfg.out_of_bounds,
            min_std=cfg.min_std,
            noise_std=plan.normalization_noise_std,
            epsilon_share=plan.normalization_share,
            # only a release whose rows were z-scored writes the statistics it used (transforms.write)
            statistics_file=f"{prefix}{NORMALIZATION_FILE}" if plan.z_scored else None,
        ),
        privacy=Privacy(
            epsilon=finite(plan.guarantee_epsilon),
            delta=acc.delta,
            target_epsilon=cfg.epsilon,
            epsilon_this_histogram=finite(acc.epsilon) if plan.mode == "poisson" else None,
            accountant=acc.accountant,
            neighbouring_relation=acc.relation,
            composition=plan.mechanism_entry.composition,
            components={k: finite(v) for k, v in acc.components.items()},
            cross_check={k: finite(v) for k, v in acc.cross_check.items()},
            delta_breakdown=dict(acc.delta_breakdown),
            noise=noise_section(plan),
            risk=risk_figures(
                # poisson without a target epsilon has no epsilon fixed before the histogram: no figures
                plan.guarantee_epsilon
                if plan.end_to_end_dp and not cfg.reproducible and not (plan.mode == "poisson" and cfg.epsilon is None)
                else None,
                acc.delta,
                acc.relation,
            ),
            # a --seed key is rebuilt by anyone who knows the seed: the release itself is not private
            end_to_end_dp=plan.end_to_end_dp and not cfg.reproducible,
            reproducible_seed=cfg.reproducible,
            paper_theorem1_epsilon=finite(paper_epsilon(plan)),
            events=release_events_to_json(acc.events) if acc.events is not None else None,
            caveats=[caveat_words(c) for c in plan.caveats] + ([TEST_SEED_CAVEAT] if cfg.reproducible else []),
        ),
        output=Output(
            rows=sum(o.rows for o in outputs),
            files=list(outputs),
            prefix=prefix,
            **(
                {
                    "format": f"parquet: {cfg.features_column} fixed_size_list<float32>[d], {cfg.label_column} "
                    f"int64, {cfg.label_column}_soft fixed_size_list<float32>[{plan.num_classes}]"
                }
                if cfg.writes_soft_labels and cfg.table is None
                else {"format": "parquet: the input's columns and Arrow types (input.table.arrow_schema)"}
                if cfg.table is not None
                else {}
            ),
        ),
        model=model,
    )


@dataclasses.dataclass(frozen=True)
class Stage:
    """A release stage after the pipeline: reads the run directory and the manifest so far (a frozen deep copy: a
    stage cannot change what another wrote) and returns the manifest's ``section``.

    ``name`` is what the log and an error call it; ``section`` is the ``Manifest`` field it fills (its type is the
    section's type: a model, or a free ``dict`` for the evaluation and audit sections, whose keys their own modules
    document); a later stage with the same ``section`` replaces the earlier one's (it reads it first)."""

    name: str
    section: str
    run: Callable[[str, Manifest], Any]

    def __post_init__(self):
        if self.section not in SECTIONS:
            raise ValueError(f"stage {self.name}: '{self.section}' is not a stage's section ({', '.join(SECTIONS)})")


# the manifest fields the stages fill; the draft holds every other field (and ``run`` and ``ledger``, the launcher's)
SECTIONS = ("utility", "audit")


def _section(field: str, value: Any, who: str) -> Any:
    """``value`` checked against the manifest's ``field`` and as the published JSON will hold it (no NaN, no
    infinity, nothing JSON cannot say); ReleaseError naming ``who`` otherwise."""
    adapter = TypeAdapter(Manifest.model_fields[field].annotation)
    try:
        typed = adapter.validate_python(value)
        json.dumps(adapter.dump_python(typed, mode="json"), allow_nan=False)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        detail = f"{where}: {first['msg']}" if where else first["msg"]
        raise ReleaseError(f"{who}: its '{field}' section does not fit the manifest ({detail})") from None
    except (TypeError, ValueError) as err:  # pydantic's serialization error is a ValueError
        raise ReleaseError(
            f"{who}: its '{field}' section cannot be written as the manifest's JSON ({str(err).splitlines()[0][:200]})"
        ) from None
    return typed


def read_draft(text: str | bytes, where: str) -> Manifest:
    """The pipeline's draft (``storage.publish.DRAFT`` at ``where``) as the typed manifest; ReleaseError naming the
    draft if it does not validate. The one validation of the whole manifest: every later part is typed."""
    try:
        return Manifest.model_validate_json(text)
    except ValidationError as err:
        first = err.errors()[0]
        where_in = ".".join(str(p) for p in first["loc"])
        raise ReleaseError(
            f"{where}: the pipeline's manifest draft does not validate ({err.error_count()} error(s); first: "
            f"{where_in or '(top)'}: {first['msg']}); nothing was published"
        ) from None


def run_stages(stages, workdir: str, manifest: Manifest) -> dict[str, Any]:
    """Runs ``stages`` in order on the run directory; returns their sections by field. Each stage reads a frozen deep
    copy of ``manifest`` with the sections before it; its own section is checked the moment it returns, so a bad one
    fails at its own step, named."""
    sections: dict[str, Any] = {}
    for stage in stages:
        seen = manifest.model_copy(update=sections, deep=True)
        sections[stage.section] = _section(stage.section, stage.run(workdir, seen), f"stage {stage.name}")
    return sections


def assemble(draft: Manifest, run: RunInfo, sections: dict[str, Any], ledger: Optional[dict] = None) -> Manifest:
    """The published manifest: the draft, the run, the stages' sections (checked again here: they may come from
    anywhere) and the ledger's section, put together once."""
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ReleaseError(f"'{unknown[0]}' is not a stage's section ({', '.join(SECTIONS)})")
    typed = {k: _section(k, v, f"section {k}") for k, v in sections.items()}
    return draft.model_copy(
        update={"run": RunInfo.model_validate(run), **typed, "ledger": _section("ledger", ledger, "the ledger")}
    )


def export_schema(path=None) -> None:
    """Writes the manifest's JSON Schema (``dpcda/schemas/manifest.schema.json``) from the pydantic model."""
    import json

    from dpcda.schemas.manifest import SCHEMA_PATH

    target = path or SCHEMA_PATH
    target.write_text(json.dumps(Manifest.model_json_schema(), indent=2) + "\n")


if __name__ == "__main__":
    export_schema()
    print("wrote dpcda/schemas/manifest.schema.json")
