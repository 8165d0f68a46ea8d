"""The registry entry of the marginals mechanism: calibration, checks, caveats and manifest section."""

from __future__ import annotations

import dataclasses

from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, PlanError, Public
from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.domain import codes_of, domain_of
from dpcda.mechanisms.marginals.plan import AIM, AIM_MAX_MODEL_SIZE, MarginalsPlan
from dpcda.mechanisms.marginals.selection import label_pairs
from dpcda.mechanisms.marginals.synthesis import fit_and_sample, integer_columns
from dpcda.schemas.mechanism_params import MarginalsParams

MAX_CELLS = 1 << 26  # cells of every one-way and two-way count array a release holds (int64: 512 MiB)


class Marginals(Mechanism):
    """Rows sampled from a graphical model fitted to noisy one- and two-way counts (MST selection), tables only."""

    name = "marginals"
    composition = (
        "sequential: the one-way counts, the selection rounds and the selected pairs' counts (one zCDP budget; "
        "selection aim: adaptive rounds under a zCDP filter capped at that budget), after the class histogram "
        "(adaptive)"
    )
    summary = "marginals (MST or AIM): noisy one- and two-way counts on public bins, a graphical model (mbi) sampled"
    params = MarginalsParams
    grouping = Grouping.DATASET
    graph = "dpcda.transforms.marginals:FitAndSampleMarginals"
    audit_game = ""  # no canary game yet: the config refuses --audit
    adaptive_caveat = ""  # the histogram chooses T alone; the composition says it is adaptive
    fits_model = True
    normalizes = False
    accountant = "rdp"

    def plan(self, public: Public) -> MarginalsPlan:
        """rho calibrated so that the whole release (its events, RDP) spends what the budget planner
        (``privacy.budget.BudgetPlan``) left after the histogram."""
        from dpcda.privacy.marginals import calibrate

        params, budget = public.params, public.budget
        dom = domain_of(public.core.data.table, params.bins)
        n = len(dom.sizes)
        if params.selection == AIM:
            from dpcda.privacy.aim import calibrate as calibrate_aim

            aim_event = calibrate_aim(
                target_epsilon=budget.synthesis_epsilon,
                delta=budget.accountant_delta,
                one_way=n,
                shared=budget.shared,
                stated_delta=budget.delta,
            )
            return MarginalsPlan(
                selection=AIM,
                domain=dom,
                iterations=params.iters,
                rho=aim_event.rho,
                event=aim_event,
                max_model_size=params.max_model_size or AIM_MAX_MODEL_SIZE,
                samples_total=public.samples,
            )
        event = calibrate(
            target_epsilon=budget.synthesis_epsilon,
            delta=budget.accountant_delta,
            one_way=n,
            rounds=n - 1,
            two_way=label_pairs(params.selection, n) + n - 1,
            shared=budget.shared,
            stated_delta=budget.delta,
        )
        return MarginalsPlan(
            selection=params.selection,
            domain=dom,
            iterations=params.iters,
            rho=event.rho,
            event=event,
            samples_total=public.samples,
        )

    def check_before_work(self, core, dim: int) -> None:
        dom = domain_of(core.data.table, core.params.bins)
        if dom.cells > MAX_CELLS:
            raise PlanError(
                f"marginals: the one- and two-way counts of this table take {dom.cells} cells at "
                f"marginals_bins={core.params.bins}, more than {MAX_CELLS}; lower --marginals-bins or drop columns"
            )

    def label_caveat(self) -> str:
        return (
            "marginals: the rows and labels are sampled from a graphical model fitted to noisy one- and two-way counts "
            "on the schema's public bins (sampling is post-processing); the row count is a DP estimate."
        )

    def synthesize(self, ctx: InProcess):
        plan, schema = ctx.plan, ctx.core.data.table
        mp = plan.synthesis
        counter = MarginalCounter(mp.domain)
        acc = counter.add(counter.create(), codes_of(ctx.x, ctx.y, schema, mp.domain.bins))
        chunk_rows, integers = ctx.core.execution.chunk_rows, integer_columns(ctx.core.data.source, schema)
        stated, chunks = fit_and_sample(acc, plan, schema, ctx.key, chunk_rows, integers)
        ctx.stated_plan = dataclasses.replace(plan, synthesis=stated)  # the picks, as the Beam path states them
        for x, y in chunks:
            yield x, y, None


def manifest_section(plan, mp: MarginalsPlan):
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
        "its codes, uniformly; a numeric code becomes a value uniform inside its bin",
    )


def _shared_fields(plan, mp: MarginalsPlan) -> dict:
    """The manifest fields every selection states alike."""
    return dict(
        name="marginals",
        mode=plan.mode,
        selection=mp.selection,
        num_classes=plan.num_classes,
        samples_total=mp.samples_total,
        dataset_size_dp=int(sum(plan.dp_class_sizes)) if plan.dp_class_sizes else None,
        bins=mp.domain.bins,
        columns={n: s for n, s in zip(mp.domain.names, mp.domain.sizes)},
        rho=mp.rho,
    )


def _aim_section(plan, mp: MarginalsPlan):
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
            "round_estimator": "dpcda.mechanisms.pgm (mbi's mirror descent, junction tree and model size in numpy)",
            "round_iterations": rec.get("round_iterations"),
            "round_tolerance": rec.get("round_tolerance"),
            "total": mp.estimated_total,
        },
        sampling="mbi's synthetic_data (randomized rounding of the model's marginals); a numeric code becomes a "
        "value uniform inside its bin",
        aim={
            "workload": "every pair of columns (the label's pair with every column among them), weighted as AIM's "
            "compile_workload; candidates: those pairs and every column (the workload's downward closure; no "
            "clique larger than a pair)",
            "max_model_size_cells": mp.max_model_size,
            **{k: v for k, v in rec.items() if k != "max_model_size_cells"},
        },
    )
