"""The registry entry of the marginals mechanism: calibration, checks, caveats and manifest section."""

from __future__ import annotations

from dpcda.mechanisms.base import Calibrated, InProcess, Mechanism, PlanError
from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.domain import codes_of, domain_of
from dpcda.mechanisms.marginals.limits import footprint, refusal
from dpcda.mechanisms.marginals.plan import AIM, AIM_MAX_MODEL_SIZE, MarginalsPlan
from dpcda.mechanisms.marginals.selection import label_pairs
from dpcda.mechanisms.marginals.synthesis import fit_and_sample, integer_columns, stated_release_plan


class Marginals(Mechanism):
    """Rows sampled from a graphical model fitted to noisy one- and two-way counts (MST selection), tables only."""

    name = "marginals"
    composition = (
        "sequential: the one-way counts, the selection rounds and the selected pairs' counts (one zCDP budget; "
        "selection aim: adaptive rounds under a zCDP filter capped at that budget); no class histogram: the row "
        "count is the fitted model's total (post-processing)"
    )
    summary = "marginals (MST or AIM): noisy one- and two-way counts on public bins, a graphical model (mbi) sampled"
    modes = ("poisson",)
    groups = "dataset"
    graph = "dpcda.transforms.marginals:FitAndSampleMarginals"
    audit_game = "marginal-counts"  # no canary game yet: the config refuses --audit
    fits_model = True
    normalizes = False
    class_histogram = False  # the row count is the fitted model's total (``synthesis.rows_of_total``)
    accountant = "rdp"

    def calibrate(self, events, budget, *, params, data, **_) -> Calibrated:
        """rho calibrated so that the whole release (its events, RDP) spends what the budget planner
        (``privacy.budget.BudgetPlan``) left (no class histogram: the whole synthesis budget)."""
        from dpcda.privacy.marginals import calibrate

        dom = domain_of(data.table, params.bins)
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
            plan = MarginalsPlan(
                selection=AIM,
                domain=dom,
                iterations=params.iters,
                rho=aim_event.rho,
                event=aim_event,
                max_model_size=params.max_model_size or AIM_MAX_MODEL_SIZE,
                rows=params.samples,
            )
            return Calibrated(sigma_x=0.0, per_group=(aim_event,), marginals=plan)
        event = calibrate(
            target_epsilon=budget.synthesis_epsilon,
            delta=budget.accountant_delta,
            one_way=n,
            rounds=n - 1,
            two_way=label_pairs(params.selection, n) + n - 1,
            shared=budget.shared,
            stated_delta=budget.delta,
        )
        plan = MarginalsPlan(
            selection=params.selection,
            domain=dom,
            iterations=params.iters,
            rho=event.rho,
            event=event,
            rows=params.samples,
        )
        return Calibrated(sigma_x=0.0, per_group=(event,), marginals=plan)

    def synthesis_events(self, mode, **_) -> list:
        """The marginals' events depend on the table's columns: ``calibrate`` makes them, not a sigma_x."""
        raise TypeError("marginals: its events come from calibrate() (the table's columns), not from a sigma_x")

    def extra_draws(self, calibrated: Calibrated, *, dim: int, num_classes: int) -> int:
        """Gaussian draws: every one-way cell, and at most the largest two-way arrays the picks can reach."""
        dom = calibrated.marginals.domain
        n = len(dom.sizes)
        if calibrated.marginals.selection == AIM:  # at most planned_rounds rounds (privacy.aim.AimSchedule)
            from dpcda.privacy.aim import ROUNDS_PER_COLUMN

            largest = max(dom.sizes[a] * dom.sizes[b] for a, b in dom.pairs) if n > 1 else max(dom.sizes)
            return sum(dom.sizes) + ROUNDS_PER_COLUMN * n * largest
        pair_cells = sorted((dom.sizes[a] * dom.sizes[b] for a, b in dom.pairs), reverse=True)
        label = sum(dom.sizes[a] * dom.sizes[-1] for a in range(n - 1))
        return sum(dom.sizes) + sum(pair_cells[: n - 1]) + label * (label_pairs(calibrated.marginals.selection, n) > 0)

    def check_before_work(self, core, dim: int) -> None:
        """The table's size against ``limits``' bounds (columns, count cells, model cells, the footprint in memory),
        from the public schema, before any row is read."""
        params, table = core.params, core.data.table
        dom = domain_of(table, params.bins)
        model_cap = (params.max_model_size or AIM_MAX_MODEL_SIZE) if params.selection == AIM else None
        fp = footprint(dom, table.encoded_width, params.selection, model_cap, core.execution.chunk_rows)
        why = refusal(fp, params.bins, params.selection)
        if why:
            raise PlanError(why)

    def label_caveat(self) -> str:
        return (
            "marginals: the rows and labels are sampled from a graphical model fitted to noisy one- and two-way counts "
            "on the schema's public bins (sampling is post-processing); the row count is the fitted model's total, "
            "rounded (post-processing of the same noisy counts), unless samples is given."
        )

    def synthesize(self, ctx: InProcess):
        plan, schema = ctx.plan, ctx.core.data.table
        mp = plan.marginals
        counter = MarginalCounter(mp.domain)
        acc = counter.add(counter.create(), codes_of(ctx.x, ctx.y, schema, mp.domain.bins))
        chunk_rows, integers = ctx.core.execution.chunk_rows, integer_columns(ctx.core.data.source, schema)
        stated, chunks = fit_and_sample(acc, plan, schema, ctx.key, chunk_rows, integers)
        ctx.stated_plan = stated_release_plan(plan, stated)  # the picks and the rows, as the Beam path states them
        for x, y in chunks:
            yield x, y, None

    def manifest_section(self, plan, *, chunk_rows, common, postprocessing, projection):
        from dpcda.schemas.manifest import MarginalsMechanism

        mp: MarginalsPlan = plan.marginals
        ev = mp.event
        if mp.selection == AIM:
            return self._aim_section(plan, mp)
        return MarginalsMechanism(
            **self._shared_fields(plan, mp),
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

    @staticmethod
    def _shared_fields(plan, mp: MarginalsPlan) -> dict:
        """The manifest fields every selection states alike."""
        return dict(
            name="marginals",
            mode=plan.mode,
            selection=mp.selection,
            num_classes=plan.num_classes,
            samples_total=plan.samples_total,
            dataset_size_dp=int(sum(plan.dp_class_sizes)) if plan.dp_class_sizes else None,
            row_count=None if mp.rows_from_model is None else "model_total" if mp.rows_from_model else "samples",
            bins=mp.domain.bins,
            columns={n: s for n, s in zip(mp.domain.names, mp.domain.sizes)},
            rho=mp.rho,
        )

    @staticmethod
    def _aim_section(plan, mp: MarginalsPlan):
        from dpcda.schemas.manifest import MarginalsMechanism

        rec = mp.aim or {}
        rounds = rec.get("rounds", [])
        first = rounds[0] if rounds else {}
        return MarginalsMechanism(
            **Marginals._shared_fields(plan, mp),
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
