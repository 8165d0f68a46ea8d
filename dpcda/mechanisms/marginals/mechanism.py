"""The registry entry of the marginals mechanism: calibration, checks, caveats and manifest section."""

from __future__ import annotations

import dataclasses

from dpcda.mechanisms.base import Grouping, InProcess, Mechanism, PlanError, Public
from dpcda.mechanisms.marginals.counting import MarginalCounter
from dpcda.mechanisms.marginals.domain import codes_of, domain_of
from dpcda.mechanisms.marginals.limits import footprint, refusal
from dpcda.mechanisms.marginals.plan import AIM, AIM_MAX_MODEL_SIZE, MarginalsPlan, label_pairs
from dpcda.mechanisms.marginals.rules import kept_rules
from dpcda.mechanisms.marginals.synthesis import fit_and_sample, integer_columns
from dpcda.schemas.mechanism_params import MarginalsParams


class Marginals(Mechanism):
    """Rows sampled from a graphical model fitted to noisy one- and two-way counts (MST selection), tables only."""

    name = "marginals"
    composition = (
        "sequential: the one-way counts, the selection rounds and the selected pairs' counts (one zCDP budget; "
        "selection aim: adaptive rounds under a zCDP filter capped at that budget); no class histogram: the row "
        "count is the fitted model's total (post-processing)"
    )
    params = MarginalsParams
    grouping = Grouping.DATASET
    graph = "dpcda.transforms.marginals:FitAndSampleMarginals"
    audit_game = ""  # no canary game yet: the config refuses --audit
    adaptive_caveat = ""  # no histogram is drawn (class_histogram below): nothing adaptive to say
    fits_model = True
    normalizes = False
    class_histogram = False  # the row count is the fitted model's total (``synthesis.rows_of_total``)
    accountant = "rdp"

    def plan(self, public: Public) -> MarginalsPlan:
        """rho calibrated so that the whole release (its events, RDP) spends what the budget planner
        (``privacy.budget.BudgetPlan``) left (no class histogram: the whole synthesis budget). ``samples_total``: the
        config's samples (public), else None: the fitted model's total, rounded, once the synthesis has run."""
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
        """The table's size against ``limits``' bounds (columns, count cells, model cells, the footprint in memory),
        from the public schema, before any row is read."""
        params, table = core.params, core.data.table
        dom = domain_of(table, params.bins)
        model_cap = (params.max_model_size or AIM_MAX_MODEL_SIZE) if params.selection == AIM else None
        fp = footprint(dom, table.encoded_width, params.selection, model_cap, core.execution.chunk_rows)
        why = refusal(fp, params.bins, params.selection)
        if why:
            raise PlanError(why)
        kept_rules(table, dom)  # the rules' tables on these codes: too large a group is refused here

    def label_caveat(self) -> str:
        return (
            "marginals: the rows and labels are sampled from a graphical model fitted to noisy one- and two-way counts "
            "on the schema's public bins (sampling is post-processing); the row count is the fitted model's total, "
            "rounded (post-processing of the same noisy counts), unless samples is given."
        )

    def synthesize(self, ctx: InProcess):
        plan, schema = ctx.plan, ctx.core.data.table
        mp = plan.synthesis
        counter = MarginalCounter(mp.domain)
        acc = counter.add(counter.create(), codes_of(ctx.x, ctx.y, schema, mp.domain.bins))
        chunk_rows, integers = ctx.core.execution.chunk_rows, integer_columns(ctx.core.data.source, schema)
        stated, chunks = fit_and_sample(acc, plan, schema, ctx.key, chunk_rows, integers)
        ctx.stated_plan = dataclasses.replace(plan, synthesis=stated)  # the picks and rows, as the Beam path states
        for x, y in chunks:
            yield x, y, None
