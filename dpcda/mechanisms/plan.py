"""Beam-free core of the Calibrate stage: first-pass statistics + core settings + key -> ReleasePlan, for every
mechanism, on one planner.

``plan_release`` is the planner: public facts in (the class sizes the mode may use, the feature width, the settings),
the privacy side of a release out (the budget's split, the mechanism's own plan with its noise and events, the
accounting, the caveats); it reads no record, so ``dpcda account`` and ``dpcda audit`` plan with it too.
``build_plan`` is a release's: it draws what needs the data first (poisson mode's DP class histogram, the DP,
public or exact normalisation statistics), plans on those public sizes, and returns the ``ReleasePlan`` the later
stages run. The mechanism says which events its synthesis spends and holds its own plan (``Mechanism.plan``, a
``SynthesisPlan``); relations are in ``privacy.accounting``. The plan holds exact private counts for the synthesis
only; only public or DP figures and the accounting reach the manifest.

The plan reads the privacy and mechanism parameters and the few public facts it needs (``schemas.settings``:
``ReleaseConfig.core``), never the whole config.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Caveat, CaveatCode, Grouping, Mechanism, PlanError, Public, SynthesisPlan
from dpcda.mechanisms.combiners import FirstPass
from dpcda.mechanisms.dppca import PcaPlan
from dpcda.mechanisms.memory import choose_mixing_paths, default_class_budget
from dpcda.mechanisms.normalization import (  # noqa: F401 - the normalisation's names, as the stages import them
    check_statistics,
    checked_public_stats,
    load_public_stats,
    normalization_record,
    normalize,
    normalize_into,
)
from dpcda.mechanisms.postprocess import resolve as resolve_post
from dpcda.privacy import dp_stats
from dpcda.privacy.accounting import Accounting, ReleaseEvents, account
from dpcda.privacy.budget import REFERENCE_EPSILON, BudgetPlan, RhoShare, Share, plan_budget
from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.mechanism_params import MAX_SAMPLES_PER_INPUT_ROW, MechanismParams
from dpcda.schemas.settings import CoreSettings, PrivacyParams
from dpcda.storage.shards import InputError


@dataclasses.dataclass(frozen=True)
class ReleasePlan:
    """What every release has: its statistics, its class sizes, its accounting and caveats; ``synthesis`` is the
    mechanism's own plan (``Mechanism.plan``: its noise, rows and events, manifest section and summary)."""

    mechanism: str
    mode: str
    num_classes: int
    feature_dim: int
    mean: np.ndarray
    std: np.ndarray
    clip: float
    bounds: tuple[float, float]
    class_rows: tuple[int, ...]  # exact N_k: private in poisson mode, for the synthesis only
    public_class_sizes: Optional[tuple[int, ...]]  # fixed mode
    dp_class_sizes: Optional[tuple[int, ...]]  # poisson mode
    normalization_method: str
    normalization_noise_std: Optional[float]
    normalization_share: Optional[float]
    histogram_noise_std: Optional[float]
    accounting: Accounting
    budget: BudgetPlan  # the planner's split of the budget (privacy.budget)
    end_to_end_dp: bool
    target_epsilon: Optional[float]
    caveats: tuple[Caveat, ...]  # worded by the manifest's owner (pipeline.manifest.caveat_words)
    synthesis: SynthesisPlan

    @property
    def mechanism_entry(self) -> Mechanism:
        return registry.get(self.mechanism)

    @property
    def dp_dataset_size(self) -> Optional[int]:
        """The DP class histogram's sum (poisson mode with a histogram), the manifest's ``dataset_size_dp``."""
        return int(sum(self.dp_class_sizes)) if self.dp_class_sizes else None

    @property
    def samples_total(self) -> Optional[int]:
        """T, the rows released (None until a synthesis that sets its own rows has run: marginals)."""
        return self.synthesis.samples_total

    @property
    def pca(self) -> Optional[PcaPlan]:
        """The DP-PCA stage the synthesis uses (its basis is computed from the z-scored rows), or None."""
        return self.synthesis.dp_pca()

    @property
    def z_scored(self) -> bool:
        """The rows were z-scored (the release writes the statistics it used, ``normalization.json``)."""
        return self.normalization_method != "none"

    @property
    def guarantee_epsilon(self) -> float:
        """The stated epsilon. poisson: the target, fixed before the histogram chose q_k and T_k (adaptive
        composition holds for that budget, not for the accounted figure of one histogram outcome)."""
        if self.mode == "poisson" and self.target_epsilon is not None:
            return self.target_epsilon
        return self.accounting.epsilon


