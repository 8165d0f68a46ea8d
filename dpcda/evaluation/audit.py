"""Empirical privacy audit: a distinguishing game against the real mixing mechanism.

Neighbouring relations (DESIGN.md, "Privacy model"), one game per mode:
- ``fixed``: replace one record's features within its class. D holds a canary ``+c u`` and
  ``N_k - 1`` background records; D' replaces the canary by ``-c u`` (the largest replace-one move,
  ``2c``). Class size and label are unchanged.
- ``poisson``: add or remove one record. D holds the canary ``+c u`` and the background; D' is the
  background alone. The sampling rate ``q = l / N_k`` is the same on both (it comes from the DP
  class count, which the mixing event treats as given).

Background records are clipped to norm ``c`` and orthogonal to ``u``, so the projection of a released
row on ``u`` is exactly (canary's share) + Gaussian noise: the canary is as easy to detect as the
relation allows. Each trial runs ``mechanisms.dpcda.mix_chunk`` (the product's mechanism) for one
class of ``samples_per_class`` rows; trials are stacked as rows of one call, batched, on CUDA when
present. The test statistic is the Neyman-Pearson log-likelihood ratio of the released projections
(monotone in the projection when a trial releases one row; the largest projection when noise is off).

Half the trials of each dataset choose a threshold; the other half measure the false-positive rate
FP (guess D on D') and false-negative rate FN (guess D' on D). With one-sided Clopper-Pearson upper
bounds at 97.5 % each (so both hold together with probability >= 95 %), any (epsilon, delta)-DP
mechanism satisfies (Kairouz et al. 2015; seed 003 eq. 2-6)::

    epsilon >= max(ln((1 - delta - FP_hi) / FN_hi), ln((1 - delta - FN_hi) / FP_hi))

so the figure is a 95 %-confidence lower bound on the true epsilon of this small configuration. It
can only ever expose accounting that is too optimistic; it never certifies privacy. Seed 003's
Theorem 1 ("noiseless privacy", Grining & Klonowski 2017) is reported beside it as an informational
figure only: it treats the data's own variance as the noise, which is not a guarantee.
"""

from __future__ import annotations

import json
import math
import time
from typing import Optional

import numpy as np
import torch
from scipy import stats

from dpcda.mechanisms import registry
from dpcda.mechanisms.device import pick_device
from dpcda.mechanisms.dpcda import mix_chunk  # Beam-free core of the mixing stage
from dpcda.mechanisms.plan import group_events, release_budget
from dpcda.privacy.accounting import RELATION_WORDS, ReleaseEvents, account
from dpcda.privacy.budget import BudgetPlan, calibrate_synthesis
from dpcda.privacy.calibration import calibrate_sigma_x
from dpcda.privacy.errors import DpcdaError
from dpcda.privacy.events import CLIP_MARGIN, MODES
from dpcda.privacy.noise import NoiseStream, key_from_test_seed
from dpcda.schemas.config import AUDIT_MAX_TRIALS, release_settings

CONFIDENCE = 0.95


class AuditError(DpcdaError, ValueError):
    """An audit configuration that cannot be played (bad sizes, options that do not go together)."""


DEFAULT_DIM = 8
# Rows per mix_chunk call: bounds memory (rows * dim floats) while keeping thousands of trials per call.
BATCH_ROWS = {"cpu": 1 << 17, "cuda": 1 << 21}
MAX_CANDIDATES = 20000  # thresholds tried on the selection half
NOISELESS_NOTE = (
    "seed 003 Theorem 1 (noiseless privacy, after Grining & Klonowski 2017): one synthetic "
    "row as a sum of n = l records, the audit data's own per-coordinate variance standing in "
    "for noise, sigma_x ignored. Informational only, NOT a guarantee: its delta is vacuous "
    "for small n, and an adversary who knows the other records defeats it"
)
AUDIT_NOTE = (
    "empirical audit of the mixing mechanism with this release's mode, l, c and sigma_x on a "
    "small synthetic class with a canary record, not on the released data; accounted_epsilon is "
    "that small class's epsilon (above the release's, whose classes are larger). The bound is a "
    "95%-confidence lower bound on it, which can expose optimistic accounting but never "
    "certifies privacy"
)


# ---------------------------------------------------------------- statistics


