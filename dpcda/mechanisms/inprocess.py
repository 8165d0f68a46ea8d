"""One in-process release: the pipeline's own cores in a plain loop, no Beam (benchmarks and reproductions).

The same functions the Beam stages call (``FirstPassCombiner``, ``build_plan``, ``normalize_into``, and each
mechanism's synthesis: ``mix_class``, ``mix_dataset``, ``perturb_block``, p3gm's ``fit`` and ``sample_rows``), so a
number measured here is a number of the product. Holds the whole dataset in memory; the pipeline is what scales.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from dpcda.mechanisms.combiners import FirstPass, FirstPassCombiner
from dpcda.mechanisms.dpcda import mix_class
from dpcda.mechanisms.dpmix import mix_dataset
from dpcda.mechanisms.local import perturb_block
from dpcda.mechanisms.plan import ReleasePlan, build_plan, normalize_into, sample_chunks
from dpcda.mechanisms.postprocess import make_postprocess
from dpcda.schemas.config import ReleaseConfig

BLOCK_ROWS = 16384


def first_pass(x: np.ndarray, y: np.ndarray, bounds=(0.0, 1.0)) -> FirstPass:
    comb = FirstPassCombiner(tuple(bounds))
    return comb.add(comb.create(), x, y)


def release_in_process(
    x: np.ndarray,
    y: np.ndarray,
    cfg: ReleaseConfig,
    key: bytes,
    *,
    first: Optional[FirstPass] = None,
    device="cpu",
    progress=None,
    on_model=None,
    replan=None,
    public_stats=None,
) -> tuple[np.ndarray, np.ndarray, ReleasePlan, Optional[np.ndarray]]:
    """(features float32, hard labels, plan, label scores or None) of one release of (x, y) under ``cfg``.
    ``progress(step, steps, loss)``: p3gm's training progress; ``on_model(model, spec)``: p3gm's fitted model, before
    sampling (benchmarks that sample one fit several ways); ``replan(plan) -> plan``: a changed plan to run instead,
    for benchmarks' diagnostics only (the plan returned then states epsilon infinite: not a release); ``public_stats``:
    (mean, std) for ``normalization`` public, as the launcher reads them from ``normalization_file``."""
    first = first if first is not None else first_pass(x, y, cfg.feature_bounds)
    plan = build_plan(first, cfg, key, public_stats)
    if replan is not None:  # whatever the change, its plan claims nothing: epsilon infinite, not end-to-end DP
        plan = replan(plan)
        plan = dataclasses.replace(
            plan,
            accounting=dataclasses.replace(plan.accounting, epsilon=math.inf),
            end_to_end_dp=False,
            target_epsilon=None,
            caveats=(*plan.caveats, "A changed plan (replan), not a release: no privacy claim."),
        )
    y = np.asarray(y, np.int64)

    def normalized(rows):
        out = np.empty(rows.shape, np.float64)
        normalize_into(out, rows, plan.mean, plan.std, plan.clip, plan.bounds)
        return out

    basis = None
    if plan.pca_components:
        from dpcda.mechanisms.dppca import CovarianceCombiner, dp_basis

        comb = CovarianceCombiner(plan.clip)
        acc = comb.create()
        for start in range(0, len(y), BLOCK_ROWS):
            acc = comb.add(acc, normalized(x[start : start + BLOCK_ROWS]))
        basis = dp_basis(
            acc,
            dim=plan.feature_dim,
            components=plan.pca_components,
            clip=plan.clip,
            noise_std=plan.pca_noise_std,
            key=key,
        )

    feats, labels, scores = [], [], []
    if plan.mechanism == "dpcda":
        for k in range(plan.num_classes):
            for _, f, lab in mix_class(
                normalized(x[y == k]),
                key=key,
                class_index=k,
                num_classes=plan.num_classes,
                mode=plan.mode,
                mixing_order=plan.mixing_order,
                sigma_x=plan.sigma_x,
                samples=plan.samples_per_class,
                chunk_rows=cfg.chunk_rows,
                sampling_rate=plan.sampling_rates[k],
                device=device,
                sigma_y=plan.sigma_y,
                lowpass=plan.lowpass,
                denoise=plan.denoise_spec,
                soft_labels=cfg.soft_labels,
                basis=basis,
                clip=plan.clip,
            ):
                feats.append(f)
                (scores if cfg.soft_labels else labels).append(lab)
        if cfg.soft_labels:
            labels = [s.argmax(axis=1) for s in scores]
    elif plan.mechanism == "dpmix":
        for _, f, sc in mix_dataset(
            normalized(x),
            y,
            key=key,
            num_classes=plan.num_classes,
            mode=plan.mode,
            mixing_order=plan.mixing_order,
            sigma_x=plan.sigma_x,
            sigma_y=plan.sigma_y,
            samples=plan.samples_total,
            chunk_rows=cfg.chunk_rows,
            sampling_rate=plan.sampling_rates[0],
            device=device,
            lowpass=plan.lowpass,
            denoise=plan.denoise_spec,
            basis=basis,
            clip=plan.clip,
        ):
            feats.append(f)
            scores.append(sc)
            labels.append(sc.argmax(axis=1))
    elif plan.mechanism == "p3gm":
        from dpcda.mechanisms.p3gm import fit, sample_rows, spec_from_plan

        spec = spec_from_plan(plan)
        model = fit(normalized(x), y, basis, plan.clip, spec, key, device, progress=progress)
        if on_model is not None:
            on_model(model, spec)
        for chunk, rows in sample_chunks(plan, cfg.chunk_rows):
            f, lab = sample_rows(model, spec, rows=rows, chunk=chunk, key=key, clip=plan.clip, device=device)
            feats.append(f)
            labels.append(lab)
    else:
        projection = None
        if plan.projection is not None:
            from dpcda.mechanisms.randproj import projection_matrix

            projection = projection_matrix(plan.feature_dim, plan.projection[0], plan.projection[1])
        post = make_postprocess(lowpass=plan.lowpass, denoise=plan.denoise_spec)
        for start in range(0, len(y), BLOCK_ROWS):
            rows = normalized(x[start : start + BLOCK_ROWS])
            feats.append(
                perturb_block(
                    rows, key=key, block=("in-process", start), sigma_x=plan.sigma_x, projection=projection, post=post
                )
            )
            labels.append(y[start : start + BLOCK_ROWS])
    return (
        np.concatenate(feats),
        np.concatenate(labels).astype(np.int64),
        plan,
        np.concatenate(scores) if scores else None,
    )