@dataclasses.dataclass(frozen=True)
class Planned:
    """The privacy side of a release, planned from public facts (``plan_release``)."""

    budget: BudgetPlan
    synthesis: SynthesisPlan
    accounting: Accounting
    caveats: tuple[Caveat, ...]
    end_to_end_dp: bool
    normalization: str  # the method the rows are z-scored with ('none': the mechanism z-scores nothing)


def budget_shares(
    privacy: PrivacyParams, params: MechanismParams, dim: int, table=None, domain: Optional[RhoShare] = None
) -> list:
    """The shares of the budget a release spends before its synthesis, for rows of width ``dim``: the class histogram
    in poisson mode (adaptive) where the mechanism uses class sizes (``Mechanism.class_histogram``), the normalisation
    moments with ``normalization: dp``, the DP-PCA covariance when a projection or the mechanism uses it, the
    mechanism's own (``Mechanism.budget_shares``: p3gm's DP-EM), and a table's DP domain step (``domain`` to plan it;
    once it ran, the event its ``table.domain`` records)."""
    mode = privacy.mode
    mech = registry.get(params.name)
    shares = []
    if mode == "poisson" and mech.class_histogram:
        shares.append(
            Share("class_histogram", privacy.histogram_budget_share, dp_stats.HISTOGRAM_SENSITIVITY, adaptive=True)
        )
    if privacy.normalization == "dp" and mech.normalizes:
        shares.append(
            Share("normalization", privacy.normalization_budget_share, dp_stats.moments_sensitivity(dim, mode))
        )
    if params.pca_components is not None:
        shares.append(Share("pca_covariance", privacy.pca_budget_share, dp_stats.covariance_sensitivity(dim, mode)))
    shares.extend(mech.budget_shares(privacy, params))
    if domain is not None:
        shares.append(domain)
    elif table is not None and table.domain is not None:
        shares.append(RhoShare("domain", table.domain.share, event=table.domain.to_event()))
    return shares


def release_budget(
    privacy: PrivacyParams, params: MechanismParams, dim: int, table=None, domain: Optional[RhoShare] = None
) -> BudgetPlan:
    """The budget planner (``privacy.budget.plan_budget``) run on what a release with these parameters spends (a
    table's DP domain step among it: ``budget_shares``)."""
    shares = budget_shares(privacy, params, dim, table, domain)
    return plan_budget(privacy.mode, epsilon=privacy.epsilon, delta=privacy.delta, shares=shares)


def _small_groups(core: CoreSettings, mech: Mechanism, counts, K: int) -> None:
    """fixed mode draws l distinct records of a group per row: a group with fewer (exact sizes, public there) is
    refused in one line."""
    data, l = core.data, core.params.mixing_order
    if not mech.mixes:
        return
    rows = int(sum(counts))
    if mech.grouping is not Grouping.CLASS:
        if rows < l:
            raise PlanError(f"{data.source}: {rows} records, fewer than mixing_order l={l}")
        return
    small = [k for k in range(K) if counts[k] < l]
    if small:
        k = small[0]
        hint = (
            ""
            if data.num_classes
            else f"; without --num-classes, K = largest label + 1 = {K}, so a stray label can create empty classes"
        )
        raise PlanError(
            f"{data.source}: column '{data.label_column}': class {k} has {counts[k]} records, fewer than "
            f"mixing_order l={l}; fixed mode draws l distinct records per row (lower l, or use --mode poisson){hint}"
        )