def clopper_pearson_upper(k, n: int, alpha: float):
    """One-sided upper confidence bound at level 1 - alpha for a binomial rate with k successes in n."""
    k = np.asarray(k, dtype=float)
    upper = stats.beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, upper)


def max_detectable_epsilon(n_d: int, n_dprime: int, delta: float, alpha: float) -> float:
    """The largest bound this many evaluation trials can give (no error at all): about ln(trials / 3.7).

    A bound of 0 from a game that could not have shown more than this is no evidence of privacy beyond it.
    """
    return float(
        epsilon_lower_bound(clopper_pearson_upper(0, n_dprime, alpha), clopper_pearson_upper(0, n_d, alpha), delta)
    )


def epsilon_lower_bound(fp, fn, delta: float):
    """max(ln((1-delta-FP)/FN), ln((1-delta-FN)/FP)), floored at 0 (arrays broadcast)."""
    fp = np.asarray(fp, dtype=float)
    fn = np.asarray(fn, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fp, 0.0) / fn)
        b = np.log(np.maximum(1.0 - delta - fn, 0.0) / fp)
    out = np.fmax(a, b)
    return np.maximum(np.nan_to_num(out, nan=0.0, posinf=np.inf, neginf=0.0), 0.0)


def _error_counts(s_d: np.ndarray, s_dprime: np.ndarray, thresholds: np.ndarray, direction: int):
    """(FP counts, FN counts) of 'guess D iff direction * s > direction * threshold'."""
    if direction > 0:
        fn = np.searchsorted(np.sort(s_d), thresholds, side="right")
        fp = len(s_dprime) - np.searchsorted(np.sort(s_dprime), thresholds, side="right")
    else:
        fn = len(s_d) - np.searchsorted(np.sort(s_d), thresholds, side="left")
        fp = np.searchsorted(np.sort(s_dprime), thresholds, side="left")
    return fp, fn


