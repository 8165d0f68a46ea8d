"""What ``dpcda account`` and ``dpcda.account`` print: one group's synthesis planned without data, by the release's
own planner (``mechanisms.plan.plan_release``) on public sizes, after the shares of the budget a release with the
same settings spends first."""

from __future__ import annotations

from typing import Optional

from dpcda.mechanisms import registry
from dpcda.privacy.calibration import CalibrationError


def _share(share, with_std: bool) -> dict:
    """One planned share as ``dpcda account`` prints it (the noise std only where d was given)."""
    out = {"epsilon": share.epsilon, "delta": share.delta, "noise_multiplier": share.noise_multiplier}
    if with_std:
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
    **settings,
) -> dict:
    """Calibrates (``epsilon``) or accounts (``sigma_x``) one group's synthesis of ``mechanism`` without data, as a
    release with the same ``settings`` (any release field: ``mode``, ``mixing_order``, ``clip``, ``delta``,
    ``normalization``, ``projection``, the budget shares, the mechanism's own parameters) plans it: its planner on
    public sizes, after the shares of the budget the release spends first. ``class_size`` is N_k (dpcda), the
    dataset size (dpmix, p3gm) or any size (local, randproj); ``samples_per_class`` is T_k (dpcda) or T (dpmix); a
    mechanism that does not mix ignores it and ``mixing_order``. ``feature_dim`` d gives the statistics' noise stds
    (their sensitivities depend on it) and is needed with a projection and where the mechanism's plan needs it;
    ``num_classes`` K where the plan needs it (p3gm)."""
    entry = registry.get(mechanism)
    settings = {k: v for k, v in settings.items() if v is not None}
    if entry.params.needs_table:
        raise CalibrationError(
            f"{mechanism}: its budget is split over the table's columns and bins; dpcda account does not plan it "
            "(a release states its split in the manifest)"
        )
    if ("epsilon" in settings) == ("sigma_x" in settings):
        raise CalibrationError("give exactly one of --epsilon or --sigma-x")
    if entry.fits_model and (feature_dim is None or num_classes is None):
        raise CalibrationError(
            f"{mechanism}: give --feature-dim d and --num-classes K (the covariance and model sizes)"
        )
    if entry.mixes:
        if samples_per_class is None:
            raise CalibrationError(f"{mechanism}: give --samples-per-class")
        settings["samples"] = samples_per_class
    else:
        settings.pop("mixing_order", None)  # one row per record, or a fitted model: nothing is mixed
    K = num_classes if entry.fits_model else 1
    cfg = _config(mechanism, {**settings, "num_classes": K})
    if cfg.mechanism.pca_components is not None and feature_dim is None:
        raise CalibrationError("projection: give --feature-dim d (the DP-PCA covariance's sensitivity depends on it)")
    if entry.needs_width and feature_dim is None:
        raise CalibrationError(f"{mechanism}: give --feature-dim d ({entry.needs_width})")
    from dpcda.mechanisms.plan import plan_release

    # one group of class_size public records; a fitted model's N spread over its K classes. Without d the statistics'
    # noise multipliers are planned at sensitivity sqrt(2) (d = 1): the same multipliers
    sizes = [class_size // K + (k < class_size % K) for k in range(K)]
    planned, public = plan_release(cfg.core, dim=feature_dim or 1, class_sizes=sizes)
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
