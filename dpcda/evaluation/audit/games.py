"""The canary games of the audit, one per way a mechanism releases a record: each plays the mechanism's own
synthesis code on a small synthetic dataset D with a canary and its neighbour D' (``evaluation.audit`` says how the
verdict is drawn). A mechanism names its game (``Mechanism.audit_game``, ``module:Class``); nothing compares names.

- ``ClassMixing`` (dpcda): rows mixed within one class (``mechanisms.dpcda.mix_chunk``); the statistic is the
  log-likelihood ratio of the rows' projections on the canary direction.
- ``DatasetMixing`` (dpmix): rows of the whole dataset (``mechanisms.dpmix.mix_dataset``), the canary switching its
  label too (class 0 on D, class 1 on D', the background in class 2), one row per trial.
- ``Perturbation`` (local, randproj): the canary's own row (``mechanisms.local.perturb_block``), +c u against -c u;
  for randproj u is the direction the public R stretches most.
- ``DpSgdStep`` (p3gm): its DP-SGD (``mechanisms.dpsgd``: the Poisson batch, the clip, the noisy sum) on a toy
  problem whose canary gradient is 10 C u; the adversary sees every noisy sum.

A game reads its noise and its event from the mechanism's own plan of the game's small configuration
(``mechanisms.plan.plan_synthesis``: the release's planner on the game's public sizes), calibrated there to a target
epsilon or given.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from fractions import Fraction
from typing import Optional

import numpy as np
import torch

from dpcda.evaluation.audit.statistics import AuditError, log_likelihood_ratio
from dpcda.mechanisms.dpcda import mix_chunk  # Beam-free core of the mixing stage
from dpcda.privacy.accounting import RELATION_WORDS
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream

# Rows per mix_chunk call: bounds memory (rows * dim floats) while keeping thousands of trials per call.
BATCH_ROWS = {"cpu": 1 << 17, "cuda": 1 << 21}
NOISELESS_NOTE = (
    "seed 003 Theorem 1 (noiseless privacy, after Grining & Klonowski 2017): one synthetic "
    "row as a sum of n = l records, the audit data's own per-coordinate variance standing in "
    "for noise, sigma_x ignored. Informational only, NOT a guarantee: its delta is vacuous "
    "for small n, and an adversary who knows the other records defeats it"
)


@dataclasses.dataclass(frozen=True)
class Setting:
    """The small configuration a game is played on: the mechanism's settings, the sizes, the trials."""

    mechanism: str
    mode: str
    mixing_order: int
    class_size: int
    samples_per_class: int
    dim: int
    clip: float
    delta: float
    trials: int
    seed: int
    label_noise_ratio: float = 1.0
    projection_dim: int = 4


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
    progress,
) -> np.ndarray:
    """(trials, samples) projections on u of the rows of ``trials`` independent mechanism runs on x (``progress``
    counts the trials, ``dpcda.progress``)."""
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
        progress.update(n)
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
    progress,
) -> np.ndarray:
    """Log-likelihood ratios of DPMix rows (one per trial, all rows of one real ``mix_dataset`` call): the feature
    projection on the canary direction and the label-score difference (class 0 minus class 1), whitened together."""
    from dpcda.mechanisms.dpmix import mix_dataset

    parts = []
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
    ):
        parts.append((f.astype(np.float64) @ u, sc[:, 0].astype(np.float64) - sc[:, 1]))
        progress.update(len(f))
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
    progress,
) -> np.ndarray:
    """The canary's released row, once per trial (``mechanisms.local.perturb_block``), projected on ``direction``
    (monotone in the likelihood ratio: the two hypotheses shift it by +-c||R||)."""
    from dpcda.mechanisms.local import perturb_block

    rows = np.repeat(x_row[None, :].astype(np.float64), trials, axis=0)
    out = perturb_block(rows, key=key, block=("audit", tag), sigma_x=sigma_x, projection=projection) @ direction
    progress.update(trials)
    return out


