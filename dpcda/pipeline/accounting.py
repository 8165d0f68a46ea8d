"""What ``dpcda account`` and ``dpcda.account`` print: one group's synthesis planned without data, by the release's
own planner (``mechanisms.plan.plan_release``) on public sizes, after the shares of the budget a release with the
same settings spends first."""

from __future__ import annotations

from typing import Optional

from dpcda.mechanisms import registry
from dpcda.privacy.calibration import CalibrationError


def _share(share, with_std: bool) -> dict:
    """One planned share as ``dpcda account`` prints it (the noise std only where d was given; the DP domain step's
    zCDP, stds, value threshold and reserved delta)."""
    out = {"epsilon": share.epsilon, "delta": share.delta, "noise_multiplier": share.noise_multiplier}
    if share.name == "domain":
        e = share.event
        out.update(rho=e.rho, share=share.fraction, value_threshold=e.threshold, reserved_delta=e.reserved_delta)
        out.update({f"{k}_noise_std": getattr(e, f"{k}_std") for k in ("coarse", "values", "fine") if getattr(e, k)})
    elif with_std:
        out["noise_std"] = share.noise_std
    if share.adaptive:
        out["adaptive"] = True
    return out


def _config(mechanism: str, settings: dict):
    """The ``ReleaseConfig`` of a release with these settings, checked as a release checks it (CalibrationError, the
    config's one line), with stand-ins for what account reads no data from: the input, the output and a public
    statistics file."""
    from dpcda.schemas.config import ConfigError, load_config

    normalization = settings.get("normalization")
    try:
        return load_config(
            None,
            dict(
                input="class_size",
                output="(account)",
                normalization_file="(account)" if normalization == "public" else None,
                allow_exact_normalization=True if normalization == "exact" else None,
                mechanism=mechanism,
                **settings,
            ),
        )
    except ConfigError as err:
        raise CalibrationError(str(err)) from None