def plan_synthesis(
    core: CoreSettings,
    *,
    dim: int,
    class_sizes,
    budget: Optional[BudgetPlan] = None,
    num_classes: Optional[int] = None,
) -> tuple[SynthesisPlan, Public, list[Caveat]]:
    """The mechanism's plan of a release with ``core``'s settings from public facts only: ``class_sizes`` (K of
    them; fixed: the exact class sizes, public there; poisson: the DP histogram's; None, with ``num_classes`` K,
    where poisson mode draws no histogram: ``Mechanism.class_histogram``), the feature width ``dim`` and, where the
    caller has planned it already, the ``budget``. Returns it with the public facts it was planned from and
    the release's caveats so far. No record is read; what ``plan_release`` accounts and the audit's games play."""
    privacy, params, data, run = core.privacy, core.params, core.data, core.execution
    mode = privacy.mode
    mech = registry.get(params.name)
    sizes = np.asarray([int(s) for s in class_sizes] if class_sizes is not None else [], np.int64)
    K = len(sizes) if class_sizes is not None else int(num_classes)
    post = resolve_post(core.postprocess, dim)
    caveats = [
        Caveat(CaveatCode.SEED_KEY if privacy.reproducible else CaveatCode.SECRET_KEY),
        Caveat(CaveatCode.LABELS, mechanism=mech.name),
    ]
    if privacy.epsilon is None:
        caveats.append(Caveat(CaveatCode.REFERENCE_BUDGET, epsilon=REFERENCE_EPSILON))
    # the join path has no DP-PCA projection yet; some mechanisms fit on one worker
    mixing_path = "memory" if params.projection or mech.one_worker else run.mixing_path
    why = (
        "the DP-PCA projection mixes in memory only; raise --max-class-bytes on bigger workers"
        if params.projection
        else mech.one_worker
    )
    where = f"{data.source}: column '{data.label_column}'"
    budget_bytes = run.max_class_bytes or default_class_budget()
    if mode == "fixed":
        _small_groups(core, mech, sizes, K)
    # Every share of the budget (histogram, statistics, DP-PCA, the mechanism's own) and what is left for the
    # synthesis, calibrated before anything is drawn (privacy.budget).
    planned = budget if budget is not None else release_budget(privacy, params, dim, data.table)
    hist = planned.get("class_histogram")
    if mode == "fixed":
        rows = int(sizes.sum())
        paths = (
            choose_mixing_paths(
                mech.grouping.sizes(sizes), dim, budget_bytes, mixing_path, where=where, exact=True, why=why
            )
            if mech.mixes
            else ()
        )
        n_public = float(rows)
        caveats.append(Caveat(CaveatCode.FIXED_CLASS_SIZES, mechanism=mech.name))
    elif hist is None:  # no class sizes used (Mechanism.class_histogram): none drawn, no row count planned here
        sizes, paths, n_public, rows = sizes[:0], (), None, None
    else:
        # The histogram's output chooses q_k, T_k and sigma_x: the planner accounted it alone, at its own share of
        # epsilon and delta, and left the rest for what follows (adaptive composition; privacy.accounting).
        # Decided on the DP counts (plus 6 noise sds), never on the exact ones: whether the job stops is public.
        grouped = (
            sizes + 6 * hist.noise_std
            if mech.grouping is Grouping.CLASS
            else [sizes.sum() + 6 * hist.noise_std * math.sqrt(K)]
        )
        paths = choose_mixing_paths(grouped, dim, budget_bytes, mixing_path, where=where, exact=False, why=why)
        n_public = float(max(sizes.sum(), 1))
        rows = int(n_public)
        if mech.adaptive_caveat:
            caveats.append(Caveat(CaveatCode.POISSON_ADAPTIVE, mechanism=mech.name))
    normalization = privacy.normalization if mech.normalizes else "none"
    if normalization == "public":
        caveats.append(Caveat(CaveatCode.PUBLIC_NORMALIZATION))
    elif normalization == "exact":
        caveats.append(Caveat(CaveatCode.EXACT_NORMALIZATION))
    pca = None
    components = params.pca_components
    if components is not None:  # the DP-PCA covariance: a Gaussian release of its own share (mechanisms.dppca)
        if components >= dim:
            what = "projection" if params.projection else f"{params.name}_latent_dim"
            raise PlanError(f"{what}: K={components} must be below the feature dimension d={dim}")
        bound = rows if mode == "fixed" else n_public + 6 * (hist.noise_std * math.sqrt(K) if hist else 0)
        if bound * 2.0 ** (2 * dp_stats.COV_QUANTUM_BITS) >= dp_stats.COV_MAX_SUM:  # decided on public counts
            raise PlanError("projection: the DP-PCA covariance takes at most 2^30 rows (exact int64 sums)")
        pca = PcaPlan(components, planned.get("pca_covariance").noise_std, privacy.pca_budget_share)
    N = rows
    T = params.samples or N  # None: the synthesis sets its rows (marginals: its fitted model's total)
    cap = MAX_SAMPLES_PER_INPUT_ROW * max(int(n_public or 0), 1)
    if T is not None and n_public is not None and T > cap:  # fixed: the exact row count (public); poisson: DP
        raise PlanError(
            f"samples: T={T} is more than {MAX_SAMPLES_PER_INPUT_ROW} times the input's rows; lower --samples"
        )
    public = Public(
        core=core,
        budget=planned,
        num_classes=K,
        dim=dim,
        class_sizes=tuple(int(s) for s in sizes),
        records=N,
        samples=T,
        records_public=max(int(n_public or 0), params.mixing_order),
        mixing_paths=paths,
        pca=pca,
        post=post,
    )
    return mech.plan(public), public, caveats


