"""One in-process release: the pipeline's own cores in a plain loop, no Beam (benchmarks and reproductions).

The same functions the Beam stages call (``FirstPassCombiner``, ``build_plan``, ``normalize_into``, and each
mechanism's synthesis through its registry entry, ``Mechanism.synthesize``: ``mix_class``, ``mix_dataset``,
``perturb_block``, p3gm's ``fit`` and ``sample_rows``), so a number measured here is a number of the product.
Holds the whole dataset in memory; the pipeline is what scales. Like the Beam stages it receives the release's core
settings (``ReleaseConfig.core``: privacy and mechanism parameters, public input facts, post-processing, execution),
not the config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Optional

import numpy as np

from dpcda.mechanisms.base import Caveat, CaveatCode, InProcess
from dpcda.mechanisms.combiners import FirstPass, FirstPassCombiner
from dpcda.mechanisms.local import BLOCK_ROWS
from dpcda.mechanisms.plan import ReleasePlan, build_plan, normalize_into
from dpcda.progress import step_callback, track
from dpcda.schemas.settings import CoreSettings


def first_pass(x: np.ndarray, y: np.ndarray, bounds=(0.0, 1.0)) -> FirstPass:
    comb = FirstPassCombiner(tuple(bounds))
    return comb.add(comb.create(), x, y)


def release_in_process(
    x: np.ndarray,
    y: np.ndarray,
    core: CoreSettings,
    key: bytes,
    *,
    first: Optional[FirstPass] = None,
    device="cpu",
    progress=None,
    on_model=None,
    replan=None,
    public_stats=None,
) -> tuple[np.ndarray, np.ndarray, ReleasePlan, Optional[np.ndarray]]:
    """(features float32, hard labels, plan, label scores or None) of one release of (x, y) with ``core`` (a config's
    ``ReleaseConfig.core``).
    ``progress(step, steps, loss)``: p3gm's training progress; ``on_model(model, spec)``: p3gm's fitted model, before
    sampling (benchmarks that sample one fit several ways); ``replan(plan) -> plan``: a changed plan to run instead,
    for benchmarks' diagnostics only (the plan returned then states epsilon infinite: not a release); ``public_stats``:
    (mean, std) for ``normalization`` public, as the launcher reads them from ``normalization_file``."""
    first = first if first is not None else first_pass(x, y, core.data.feature_bounds)
    plan = build_plan(first, core, key, public_stats)
    if replan is not None:  # whatever the change, its plan claims nothing: epsilon infinite, not end-to-end DP
        plan = replan(plan)
        plan = dataclasses.replace(
            plan,
            accounting=dataclasses.replace(plan.accounting, epsilon=math.inf),
            end_to_end_dp=False,
            target_epsilon=None,
            caveats=(*plan.caveats, Caveat(CaveatCode.REPLANNED)),
        )
    y = np.asarray(y, np.int64)

    def normalized(rows):
        out = np.empty(rows.shape, np.float64)
        normalize_into(out, rows, plan.mean, plan.std, plan.clip, plan.bounds)
        return out

    basis = None
    if plan.pca is not None:
        from dpcda.mechanisms.dppca import CovarianceCombiner, dp_basis

        comb = CovarianceCombiner(plan.clip)
        acc = comb.create()
        for start in range(0, len(y), BLOCK_ROWS):
            acc = comb.add(acc, normalized(x[start : start + BLOCK_ROWS]))
        basis = dp_basis(
            acc,
            dim=plan.feature_dim,
            components=plan.pca.components,
            clip=plan.clip,
            noise_std=plan.pca.noise_std,
            key=key,
        )

    feats, labels, scores = [], [], []
    progress = progress if progress is not None else step_callback(f"{plan.mechanism} training")
    ctx = InProcess(x, y, plan, core, key, normalized, basis, device, progress=progress, on_model=on_model)
    what = f"{plan.mechanism} rows synthesised"
    with contextlib.ExitStack() as stack:
        bar = None if plan.samples_total is None else stack.enter_context(track(what, plan.samples_total, unit="rows"))
        for f, lab, sc in plan.mechanism_entry.synthesize(ctx):
            if bar is None:  # a synthesis that sets its own rows (marginals: its model's total) states them first
                bar = stack.enter_context(track(what, ctx.stated_plan.samples_total, unit="rows"))
            feats.append(f)
            labels.append(lab)
            bar.update(len(lab))
            if sc is not None:
                scores.append(sc)
    return (
        np.concatenate(feats),
        np.concatenate(labels).astype(np.int64),
        ctx.stated_plan if ctx.stated_plan is not None else plan,  # with the synthesis's DP choices, as Beam states
        np.concatenate(scores) if scores else None,
    )
