"""The rules a release config's fields follow together (``ReleaseConfig``'s last check), each refusal one line that
names the field; the mechanism's own rules are its model's (``MechanismParams.check``)."""

from __future__ import annotations

import math


def check(cfg) -> None:
    """ValueError (the config's one line) where the fields of ``cfg`` (a ``ReleaseConfig``) do not go together."""
    lo, hi = cfg.feature_bounds
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"feature_bounds: need finite lo < hi, got {lo},{hi}")
    if not (math.isfinite(hi - lo) and hi - lo <= 1e30 and max(abs(lo), abs(hi)) <= 1e30):
        raise ValueError(
            f"feature_bounds: {lo:g},{hi:g} is too wide (|bounds| and hi - lo must be at most 1e30; "
            f"the z-score would overflow)"
        )
    params = cfg.mechanism
    if params.needs_table and cfg.table is None:
        raise ValueError(f"table: {params.needs_table}")
    if cfg.epsilon is None and cfg.sigma_x is None:
        raise ValueError("epsilon: give a target epsilon (or an explicit sigma_x)")
    if cfg.epsilon is not None and cfg.sigma_x is not None:
        raise ValueError("epsilon and sigma_x: give one, not both")
    if cfg.mode == "poisson" and cfg.epsilon is not None:
        from dpcda.privacy.accounting import PLD_MIN_DELTA, SAMPLER_DELTA_SHARE, accountant_delta, round_up

        share = cfg.histogram_budget_share
        if not accountant_delta(cfg.delta, [share * cfg.delta]) >= PLD_MIN_DELTA:  # the plan's own arithmetic
            least = round_up(PLD_MIN_DELTA / (1.0 - SAMPLER_DELTA_SHARE - share))
            raise ValueError(
                f"delta: {cfg.delta:g} is below {least:.3g}, the least a poisson release can state (its PLD "
                f"accountant composes in float64 and does not resolve less than {PLD_MIN_DELTA:g} after the "
                f"class counts' share); raise delta"
                + (", or use --mode fixed (RDP)" if "fixed" in params.modes else "")
            )
    if cfg.mode == "fixed" and cfg.epsilon is not None and (cfg.normalization == "dp" or params.projection):
        from dpcda.privacy.accounting import SAMPLER_DELTA_SHARE, accountant_delta, round_up
        from dpcda.privacy.calibration import ALONE_MIN_DELTA

        if not accountant_delta(cfg.delta) >= ALONE_MIN_DELTA:  # the statistics' share: the plan's arithmetic
            raise ValueError(
                f"delta: {cfg.delta:g} is below {round_up(ALONE_MIN_DELTA / (1.0 - SAMPLER_DELTA_SHARE)):g}, the "
                f"least the DP statistics can be calibrated at (one Gaussian's PLD is exact down to "
                f"{ALONE_MIN_DELTA:g}); raise delta"
            )
    if cfg.mode == "poisson" and cfg.sigma_x:
        raise ValueError(
            "sigma_x: poisson mode chooses q_k and T_k from the DP class histogram, so its epsilon "
            "holds only for a budget fixed in advance: give --epsilon (sigma_x 0 is allowed: no "
            "privacy)"
        )
    if cfg.mode == "poisson" and cfg.num_classes is None and not cfg.derives_label:
        raise ValueError("num_classes: required in poisson mode (which labels occur is private)")
    if cfg.normalization == "public" and not cfg.normalization_file:
        raise ValueError("normalization_file: required with normalization=public")
    if cfg.normalization == "exact" and not cfg.allow_exact_normalization:
        raise ValueError(
            "normalization: 'exact' uses private statistics without noise; pass "
            "--i-understand-exact-normalization-is-not-dp to allow it"
        )
    if cfg.soft_labels and cfg.num_classes is None:
        raise ValueError("num_classes: required with soft_labels (the width of the soft-label column)")
    if cfg.image_shape is not None and cfg.lowpass is None and cfg.denoise is None:
        raise ValueError("image_shape: only used with --lowpass or --denoise; give it with one of them")
    params.check(cfg)
    if cfg.table is not None:
        _check_table(cfg)
    if cfg.ledger is not None and cfg.dataset_id is None:
        raise ValueError("dataset_id: required with --ledger (the name under which releases compose)")
    if cfg.ledger is None and (cfg.dataset_id is not None or cfg.budget_cap is not None):
        raise ValueError(f"{'dataset_id' if cfg.dataset_id is not None else 'budget_cap'}: only used with --ledger")
    if cfg.ledger is not None and cfg.epsilon is None:
        raise ValueError(
            "ledger: give --epsilon (the ledger composes the release's budget before any data is read; with "
            "--sigma-x the epsilon is known only after the data)"
        )
    if cfg.ledger is not None and cfg.seed is not None:
        raise ValueError(
            "seed: a TEST seed makes the release reproducible and NOT private; a ledger records private releases only"
        )
    if cfg.ledger is not None and cfg.normalization == "exact":
        raise ValueError(
            "ledger: a release with exact normalization is not end-to-end DP; the ledger cannot compose it"
        )
    if cfg.membership_audit and not cfg.eval_input:
        raise ValueError("membership_audit: needs --eval-input (the held-out real rows)")
    statistics = params.statistics_shares(cfg.pca_budget_share)
    if cfg.normalization_budget_share + cfg.histogram_budget_share + statistics >= 0.5:
        raise ValueError(
            "normalization_budget_share: the statistics (with pca_budget_share"
            + (" and p3gm_em_budget_share" if "p3gm_em_budget_share" in params.own_flat() else "")
            + ") may take under half the budget"
        )
    if params.projection is not None:
        if cfg.mixing_path == "join":
            raise ValueError("projection: not available on the join mixing path yet; use --mixing-path memory")
        if cfg.table is not None:
            raise ValueError("projection: for image and vector rows; a table's encoded columns are not projected")


def _check_table(cfg) -> None:
    if cfg.input_format == "tfrecord":
        raise ValueError("table: a table input is Parquet (named, typed columns); input_format tfrecord is not")
    for name in ("lowpass", "denoise", "image_shape"):
        if getattr(cfg, name) is not None:
            raise ValueError(f"{name}: image post-processing; a table has no image")
    if cfg.soft_labels:
        raise ValueError("soft_labels: a table release has the input's columns only")
    if cfg.out_of_bounds != "clip":
        raise ValueError("out_of_bounds: a table's numeric columns are clipped to their declared bounds")
    if tuple(cfg.feature_bounds) != (0.0, 1.0):
        raise ValueError("feature_bounds: set per column in the table schema (encoded values lie in [0, 1])")
    if not cfg.table.complete and not cfg.mechanism.derives_domain:
        raise ValueError(
            f"table: the label's categories and every column's domain must be declared for {cfg.mechanism.name} (the "
            "DP domain step feeds --mechanism marginals)"
        )
    if cfg.derives_label:
        if cfg.num_classes is not None:
            raise ValueError("num_classes: the label's categories are derived by the DP domain step")
        return
    if cfg.num_classes != cfg.table.num_classes:
        raise ValueError(
            f"num_classes: {cfg.num_classes}, but the table's label declares {cfg.table.num_classes} categories"
        )