def plan_release(
    core: CoreSettings, *, dim: int, class_sizes, budget: Optional[BudgetPlan] = None, num_classes: Optional[int] = None
) -> tuple[Planned, Public]:
    """The privacy side of a release with ``core``'s settings, planned from public facts only (``plan_synthesis``)
    and accounted: the planner of a release, ``dpcda account`` and the audit. Returns it with the public facts the
    mechanism planned from (``Public``). No record is read."""
    privacy = core.privacy
    mode = privacy.mode
    mech = registry.get(core.params.name)
    synthesis, public, caveats = plan_synthesis(
        core, dim=dim, class_sizes=class_sizes, budget=budget, num_classes=num_classes
    )
    planned, K = public.budget, public.num_classes
    normalization = privacy.normalization if mech.normalizes else "none"
    histogram = planned.get("class_histogram") is not None
    gaussian_draws = (
        synthesis.gaussian_draws(dim=dim, num_classes=K)
        + 2 * dim * (normalization == "dp")
        + K * histogram
        + sum(getattr(s.event, "gaussian_draws", 0) for s in planned.shares)  # the DP domain step's
    )
    acc = account(
        ReleaseEvents(
            mode,
            planned.shared,
            tuple(synthesis.events),
            planned.adaptive,
            gaussian_draws=gaussian_draws,
            # rows drawn per class by the histogram's sizes (none where the synthesis sets its own rows: marginals)
            binomial_draws=(synthesis.samples_total or 0) * histogram,
        ),
        privacy.delta,
        relation=mech.relation(mode),
        accountant=mech.accountant or None,
    )
    if privacy.epsilon is not None and acc.epsilon > privacy.epsilon:
        raise AssertionError(f"calibration overshot: {acc.epsilon} > {privacy.epsilon}")  # never expected
    caveats.extend(synthesis.caveats(acc.epsilon, mech.name))
    end_to_end = privacy.normalization != "exact" and math.isfinite(acc.epsilon)
    return Planned(planned, synthesis, acc, tuple(caveats), end_to_end, normalization), public


