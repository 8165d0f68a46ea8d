"""Beam-free core of the Calibrate stage: first-pass statistics + core settings + key -> ReleasePlan, for every
mechanism.

Everything the later stages need, decided before any row is synthesised: the (DP, public or exact) normalisation
statistics, the group sizes the mode may use, the rows per group, the noise, and the accounting. The mechanism says
which events its synthesis spends (``privacy.events``: MixingEvent for DP-CDA, DpmixEvent, PerturbEvent for local
perturbation and random projection); relations are in ``privacy.accounting``. The plan holds exact private counts
for the synthesis only; only ``public_*`` fields and the accounting reach the manifest.

The plan reads the privacy and mechanism parameters and the few public facts it needs (``schemas.settings``:
``ReleaseConfig.core``), never the whole config.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from fractions import Fraction
from typing import Any, Optional

import numpy as np

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Mechanism, PlanError
from dpcda.mechanisms.combiners import FirstPass
from dpcda.mechanisms.p3gm import P3gmPlan
from dpcda.privacy import dp_stats
from dpcda.privacy.accounting import Accounting, ReleaseEvents, account
from dpcda.privacy.budget import REFERENCE_EPSILON, BudgetPlan, RhoShare, Share, plan_budget
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.mechanism_params import MAX_SAMPLES_PER_INPUT_ROW, MechanismParams
from dpcda.schemas.settings import CoreSettings, PostprocessParams, PrivacyParams
from dpcda.storage.paths import open_file
from dpcda.storage.shards import InputError


class CaveatCode(enum.Enum):
    """What a plan has to say about its release; ``pipeline.manifest.caveat_words`` words each one."""

    SECRET_KEY = "secret_key"  # noise from a fresh secret key
    SEED_KEY = "seed_key"  # noise from a key derived from a test seed
    LABELS = "labels"  # what the released labels and sizes are (the mechanism's words)
    REFERENCE_BUDGET = "reference_budget"  # sigma_x given: the statistics' shares are of the reference budget
    FIXED_CLASS_SIZES = "fixed_class_sizes"  # fixed mode: class sizes public (the mechanism's words)
    POISSON_ADAPTIVE = "poisson_adaptive"  # poisson mode: the DP histogram chose q_k, T_k, sigma_x
    PUBLIC_NORMALIZATION = "public_normalization"  # the user's statistics, assumed public
    EXACT_NORMALIZATION = "exact_normalization"  # exact private statistics: not end-to-end DP
    NO_FEATURE_NOISE = "no_feature_noise"  # sigma_x = 0
    MODEL_WITHOUT_NOISE = "model_without_noise"  # a model fitted without noise or clipping
    REPLANNED = "replanned"  # a changed plan for diagnostics, not a release


@dataclasses.dataclass(frozen=True)
class Caveat:
    """One caveat of a plan: its code and the parameters its words need (the mechanism whose words or name it uses,
    the reference epsilon)."""

    code: CaveatCode
    mechanism: str = ""
    epsilon: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class ReleasePlan:
    mechanism: str
    mode: str
    num_classes: int
    feature_dim: int
    mean: np.ndarray
    std: np.ndarray
    clip: float
    bounds: tuple[float, float]
    mixing_order: int
    sigma_x: float
    sigma_y: float
    samples_per_class: tuple[int, ...]  # dpcda: T_k of each class; dpmix, local, randproj, p3gm: () (not per class)
    samples_total: int
    class_rows: tuple[int, ...]  # exact N_k: private in poisson mode, for the synthesis only
    sampling_rates: tuple[
        Fraction, ...
    ]  # exact q per group (dpcda: per class; dpmix: one), rounded up for the accountant
    public_class_sizes: Optional[tuple[int, ...]]  # fixed mode
    dp_class_sizes: Optional[tuple[int, ...]]  # poisson mode
    normalization_method: str
    normalization_noise_std: Optional[float]
    histogram_noise_std: Optional[float]
    normalization_share: Optional[float]
    accounting: Accounting
    records_public: int  # N as the paper's Theorem 1 uses it (public in fixed mode, the DP total in poisson mode)
    end_to_end_dp: bool
    target_epsilon: Optional[float]
    caveats: tuple[Caveat, ...]  # worded by the manifest's owner (pipeline.manifest.caveat_words)
    lowpass: Optional[tuple[tuple[int, ...], int]] = None  # (image_shape, K): post-processing projection
    label_noise_ratio: Optional[float] = None  # dpmix: sigma_y / sigma_x
    projection: Optional[tuple[int, int, float]] = None  # randproj: (p, public seed, a bound on ||R||_2)
    denoise: Optional[float] = None  # post-processing: Gaussian blur of this std (pixels) on image rows
    image_shape: Optional[tuple[int, ...]] = None  # of the rows, for the post-processing
    mixing_paths: tuple[str, ...] = ()  # per group (dpcda: class; dpmix: the dataset): 'memory' or 'join'
    pca_components: Optional[int] = None  # K of a DP-PCA projection (mechanisms.dppca)
    pca_noise_std: Optional[float] = None  # of the covariance's upper triangle, in quantized units
    pca_share: Optional[float] = None
    join_block_rows: int = 0  # R of the join path (mechanisms.joinmix)
    p3gm: Optional[P3gmPlan] = None
    budget: Optional[BudgetPlan] = None  # the planner's split of the budget (privacy.budget)
    class_rows_rule: str = "equal"  # the config's class_rows: how T is split into T_k ('equal' or 'proportional')
    marginals: Any = None  # mechanisms.marginals.plan.MarginalsPlan

    @property
    def mechanism_entry(self) -> Mechanism:
        return registry.get(self.mechanism)

    @property
    def join_groups(self) -> tuple[int, ...]:
        return tuple(g for g, p in enumerate(self.mixing_paths) if p == "join")

    @property
    def one_group(self) -> bool:
        """Rows are made from the whole dataset (one group), not per class."""
        return self.mechanism_entry.groups == "dataset"

    def group_records(self, g: int) -> int:
        """Exact records of group g (private: the join path's index range)."""
        return self.mechanism_entry.group_records(self, g)

    def group_samples(self, g: int) -> int:
        return self.mechanism_entry.group_samples(self, g)

    @property
    def guarantee_epsilon(self) -> float:
        """The stated epsilon. poisson: the target, fixed before the histogram chose q_k and T_k (adaptive
        composition holds for that budget, not for the accounted figure of one histogram outcome)."""
        if self.mode == "poisson" and self.target_epsilon is not None:
            return self.target_epsilon
        return self.accounting.epsilon

    @property
    def denoise_spec(self) -> Optional[tuple[tuple[int, ...], float]]:
        """(image_shape, sigma) for the blur post-processing, or None."""
        if self.denoise is None:
            return None
        shape = self.image_shape or (math.isqrt(self.feature_dim),) * 2
        return shape, self.denoise

    @property
    def output_dim(self) -> int:
        return self.projection[0] if self.projection else self.feature_dim


def load_public_stats(path: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) from a JSON file {"mean": [d numbers], "std": [d numbers]}; PlanError naming the problem."""
    where = f"normalization_file {path}"
    try:
        with open_file(path) as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError) as err:
        kind = "not valid JSON" if isinstance(err, ValueError) else "cannot be read"
        raise PlanError(f"{where}: {kind} ({type(err).__name__})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{where}: must hold an object with 'mean' and 'std'")
    return checked_public_stats(data.get("mean", []), data.get("std", []), dim, where)


def checked_public_stats(mean, std, dim: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """float64 (mean, std), each of shape (d,), mean finite and std positive and finite; PlanError otherwise."""
    out = []
    for name, values in (("mean", mean), ("std", std)):
        try:
            arr = np.asarray(values, np.float64)
        except (TypeError, ValueError):
            raise PlanError(f"{where}: '{name}' must be a list of numbers") from None
        if arr.shape != (dim,):
            raise PlanError(f"{where}: '{name}' must be a flat list of {dim} numbers, found shape {list(arr.shape)}")
        out.append(arr)
    mean, std = out
    if not np.all(np.isfinite(mean)) or not np.all(np.isfinite(std)) or not np.all(std > 0):
        raise PlanError(f"{where}: mean must be finite and std positive and finite")
    return mean, std


CLASS_BUDGET_SHARE = 0.4
MAX_Z_REACH = 1e12


def default_class_budget() -> int:
    """40 % of this machine's memory (the workers that mix are assumed to be machines like it)."""
    try:
        return int(CLASS_BUDGET_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def class_bytes(rows: float, dim: int) -> float:
    """Memory of one class on the mixing worker: our float64 copy of its rows and an int64 index, plus the runner's
    grouped float32 rows (a runner that holds groups in memory, like the DirectRunner, keeps them meanwhile)."""
    return float(rows) * (12 * dim + 8)


def check_class_memory(sizes, dim: int, budget: int, *, where: str, exact: bool, why: str = "") -> None:
    for k, n in enumerate(sizes):
        need = class_bytes(n, dim)
        if need > budget:
            size = f"{int(n)} records" if exact else "its DP size"
            raise PlanError(
                f"{where}: class {k} needs about {need / 2**30:.2f} GiB ({size} at d={dim}), more than "
                f"max_class_bytes={budget / 2**30:.2f} GiB, the limit of the in-memory mixer (one class "
                + (
                    f"on one worker); {why}"
                    if why
                    else "on one worker); use --mixing-path auto or join, or raise --max-class-bytes on bigger workers"
                )
            )


JOIN_BLOCK_BYTES = 1 << 27  # records of one join block of the join path: 128 MiB of float64 rows
MIN_JOIN_BLOCK_ROWS = 1024


def join_block_rows(dim: int, requested: int = 0) -> int:
    """R: records per join block of the join path (a power of two; ``requested`` > 0 overrides)."""
    if requested > 0:
        return int(requested)
    rows = max(MIN_JOIN_BLOCK_ROWS, JOIN_BLOCK_BYTES // (8 * max(int(dim), 1)))
    return 1 << (rows.bit_length() - 1)


def choose_mixing_paths(
    sizes, dim: int, budget: int, path: str, *, where: str, exact: bool, why: str = ""
) -> tuple[str, ...]:
    """'memory' or 'join' for each group. ``sizes`` are public (fixed: exact class sizes; poisson: DP sizes plus a
    margin), so the choice is too; auto sends a group to the join path where it would not fit one worker."""
    if path == "memory":
        check_class_memory(sizes, dim, budget, where=where, exact=exact, why=why)
        return ("memory",) * len(sizes)
    if path == "join":
        return ("join",) * len(sizes)
    return tuple("join" if class_bytes(n, dim) > budget else "memory" for n in sizes)


def check_statistics(mean: np.ndarray, std: np.ndarray, bounds: tuple[float, float], clip: float) -> None:
    """Statistics that would make the z-score overflow (or are not finite) are refused before any row is mixed."""
    lo, hi = bounds
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
        raise PlanError("normalization: the statistics are not finite positive numbers; nothing was released")
    reach = (hi - lo + np.abs(np.asarray(mean, np.float64) - (lo + hi) / 2)) / np.asarray(std, np.float64)
    if not np.all(reach < MAX_Z_REACH):
        raise PlanError(
            f"normalization: a std is below 1e-12 of feature_bounds [{lo:g}, {hi:g}] (z-scores near "
            f"1e12 would leave nothing but their signs after the clip); nothing was released"
        )


def resolve_image_shape(post: PostprocessParams, dim: int) -> tuple[int, ...]:
    """The rows' image grid for post-processing: --image-shape (checked against d), else a square."""
    if post.image_shape is not None:
        shape = tuple(post.image_shape)
        if math.prod(shape) != dim:
            raise PlanError(
                f"image_shape: {','.join(map(str, shape))} has {math.prod(shape)} features, the input has d={dim}"
            )
        return shape
    side = math.isqrt(dim)
    if side * side != dim:
        raise PlanError(f"lowpass/denoise: d={dim} is not a square image; give --image-shape H,W or C,H,W")
    return (side, side)


def resolve_lowpass(post: PostprocessParams, dim: int) -> Optional[tuple[tuple[int, ...], int]]:
    """(image_shape, K) for the low-pass post-processing, checked against the feature dimension d."""
    if post.lowpass is None:
        return None
    shape = resolve_image_shape(post, dim)
    h, w = shape[-2:]
    if post.lowpass >= h + w - 1:
        raise PlanError(
            f"lowpass: K={post.lowpass} keeps every DCT coefficient of a {h}x{w} image (u + v <= "
            f"{h + w - 2}); use K < {h + w - 1} or leave --lowpass out"
        )
    return shape, int(post.lowpass)


def synthesis_events(mechanism: str, mode: str, **kw) -> list:
    """The events mechanism ``mechanism``'s synthesis spends (``Mechanism.synthesis_events``): one per group (dpcda:
    per class; dpmix: one, the dataset; local/randproj: one Gaussian per record, in parallel). Groups compose in
    parallel. Used by the plan, ``dpcda account`` and the audit."""
    return registry.get(mechanism).synthesis_events(mode, **kw)


def group_events(
    mechanism: str,
    mode: str,
    *,
    group_size: int,
    samples: int,
    mixing_order: int,
    clip: float,
    label_noise_ratio: Optional[float],
    gain: float = 1.0,
):
    """sigma -> the events one group of ``group_size`` public records spends in ``mechanism``'s synthesis: what
    ``dpcda account`` and ``dpcda audit`` calibrate (``privacy.budget.calibrate_synthesis``) and account."""

    def events(sigma: float) -> list:
        return synthesis_events(
            mechanism,
            mode,
            group_sizes=[group_size],
            samples=samples,
            mixing_order=mixing_order,
            clip=clip,
            sigma_x=sigma,
            label_noise_ratio=label_noise_ratio,
            gain=gain,
        )

    return events


def budget_shares(
    privacy: PrivacyParams, params: MechanismParams, dim: int, table=None, domain: Optional[RhoShare] = None
) -> list:
    """The shares of the budget a release spends before its synthesis, for rows of width ``dim``: the class histogram
    in poisson mode (adaptive), the normalisation moments with ``normalization: dp``, the DP-PCA covariance when a
    projection or the mechanism uses it, the mechanism's own (``Mechanism.budget_shares``: p3gm's DP-EM), and a
    table's DP domain step (``domain`` to plan it; once it ran, the event its ``table.domain`` records)."""
    mode = privacy.mode
    mech = registry.get(params.name)
    shares = []
    if mode == "poisson":
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
    """The budget planner (``privacy.budget.plan_budget``) run on what a release with these parameters spends: what
    the release, ``dpcda account`` and ``dpcda audit`` calibrate with."""
    shares = budget_shares(privacy, params, dim, table, domain)
    return plan_budget(privacy.mode, epsilon=privacy.epsilon, delta=privacy.delta, shares=shares)


def build_plan(
    first: FirstPass, core: CoreSettings, key: bytes, public_stats: Optional[tuple[np.ndarray, np.ndarray]] = None
) -> ReleasePlan:
    """The plan of one release. ``core``: the release's privacy and mechanism parameters and the public facts the plan
    needs (``ReleaseConfig.core``). ``public_stats``: (mean, std) read by the launcher from --normalization-file
    (public by the user's declaration); the plan itself reads no file."""
    privacy, params, data, post, run = core.privacy, core.params, core.data, core.postprocess, core.execution
    rows = first.rows
    if rows == 0 or first.dim is None:
        raise InputError(f"{data.source}: zero rows")
    dim = first.dim
    counts = np.asarray(first.class_counts, np.int64)
    K = data.num_classes or len(counts)
    if len(counts) > K:
        raise InputError(f"{data.source}: column '{data.label_column}': label {len(counts) - 1} >= num_classes {K}")
    counts = np.pad(counts, (0, K - len(counts)))
    lowpass = resolve_lowpass(post, dim)
    mode, l, c, delta = privacy.mode, params.mixing_order, privacy.clip, privacy.delta
    mech = registry.get(params.name)
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
    # Class sizes: public in fixed mode, a DP histogram in poisson mode.
    where = f"{data.source}: column '{data.label_column}'"
    budget_bytes = run.max_class_bytes or default_class_budget()
    if mode == "fixed":
        small = [k for k in range(K) if counts[k] < l] if mech.mixes and mech.groups == "class" else []
        if mech.mixes and mech.groups == "dataset" and rows < l:
            raise PlanError(f"{data.source}: {rows} records, fewer than mixing_order l={l}")
        if small:
            k = small[0]
            hint = (
                ""
                if data.num_classes
                else f"; without --num-classes, K = largest label + 1 = {K}, so a stray label can create empty classes"
            )
            raise PlanError(
                f"{where}: class {k} has {counts[k]} records, fewer than mixing_order l={l}; fixed mode "
                f"draws l distinct records per row (lower l, or use --mode poisson){hint}"
            )
    # Every share of the budget (histogram, statistics, DP-PCA, the mechanism's own) and what is left for the
    # synthesis, calibrated before anything is drawn (privacy.budget).
    planned = release_budget(privacy, params, dim, data.table)
    hist = planned.get("class_histogram")
    if mode == "fixed":
        groups = [rows] if mech.groups == "dataset" else counts
        paths = (
            choose_mixing_paths(groups, dim, budget_bytes, mixing_path, where=where, exact=True, why=why)
            if mech.mixes
            else ()
        )
        sizes, n_public = counts, float(rows)
        dp_sizes = None
        caveats.append(Caveat(CaveatCode.FIXED_CLASS_SIZES, mechanism=mech.name))
    else:
        # The histogram's output chooses q_k, T_k and sigma_x: the planner accounted it alone, at its own share of
        # epsilon and delta, and left the rest for what follows (adaptive composition; privacy.accounting).
        dp_sizes = dp_stats.class_histogram(counts, noise_std=hist.noise_std, stream=NoiseStream(key, "histogram"))
        # decided on the DP counts (plus 6 noise sds), never on the exact ones: whether the job stops is public
        grouped = (
            [dp_sizes.sum() + 6 * hist.noise_std * math.sqrt(K)]
            if mech.groups == "dataset"
            else dp_sizes + 6 * hist.noise_std
        )
        paths = choose_mixing_paths(grouped, dim, budget_bytes, mixing_path, where=where, exact=False, why=why)
        sizes, n_public = dp_sizes, float(max(dp_sizes.sum(), 1))
        caveats.append(Caveat(CaveatCode.POISSON_ADAPTIVE))

    # Normalisation statistics.
    bounds = tuple(data.feature_bounds)
    min_std = privacy.min_std * (bounds[1] - bounds[0])
    norm_std = None
    normalization = privacy.normalization if mech.normalizes else "none"
    if normalization == "none":  # rows that are not z-scored (counts on public bins): nothing computed or spent
        mean, std = np.zeros(dim), np.ones(dim)
    elif privacy.normalization == "dp":
        norm_std = planned.get("normalization").noise_std
        mean, std = dp_stats.feature_stats(
            n=n_public,
            sum_qu=first.sum_qu,
            sum_qv=first.sum_qv,
            bounds=bounds,
            min_std=min_std,
            noise_std=norm_std,
            stream=NoiseStream(key, "stats"),
        )
    elif privacy.normalization == "public":
        if public_stats is None:
            raise PlanError("normalization public: the statistics file was not loaded")  # the launcher loads it
        mean, std = checked_public_stats(*public_stats, dim, "normalization public")
        caveats.append(Caveat(CaveatCode.PUBLIC_NORMALIZATION))
    else:
        mean, std = dp_stats.feature_stats(
            n=rows, sum_qu=first.sum_qu, sum_qv=first.sum_qv, bounds=bounds, min_std=min_std
        )
        caveats.append(Caveat(CaveatCode.EXACT_NORMALIZATION))

    check_statistics(mean, std, bounds, c)
    pca_std = None
    components = params.pca_components
    if components is not None:  # the DP-PCA covariance: a Gaussian release of its own share (mechanisms.dppca)
        if components >= dim:
            what = "projection" if params.projection else f"{params.name}_latent_dim"
            raise PlanError(f"{what}: K={components} must be below the feature dimension d={dim}")
        bound = rows if mode == "fixed" else n_public + 6 * (hist.noise_std * math.sqrt(K) if hist else 0)
        if bound * 2.0 ** (2 * dp_stats.COV_QUANTUM_BITS) >= dp_stats.COV_MAX_SUM:  # decided on public counts
            raise PlanError("projection: the DP-PCA covariance takes at most 2^30 rows (exact int64 sums)")
        pca_std = planned.get("pca_covariance").noise_std
    N = rows if mode == "fixed" else int(n_public)
    T = params.samples or N
    cap = MAX_SAMPLES_PER_INPUT_ROW * max(int(n_public), 1)
    if T > cap:  # fixed: n_public is the exact row count (public there); poisson: the DP total
        raise PlanError(
            f"samples: T={T} is more than {MAX_SAMPLES_PER_INPUT_ROW} times the input's rows; lower --samples"
        )
    sizes_list = [int(s) for s in sizes]
    projection, gain = mech.projection(params, dim)
    ratio = mech.label_noise_ratio(params)
    class_rows = getattr(params, "class_rows", "equal")  # dpcda's rule; the other mechanisms make no rows per class
    T_k, T_total = mech.rows(
        T, K, given=params.samples is not None, where=data.source, mode=mode, sizes=sizes_list, class_rows=class_rows
    )

    def events(sigma: float) -> list:
        return mech.synthesis_events(
            mode,
            group_sizes=sizes_list if mech.groups == "class" else [N],
            samples=T_k if mech.groups == "class" else T,
            mixing_order=l,
            clip=c,
            sigma_x=sigma,
            label_noise_ratio=ratio,
            gain=gain,
        )

    calibrated = mech.calibrate(
        events,
        planned,
        privacy=privacy,
        params=params,
        data=data,
        clip=c,
        dim=dim,
        num_classes=K,
        records=N,
    )
    sigma_x, per_group, p3gm = calibrated.sigma_x, calibrated.per_group, calibrated.p3gm
    sigma_y = mech.sigma_y(params, sigma_x)
    out_dim = projection[0] if projection else dim
    mixed_dim = components or out_dim  # with a DP-PCA projection the noise is drawn in K dimensions
    gaussian_draws = (
        T_total * mixed_dim * (sigma_x > 0)
        + dim * (dim + 1) // 2 * (pca_std is not None)
        + T_total * K * (sigma_y > 0)
        + 2 * dim * (normalization == "dp")
        + K * (mode == "poisson")
        + mech.extra_draws(calibrated, dim=dim, num_classes=K)
        + sum(getattr(s.event, "gaussian_draws", 0) for s in planned.shares)  # the DP domain step's
    )
    binomial_draws = T_total * (mode == "poisson")
    acc = account(
        ReleaseEvents(
            mode,
            planned.shared,
            per_group,
            planned.adaptive,
            gaussian_draws=gaussian_draws,
            binomial_draws=binomial_draws,
        ),
        delta,
        relation=mech.relation(mode),
        accountant=mech.accountant or None,
    )
    if privacy.epsilon is not None and acc.epsilon > privacy.epsilon:
        raise AssertionError(f"calibration overshot: {acc.epsilon} > {privacy.epsilon}")  # never expected
    end_to_end = privacy.normalization != "exact" and math.isfinite(acc.epsilon)
    if sigma_x == 0 and not mech.fits_model:
        caveats.append(Caveat(CaveatCode.NO_FEATURE_NOISE))
    if mech.fits_model and not math.isfinite(acc.epsilon):
        caveats.append(Caveat(CaveatCode.MODEL_WITHOUT_NOISE, mechanism=mech.name))
    return ReleasePlan(
        mechanism=mech.name,
        mode=mode,
        num_classes=K,
        feature_dim=dim,
        mean=mean,
        std=std,
        clip=c,
        bounds=bounds,
        mixing_order=l,
        sigma_x=sigma_x,
        sigma_y=sigma_y,
        samples_per_class=T_k,
        samples_total=T_total,
        class_rows=tuple(int(x) for x in counts),
        sampling_rates=tuple(getattr(e, "exact_sampling_rate", Fraction(1)) for e in per_group),
        public_class_sizes=tuple(sizes_list) if mode == "fixed" else None,
        dp_class_sizes=tuple(int(x) for x in dp_sizes) if dp_sizes is not None else None,
        normalization_method=normalization,
        normalization_noise_std=norm_std,
        histogram_noise_std=hist.noise_std if hist else None,
        normalization_share=privacy.normalization_budget_share if normalization == "dp" else None,
        accounting=acc,
        records_public=max(int(n_public), l),
        end_to_end_dp=end_to_end,
        target_epsilon=privacy.epsilon,
        caveats=tuple(caveats),
        lowpass=lowpass,
        label_noise_ratio=ratio,
        projection=projection,
        denoise=post.denoise,
        image_shape=resolve_image_shape(post, dim) if post.denoise else None,
        mixing_paths=paths,
        pca_components=components,
        pca_noise_std=pca_std,
        pca_share=privacy.pca_budget_share if pca_std is not None else None,
        join_block_rows=join_block_rows(dim, run.join_block_rows) if "join" in paths else 0,
        p3gm=p3gm,
        budget=planned,
        class_rows_rule=class_rows,
        marginals=calibrated.marginals,
    )


def _normalized64(
    features: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float, bounds: tuple[float, float]
) -> np.ndarray:
    z = (np.clip(np.asarray(features, np.float64), *bounds) - np.asarray(mean, np.float64)) / np.asarray(
        std, np.float64
    )
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    z *= np.minimum(1.0, clip * (1.0 - CLIP_MARGIN) / np.maximum(norms, np.finfo(np.float64).tiny))
    return z


def _check_clipped(rows: np.ndarray, clip: float) -> None:
    if rows.size and np.linalg.norm(np.asarray(rows, np.float64), axis=1).max() > clip * (1.0 - CLIP_MARGIN / 2):
        raise AssertionError("clip: a row's norm exceeds the clip margin after rounding")  # never expected


def normalization_record(plan: "ReleasePlan") -> dict:
    """What ``normalization.json`` holds: the statistics and clip the released rows were normalised with."""
    return {
        "mean": plan.mean.tolist(),
        "std": plan.std.tolist(),
        "clip": plan.clip,
        "feature_bounds": list(plan.bounds),
        "method": plan.normalization_method,
    }


def normalize(
    features: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float, bounds: tuple[float, float]
) -> np.ndarray:
    """float32 rows z-scored with the plan's statistics, each clipped to L2 norm ``clip (1 - CLIP_MARGIN)``
    (Algorithm 1, 2-6); what the evaluation applies to real test rows.

    The margin absorbs float32 rounding and the mixer's float64 summation (``mechanisms.dpcda``): what leaves
    here has a norm below ``clip (1 - 2^-21)`` as computed in float64, which is checked.
    """
    out = _normalized64(features, mean, std, clip, bounds).astype(np.float32)
    _check_clipped(out, clip)
    return out


def normalize_into(
    out: np.ndarray,
    features: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray,
    clip: float,
    bounds: tuple[float, float],
    rows_per_step: int = 4096,
) -> None:
    """``normalize`` in float64, written into ``out`` (the class's preallocated rows) a few thousand rows at a time."""
    for start in range(0, len(features), rows_per_step):
        part = _normalized64(features[start : start + rows_per_step], mean, std, clip, bounds)
        _check_clipped(part, clip)
        out[start : start + len(part)] = part
