"""Beam-free core of the Calibrate stage: first-pass statistics + config + key -> ReleasePlan.

Everything the later stages need, decided before any row is mixed: the (DP, public or exact)
normalisation statistics, the class sizes the mode may use, T_k, sigma_x, and the accounting.
Neighbouring relations are the modes' (``privacy.accounting``). The plan holds exact private counts
for the mixer; only ``public_*`` fields and the accounting reach the manifest.
"""
from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction
from typing import Optional

import numpy as np

from privacy import dp_stats
from privacy.accounting import Accounting, ReleaseEvents, account, accountant_delta, adaptive_epsilon
from privacy.calibration import calibrate_gaussian, calibrate_sigma_x
from privacy.events import CLIP_MARGIN, MixingEvent
from privacy.noise import NoiseStream
from privacy.paper import theorem1_epsilon
from schemas.config import ReleaseConfig
from transforms.combiners import FirstPass
from transforms.shards import InputError, open_file

# With an explicit sigma_x there is no target epsilon to take shares of; the statistics then spend
# their share of this reference budget (stated in the manifest).
REFERENCE_EPSILON = 10.0


class PlanError(ValueError):
    """The data and config cannot make a release (e.g. a class smaller than l in fixed mode)."""


@dataclasses.dataclass(frozen=True)
class ReleasePlan:
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
    samples_per_class: int
    class_rows: tuple[int, ...]  # exact N_k: private in poisson mode, for the mixer only
    sampling_rates: tuple[Fraction, ...]  # exact q_k (the accountant uses these, rounded up)
    public_class_sizes: Optional[tuple[int, ...]]  # fixed mode
    dp_class_sizes: Optional[tuple[int, ...]]  # poisson mode
    normalization_method: str
    normalization_noise_std: Optional[float]
    histogram_noise_std: Optional[float]
    normalization_share: Optional[float]
    accounting: Accounting
    paper_theorem1_epsilon: Optional[float]
    end_to_end_dp: bool
    caveats: tuple[str, ...]
    lowpass: Optional[tuple[tuple[int, ...], int]] = None  # (image_shape, K): post-processing projection

    @property
    def samples_total(self) -> int:
        return self.samples_per_class * self.num_classes


