"""Builds the Manifest from a ReleasePlan: the one place that decides what is released."""

from __future__ import annotations

import datetime
import math
import platform

from dpcda.pipeline import __version__
from dpcda.privacy import noise
from dpcda.privacy.composition import release_events_to_json
from dpcda.privacy.risk import risk_figures
from dpcda.schemas.manifest import (
    InputInfo,
    Manifest,
    Noise,
    Normalization,
    Output,
    PostProcessing,
    Privacy,
    Software,
)

TEST_SEED_CAVEAT = (
    "TEST SEED: the noise key is derived from a fixed seed; anyone who knows it rebuilds every draw, so this release "
    "is reproducible and NOT private (end_to_end_dp false). privacy.epsilon is the mechanism's, under a secret key, "
    "not this release's."
)


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


def postprocessing(plan) -> PostProcessing | None:
    if plan.lowpass is None and plan.denoise is None:
        return None
    from dpcda.mechanisms.postprocess import lowpass_kept

    shape = plan.lowpass[0] if plan.lowpass else plan.denoise_spec[0]
    k = plan.lowpass[1] if plan.lowpass else None
    return PostProcessing(
        lowpass=k,
        denoise=plan.denoise,
        image_shape=list(shape),
        kept_coefficients=lowpass_kept(shape, k)[1] if k else None,
    )


def projection_section(plan):
    if not plan.pca_components:
        return None
    return {
        "method": "dp-pca",
        "components": plan.pca_components,
        "covariance_noise_std": plan.pca_noise_std,
        "epsilon_share": plan.pca_share,
    }


def mechanism_section(cfg, plan):
    """The manifest's ``mechanism``: one model per mechanism (a discriminated union on ``name``), which the
    mechanism's registry entry builds (``Mechanism.manifest_section``)."""
    worst = plan.accounting.worst_class_event
    z = worst.noise_multiplier if worst else 0.0
    common = dict(
        mode=plan.mode,
        clip=plan.clip,
        sigma_x=plan.sigma_x,
        noise_multiplier=z,
        num_classes=plan.num_classes,
        samples_total=plan.samples_total,
    )
    return plan.mechanism_entry.manifest_section(
        plan,
        chunk_rows=cfg.chunk_rows,
        common=common,
        postprocessing=postprocessing(plan),
        projection=projection_section(plan),
    )


def paper_epsilon(plan) -> float | None:
    """Seed 000's Theorem 1 for this release's sigmas, as written: informational, never the guarantee (where the
    mechanism is seed 000's: ``Mechanism.paper_theorem``)."""
    from dpcda.evaluation.paper import theorem1_epsilon

    if not plan.mechanism_entry.paper_theorem:
        return None
    return theorem1_epsilon(
        sigma_x=plan.sigma_x,
        sigma_y=plan.sigma_y,
        mixing_order=plan.mixing_order,
        clip=plan.clip,
        num_records=plan.records_public,
        num_samples=plan.samples_total,
        delta=plan.accounting.delta,
    )


def noise_section(plan) -> Noise:
    sigmas = {
        "features": plan.sigma_x,
        "labels": plan.sigma_y,
        "normalization": plan.normalization_noise_std,
        "class_histogram": plan.histogram_noise_std,
        # in units of (clip / 2^16)^2, as the covariance sums are (privacy.dp_stats.dp_covariance)
        "pca_covariance": plan.pca_noise_std,
        **(
            {
                "dp_em": plan.p3gm.em_noise_std,
                "dp_sgd": plan.p3gm.noise_multiplier * plan.p3gm.grad_clip if plan.p3gm.noise_multiplier else 0,
            }
            if plan.p3gm
            else {}
        ),
        **(
            {
                "marginals_one_way": plan.marginals.event.one_way_std,
                "marginals_two_way": plan.marginals.event.two_way_std,
            }
            if plan.marginals
            else {}
        ),
    }
    return Noise(
        generator=noise.GENERATOR,
        sampler=noise.SAMPLER,
        words=noise.WORDS,
        grids={k: noise.grid_for(s) for k, s in sigmas.items() if s},
    )


def build_manifest(cfg, input_info: InputInfo, plan, outputs, prefix: str = "") -> Manifest:
    """The manifest draft of a release (the pipeline writes it; ``storage.publish`` writes the final manifest).

    ``prefix`` is the run directory relative to OUTPUT ('' locally, ``runs/<run>/`` on GCS): every path in the
    manifest is relative to OUTPUT.
    """
    acc = plan.accounting
    return Manifest(
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        software=software(),
        input=input_info,
        mechanism=mechanism_section(cfg, plan),
        normalization=Normalization(
            method=plan.normalization_method,
            feature_bounds=plan.bounds,
            out_of_bounds=cfg.out_of_bounds,
            min_std=cfg.min_std,
            noise_std=plan.normalization_noise_std,
            epsilon_share=plan.normalization_share,
            statistics_file=f"{prefix}normalization.json",
        ),
        privacy=Privacy(
            epsilon=finite(plan.guarantee_epsilon),
            delta=acc.delta,
            target_epsilon=cfg.epsilon,
            epsilon_this_histogram=finite(acc.epsilon) if plan.mode == "poisson" else None,
            accountant=acc.accountant,
            neighbouring_relation=acc.relation,
            composition="parallel over classes (a record meets only its own class's rows); sequential "
            "with the statistics releases",
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
            caveats=list(plan.caveats) + ([TEST_SEED_CAVEAT] if cfg.reproducible else []),
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