def _dpsgd_scores(
    grads: np.ndarray,
    u: np.ndarray,
    *,
    rate,
    noise_multiplier: float,
    clip: float,
    steps: int,
    trials: int,
    key,
    tag,
    progress,
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
        progress.update(1)
    if std <= 0:
        return proj.max(axis=1)
    a, q = clip * (1.0 - CLIP_MARGIN), float(rate)  # the canary's clipped gradient on u (under D)
    llr = np.logaddexp(math.log1p(-q) if q < 1 else -math.inf, math.log(q) + (a * proj - a * a / 2) / std**2)
    return llr.sum(axis=1)


# ---------------------------------------------------------------- the games


class Game(abc.ABC):
    """A canary game: the release settings it plans (``settings``), the noise and event it claims (``noise``), and
    the scores of ``trials`` runs on D and on D' (``scores``); ``fields`` and ``extra`` are its result's own."""

    noise_name = "sigma_x"

    def check(self, s: Setting) -> None:
        """AuditError where the game cannot be played at these sizes."""

    def settings(self, s: Setting) -> dict:
        """The release settings (flat config keys) of the mechanism's plan of this small configuration."""
        return {"mixing_order": s.mixing_order, "samples": s.samples_per_class}

    def plans(self, given: Optional[float]) -> bool:
        """Whether the mechanism's plan is drawn (else the given noise makes the event alone)."""
        return True

    def noise(self, s: Setting, synthesis, given: Optional[float]) -> tuple[float, object]:
        """(the noise, the event it spends): the plan's (``synthesis``, calibrated or at the given sigma_x)."""
        return float(synthesis.sigma_x), synthesis.events[0]

    @abc.abstractmethod
    def scores(self, s: Setting, synthesis, noise: float, event, key: bytes, device, progress) -> dict:
        """{"D": scores, "D'": scores}, ``s.trials`` each; ``progress`` (``dpcda.progress.track``) counts the trials
        as they are played, batch by batch."""

    def fields(self, s: Setting, noise: float, event) -> dict:
        """The result's fields before the target and the verdict."""
        rate = float(getattr(event, "exact_sampling_rate", 1))
        return {
            "mechanism": s.mechanism,
            "mode": s.mode,
            "mixing_order": s.mixing_order,
            "class_size": s.class_size,
            "samples_per_class": s.samples_per_class,
            "dim": s.dim,
            "clip": s.clip,
            "delta": s.delta,
            "sigma_x": float(noise),
            "noise_multiplier": event.noise_multiplier,
            "sampling_rate": rate,
            "game": "D' replaces the canary +c*u by -c*u" if s.mode == "fixed" else "D' removes the canary +c*u",
        }

    def from_manifest(self, manifest: dict, *, class_size: Optional[int], trials: Optional[int], device) -> dict:
        """``run_audit``'s settings for a release's manifest: its mode, l, c and sigma_x, a class of ``max(2, l)``
        records (the canary joins every row: the audit is as strong as it can be), 20000 trials per dataset on the
        CPU (about a second), 200000 on CUDA."""
        mech = manifest["mechanism"]
        l = int(mech.get("mixing_order", 1))  # local and randproj release each record once: no mixing order
        return dict(
            mode=mech["mode"],
            mixing_order=l,
            sigma_x=float(mech["sigma_x"]),
            delta=float(manifest["privacy"]["delta"]),
            clip=float(mech["clip"]),
            class_size=class_size or max(2, l),
            samples_per_class=1,
            trials=trials or (200000 if device.type == "cuda" else 20000),
            label_noise_ratio=float(mech.get("label_noise_ratio") or 1.0),
        )

    def scope(self) -> str:
        """What of the release the game does not exercise ('' where it plays the release's own settings)."""
        return ""

    def extra(self, s: Setting, noise: float) -> dict:
        """The result's fields after the verdict (seed 003's noiseless figure)."""
        d, _, _ = canary_datasets(s.mode, s.class_size, s.dim, s.clip, s.seed)
        noiseless = noiseless_privacy(d, mode=s.mode, mixing_order=s.mixing_order, clip=s.clip)
        return {"noiseless_privacy_epsilon": noiseless["epsilon"], "noiseless_privacy": noiseless}


class ClassMixing(Game):
    def scores(self, s, synthesis, noise, event, key, device, progress):
        rate = getattr(event, "exact_sampling_rate", 1)
        d, d_prime, u = canary_datasets(s.mode, s.class_size, s.dim, s.clip, s.seed)
        common = dict(
            mode=s.mode,
            mixing_order=s.mixing_order,
            sigma_x=float(noise),
            rate=rate,
            samples=s.samples_per_class,
            key=key,
            device=device,
        )
        out = {}
        for name, x in (("D", d), ("D'", d_prime)):
            proj = _projections(x, u, trials=s.trials, tag=name, progress=progress, **common)
            out[name] = log_likelihood_ratio(
                proj, mode=s.mode, shift=s.clip / s.mixing_order, rate=float(rate), sigma=float(noise)
            )
        return out


class DatasetMixing(Game):
    def settings(self, s):
        return {**super().settings(s), "label_noise_ratio": s.label_noise_ratio}

    def scores(self, s, synthesis, noise, event, key, device, progress):
        rate = getattr(event, "exact_sampling_rate", 1)
        d, d_prime, u = canary_datasets(s.mode, s.class_size, s.dim, s.clip, s.seed)
        n = s.class_size
        labels = {"D": np.r_[0, np.full(n - 1, 2)], "D'": np.r_[1, np.full(n - 1, 2)]}
        if s.mode == "poisson":  # D' removes the canary (features and label)
            labels["D'"] = labels["D'"][1:]
        return {
            name: _dpmix_scores(
                x,
                labels[name],
                u,
                mode=s.mode,
                mixing_order=s.mixing_order,
                sigma_x=float(noise),
                sigma_y=s.label_noise_ratio * float(noise),
                rate=rate,
                trials=s.trials,
                key=key,
                tag=name,
                clip=s.clip,
                progress=progress,
            )
            for name, x in (("D", d), ("D'", d_prime))
        }


class Perturbation(Game):
    def settings(self, s):
        # randproj's public R is drawn from the audit's seed at the audit's own small dimension
        return {"projection_dim": s.projection_dim, "projection_seed": s.seed}

    def scores(self, s, synthesis, noise, event, key, device, progress):
        _, _, u = canary_datasets(s.mode, s.class_size, s.dim, s.clip, s.seed)
        projection = synthesis.projection_matrix(s.dim)
        direction, canary = u.astype(np.float64), s.clip * u.astype(np.float64)
        if projection is not None:  # the input direction R stretches most, and where it goes
            left, _, right = np.linalg.svd(projection, full_matrices=False)
            canary, direction = s.clip * left[:, 0], right[0]
        return {
            name: _perturb_scores(
                sign * canary,
                direction,
                sigma_x=float(noise),
                trials=s.trials,
                key=key,
                tag=name,
                projection=projection,
                progress=progress,
            )
            for name, sign in (("D", 1.0), ("D'", -1.0))
        }


class Projection(Perturbation):
    """randproj's game: the canary's row projected by a public R of the audit's own small dimension."""

    def scope(self) -> str:
        return (
            "the canary game on a public random projection of the audit's own small dimension, drawn from the audit's "
            "seed: the release's R is not exercised"
        )


class DpSgdStep(Game):
    """p3gm's canary game: its DP-SGD (the one step that touches records in every iteration) on a toy problem.

    D: a canary whose gradient is 10 C u (clipped to C) plus ``class_size - 1`` records whose gradients are
    orthogonal to u; D': the same without the canary. Each trial runs ``samples_per_class`` DP-SGD steps with the
    expected batch ``mixing_order`` (q = batch / class_size) through ``mechanisms.dpsgd``; the adversary sees every
    noisy sum. The noise is the noise multiplier z (0: no noise): the given one, or the one p3gm's plan calibrates
    for this batch and step count after the rest of its budget (statistics, DP-PCA, DP-EM)."""

    noise_name = "noise_multiplier"

    def check(self, s):
        if s.mixing_order > s.class_size:
            raise AuditError(f"p3gm: the expected batch (--mixing-order {s.mixing_order}) must be at most --class-size")

    def rate(self, s) -> Fraction:
        return Fraction(s.mixing_order, s.class_size)

    def settings(self, s):
        # the plan's own schedule: q = batch / N, steps = ceil(epochs / q) = samples_per_class for these epochs
        return {
            "p3gm_batch": s.mixing_order,
            "p3gm_epochs": (s.samples_per_class - 0.5) * float(self.rate(s)),
            "p3gm_latent_dim": min(10, s.dim - 1),  # the DP-PCA stage of a d-wide toy: its share is the same
        }

    def plans(self, given):
        return given is None

    def noise(self, s, synthesis, given):
        from dpcda.privacy.events import DpSgdEvent

        z = float(synthesis.noise_multiplier) if synthesis is not None else float(given)
        return z, DpSgdEvent("dp_sgd", self.rate(s), s.samples_per_class, z)

    def scores(self, s, synthesis, noise, event, key, device, progress):
        u = np.zeros(s.dim)
        u[0] = 1.0
        background = np.zeros((s.class_size - 1, s.dim))
        background[:, 1] = s.clip * 3.0  # orthogonal to u, clipped too
        grads = {"D": np.vstack([10.0 * s.clip * u, background]), "D'": background}
        return {
            name: _dpsgd_scores(
                g,
                u,
                rate=self.rate(s),
                noise_multiplier=float(noise),
                clip=s.clip,
                steps=s.samples_per_class,
                trials=s.trials,
                key=key,
                tag=name,
                progress=progress,
            )
            for name, g in grads.items()
        }

    def fields(self, s, noise, event):
        return {
            "mechanism": s.mechanism,
            "mode": "poisson",
            "component": "dp_sgd (mechanisms.dpsgd: Poisson batch, per-example clip, noisy sum)",
            "class_size": s.class_size,
            "expected_batch": s.mixing_order,
            "steps": s.samples_per_class,
            "dim": s.dim,
            "clip": s.clip,
            "delta": s.delta,
            "noise_multiplier": float(noise),
            "sampling_rate": float(self.rate(s)),
            "neighbouring_relation": RELATION_WORDS["poisson"],
            "game": "D' removes the canary (gradient 10 C u, clipped to C); the adversary sees every noisy sum",
        }

    def from_manifest(self, manifest, *, class_size, trials, device):
        """One DP-SGD step at the release's noise multiplier with the canary in every batch (q = 1)."""
        size = class_size or 2
        return dict(
            mode="poisson",
            mixing_order=size,
            sigma_x=float(manifest["mechanism"]["dp_sgd"]["noise_multiplier"]),
            delta=float(manifest["privacy"]["delta"]),
            class_size=size,
            trials=trials or 20000,
        )

    def scope(self) -> str:
        return (
            "one DP-SGD step at the release's noise multiplier with the canary in every batch (q = 1); the release's "
            "own q, step count and network are not exercised"
        )

    def extra(self, s, noise):
        return {}