def build_plan(
    first: FirstPass, core: CoreSettings, key: bytes, public_stats: Optional[tuple[np.ndarray, np.ndarray]] = None
) -> ReleasePlan:
    """The plan of one release. ``core``: the release's privacy and mechanism parameters and the public facts the plan
    needs (``ReleaseConfig.core``). ``public_stats``: (mean, std) read by the launcher from --normalization-file
    (public by the user's declaration); the plan itself reads no file."""
    privacy, params, data = core.privacy, core.params, core.data
    rows = first.rows
    if rows == 0 or first.dim is None:
        raise InputError(f"{data.source}: zero rows")
    dim = first.dim
    counts = np.asarray(first.class_counts, np.int64)
    K = data.num_classes or len(counts)
    if len(counts) > K:
        raise InputError(f"{data.source}: column '{data.label_column}': label {len(counts) - 1} >= num_classes {K}")
    counts = np.pad(counts, (0, K - len(counts)))
    mode = privacy.mode
    budget = dp_sizes = hist_std = None
    if mode == "poisson":  # the DP class histogram first: its sizes are the public facts the rest is planned on
        budget = release_budget(privacy, params, dim, data.table)
        if budget.get("class_histogram") is not None:  # none where the mechanism uses no class sizes (marginals)
            hist_std = budget.get("class_histogram").noise_std
            dp_sizes = dp_stats.class_histogram(counts, noise_std=hist_std, stream=NoiseStream(key, "histogram"))
    planned, public = plan_release(
        core, dim=dim, class_sizes=counts if mode == "fixed" else dp_sizes, budget=budget, num_classes=K
    )
    budget = planned.budget

    # Normalisation statistics.
    bounds = tuple(data.feature_bounds)
    min_std = privacy.min_std * (bounds[1] - bounds[0])
    norm_std = None
    if planned.normalization == "none":  # rows that are not z-scored (counts on public bins): nothing computed
        mean, std = np.zeros(dim), np.ones(dim)
    elif planned.normalization == "dp":
        norm_std = budget.get("normalization").noise_std
        if mode != "fixed" and dp_sizes is None:  # a mechanism that z-scores its rows draws the histogram
            raise PlanError(f"{params.name}: normalization dp in poisson mode needs the DP class histogram's total")
        mean, std = dp_stats.feature_stats(
            n=float(rows) if mode == "fixed" else float(max(dp_sizes.sum(), 1)),
            sum_qu=first.sum_qu,
            sum_qv=first.sum_qv,
            bounds=bounds,
            min_std=min_std,
            noise_std=norm_std,
            stream=NoiseStream(key, "stats"),
        )
    elif planned.normalization == "public":
        if public_stats is None:
            raise PlanError("normalization public: the statistics file was not loaded")  # the launcher loads it
        mean, std = checked_public_stats(*public_stats, dim, "normalization public")
    else:
        mean, std = dp_stats.feature_stats(
            n=rows, sum_qu=first.sum_qu, sum_qv=first.sum_qv, bounds=bounds, min_std=min_std
        )
    check_statistics(mean, std, bounds, privacy.clip)
    return ReleasePlan(
        mechanism=params.name,
        mode=mode,
        num_classes=K,
        feature_dim=dim,
        mean=mean,
        std=std,
        clip=privacy.clip,
        bounds=bounds,
        class_rows=tuple(int(x) for x in counts),
        public_class_sizes=public.class_sizes if mode == "fixed" else None,
        dp_class_sizes=tuple(int(x) for x in dp_sizes) if dp_sizes is not None else None,
        normalization_method=planned.normalization,
        normalization_noise_std=norm_std,
        normalization_share=privacy.normalization_budget_share if planned.normalization == "dp" else None,
        histogram_noise_std=hist_std,
        accounting=planned.accounting,
        budget=budget,
        end_to_end_dp=planned.end_to_end_dp,
        target_epsilon=privacy.epsilon,
        caveats=planned.caveats,
        synthesis=planned.synthesis,
    )
