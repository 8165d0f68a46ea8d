"""The registry entry of the marginals mechanism: calibration, checks, caveats and manifest section."""

from __future__ import annotations

import dataclasses

from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, PlanError, Public
from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.domain import codes_of, domain_of
from dpcda.mechanisms.marginals.plan import AIM, AIM_MAX_MODEL_SIZE, MarginalsPlan, label_pairs
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