def choose_threshold(s_d: np.ndarray, s_dprime: np.ndarray, delta: float, alpha: float):
    """(threshold, direction) maximising the confidence-adjusted bound on these (selection) runs."""
    values = np.unique(np.concatenate([s_d, s_dprime]))
    values = values[np.isfinite(values)]
    if len(values) > MAX_CANDIDATES:  # every rank near the tails (where the bound lives), sparser inside
        ranks = np.geomspace(1, len(values), MAX_CANDIDATES // 2).astype(np.int64) - 1
        values = values[np.unique(np.concatenate([ranks, len(values) - 1 - ranks]))]
    candidates = np.concatenate([[-np.inf], values, [np.inf]])
    best = (-1.0, 0.0, 1)
    for direction in (1, -1):
        fp, fn = _error_counts(s_d, s_dprime, candidates, direction)
        bound = epsilon_lower_bound(
            clopper_pearson_upper(fp, len(s_dprime), alpha), clopper_pearson_upper(fn, len(s_d), alpha), delta
        )
        i = int(np.argmax(bound))
        if bound[i] > best[0]:
            best = (float(bound[i]), float(candidates[i]), direction)
    return best[1], best[2]


def log_likelihood_ratio(proj: np.ndarray, *, mode: str, shift: float, rate: float, sigma: float) -> np.ndarray:
    """Sum over a trial's rows of log p(row | D) / p(row | D') for projections ``proj`` (trials, rows).

    A row holds the canary with probability ``rate``; its projection is then ``+shift`` on D and
    ``-shift`` (fixed) or 0 (poisson) on D', plus N(0, sigma^2). Rows of one release are independent.
    With sigma = 0 the ratio is degenerate, and the largest projection is returned instead.
    """
    if sigma <= 0:
        return proj.max(axis=1)
    log_keep = math.log1p(-rate) if rate < 1 else -math.inf
    log_rate = math.log(rate)
    up = (proj * shift - shift**2 / 2) / sigma**2
    num = np.logaddexp(log_keep, log_rate + up)
    if mode == "fixed":
        down = (-proj * shift - shift**2 / 2) / sigma**2
        num = num - np.logaddexp(log_keep, log_rate + down)
    return num.sum(axis=1)


# ---------------------------------------------------------------- the game


def canary_datasets(mode: str, class_size: int, dim: int, clip: float, seed: int):
    """(D, D', u): background clipped to ``clip`` and orthogonal to u = e_0, canary ``clip * u``."""
    rng = np.random.default_rng([seed, 3])
    g = rng.standard_normal((class_size - 1, dim))
    g[:, 0] = 0.0
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    background = g / np.maximum(norms, 1e-12) * clip * rng.uniform(0.0, 1.0, (class_size - 1, 1))
    canary = np.zeros((1, dim))
    canary[0, 0] = clip
    d = np.concatenate([canary, background]).astype(np.float32)
    if mode == "fixed":
        d_prime = np.concatenate([-canary, background]).astype(np.float32)
    else:
        d_prime = background.astype(np.float32)
    u = np.zeros(dim, np.float32)
    u[0] = 1.0
    return d, d_prime, u


def _projections(
    x: np.ndarray,
    u: np.ndarray,
    *,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    rate: float,
    samples: int,
    trials: int,
    key: bytes,
    tag: str,
    device: torch.device,
) -> np.ndarray:
    """(trials, samples) projections on u of the rows of ``trials`` independent mechanism runs on x."""
    xt = torch.from_numpy(np.asarray(x, np.float64)).to(device)
    per_batch = max(1, BATCH_ROWS.get(device.type, BATCH_ROWS["cpu"]) // samples)
    parts = []
    for b, start in enumerate(range(0, trials, per_batch)):
        n = min(per_batch, trials - start)
        rows = mix_chunk(
            xt,
            mode=mode,
            mixing_order=mixing_order,
            sigma_x=sigma_x,
            rows=n * samples,
            index_stream=NoiseStream(key, "audit-index", tag, b),
            noise_stream=NoiseStream(key, "audit-noise", tag, b),
            sampling_rate=rate,
        )
        parts.append((rows @ np.asarray(u, np.float64)).reshape(n, samples))
    return np.concatenate(parts)


def noiseless_privacy(x: np.ndarray, *, mode: str, mixing_order: int, clip: float) -> dict:
    """Seed 003 Theorem 1 for one row (a sum of n = l records) of class data ``x``; informational."""
    n = mixing_order
    sensitivity = (2.0 if mode == "fixed" else 1.0) * clip
    var = float(x.var(axis=0).mean())
    third = float(np.abs(x - x.mean(axis=0)).__pow__(3).mean())
    if var <= 0:
        eps = math.inf
    else:
        eps = math.sqrt(sensitivity**2 * math.log(n) / (n * var))
    with np.errstate(over="ignore"):
        delta = (
            (1.12 * n * third / (n * var) ** 1.5 * (1 + math.exp(min(eps, 700.0))) + 4 / (5 * math.sqrt(n)))
            if var > 0
            else math.inf
        )
    return {
        "epsilon": eps,
        "delta": delta,
        "n": n,
        "data_variance": var,
        "sensitivity": sensitivity,
        "note": NOISELESS_NOTE,
    }


def _dpmix_scores(
    x: np.ndarray,
    labels: np.ndarray,
    u: np.ndarray,
    *,
    mode: str,
    mixing_order: int,
    sigma_x: float,
    sigma_y: float,
    rate,
    trials: int,
    key: bytes,
    tag: str,
    clip: float,
) -> np.ndarray:
    """Log-likelihood ratios of DPMix rows (one per trial, all rows of one real ``mix_dataset`` call): the feature
    projection on the canary direction and the label-score difference (class 0 minus class 1), whitened together."""
    from dpcda.mechanisms.dpmix import mix_dataset

    parts = [
        (f.astype(np.float64) @ u, sc[:, 0].astype(np.float64) - sc[:, 1])
        for _, f, sc in mix_dataset(
            x.astype(np.float64),
            labels,
            key=key,
            num_classes=3,
            mode=mode,
            mixing_order=mixing_order,
            sigma_x=sigma_x,
            sigma_y=sigma_y,
            samples=trials,
            chunk_rows=1 << 15,
            sampling_rate=rate,
        )
    ]
    proj, diff = np.concatenate([p for p, _ in parts]), np.concatenate([d for _, d in parts])
    if sigma_x <= 0 or sigma_y <= 0:
        return proj + diff
    a, b = clip / mixing_order, 1.0 / mixing_order  # the canary's share of a row: features, label difference
    q = float(rate)
    log_keep = math.log1p(-q) if q < 1 else -math.inf

    def log_mix(sign):
        w = sign * (proj * a / sigma_x**2 + diff * b / (2 * sigma_y**2))
        return np.logaddexp(log_keep, math.log(q) + w - (a**2 / sigma_x**2 + b**2 / (2 * sigma_y**2)) / 2)

    return log_mix(1) - (log_mix(-1) if mode == "fixed" else 0.0)


def _perturb_scores(
    x_row: np.ndarray,
    direction: np.ndarray,
    *,
    sigma_x: float,
    trials: int,
    key: bytes,
    tag: str,
    projection: Optional[np.ndarray],
) -> np.ndarray:
    """The canary's released row, once per trial (``mechanisms.local.perturb_block``), projected on ``direction``
    (monotone in the likelihood ratio: the two hypotheses shift it by +-c||R||)."""
    from dpcda.mechanisms.local import perturb_block

    rows = np.repeat(x_row[None, :].astype(np.float64), trials, axis=0)
    return perturb_block(rows, key=key, block=("audit", tag), sigma_x=sigma_x, projection=projection) @ direction


def _dpsgd_scores(
    grads: np.ndarray, u: np.ndarray, *, rate, noise_multiplier: float, clip: float, steps: int, trials: int, key, tag
) -> np.ndarray:
    """p3gm's DP-SGD (``mechanisms.dpsgd``: the Poisson batch, the clip, the noisy sum) on per-example gradients
    ``grads``, ``steps`` steps per trial; the statistic is the log-likelihood ratio of the noisy sums' projections
    on u (the canary is record 0, its clipped gradient C (1 - margin) u; the rest are orthogonal to u)."""
    import torch

    from dpcda.mechanisms.dpsgd import clip_factors, noisy_sum, poisson_batch

    g = torch.from_numpy(grads.astype(np.float64))
    factors = clip_factors(torch.linalg.vector_norm(g, dim=1), clip)
    clipped = g * factors[:, None]
    std = noise_multiplier * clip
    proj = np.empty((trials, steps))
    for t in range(trials):
        for s in range(steps):
            batch = poisson_batch(NoiseStream(key, "audit-batch", tag, t, s), len(grads), rate)
            total = clipped[torch.from_numpy(batch)].sum(dim=0)
            proj[t, s] = float(noisy_sum(total, std, NoiseStream(key, "audit-noise", tag, t, s)).double() @ u)
    if std <= 0:
        return proj.max(axis=1)
    a, q = clip * (1.0 - CLIP_MARGIN), float(rate)  # the canary's clipped gradient on u (under D)
    llr = np.logaddexp(math.log1p(-q) if q < 1 else -math.inf, math.log(q) + (a * proj - a * a / 2) / std**2)
    return llr.sum(axis=1)


def _score_game(scores: dict, half: int, delta: float) -> dict:
    """The game's verdict figures: a threshold chosen on the first ``half`` trials of D and D', FP and FN measured on
    the rest, their one-sided Clopper-Pearson upper bounds (a union bound: both hold with CONFIDENCE) and the epsilon
    lower bound they imply."""
    alpha = (1.0 - CONFIDENCE) / 2  # two one-sided intervals, union bound
    threshold, direction = choose_threshold(scores["D"][:half], scores["D'"][:half], delta, alpha)
    eval_d, eval_dp = scores["D"][half:], scores["D'"][half:]
    fp_count, fn_count = _error_counts(eval_d, eval_dp, np.array([threshold]), direction)
    n_d, n_dp = len(eval_d), len(eval_dp)
    fp_upper = float(clopper_pearson_upper(fp_count, n_dp, alpha)[0])
    fn_upper = float(clopper_pearson_upper(fn_count, n_d, alpha)[0])
    return {
        "empirical_epsilon_lower_bound": float(epsilon_lower_bound(fp_upper, fn_upper, delta)),
        "confidence": CONFIDENCE,
        "max_detectable_epsilon": max_detectable_epsilon(n_d, n_dp, delta, alpha),
        "empirical_epsilon_point_estimate": float(epsilon_lower_bound(fp_count[0] / n_dp, fn_count[0] / n_d, delta)),
        "fp": float(fp_count[0] / n_dp),
        "fn": float(fn_count[0] / n_d),
        "fp_upper": fp_upper,
        "fn_upper": fn_upper,
        "threshold": threshold,
        "guess_d_when": "above" if direction > 0 else "below",
        "evaluation_trials": n_d,
    }


def run_audit(
    *,
    mode: str,
    mixing_order: int,
    epsilon: Optional[float] = None,
    sigma_x: Optional[float] = None,
    delta: float = 1e-5,
    class_size: int = 20,
    samples_per_class: int = 1,
    dim: int = DEFAULT_DIM,
    clip: float = 1.0,
    trials: int = 2000,
    seed: int = 0,
    device: str = "auto",
    claimed_epsilon: Optional[float] = None,
    mechanism: str = "dpcda",
    label_noise_ratio: float = 1.0,
    projection_dim: int = 4,
    normalization: Optional[str] = None,
) -> dict:
    """Audit one small configuration; ``trials`` mechanism runs on each of D and D'.

    Every mechanism plays the game its relation allows, on its own synthesis code: dpcda as described above;
    dpmix with a canary that also switches label (class 0 on D, class 1 on D', the background in class 2), one row
    per trial; local and randproj with the canary's own row (+c u vs -c u; for randproj u is the direction R
    stretches most).

    Give ``epsilon`` (sigma_x is calibrated as a release with these settings calibrates it, for one class of
    ``class_size``: after the shares of the budget the release spends first, by the same planner; ``normalization``
    as the release's, default dp) or ``sigma_x``. ``claimed_epsilon`` is what the bound is checked against; it
    defaults to the epsilon ``privacy.accounting`` gives this configuration's synthesis. ``violation`` is true when
    the 95 % lower bound exceeds the claim: the claim is then wrong (a false alarm has probability <= 5 %).
    """
    t0 = time.time()
    if mode not in MODES:
        raise AuditError(f"mode: expected one of {MODES}, got {mode!r}")
    if mixing_order < 1:
        raise AuditError(f"mixing_order must be >= 1, got {mixing_order}")
    if class_size < max(2, mixing_order if mode == "fixed" else 2):
        raise AuditError(
            f"class_size {class_size} too small: the audit needs at least 2 records and, "
            f"in fixed mode, at least l = {mixing_order}"
        )
    if samples_per_class < 1 or trials < 4 or dim < 2 or clip <= 0:
        raise AuditError("samples_per_class >= 1, trials >= 4, dim >= 2 and clip > 0 are required")
    if trials > AUDIT_MAX_TRIALS:  # the game holds every trial's projections: time and memory grow with the count
        raise AuditError(f"trials must be at most {AUDIT_MAX_TRIALS:,}, got {trials:,}")
    if trials * samples_per_class > AUDIT_MAX_TRIALS * 16:  # (trials, samples) float64 per dataset: at most 128 MB
        raise AuditError(
            f"trials x samples_per_class must be at most {AUDIT_MAX_TRIALS * 16:,}, got {trials * samples_per_class:,}"
        )
    if (epsilon is None) == (sigma_x is None):
        raise AuditError("give exactly one of epsilon or sigma_x")
    try:
        entry = registry.get(mechanism)
    except registry.UnknownMechanism as err:
        raise AuditError(str(err)) from None
    if mode not in entry.modes:
        raise AuditError(
            f"mode: {mechanism} is accounted under add/remove only (mode poisson)"
            if entry.audit_game == "dp-sgd-step"
            else f"mode: {mechanism} offers mode {' or '.join(entry.modes)} only"
        )
    planned = None
    if epsilon is not None:  # the split a release with these settings makes (privacy.budget)
        settings = release_settings(
            mechanism=mechanism, mode=mode, epsilon=epsilon, delta=delta, clip=clip, normalization=normalization
        )
        planned = release_budget(settings.privacy, settings.mechanism_params, dim)
    if entry.audit_game == "dp-sgd-step":
        return _run_dpsgd_audit(
            planned=planned,
            epsilon=epsilon,
            sigma_x=sigma_x,
            delta=delta,
            class_size=class_size,
            batch=mixing_order,
            steps=samples_per_class,
            dim=dim,
            clip=clip,
            trials=trials,
            seed=seed,
            claimed_epsilon=claimed_epsilon,
            t0=t0,
        )
    projection, gain = None, 1.0
    if entry.projects:
        from dpcda.mechanisms.randproj import matrix_gain, projection_matrix

        projection = projection_matrix(dim, projection_dim, seed)
        gain = matrix_gain(projection)  # the release's gain
    samples = samples_per_class if entry.mixes else 1
    events = group_events(
        mechanism,
        mode,
        group_size=class_size,
        samples=samples,
        mixing_order=mixing_order,
        clip=clip,
        label_noise_ratio=label_noise_ratio,
        gain=gain,
    )
    if sigma_x is None:
        sigma_x = calibrate_synthesis(planned, events, scale=clip)
    if sigma_x < 0:
        raise AuditError(f"sigma_x must be >= 0, got {sigma_x}")
    event = events(float(sigma_x))[0]
    accounted = account(ReleaseEvents(mode, (), (event,)), delta, cross_check=False).epsilon
    claimed = accounted if claimed_epsilon is None else float(claimed_epsilon)

    dev = pick_device(device)
    key = key_from_test_seed(seed)
    rate = getattr(event, "exact_sampling_rate", 1)
    d, d_prime, u = canary_datasets(mode, class_size, dim, clip, seed)
    half = trials // 2
    scores = {}
    if entry.audit_game == "class-mixing":
        common = dict(
            mode=mode,
            mixing_order=mixing_order,
            sigma_x=float(sigma_x),
            rate=rate,
            samples=samples_per_class,
            key=key,
            device=dev,
        )
        for name, x in (("D", d), ("D'", d_prime)):
            proj = _projections(x, u, trials=trials, tag=name, **common)
            scores[name] = log_likelihood_ratio(
                proj, mode=mode, shift=clip / mixing_order, rate=float(rate), sigma=float(sigma_x)
            )
    elif entry.audit_game == "dataset-mixing":
        labels = {"D": np.r_[0, np.full(class_size - 1, 2)], "D'": np.r_[1, np.full(class_size - 1, 2)]}
        if mode == "poisson":  # D' removes the canary (features and label)
            labels["D'"] = labels["D'"][1:]
        for name, x in (("D", d), ("D'", d_prime)):
            scores[name] = _dpmix_scores(
                x,
                labels[name],
                u,
                mode=mode,
                mixing_order=mixing_order,
                sigma_x=float(sigma_x),
                sigma_y=label_noise_ratio * float(sigma_x),
                rate=rate,
                trials=trials,
                key=key,
                tag=name,
                clip=clip,
            )
    else:
        direction, canary = u.astype(np.float64), clip * u.astype(np.float64)
        if projection is not None:  # the input direction R stretches most, and where it goes
            left, _, right = np.linalg.svd(projection, full_matrices=False)
            canary, direction = clip * left[:, 0], right[0]
        for name, sign in (("D", 1.0), ("D'", -1.0)):
            scores[name] = _perturb_scores(
                sign * canary,
                direction,
                sigma_x=float(sigma_x),
                trials=trials,
                key=key,
                tag=name,
                projection=projection,
            )
    game = _score_game(scores, half, delta)
    noiseless = noiseless_privacy(d, mode=mode, mixing_order=mixing_order, clip=clip)
    return {
        "mechanism": mechanism,
        "mode": mode,
        "mixing_order": mixing_order,
        "class_size": class_size,
        "samples_per_class": samples_per_class,
        "dim": dim,
        "clip": clip,
        "delta": delta,
        "sigma_x": float(sigma_x),
        "noise_multiplier": event.noise_multiplier,
        "sampling_rate": float(rate),
        "neighbouring_relation": RELATION_WORDS[entry.relation(mode)],
        "game": ("D' replaces the canary +c*u by -c*u" if mode == "fixed" else "D' removes the canary +c*u"),
        "target_epsilon": epsilon,
        **_planned_fields(planned),
        "accounted_epsilon": accounted,
        "claimed_epsilon": claimed,
        **game,
        "violation": bool(game["empirical_epsilon_lower_bound"] > claimed),
        "statistic": "log-likelihood ratio" if sigma_x > 0 else "largest projection on the canary",
        "trials": trials,
        "selection_trials": half,
        "noiseless_privacy_epsilon": noiseless["epsilon"],
        "noiseless_privacy": noiseless,
        "device": dev.type,
        "wall_seconds": time.time() - t0,
    }


def _planned_fields(planned: Optional[BudgetPlan]) -> dict:
    """What the budget planner set aside before the synthesis (the audit's game plays the synthesis alone, and its
    accounted epsilon is the synthesis' own)."""
    if planned is None:
        return {}
    return {
        "statistics_epsilon": {s.name: s.epsilon for s in planned.shares},
        "synthesis_epsilon": planned.synthesis_epsilon,
    }


def run_paper_rate_audit(
    *, mode: str, mixing_order: int, epsilon: float, num_classes: int = 10, class_size: Optional[int] = None, **kwargs
) -> dict:
    """A deliberately broken claim: epsilon accounted with the paper's rate p = l/N, N = K * N_k.

    sigma_x is calibrated for one 'class' of N records (as if rows sampled the whole dataset), then
    the real per-class mechanism (rate l/N_k) is audited against that claim.
    """
    class_size = mixing_order if class_size is None else class_size
    sigma = calibrate_sigma_x(
        mode,
        class_sizes=[num_classes * class_size],
        samples_per_class=kwargs.get("samples_per_class", 1),
        mixing_order=mixing_order,
        clip=kwargs.get("clip", 1.0),
        target_epsilon=epsilon,
        delta=kwargs.get("delta", 1e-5),
    )
    out = run_audit(
        mode=mode, mixing_order=mixing_order, sigma_x=sigma, class_size=class_size, claimed_epsilon=epsilon, **kwargs
    )
    out["broken_claim"] = (
        f"epsilon {epsilon} accounted with p = l/N, N = {num_classes} x {class_size} records, "
        f"while rows sample one class of {class_size}"
    )
    return out


# ---------------------------------------------------------------- CLI and manifest


def format_table(result: dict) -> str:
    keys = [
        "mode",
        "mixing_order",
        "class_size",
        "samples_per_class",
        "expected_batch",
        "steps",
        "sigma_x",
        "noise_multiplier",
        "sampling_rate",
        "accounted_epsilon",
        "claimed_epsilon",
        "empirical_epsilon_lower_bound",
        "max_detectable_epsilon",
        "violation",
        "fp",
        "fn",
        "fp_upper",
        "fn_upper",
        "trials",
        "noiseless_privacy_epsilon",
        "device",
        "wall_seconds",
    ]
    lines = []
    for k in (k for k in keys if k in result):
        v = result[k]
        lines.append(f"{k:>30}: {v:.4g}" if isinstance(v, float) else f"{k:>30}: {v}")
    lines.append(
        f"{'':>30}  lower bound at {CONFIDENCE:.0%} confidence on synthetic canary data; "
        f"noiseless_privacy_epsilon is informational, NOT a guarantee"
    )
    return "\n".join(lines)


def json_safe(value):
    """JSON has no infinity (the manifest's convention): non-finite floats become null."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _audit_mode(mechanism: str, mode: Optional[str]) -> str:
    """The mode a mechanism is audited in: the one asked for (refused by ``run_audit`` if the mechanism does not
    offer it), else the mechanism's only mode (p3gm: poisson), else fixed."""
    modes = registry.get(mechanism).modes
    return mode if mode is not None else modes[0] if len(modes) == 1 else "fixed"


def run_audit_cli(args) -> int:
    """``dpcda audit``: prints the result; exit status 1 when the bound exceeds the accounted epsilon."""
    result = run_audit(
        mode=_audit_mode(args.mechanism, args.mode),
        mixing_order=args.mixing_order,
        epsilon=args.epsilon,
        delta=args.delta,
        class_size=args.class_size,
        samples_per_class=args.samples_per_class,
        trials=args.trials,
        seed=args.seed,
        mechanism=args.mechanism,
        label_noise_ratio=args.label_noise_ratio,
        normalization=args.normalization,
    )
    print(json.dumps(json_safe(result), indent=2) if args.json else format_table(result))
    return 1 if result["violation"] else 0


def audit_section(
    manifest: dict, *, class_size: Optional[int] = None, trials: Optional[int] = None, seed: int = 0
) -> dict:
    """The ``audit`` section for a release's manifest (its mode, l, c, sigma_x).

    Defaults: a class of ``max(2, l)`` records, so the canary joins every row and the audit is as
    strong as it can be (its accounted epsilon is that small class's, above the release's, whose
    classes are larger); 20000 trials per dataset on the CPU (about a second), 200000 on CUDA.
    """
    mech = manifest["mechanism"]
    dev = pick_device("auto")
    # p3gm: its DP-SGD step at the release's noise multiplier, the canary in every batch
    name = mech.get("name", "dpcda")  # the manifest model's default: DP-CDA's section may leave it out
    if registry.get(name).audit_game == "dp-sgd-step":
        size = class_size or 2
        result = run_audit(
            mode="poisson",
            mixing_order=size,
            sigma_x=float(mech["dp_sgd"]["noise_multiplier"]),
            delta=float(manifest["privacy"]["delta"]),
            class_size=size,
            trials=trials or 20000,
            seed=seed,
            mechanism=name,
        )
        result["note"] = AUDIT_NOTE
        result["scope"] = (
            "one DP-SGD step at the release's noise multiplier with the canary in every batch (q = 1); the release's "
            "own q, step count and network are not exercised"
        )
        return json_safe(result)
    entry = registry.get(name)
    l = int(mech.get("mixing_order", 1))  # local and randproj release each record once: no mixing order
    result = run_audit(
        mode=mech["mode"],
        mixing_order=l,
        sigma_x=float(mech["sigma_x"]),
        delta=float(manifest["privacy"]["delta"]),
        clip=float(mech["clip"]),
        class_size=class_size or max(2, l),
        samples_per_class=1,
        trials=trials or (200000 if dev.type == "cuda" else 20000),
        seed=seed,
        device=dev.type,
        mechanism=name,
        label_noise_ratio=float(mech.get("label_noise_ratio") or 1.0),
    )
    result["note"] = AUDIT_NOTE
    if entry.projects:
        result["scope"] = (
            "the canary game on a public random projection of the audit's own small dimension, drawn from the audit's "
            "seed: the release's R is not exercised"
        )
    return json_safe(result)


def _run_dpsgd_audit(
    *, planned, epsilon, sigma_x, delta, class_size, batch, steps, dim, clip, trials, seed, claimed_epsilon, t0
) -> dict:
    """p3gm's canary game: its DP-SGD (the one step that touches records in every iteration) on a toy problem.

    D: a canary whose gradient is 10 C u (clipped to C) plus ``class_size - 1`` records whose gradients are
    orthogonal to u; D': the same without the canary. Each trial runs ``steps`` DP-SGD steps with the expected batch
    ``batch`` (q = batch / class_size) through ``mechanisms.dpsgd``; the adversary sees every noisy sum. ``sigma_x``
    here is the noise multiplier z (0: no noise); with ``epsilon`` z is calibrated to what ``planned`` (the budget of
    a p3gm release with these settings: statistics, DP-PCA, DP-EM) leaves."""
    from fractions import Fraction

    from dpcda.privacy.events import DpSgdEvent

    if batch > class_size:
        raise AuditError(f"p3gm: the expected batch (--mixing-order {batch}) must be at most --class-size")
    rate = Fraction(batch, class_size)

    def events(z):
        return [DpSgdEvent("dp_sgd", rate, steps, z)]

    z = sigma_x if sigma_x is not None else calibrate_synthesis(planned, events)
    event = events(float(z))[0]
    accounted = account(ReleaseEvents("poisson", (event,), ()), delta, cross_check=False).epsilon
    claimed = accounted if claimed_epsilon is None else float(claimed_epsilon)
    key = key_from_test_seed(seed)
    u = np.zeros(dim)
    u[0] = 1.0
    background = np.zeros((class_size - 1, dim))
    background[:, 1] = clip * 3.0  # orthogonal to u, clipped too
    grads = {"D": np.vstack([10.0 * clip * u, background]), "D'": background}
    scores = {
        name: _dpsgd_scores(
            g, u, rate=rate, noise_multiplier=float(z), clip=clip, steps=steps, trials=trials, key=key, tag=name
        )
        for name, g in grads.items()
    }
    half = trials // 2
    game = _score_game(scores, half, delta)
    return {
        "mechanism": "p3gm",
        "mode": "poisson",
        "component": "dp_sgd (mechanisms.dpsgd: Poisson batch, per-example clip, noisy sum)",
        "class_size": class_size,
        "expected_batch": batch,
        "steps": steps,
        "dim": dim,
        "clip": clip,
        "delta": delta,
        "noise_multiplier": float(z),
        "sampling_rate": float(rate),
        "neighbouring_relation": RELATION_WORDS["poisson"],
        "game": "D' removes the canary (gradient 10 C u, clipped to C); the adversary sees every noisy sum",
        "target_epsilon": epsilon,
        **_planned_fields(planned),
        "accounted_epsilon": accounted,
        "claimed_epsilon": claimed,
        **game,
        "violation": bool(game["empirical_epsilon_lower_bound"] > claimed),
        "statistic": "log-likelihood ratio" if z > 0 else "largest projection on the canary",
        "trials": trials,
        "selection_trials": half,
        "wall_seconds": time.time() - t0,
    }