def load_public_stats(path: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    with open_file(path) as fh:
        data = json.loads(fh.read())
    mean, std = (np.asarray(data.get(k, []), np.float32) for k in ("mean", "std"))
    for name, arr in (("mean", mean), ("std", std)):
        if arr.shape != (dim,):
            raise PlanError(f"normalization_file: '{name}' must list {dim} numbers, found {arr.size}")
    if not np.all(np.isfinite(mean)) or not np.all(std > 0):
        raise PlanError("normalization_file: mean must be finite and std positive")
    return mean, std


def resolve_lowpass(cfg: ReleaseConfig, dim: int) -> Optional[tuple[tuple[int, ...], int]]:
    """(image_shape, K) for the low-pass post-processing, checked against the feature dimension d."""
    if cfg.lowpass is None:
        return None
    if cfg.image_shape is not None:
        shape = tuple(cfg.image_shape)
        if math.prod(shape) != dim:
            raise PlanError(f"image_shape: {','.join(map(str, shape))} has {math.prod(shape)} features, the "
                            f"input has d={dim}")
    else:
        side = math.isqrt(dim)
        if side * side != dim:
            raise PlanError(f"lowpass: d={dim} is not a square image; give --image-shape H,W or C,H,W")
        shape = (side, side)
    h, w = shape[-2:]
    if cfg.lowpass >= h + w - 1:
        raise PlanError(f"lowpass: K={cfg.lowpass} keeps every DCT coefficient of a {h}x{w} image (u + v <= "
                        f"{h + w - 2}); use K < {h + w - 1} or leave --lowpass out")
    return shape, int(cfg.lowpass)


def build_plan(first: FirstPass, cfg: ReleaseConfig, key: bytes) -> ReleasePlan:
    rows = first.rows
    if rows == 0 or first.dim is None:
        raise InputError(f"{cfg.input}: zero rows")
    dim = first.dim
    counts = np.asarray(first.class_counts, np.int64)
    K = cfg.num_classes or len(counts)
    if len(counts) > K:
        raise InputError(f"{cfg.input}: column '{cfg.label_column}': label {len(counts) - 1} >= num_classes {K}")
    counts = np.pad(counts, (0, K - len(counts)))
    lowpass = resolve_lowpass(cfg, dim)
    mode, l, c, delta = cfg.mode, cfg.mixing_order, cfg.clip, cfg.delta
    budget = cfg.epsilon if cfg.epsilon is not None else REFERENCE_EPSILON
    caveats = [
        "Noise and sampling draw from ChaCha20 keystreams under a fresh 256-bit secret key: the guarantee holds "
        "against adversaries who cannot tell ChaCha20 from random bits (privacy.noise says how draws are made).",
        "Label noise (sigma_y) costs no privacy here: within a class the one-hot mean is always e_k.",
    ]
    shared: list = []
    adaptive: list = []
    if cfg.epsilon is None:
        caveats.append(f"sigma_x was given explicitly: the statistics spent their shares of a reference budget "
                       f"epsilon={REFERENCE_EPSILON:g}; the epsilon below is what the whole release spends.")

    # Class sizes: public in fixed mode, a DP histogram in poisson mode.
    where = f"{cfg.input}: column '{cfg.label_column}'"
    too_big = [k for k in range(K) if counts[k] > cfg.max_class_rows]
    if too_big:
        k = too_big[0]
        size = f"{counts[k]} records, more" if mode == "fixed" else "more records"  # poisson: exact N_k is private
        raise PlanError(f"{where}: class {k} has {size} than max_class_rows={cfg.max_class_rows}, "
                        f"the limit of the in-memory mixer (one class held by one worker); raise --max-class-rows on "
                        f"workers with more memory, or split the class")
    if mode == "fixed":
        small = [k for k in range(K) if counts[k] < l]
        if small:
            k = small[0]
            hint = ("" if cfg.num_classes else f"; without --num-classes, K = largest label + 1 = {K}, so a stray "
                    f"label can create empty classes")
            raise PlanError(f"{where}: class {k} has {counts[k]} records, fewer than mixing_order l={l}; fixed mode "
                            f"draws l distinct records per row (lower l, or use --mode poisson){hint}")
        sizes, n_public = counts, float(rows)
        dp_sizes = None
        caveats.append("fixed mode: class sizes N_k are public and stated here; the guarantee covers "
                       "replacing one record's features within its class.")
    else:
        # The histogram's output chooses q_k, T_k and sigma_x: it is accounted alone, at its own share of epsilon and
        # delta, and the rest is calibrated to what remains (adaptive composition; privacy.accounting).
        hist_delta = cfg.histogram_budget_share * delta
        hist = calibrate_gaussian(mode, name="class_histogram", sensitivity=dp_stats.HISTOGRAM_SENSITIVITY,
                                  target_epsilon=cfg.histogram_budget_share * budget, delta=hist_delta)
        adaptive.append((hist, hist_delta))
        dp_sizes = dp_stats.class_histogram(counts, noise_std=hist.noise_std, stream=NoiseStream(key, "histogram"))
        sizes, n_public = dp_sizes, float(max(dp_sizes.sum(), 1))
        caveats.append("poisson mode: q_k, T_k and sigma_x are chosen from the DP class histogram; the histogram is "
                       "accounted alone at its own (epsilon, delta) share and the rest is calibrated to what remains, "
                       "so the guarantee is the sum (adaptive composition).")
    acc_delta = accountant_delta(delta, [d for _, d in adaptive])
    rest_budget = None
    if cfg.epsilon is not None:
        rest_budget = cfg.epsilon - sum(adaptive_epsilon(mode, ev, d) for ev, d in adaptive)

    # Normalisation statistics.
    min_std = cfg.min_std * (cfg.feature_bounds[1] - cfg.feature_bounds[0])
    norm_std = None
    if cfg.normalization == "dp":
        stats_ev = calibrate_gaussian(mode, name="normalization", sensitivity=dp_stats.moments_sensitivity(dim, mode),
                                      target_epsilon=cfg.normalization_budget_share * budget, delta=acc_delta)
        shared.append(stats_ev)
        norm_std = stats_ev.noise_std
        mean, std = dp_stats.feature_stats(n=n_public, sum_qu=first.sum_qu, sum_qv=first.sum_qv,
                                           bounds=cfg.feature_bounds, min_std=min_std, noise_std=norm_std,
                                           stream=NoiseStream(key, "stats"))
    elif cfg.normalization == "public":
        mean, std = load_public_stats(cfg.normalization_file, dim)
        caveats.append("Normalisation statistics were supplied by the user and are assumed public.")
    else:
        mean, std = dp_stats.feature_stats(n=rows, sum_qu=first.sum_qu, sum_qv=first.sum_qv,
                                           bounds=cfg.feature_bounds, min_std=min_std)
        caveats.append("NOT END-TO-END DP: the z-score uses exact private means and stds "
                       "(--normalization exact); epsilon below covers the mixing only.")

    T = cfg.samples or (rows if mode == "fixed" else int(n_public))
    T_k = T // K
    if T_k < 1:
        raise PlanError(f"samples: T={T} gives no rows for {K} classes (T_k = floor(T/K) = 0)")
    sizes_list = [int(s) for s in sizes]
    if cfg.sigma_x is not None:
        sigma_x = float(cfg.sigma_x)
    else:
        sigma_x = calibrate_sigma_x(mode, class_sizes=[max(s, l) for s in sizes_list], samples_per_class=T_k,
                                    mixing_order=l, clip=c, target_epsilon=rest_budget, delta=acc_delta,
                                    shared=shared)
    per_class = tuple(MixingEvent(mode, max(s, 1), T_k, l, c, sigma_x) for s in sizes_list)
    gaussian_draws = (K * T_k * dim * (sigma_x > 0) + K * T_k * K * (cfg.sigma_y > 0)
                      + 2 * dim * (cfg.normalization == "dp") + K * (mode == "poisson"))
    acc = account(ReleaseEvents(mode, tuple(shared), per_class, tuple(adaptive), gaussian_draws=gaussian_draws,
                                binomial_draws=K * T_k * (mode == "poisson")), delta)
    if cfg.epsilon is not None and acc.epsilon > cfg.epsilon:
        raise AssertionError(f"calibration overshot: {acc.epsilon} > {cfg.epsilon}")  # never expected
    end_to_end = cfg.normalization != "exact" and math.isfinite(acc.epsilon)
    if sigma_x == 0:
        caveats.append("sigma_x = 0: no noise on the features; epsilon is infinite.")
    paper = theorem1_epsilon(sigma_x=sigma_x, sigma_y=cfg.sigma_y, mixing_order=l, clip=c,
                             num_records=max(int(n_public), l), num_samples=T_k * K, delta=delta)
    return ReleasePlan(
        mode=mode, num_classes=K, feature_dim=dim, mean=mean, std=std, clip=c, bounds=cfg.feature_bounds,
        mixing_order=l, sigma_x=sigma_x, sigma_y=cfg.sigma_y, samples_per_class=T_k,
        class_rows=tuple(int(x) for x in counts),
        sampling_rates=tuple(e.exact_sampling_rate for e in per_class),
        public_class_sizes=tuple(sizes_list) if mode == "fixed" else None,
        dp_class_sizes=tuple(int(x) for x in dp_sizes) if dp_sizes is not None else None,
        normalization_method=cfg.normalization, normalization_noise_std=norm_std,
        histogram_noise_std=adaptive[0][0].noise_std if adaptive else None,
        normalization_share=cfg.normalization_budget_share if cfg.normalization == "dp" else None,
        accounting=acc, paper_theorem1_epsilon=paper, end_to_end_dp=end_to_end, caveats=tuple(caveats),
        lowpass=lowpass)


def normalize(features: np.ndarray, mean: np.ndarray, std: np.ndarray, clip: float,
              bounds: tuple[float, float]) -> np.ndarray:
    """z-score with the plan's statistics, then clip each row to L2 norm ``clip (1 - CLIP_MARGIN)`` (Algorithm 1, 2-6).

    The margin absorbs float32 rounding and the mixer's float64 summation (``transforms.mixing``): what leaves
    here has a norm below ``clip (1 - 2^-21)`` as computed in float64, which is checked.
    """
    z = (np.clip(np.asarray(features, np.float64), *bounds) - np.asarray(mean, np.float64)) / np.asarray(std, np.float64)
    target = clip * (1.0 - CLIP_MARGIN)
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    out = (z * np.minimum(1.0, target / np.maximum(norms, np.finfo(np.float64).tiny))).astype(np.float32)
    limit = clip * (1.0 - CLIP_MARGIN / 2)
    if out.size and np.linalg.norm(out.astype(np.float64), axis=1).max() > limit:
        raise AssertionError("clip: a row's norm exceeds the clip margin after rounding")  # never expected
    return out