def account(
    mechanism: str = "dpcda",
    *,
    class_size: int,
    samples_per_class: Optional[int] = None,
    feature_dim: Optional[int] = None,
    num_classes: Optional[int] = None,
    table_columns: Optional[int] = None,
    derived_numeric: Optional[int] = None,
    derived_categorical: Optional[int] = None,
    **settings,
) -> dict:
    """Calibrates (``epsilon``) or accounts (``sigma_x``) one group's synthesis of ``mechanism`` without data, as a
    release with the same ``settings`` (any release field: ``mode``, ``mixing_order``, ``clip``, ``delta``,
    ``normalization``, ``projection``, the budget shares, the mechanism's own parameters) plans it: its planner on
    public sizes, after the shares of the budget the release spends first. ``class_size`` is N_k (dpcda), the
    dataset size (dpmix, p3gm) or any size (local, randproj); ``samples_per_class`` is T_k (dpcda) or T (dpmix); a
    mechanism that does not mix ignores it and ``mixing_order``. ``feature_dim`` d gives the statistics' noise stds
    (their sensitivities depend on it) and is needed with a projection and where the mechanism's plan needs it;
    ``num_classes`` K where the plan needs it (p3gm). A table mechanism (marginals) takes ``table_columns`` (the
    label included) and, for its DP domain step, ``derived_numeric`` and ``derived_categorical`` (the columns whose
    domain the step derives, the label among them if derived): ``class_size`` is then the dataset size N."""
    entry = registry.get(mechanism)
    settings = {k: v for k, v in settings.items() if v is not None}
    table = domain = None
    if entry.params.needs_table:
        table, domain = _table(mechanism, table_columns, derived_numeric or 0, derived_categorical or 0, num_classes)
        settings = {**settings, "table": table}
    elif table_columns is not None or derived_numeric or derived_categorical:
        raise CalibrationError(f"--table-columns: for a table mechanism (marginals); {mechanism} takes no table")
    if ("epsilon" in settings) == ("sigma_x" in settings):
        raise CalibrationError("give exactly one of --epsilon or --sigma-x")
    if entry.fits_model and table is None and (feature_dim is None or num_classes is None):
        raise CalibrationError(
            f"{mechanism}: give --feature-dim d and --num-classes K (the covariance and model sizes)"
        )
    if entry.mixes:
        if samples_per_class is None:
            raise CalibrationError(f"{mechanism}: give --samples-per-class")
        settings["samples"] = samples_per_class
    else:
        settings.pop("mixing_order", None)  # one row per record, or a fitted model: nothing is mixed
    K = (table.num_classes if table is not None else num_classes) if entry.fits_model else 1
    cfg = _config(mechanism, {**settings, "num_classes": K})
    if cfg.mechanism.pca_components is not None and feature_dim is None:
        raise CalibrationError("projection: give --feature-dim d (the DP-PCA covariance's sensitivity depends on it)")
    if entry.needs_width and feature_dim is None:
        raise CalibrationError(f"{mechanism}: give --feature-dim d ({entry.needs_width})")
    from dpcda.mechanisms.plan import plan_release, release_budget

    # one group of class_size public records; a fitted model's N spread over its K classes. Without d the statistics'
    # noise multipliers are planned at sensitivity sqrt(2) (d = 1): the same multipliers
    sizes = [class_size // K + (k < class_size % K) for k in range(K)]
    dim = table.encoded_width if table is not None else feature_dim or 1
    budget = None
    if domain is not None:  # the DP domain step's share, planned as the release plans it (pipeline.domain)
        budget = release_budget(cfg.privacy, cfg.mechanism, dim, domain=domain(cfg.domain_budget_share))
    planned, public = plan_release(cfg.core, dim=dim, class_sizes=sizes, budget=budget)
    acc, budget = planned.accounting, planned.budget
    notes = []
    if not entry.fits_model:
        notes.append(
            "sigma_x as a release with these settings calibrates it: after the shares above (--normalization public "
            "or exact and no --projection leave the synthesis alone)"
        )
    else:
        notes.append("planned as a release plans, for class_size records spread over K classes as its DP counts")
    if cfg.mode == "poisson":
        notes.append(
            "poisson: a release takes N_k, and so q and T_k, from its DP class histogram; this is for N_k = "
            "class_size, and the histogram's share is accounted alone (adaptive composition)"
        )
    if cfg.normalization == "exact":
        notes.append("normalization exact: such a release is NOT end-to-end DP (end_to_end_dp: false)")
    if table is not None:
        notes.append(
            f"a table of {table_columns} columns (the label included; {derived_numeric or 0} numeric and "
            f"{derived_categorical or 0} categorical derived by the DP domain step, whose share is planned as a "
            "release plans it: a fraction of the zCDP budget and of delta, its value thresholds' term reserved)"
        )
    if cfg.epsilon is None and budget.shares:
        notes.append(f"sigma_x given: the shares are of the reference budget epsilon={budget.budget_epsilon:g}")
    return {
        "mechanism": mechanism,
        "mode": cfg.mode,
        "normalization": cfg.normalization,
        "shares": {s.name: _share(s, feature_dim is not None) for s in budget.shares},
        "synthesis_epsilon": budget.synthesis_epsilon,
        **planned.synthesis.account_figures(cfg.clip),
        "epsilon": acc.epsilon,
        "delta": cfg.delta,
        "target_epsilon": cfg.epsilon,
        "accountant": acc.accountant,
        "neighbouring_relation": acc.relation,
        "components": acc.components,
        "cross_check": acc.cross_check,
        "delta_breakdown": acc.delta_breakdown,
        "note": "; ".join(notes),
    }


def _table(mechanism: str, columns: Optional[int], numeric: int, categorical: int, num_classes: Optional[int]):
    """A stand-in public schema of ``columns`` columns (the label included; numeric columns on the mechanism's bins,
    with nulls: the largest counts) and K ``num_classes`` (2 unless given), and, where ``numeric + categorical``
    columns are derived, a function of the domain step's budget share to its ``RhoShare``."""
    import pyarrow as pa

    from dpcda.mechanisms.domain.grid import Coarse, Fine
    from dpcda.pipeline.domain import domain_share
    from dpcda.schemas.table import TableSchema

    if columns is None:
        raise CalibrationError(
            f"{mechanism}: its budget is split over the table's columns; give --table-columns (and, for the DP domain "
            "step, --derived-numeric and --derived-categorical)"
        )
    if not (columns >= 2 and numeric >= 0 and categorical >= 0 and numeric + categorical <= columns):
        raise CalibrationError("--table-columns: at least 2 (the label included), the derived ones among them")
    K = num_classes or 2
    table = TableSchema(
        label={"name": "label", "categories": [str(k) for k in range(K)]},
        columns=[{"name": f"c{j}", "kind": "numeric", "lower": 0, "upper": 1, "nullable": True} for j in
                 range(columns - 1)],
    )  # fmt: skip
    if not numeric + categorical:
        return table, None
    cells = Coarse.of(pa.float64()).cells  # the widest type's coarse grid: its noise draws at their largest

    def share(fraction: float):
        return domain_share(
            fraction,
            numeric=numeric,
            counted=numeric + categorical,
            coarse_cells=numeric * cells,
            fine_cells=numeric * Fine(0.0, 1.0, False).cells,
        )

    return table, share
