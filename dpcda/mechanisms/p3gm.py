"""P3GM (seed 004, Algorithm 1): a DP mixture prior on a DP-PCA projection, a VAE trained with DP-SGD, sampled rows.

Relation: add or remove one record, label included (``poisson``). The rows reach this module z-scored and clipped to
L2 norm ``clip (1 - CLIP_MARGIN)``; the DP-PCA basis V (d x d', orthonormal columns) is already DP (its own event,
``mechanisms.dppca``). What it fits, what each step spends, and what is post-processing:

1. Projection (post-processing of V): xhat_i = V^T x_i / clip (``project_rows``), so ||xhat_i|| <= 1 - CLIP_MARGIN.
2. DP-EM (``fit_prior``; ``privacy.events.IteratedGaussianEvent`` with ``sensitivity = em_sensitivity() = sqrt(3)``):
   a mixture of ``components`` diagonal Gaussians on xhat. The start is public and data-independent (equal weights,
   unit-ball-scaled means from the public stream ``public_key("p3gm-em-init", 0)``, per-coordinate variances 1/d').
   Each iteration's E-step uses only the previous (DP) parameters, so record i's responsibilities r_i >= 0,
   sum_k r_ik = 1, depend on x_i alone. Three blocks of sums are released with N(0, sigma_e^2) on every coordinate
   (stream ("p3gm-em", iteration)): S0 = sum_i r_i (K), S1 = sum_i r_i xhat_i^T (K x d'), S2 = sum_i r_i (xhat_i^2)^T
   (K x d', squares elementwise). One record moves S0 by ||r_i|| <= 1, S1 by ||r_i|| ||xhat_i|| <= 1 and S2 by
   ||r_i|| ||xhat_i^2|| <= ||xhat_i||^2 <= 1: L2 sensitivity sqrt(3) for the whole vector, ``em_iterations`` adaptive
   Gaussian releases. The M-step is post-processing (floored counts and weights, means kept in the unit ball,
   variances in [VAR_FLOOR, 1]).
3. DP-SGD (``train_vae``; ``privacy.events.DpSgdEvent(sampling_rate, steps, noise_multiplier)``): the encoder's mean is
   FIXED to the projection (P3GM's point: the latent mean is sqrt(d') xhat_i); the encoder [d, encoder_hidden, d']
   (ReLU; the width defaults to hidden) outputs only the log-variance; the decoder [d', hidden, d + K] (ReLU) outputs
   the feature means (unit-variance Gaussian likelihood on the rows scaled by sqrt(d) / clip, so coordinates are about
   unit size: a public rescaling) and K label logits (cross-entropy with y, weighted ``label_weight_for``). The KL term
   is the single-sample Monte Carlo estimate log q(z|x) - log p_MoG(z) at the reparametrised z = mu + sigma eps. Per
   step t: the Poisson batch (``mechanisms.dpsgd.poisson_batch``, stream ("p3gm-batch", t)); eps from ("p3gm-eps", t)
   (given the batch, its records' eps are iid N(0, I) whatever their order, so each record's gradient is a function of
   that record and of randomness independent of the data, as the DP-SGD analysis allows); per-example gradients of ALL
   parameters, clipped to ``grad_clip`` (``clip_factors``) and summed in float64; N(0, (z C)^2) on every coordinate
   (``noisy_sum``, stream ("p3gm-sgd", t)); an empty batch still gets its noise. Dividing by the public
   ``expected_batch`` and Adam's step are post-processing. The start is public (PyTorch's default init drawn from the
   public stream ``public_key("p3gm-init", 0)``), and by default (``decoder_start`` "pca") the decoder's feature output
   starts as the DP-PCA reconstruction V V^T x (``pca_decoder``: a function of V, post-processing).
4. Sampling (``sample_rows``, post-processing of the DP prior and decoder): component by exact inversion of 53-bit
   uniforms, z from that Gaussian, features = the decoder's feature means mapped back to the rows' units and clipped
   to norm ``clip``, label = argmax of the label logits; stream ("p3gm-sample", chunk), so a retried bundle redraws
   the same rows.

Per-example gradients without per-example passes (ghost clipping, exact for Linear layers): for a Linear layer with
input a_i and output gradient g_i, example i's weight gradient is g_i a_i^T (Frobenius norm ||g_i|| ||a_i||) and its
bias gradient g_i. One backward of the summed loss to the pre-activations gives every g_i (no example's loss depends
on another's pre-activations: no batch statistics anywhere); the squared norms sum_l ||g_il||^2 (||a_il||^2 + 1)
and the clipped sums (f G)^T A are computed in float64 from the float32 G and A. The squared norms are sums in a fixed
order made of elementwise operations only (``row_square_sums``), so a row's norm has the same bits at any position of
its block on any IEEE device, where a reduction kernel's order can depend on the row's place in memory.

Floats. EM: each record's contribution (r', r' xhat, r' xhat^2), r' = r (1 - CLIP_MARGIN), is computed in float64,
truncated toward zero to multiples of 2^-EM_QUANTUM_BITS (never growing any block's norm: each stays below 1 in the
bits), then summed as exact int64; the sums (< 2^53 quanta for fewer than ``MAX_EM_ROWS`` rows) are exact float64
centres for ``NoiseStream.gaussian``. DP-SGD: products of float32 values are exact in float64, the float64 norms are
within a relative d 2^-52 of the exact ones (pairwise sums: far closer), and the margin CLIP_MARGIN in ``clip_factors``
absorbs that and the float64 summation of the batch (``mechanisms.dpsgd``). That one row's float32 forward and backward
do not depend on which other rows share its batch is made true rather than assumed (``mechanisms.rowwise``): the
projection, the EM contributions and the DP-SGD passes run on zero-padded blocks of fixed shapes (SGD_BLOCK rows; Linear
widths padded to multiples of ``rowwise.WIDTH_MULTIPLE`` on the CPU, and on a GPU the Linear products summed in an order
fixed by the width alone, ``rowwise.fixed_order_matmul``; the projection on one BLAS thread), and the position of a row
in its block is checked not to matter (``check_shapes`` before any row is read, ``check_sgd_block`` and the cached
checks again in the fit).

Randomness. Nothing here calls torch's or numpy's generators: every draw touching private data is a
``privacy.noise.NoiseStream`` under the run key; the weight initialisation and the EM start are public draws
(``public_key``), the same in every run. The noise draws that carry privacy are one per parameter per DP-SGD step and
K (1 + 2 d') per EM iteration (what the plan counts for the sampler's delta). The loss handed to ``progress`` is
computed from private rows and is NOT DP: it is for logs that only those who may see the rows read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import threading
from fractions import Fraction
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from dpcda.mechanisms import rowwise
from dpcda.mechanisms.base import Caveat, CaveatCode, Grouping, InProcess, Mechanism, Public, SynthesisPlan
from dpcda.mechanisms.dpcda import canonical_order
from dpcda.mechanisms.dppca import PcaPlan, check_projection, project_rows
from dpcda.mechanisms.dpsgd import clip_factors, noisy_sum, poisson_batch
from dpcda.privacy.budget import Share, calibrate_synthesis
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import NoiseStream, public_key
from dpcda.schemas.mechanism_params import P3gmParams

log = logging.getLogger(__name__)

EM_QUANTUM_BITS = 24  # EM contributions are multiples of 2^-24 (each coordinate at most 1 in size)
MAX_EM_ROWS = 1 << 29  # the EM sums then stay below 2^53 quanta: exact in float64
SGD_BLOCK = 64  # rows per DP-SGD forward and backward (a fixed shape: mechanisms.rowwise)
EM_BLOCK_ROWS = 4096  # rows per contribution block (a fixed shape: mechanisms.rowwise)
WEIGHT_FLOOR = 1e-3  # mixture weights after the M-step (then renormalised)
VAR_FLOOR = 1e-4  # per-coordinate variance of a component, in xhat units (xhat in the unit ball)
LOGVAR_RANGE = (-12.0, 4.0)  # the encoder's log-variance (latent units), clamped
PROGRESS_EVERY = 50
# What the fit checks before it reads a row (``check_shapes``) and again per device in the fit (``check_sgd_block``),
# stated in the manifest.
SGD_ROW_CHECK = (
    "on the fit's device and thread count (on a CPU the process's, or the largest power of two below it that passes), "
    "a block of 64 public random rows in 16 rotations, each shifted by 1 and "
    "by 33 positions: every row's float32 loss, float64 copies of its float32 layer inputs and pre-activation "
    "gradients, and float64 per-example gradient norm (squares summed in a fixed pairwise order of elementwise "
    "operations) must agree bit for bit, else the release is refused (mechanisms.rowwise); on a GPU the Linear "
    "products and the loss's row sums are added in a fixed pairwise order (rowwise.fixed_order_matmul, row_sums), so "
    "a release's last bits depend on the device"
)
PARAM_NAMES = (
    "enc1.weight",
    "enc1.bias",
    "enc2.weight",
    "enc2.bias",
    "dec1.weight",
    "dec1.bias",
    "dec2.weight",
    "dec2.bias",
)
_LOG_2PI = math.log(2.0 * math.pi)


def em_sensitivity() -> float:
    """L2 sensitivity of one DP-EM release (S0, S1, S2) under add/remove: three blocks of norm at most 1 each."""
    return math.sqrt(3.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class P3gmSpec:
    """P3GM's public settings. ``noise_multiplier`` 0 and ``em_noise_std`` 0: no noise (the non-private PGM
    reference); ``grad_clip`` inf: no clipping (only with ``noise_multiplier`` 0)."""

    em_noise_std: float  # sigma_e: std of the noise on every coordinate of the EM sufficient statistics
    sampling_rate: Fraction  # q of DP-SGD (each record joins a batch with probability q)
    steps: int  # DP-SGD steps
    noise_multiplier: float  # z: the noise std on the SUM of clipped gradients is z * grad_clip
    latent_dim: int = 10
    components: int = 3
    em_iterations: int = 20
    hidden: int = 1000
    # The encoder's hidden width (it outputs only the log-variance); None: ``hidden``
    encoder_hidden: Optional[int] = None
    grad_clip: float = 1.0
    lr: float = 1e-3
    num_classes: int = 10
    # The cross-entropy's weight; None: sqrt(d) (``label_weight_for``).
    label_weight: Optional[float] = None
    # The public divisor of the noisy gradient sum (q N_hat, e.g. the configured batch). None: 1. Adam is invariant
    # to it (it only rescales Adam's epsilon, 1e-8, far below the noise), so it never needs the private N.
    expected_batch: Optional[float] = None
    # "public": the public start only; "pca": the decoder starts as the DP-PCA reconstruction (``pca_decoder``).
    decoder_start: str = "pca"

    def __post_init__(self):
        for name in ("latent_dim", "components", "hidden", "num_classes", "encoder_hidden"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ValueError(f"P3gmSpec.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("em_iterations", "steps"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"P3gmSpec.{name} must be at least 0, got {getattr(self, name)}")
        for name in ("em_noise_std", "noise_multiplier", "label_weight"):
            if getattr(self, name) is None:
                continue
            v = float(getattr(self, name))
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"P3gmSpec.{name} must be finite and >= 0, got {v}")
        if not 0 < Fraction(self.sampling_rate) <= 1:
            raise ValueError(f"P3gmSpec.sampling_rate must lie in (0, 1], got {self.sampling_rate}")
        if not float(self.grad_clip) > 0:
            raise ValueError(f"P3gmSpec.grad_clip must be positive, got {self.grad_clip}")
        if self.noise_multiplier > 0 and not math.isfinite(self.grad_clip):
            raise ValueError("P3gmSpec.grad_clip must be finite when noise_multiplier > 0")
        if not float(self.lr) > 0:
            raise ValueError(f"P3gmSpec.lr must be positive, got {self.lr}")
        if self.decoder_start not in ("public", "pca"):
            raise ValueError(f"P3gmSpec.decoder_start must be 'public' or 'pca', got {self.decoder_start!r}")
        if self.expected_batch is not None and not float(self.expected_batch) > 0:
            raise ValueError(f"P3gmSpec.expected_batch must be positive, got {self.expected_batch}")

    @property
    def encoder_width(self) -> int:
        return int(self.hidden if self.encoder_hidden is None else self.encoder_hidden)

    @property
    def sgd_noise_std(self) -> float:
        """z C, the std of the noise on every coordinate of the clipped gradient sum (0: none)."""
        return float(self.noise_multiplier) * float(self.grad_clip) if self.noise_multiplier > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class MogPrior:
    """Diagonal Gaussian mixture in xhat units (the unit ball): weights (K,), means and variances (K, d')."""

    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray


@dataclasses.dataclass(frozen=True)
class P3gmModel:
    """The fitted (DP) model: the prior and the network's float32 weights (``PARAM_NAMES``), numpy only (pickles
    as a Beam side input and moves to any device)."""

    prior: MogPrior
    state: dict


# ---------------------------------------------------------------- DP-EM


def _public_start(components: int, dim: int) -> MogPrior:
    """Equal weights, means N(0, 1/(4 d')) per coordinate from a public stream, variances 1/d': no data in it."""
    means = NoiseStream(public_key("p3gm-em-init", 0), "means").gaussian(
        np.zeros((components, dim)), 0.5 / math.sqrt(dim)
    )
    return MogPrior(
        weights=np.full(components, 1.0 / components),
        means=_into_ball(means),
        variances=np.full((components, dim), 1.0 / dim),
    )


def _into_ball(m: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    return m * np.minimum(1.0, 1.0 / np.maximum(norms, 1e-300))


def _log_responsibilities(xhat: np.ndarray, prior: MogPrior) -> np.ndarray:
    """float64 (n, K) log r_ik under ``prior`` (log-sum-exp normalised)."""
    diff = xhat[:, None, :] - prior.means[None, :, :]
    logp = -0.5 * (np.log(2.0 * np.pi * prior.variances).sum(axis=1)[None, :] + (diff**2 / prior.variances).sum(axis=2))
    logp += np.log(prior.weights)[None, :]
    top = logp.max(axis=1, keepdims=True)
    return logp - (top + np.log(np.exp(logp - top).sum(axis=1, keepdims=True)))


def em_statistics(xhat: np.ndarray, prior: MogPrior) -> np.ndarray:
    """The exact statistics one DP-EM iteration releases, float64 (K + 2 K d'): S0, then S1 and S2 row-major.

    Each record's contribution is truncated toward zero onto the 2^-EM_QUANTUM_BITS grid and summed as int64. The
    contributions are computed on zero-padded blocks of exactly EM_BLOCK_ROWS rows (``mechanisms.rowwise``; the
    padding is dropped before the sums), so a record's contribution has the same bits whatever the other rows."""
    n, dim = xhat.shape
    if n >= MAX_EM_ROWS:
        raise ValueError(f"p3gm: DP-EM sums more than {MAX_EM_ROWS} rows; its exact sums would overflow float64")
    K = len(prior.weights)
    _check_em(K, dim)
    total = np.zeros(K + 2 * K * dim, np.int64)
    for start, stop in rowwise.blocks(n, EM_BLOCK_ROWS):
        q = _em_contributions(rowwise.pad_rows(xhat[start:stop], EM_BLOCK_ROWS), prior)[0]
        total += q[: stop - start].sum(axis=0)
    return total.astype(np.float64) / float(1 << EM_QUANTUM_BITS)


def _em_contributions(xb: np.ndarray, prior: MogPrior) -> tuple[np.ndarray, np.ndarray]:
    """(int64 per-record contributions in quanta, the float64 values they truncate), both (rows, K + 2 K d'):
    (r', r' xhat, r' xhat^2), r' = r (1 - CLIP_MARGIN)."""
    scale = float(1 << EM_QUANTUM_BITS)
    r = np.exp(_log_responsibilities(xb, prior)) * (1.0 - CLIP_MARGIN)  # sum_k r_ik < 1 in the bits
    rx = r[:, :, None] * xb[:, None, :]
    values = np.concatenate([r, rx.reshape(len(xb), -1), (rx * xb[:, None, :]).reshape(len(xb), -1)], axis=1)
    return np.trunc(values * scale).astype(np.int64), values


@functools.lru_cache(maxsize=None)
def _check_em(components: int, dim: int) -> None:
    """Position invariance of ``_em_contributions`` at this shape (the floats before truncation too, where a
    difference would hide): public rows in the unit ball, a public prior, ``rowwise.TRIALS`` rolled blocks."""
    stream = NoiseStream(public_key("rowwise-check", 0), "em", components, dim)
    u = stream.uniform(EM_BLOCK_ROWS * dim) - 0.5
    trials = rowwise.rolled_trials([_into_ball(u.reshape(EM_BLOCK_ROWS, dim) * (2.0 / math.sqrt(dim)))])
    prior = _public_start(components, dim)
    rowwise.check_position_invariance(lambda a: _em_contributions(a, prior), trials, what="p3gm DP-EM")


def m_step(stats: np.ndarray, *, components: int, dim: int, noise_std: float) -> MogPrior:
    """Post-processing of the noisy statistics into a valid mixture (floors and caps, see the module docstring).

    Counts below max(1, 3 sigma_e) are mostly noise: means and variances divide by at least that."""
    K, d = components, dim
    s0, s1, s2 = stats[:K], stats[K : K + K * d].reshape(K, d), stats[K + K * d :].reshape(K, d)
    count = np.maximum(s0, max(1.0, 3.0 * noise_std))
    w = np.maximum(s0, 0.0)
    w = w / w.sum() if w.sum() > 0 else np.full(K, 1.0 / K)
    w = np.maximum(w, WEIGHT_FLOOR)
    means = _into_ball(s1 / count[:, None])
    var = np.clip(s2 / count[:, None] - means**2, VAR_FLOOR, 1.0)
    return MogPrior(weights=w / w.sum(), means=means, variances=var)


def fit_prior(xhat: np.ndarray, spec: P3gmSpec, key: bytes) -> MogPrior:
    """DP-EM on ``xhat`` (float64 (N, d'), rows in the unit ball): ``spec.em_iterations`` noisy releases."""
    xhat = np.asarray(xhat, np.float64)
    prior = _public_start(spec.components, xhat.shape[1])
    for it in range(spec.em_iterations):
        stats = em_statistics(xhat, prior)
        noisy = NoiseStream(key, "p3gm-em", it).gaussian(stats, float(spec.em_noise_std))
        prior = m_step(noisy, components=spec.components, dim=xhat.shape[1], noise_std=float(spec.em_noise_std))
    return prior


# ---------------------------------------------------------------- the network


def init_state(dim: int, spec: P3gmSpec) -> dict:
    """Public weights: PyTorch's default Linear init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a public stream."""
    shapes = _shapes(dim, spec)
    stream = NoiseStream(public_key("p3gm-init", 0), "weights")
    state = {}
    for name in PARAM_NAMES:
        shape = shapes[name]
        fan_in = shapes[name.replace("bias", "weight")][1]
        bound = 1.0 / math.sqrt(fan_in)
        u = stream.uniform(int(np.prod(shape)))
        state[name] = ((2.0 * u - 1.0) * bound).astype(np.float32).reshape(shape)
    return state


def _shapes(dim: int, spec: P3gmSpec) -> dict:
    h, eh, dl, K = spec.hidden, spec.encoder_width, spec.latent_dim, spec.num_classes
    return {
        "enc1.weight": (eh, dim),
        "enc1.bias": (eh,),
        "enc2.weight": (dl, eh),
        "enc2.bias": (dl,),
        "dec1.weight": (h, dl),
        "dec1.bias": (h,),
        "dec2.weight": (dim + K, h),
        "dec2.bias": (dim + K,),
    }


def pca_decoder(state: dict, basis: np.ndarray, spec: P3gmSpec) -> dict:
    """The public start with the decoder's feature output set to the DP-PCA reconstruction (post-processing of V).

    Hidden units j < d' compute relu(u_j) and units d' + j relu(-u_j); the feature rows of the output layer map them
    to sqrt(d / d') V (relu(u) - relu(-u)) = sqrt(d / d') V u, which is V V^T x in the network's scale for u the
    latent mean, and ignore every other unit (their weights 0, biases 0). The label rows keep their public start."""
    d, dl = basis.shape
    if spec.hidden < 2 * dl:
        raise ValueError(f"p3gm: the PCA decoder start needs hidden >= 2 latent_dim, got {spec.hidden} < {2 * dl}")
    out = {k: v.copy() for k, v in state.items()}
    eye = np.eye(dl, dtype=np.float32)
    out["dec1.weight"][: 2 * dl] = np.vstack([eye, -eye])
    out["dec1.bias"][: 2 * dl] = 0.0
    v = (basis * math.sqrt(d / dl)).astype(np.float32)
    out["dec2.weight"][:d] = 0.0
    out["dec2.weight"][:d, : 2 * dl] = np.hstack([v, -v])
    out["dec2.bias"][:d] = 0.0
    return out


def label_weight_for(spec: P3gmSpec, dim: int) -> float:
    """The label term's weight: ``spec.label_weight``, or sqrt(d) by default. Under clipping only the direction of
    an example's gradient counts; the reconstruction's gradient at the output has d coordinates of about unit size
    (norm about sqrt(d)), the cross-entropy's has norm at most sqrt(2), so sqrt(d) keeps the labels from drowning.
    (Fashion-MNIST, 12,000 rows, 200 DP steps: weight 1 gave 0.55 LogisticRegression accuracy, 10 0.69, 50 0.70.)"""
    return math.sqrt(dim) if spec.label_weight is None else float(spec.label_weight)


def feature_scale(dim: int, clip: float) -> float:
    """Rows enter the network multiplied by sqrt(d) / clip (about unit-size coordinates)."""
    return math.sqrt(dim) / float(clip)


def latent_scale(latent_dim: int) -> float:
    """The latent mean is sqrt(d') xhat (about unit-size coordinates); the prior is scaled with it."""
    return math.sqrt(latent_dim)


def _prior_tensors(prior: MogPrior, latent_dim: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = latent_scale(latent_dim)
    as_t = lambda a: torch.as_tensor(np.asarray(a, np.float32), device=device)  # noqa: E731
    return as_t(np.log(prior.weights)), as_t(prior.means * s), as_t(prior.variances * s * s)


def mog_log_density(z: torch.Tensor, log_w: torch.Tensor, means: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """log p_MoG(z) per row of z (B, d')."""
    diff = z[:, None, :] - means[None, :, :]
    terms = -0.5 * (_LOG_2PI + torch.log(var)[None] + diff * diff / var[None])  # (B, components, d')
    comp = rowwise.row_sums(terms.reshape(-1, terms.shape[2])).reshape(terms.shape[:2])
    return torch.logsumexp(comp + log_w[None, :], dim=1)


def per_example_loss(params: dict, x, mu, eps, y, prior_t, label_weight: float):
    """(loss (B,), [(input, pre-activation)] of the four Linear layers in ``PARAM_NAMES`` order).

    ``x`` rows at the network's scale, ``mu`` the fixed latent means, ``eps`` (B, d') standard normal."""
    s1 = rowwise.linear(x, params["enc1.weight"], params["enc1.bias"])
    h1 = torch.relu(s1)
    s2 = rowwise.linear(h1, params["enc2.weight"], params["enc2.bias"])
    logvar = torch.clamp(s2, *LOGVAR_RANGE)
    z = mu + torch.exp(0.5 * logvar) * eps
    s3 = rowwise.linear(z, params["dec1.weight"], params["dec1.bias"])
    h3 = torch.relu(s3)
    s4 = rowwise.linear(h3, params["dec2.weight"], params["dec2.bias"])
    d = x.shape[-1]
    recon = 0.5 * rowwise.row_sums((s4[:, :d] - x) ** 2)
    ce = F.cross_entropy(s4[:, d:], y, reduction="none")
    log_q = -0.5 * rowwise.row_sums(_LOG_2PI + logvar + eps * eps)
    kl = log_q - mog_log_density(z, *prior_t)
    return recon + label_weight * ce + kl, [(x, s1), (h1, s2), (z, s3), (h3, s4)]


def _block_terms(params: dict, x, mu, eps, y, prior_t, label_weight: float):
    """One block's per-row terms: (losses, [float64 layer inputs], [float64 pre-activation gradients], float64
    per-example gradient norms), every one of them a per-row array (first axis the rows). Only the pre-activations'
    gradients are taken (ghost clipping needs no weight gradient), so the weights enter detached."""
    params = {k: v.detach() for k, v in params.items()}
    x = x.detach().requires_grad_(True)  # a graph to differentiate through (the gradient of x itself is never formed)
    loss, layers = per_example_loss(params, x, mu, eps, y, prior_t, label_weight)
    grads = torch.autograd.grad(loss.sum(), [s for _, s in layers])
    acts = [a.detach().to(torch.float64) for a, _ in layers]
    grads = [g.detach().to(torch.float64) for g in grads]
    sq = torch.zeros(len(y), dtype=torch.float64, device=x.device)
    for a, g in zip(acts, grads):
        sq = sq + row_square_sums(g) * (row_square_sums(a) + 1.0)
    return loss.detach(), acts, grads, torch.sqrt(sq)


def row_square_sums(v: torch.Tensor) -> torch.Tensor:
    """float64 (rows,): each row's sum of squares of the float64 (rows, width) ``v``, in one fixed order on any device.

    A reduction kernel (``vecdot``, ``sum``) may add a row's terms in an order that depends on where the row lies in
    memory (vectorised loads aligned or not, split across threads or warps): on an H200 it gave 8 of 64 rows norms
    one ulp apart by position, which the position check refuses. Here only elementwise IEEE float64 operations run,
    each correctly rounded on every device (no reassociation, no fused multiply-add between kernels): the squares
    (exact for float32 inputs), zero-padded to a power-of-two width, then the first half of the columns added to the
    second half until one column is left. The order of a row's additions is fixed by the width alone, so its sum
    has the same bits at any position, in any batch, on any device (pairwise summation: relative error at most
    ceil(log2 width) 2^-53 of the exact sum, as the terms are >= 0)."""
    return rowwise.pairwise_sum(v * v)


def ghost_clipped_sum(params: dict, x, mu, eps, y, prior_t, label_weight: float, clip: float):
    """(float64 flat sum of the per-example gradients clipped to ``clip`` in ``PARAM_NAMES`` order, float64
    per-example gradient norms, float32 per-example losses), by ghost clipping (see the module docstring).

    The batch runs in zero-padded blocks of exactly SGD_BLOCK rows (``mechanisms.rowwise``); padded rows get factor 0,
    so a record's terms have the same bits whatever the batch's size and other records (``check_sgd_block``)."""
    dev = x.device
    n = len(y)
    if n == 0:
        total = torch.zeros(sum(int(p.numel()) for p in params.values()), dtype=torch.float64, device=dev)
        return total, torch.zeros(0, dtype=torch.float64), torch.zeros(0)
    per_block = []
    for start, stop in rowwise.blocks(n, SGD_BLOCK):
        pad = [rowwise.pad_rows(t[start:stop], SGD_BLOCK) for t in (x, mu, eps, y)]
        per_block.append(_block_terms(params, *pad, prior_t, label_weight))
    # every row's terms are final here; what follows is the float64 sum over the batch (the clip margin covers it)
    loss = torch.cat([b[0] for b in per_block])
    acts = [torch.cat([b[1][i] for b in per_block]) for i in range(len(per_block[0][1]))]
    grads = [torch.cat([b[2][i] for b in per_block]) for i in range(len(per_block[0][2]))]
    norms = torch.cat([b[3] for b in per_block])
    factors = clip_factors(norms, clip)  # 0 where a norm is not finite: that example contributes nothing
    factors[n:] = 0.0  # the padding contributes nothing
    keep = factors > 0
    parts = []
    for a, g in zip(acts, grads):
        gf = torch.where(keep[:, None], g, 0.0) * factors[:, None]
        parts += [(gf.T @ torch.where(keep[:, None], a, 0.0)).reshape(-1), gf.sum(dim=0)]
    return torch.cat(parts), norms[:n], loss[:n]


def check_sgd_block(params: dict, dim: int, spec: P3gmSpec, prior_t) -> None:
    """Position invariance of ``_block_terms`` at SGD_BLOCK rows on this device and thread count, with the given
    (public) weights and ``rowwise.TRIALS`` rolled blocks of public random rows; once per shape, device, threads."""
    dev = next(iter(params.values())).device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else ""
    shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in params.items())
    priors = tuple((tuple(t.shape), str(t.dtype)) for t in prior_t)
    key = (
        dim,
        spec.latent_dim,
        spec.num_classes,
        shapes,
        priors,
        SGD_BLOCK,
        str(dev),
        name,
        torch.get_num_threads(),
        rowwise.fixed_order_for(dev),
    )
    if key in _CHECKED_SGD:
        return
    stream = NoiseStream(public_key("rowwise-check", 0), "p3gm-sgd", dim, spec.latent_dim, spec.num_classes)
    as_t = lambda a, dt=torch.float32: torch.as_tensor(np.ascontiguousarray(a), dtype=dt, device=dev)  # noqa: E731
    u = (stream.uniform(SGD_BLOCK * (dim + 2 * spec.latent_dim)) - 0.5).reshape(SGD_BLOCK, -1) * 2.0
    block = [
        as_t(u[:, :dim] * math.sqrt(3.0)),
        as_t(u[:, dim : dim + spec.latent_dim]),
        as_t(u[:, dim + spec.latent_dim :] * 2.0),
        as_t(stream.uniform_int(spec.num_classes, SGD_BLOCK), torch.int64),
    ]
    trials = rowwise.rolled_trials(block)

    def terms(x, mu, eps, y):
        loss, acts, grads, norms = _block_terms(params, x, mu, eps, y, prior_t, 1.0)
        return [loss, *acts, *grads, norms]

    rowwise.check_position_invariance(terms, trials, what="p3gm DP-SGD")
    _CHECKED_SGD.add(key)


_CHECKED_SGD: set = set()


# ---------------------------------------------------------------- DP-SGD


def train_vae(
    x: np.ndarray,
    y: np.ndarray,
    xhat: np.ndarray,
    prior: MogPrior,
    spec: P3gmSpec,
    key: bytes,
    device,
    *,
    clip: float,
    basis: Optional[np.ndarray] = None,
    progress: Optional[Callable[[int, int, float], None]] = None,
) -> dict:
    """DP-SGD on the VAE (``spec.steps`` steps); returns the float32 weights by ``PARAM_NAMES``.

    ``x`` float64 (N, d) rows clipped to ``clip``, ``y`` int64 labels, ``xhat`` (N, d') the projection / clip;
    ``basis`` the DP-PCA basis when ``spec.decoder_start`` is "pca" (``pca_decoder``).
    ``progress(step, steps, loss)`` every PROGRESS_EVERY steps and at the last; its loss (the batch's mean
    per-example loss) is a diagnostic of private data, NOT DP: log it where the rows themselves may be seen."""
    dev = torch.device(device)
    n, d = x.shape
    start = init_state(d, spec)
    if spec.decoder_start == "pca":
        if basis is None:
            raise ValueError("p3gm: decoder_start 'pca' needs the basis")
        start = pca_decoder(start, np.asarray(basis, np.float64), spec)
    params = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in start.items()}
    xt = torch.as_tensor(np.asarray(x, np.float64) * feature_scale(d, clip), dtype=torch.float32, device=dev)
    mut = torch.as_tensor(np.asarray(xhat, np.float64) * latent_scale(spec.latent_dim), dtype=torch.float32, device=dev)
    yt = torch.as_tensor(np.asarray(y, np.int64), device=dev)
    prior_t = _prior_tensors(prior, spec.latent_dim, dev)
    label_weight = label_weight_for(spec, d)
    with _torch_threads(sgd_threads(params, d, spec, prior_t)):
        _sgd_steps(params, xt, mut, yt, prior_t, label_weight, spec, key, progress)
    return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in params.items()}


def _sgd_steps(params: dict, xt, mut, yt, prior_t, label_weight: float, spec: P3gmSpec, key: bytes, progress) -> None:
    """``train_vae``'s DP-SGD steps on the device tensors (rows, latent means, labels), updating ``params``."""
    dev, n = xt.device, len(yt)
    order = list(params.values())
    opt = torch.optim.Adam(order, lr=float(spec.lr), fused=True)  # fused: one kernel per tensor (7x faster on CPU)
    divisor = float(spec.expected_batch) if spec.expected_batch is not None else 1.0
    rate = Fraction(spec.sampling_rate)
    for step in range(spec.steps):
        batch = poisson_batch(NoiseStream(key, "p3gm-batch", step), n, rate)
        eps = NoiseStream(key, "p3gm-eps", step).gaussian(np.zeros((len(batch), spec.latent_dim)), 1.0)
        idx = torch.as_tensor(batch, device=dev)
        total, _, loss = ghost_clipped_sum(
            params,
            xt[idx],
            mut[idx],
            torch.as_tensor(eps, dtype=torch.float32, device=dev),
            yt[idx],
            prior_t,
            label_weight,
            float(spec.grad_clip),
        )
        flat = noisy_sum(total, spec.sgd_noise_std, NoiseStream(key, "p3gm-sgd", step)) / divisor
        offset = 0
        for p in order:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        opt.step()
        if progress is not None and ((step + 1) % PROGRESS_EVERY == 0 or step + 1 == spec.steps):
            progress(step + 1, spec.steps, float(loss.mean()) if len(loss) else float("nan"))


_THREADS_LOCK = threading.RLock()  # held while a fit sets torch's thread count


def _new_threads_lock() -> None:  # a child forked while a fit held the lock gets a free one
    global _THREADS_LOCK
    _THREADS_LOCK = threading.RLock()


os.register_at_fork(after_in_child=_new_threads_lock)


@contextlib.contextmanager
def _torch_threads(n: int):
    """torch's intra-op thread count set to ``n`` inside, restored after, under a lock. Whether another thread sees
    the count depends on the build and on whether that thread has run torch's parallel kernels yet (measured with
    torch 2.13's OpenMP build: a count set in a worker thread changed what the main thread read in one test and not
    in another), so a fit changes it only under the lock: two fits in one process do not set it under each other's
    checked blocks."""
    with _THREADS_LOCK:
        before = torch.get_num_threads()
        if n != before:
            torch.set_num_threads(n)
        try:
            yield
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)


def sgd_threads(params: dict, dim: int, spec: P3gmSpec, prior_t) -> int:
    """The torch thread count the DP-SGD blocks run at: one at which ``check_sgd_block`` passes.

    That is the process's own count, or, on a CPU where the BLAS gives a row other bits at other positions with that
    many threads, the largest power of two below it that passes. Measured: on a 16-core Intel Xeon (torch 2.11),
    16 threads failed the check and 1 and 2 passed. The check still decides: if no count passes, its refusal
    stands."""
    have = torch.get_num_threads()
    on_cpu = next(iter(params.values())).device.type == "cpu"
    below = [1 << k for k in reversed(range(have.bit_length())) if 1 << k < have]  # 16, 8, ..., 1 below 17 to 32
    counts = [have] + (below if on_cpu else [])
    for i, t in enumerate(counts):
        try:
            with _torch_threads(t):
                check_sgd_block(params, dim, spec, prior_t)
        except rowwise.RowDependenceError as err:
            if i + 1 == len(counts):
                raise
            log.warning(
                "p3gm: the position check failed at %d torch threads, checking %d. It said: %s", t, counts[i + 1], err
            )
            continue
        return t
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- the whole fit and sampling


def fit(
    x: np.ndarray,
    y: np.ndarray,
    basis: np.ndarray,
    clip: float,
    spec: P3gmSpec,
    key: bytes,
    device,
    progress: Optional[Callable[[int, int, float], None]] = None,
) -> P3gmModel:
    """The whole fit on rows ``x`` (float64 (N, d), z-scored, clipped to ``clip``) and labels ``y`` given the DP
    basis (d, d'): DP-EM, then DP-SGD. Spends the events of the module docstring."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.int64)
    basis = np.asarray(basis, np.float64)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"p3gm: expected rows (N, d) and N labels, got {x.shape} and {y.shape}")
    if basis.shape != (x.shape[1], spec.latent_dim):
        raise ValueError(f"p3gm: basis must be (d, latent_dim) = ({x.shape[1]}, {spec.latent_dim}), got {basis.shape}")
    if len(y) and (y.min() < 0 or y.max() >= spec.num_classes):
        raise ValueError(f"p3gm: labels must lie in [0, {spec.num_classes})")
    order = canonical_order(x, y)  # the rows' arrival order never changes the fit: a retried fit redraws the same model
    x, y = x[order], y[order]
    xhat = project_rows(x, basis, clip) / float(clip)
    prior = fit_prior(xhat, spec, key)
    state = train_vae(x, y, xhat, prior, spec, key, device, clip=clip, basis=basis, progress=progress)
    return P3gmModel(prior=prior, state=state)


def check_shapes(
    *, dim: int, num_classes: int, latent_dim: int, components: int, hidden: int, device, encoder_hidden=None
) -> None:
    """Every fixed-shape position check of a fit (projection, DP-EM, DP-SGD) on public stand-ins, before any row is
    read: raises ``rowwise.RowDependenceError`` for shapes whose per-record arithmetic depends on the batch."""
    spec = P3gmSpec(
        em_noise_std=0.0,
        sampling_rate=Fraction(1),
        steps=0,
        noise_multiplier=0.0,
        latent_dim=latent_dim,
        components=components,
        hidden=hidden,
        encoder_hidden=encoder_hidden,
        num_classes=num_classes,
    )
    dev = torch.device(device)
    check_projection(dim, latent_dim)
    _check_em(components, latent_dim)
    params = {k: torch.tensor(v, device=dev, requires_grad=True) for k, v in init_state(dim, spec).items()}
    sgd_threads(params, dim, spec, _prior_tensors(_public_start(components, latent_dim), latent_dim, dev))


def sample_latent(prior: MogPrior, rows: int, stream: NoiseStream) -> np.ndarray:
    """float64 (rows, d') draws of the prior in xhat units: components by inversion of 53-bit uniforms."""
    u = stream.uniform_int(1 << 53, rows)
    edges = np.rint(np.cumsum(prior.weights)[:-1] / prior.weights.sum() * float(1 << 53)).astype(np.int64)
    comp = np.searchsorted(edges, u, side="right")
    std = np.sqrt(prior.variances[comp])
    return prior.means[comp] + stream.gaussian(np.zeros((rows, prior.means.shape[1])), 1.0) * std


def decode(state: dict, z: np.ndarray, *, dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(feature means at the network's scale, label logits) for latent rows z (latent units)."""
    dev = torch.device(device)
    p = {k: torch.as_tensor(v, device=dev) for k, v in state.items()}
    with torch.no_grad():
        zt = torch.as_tensor(z, dtype=torch.float32, device=dev)
        out = F.linear(torch.relu(F.linear(zt, p["dec1.weight"], p["dec1.bias"])), p["dec2.weight"], p["dec2.bias"])
    return out[:, :dim], out[:, dim:]


# Rounds of draws a chunk makes to fill its class quotas before the rest is taken as it comes (``sample_rows``).
QUOTA_ROUNDS = 32


def class_quota(rows: int, weights) -> np.ndarray:
    """int64 (K,) rows of each class in a chunk of ``rows``: the largest-remainder split of ``rows`` in proportion to
    ``weights`` (the DP class histogram: post-processing), ties to the lower class; equal shares if none is positive."""
    w = np.maximum(np.asarray(weights, np.float64), 0.0)
    if not w.sum() > 0:
        w = np.ones_like(w)
    exact = int(rows) * w / w.sum()
    quota = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - quota), kind="stable")
    quota[order[: int(rows) - int(quota.sum())]] += 1
    return quota


def sample_rows(
    model: P3gmModel,
    spec: P3gmSpec,
    *,
    rows: int,
    chunk: int,
    key: bytes,
    clip: float,
    device,
    quota: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(float32 features (rows, d) in the rows' units, norms at most ``clip``; int64 labels (rows,)) of one chunk,
    deterministic in (key, chunk): post-processing of the fitted model.

    ``quota`` (K,) summing to ``rows``: seed 004's sampling (Section VI: the label ratio of the training data), rows
    drawn in rounds of ``rows`` and kept, in the order drawn, while their label's quota is open; after
    ``QUOTA_ROUNDS`` rounds a class the decoder rarely labels is left short and the chunk is filled with rows as they
    come (every label is still the decoder's argmax). None: ``rows`` draws as they come."""
    dim = model.state["dec2.bias"].shape[0] - spec.num_classes
    stream = NoiseStream(key, "p3gm-sample", chunk)

    def draw(n):
        z = sample_latent(model.prior, int(n), stream) * latent_scale(spec.latent_dim)
        means, logits = decode(model.state, z, dim=dim, device=device)
        feats = means.cpu().numpy().astype(np.float64) / feature_scale(dim, clip)
        norms = np.linalg.norm(feats, axis=1, keepdims=True)
        feats *= np.minimum(1.0, float(clip) / np.maximum(norms, 1e-300))
        return feats.astype(np.float32), logits.argmax(dim=1).cpu().numpy().astype(np.int64)

    if quota is None:
        return draw(rows)
    need = np.asarray(quota, np.int64).copy()
    if need.shape != (spec.num_classes,) or need.min() < 0 or need.sum() != rows:
        raise ValueError(f"p3gm: quota must be {spec.num_classes} counts >= 0 summing to {rows}, got {quota!r}")
    feats, labels = [], []
    for _ in range(QUOTA_ROUNDS):
        if not need.any():
            break
        f, lab = draw(rows)
        # the i-th row drawn with label k is kept iff fewer than need[k] rows labelled k came before it in this round
        rank = np.empty(len(lab), np.int64)
        for k in np.unique(lab):
            at = np.flatnonzero(lab == k)
            rank[at] = np.arange(len(at))
        keep = rank < need[lab]
        feats.append(f[keep])
        labels.append(lab[keep])
        need -= np.bincount(lab[keep], minlength=len(need))
    if need.any():
        f, lab = draw(int(need.sum()))
        feats.append(f)
        labels.append(lab)
    return np.concatenate(feats), np.concatenate(labels)


def spec_from_plan(plan) -> P3gmSpec:
    """The public settings of the fit, from a release plan (its ``P3gmPlan``)."""
    p = plan.synthesis
    return P3gmSpec(
        latent_dim=p.latent_dim,
        components=p.components,
        em_iterations=p.em_iterations,
        hidden=p.hidden,
        encoder_hidden=p.encoder_hidden,
        em_noise_std=p.em_noise_std,
        sampling_rate=p.sampling_rate,
        steps=p.steps,
        noise_multiplier=p.noise_multiplier,
        grad_clip=p.grad_clip,
        lr=p.lr,
        num_classes=plan.num_classes,
        expected_batch=p.batch,
        label_weight=p.label_weight,
    )


# ---------------------------------------------------------------- the registry entry


def sample_chunks(plan, chunk_rows: int):
    """(chunk, rows) of a release sampled ``chunk_rows`` at a time (p3gm): every chunk full but the last."""
    for chunk in range(-(-plan.samples_total // chunk_rows)):
        yield chunk, min(chunk_rows, plan.samples_total - chunk * chunk_rows)


@dataclasses.dataclass(frozen=True)
class P3gmPlan(SynthesisPlan):
    """What p3gm's fitting needs (all public or DP): the DP-EM noise and the DP-SGD schedule; its DP-PCA stage."""

    latent_dim: int
    components: int
    em_iterations: int
    em_noise_std: float  # on every coordinate of the EM sufficient statistics (sensitivity em_sensitivity)
    em_sensitivity: float
    em_share: float
    sampling_rate: Fraction  # q = batch / N_hat, exact
    steps: int
    noise_multiplier: float  # z: the noise std on the sum of clipped gradients is z * grad_clip
    grad_clip: float
    lr: float
    hidden: int
    encoder_hidden: int
    epochs: float
    batch: int
    label_weight: float  # of the label cross-entropy (public: the config's, or sqrt(d))
    samples_total: int = 0  # T, the rows sampled from the fitted model
    pca: Optional[PcaPlan] = None  # the DP-PCA basis of the latent space

    @property
    def events(self) -> tuple:
        """DP-SGD's event: the synthesis' (DP-PCA and DP-EM are shares of the budget, composed with it)."""
        from dpcda.privacy.events import DpSgdEvent

        return (DpSgdEvent("dp_sgd", self.sampling_rate, self.steps, self.noise_multiplier),)

    def dp_pca(self) -> Optional[PcaPlan]:
        return self.pca

    def summary(self) -> str:
        return f"em_noise_std={self.em_noise_std:.6g} noise_multiplier={self.noise_multiplier:.6g} steps={self.steps}"

    def noise_stds(self) -> dict:
        return {
            "pca_covariance": self.pca.noise_std if self.pca else None,
            "dp_em": self.em_noise_std,
            "dp_sgd": self.noise_multiplier * self.grad_clip if self.noise_multiplier else 0,
        }

    def gaussian_draws(self, *, dim: int, num_classes: int) -> int:
        """One per parameter per DP-SGD step, the EM statistics per iteration, the covariance's upper triangle."""
        params = p3gm_parameters(dim, num_classes, self.latent_dim, self.hidden, self.encoder_hidden)
        sgd = self.steps * params * (self.noise_multiplier > 0)
        em = self.em_iterations * self.components * (1 + 2 * self.latent_dim) * (self.em_noise_std > 0)
        return sgd + em + dim * (dim + 1) // 2 * (self.pca is not None)

    def caveats(self, epsilon: float, mechanism: str) -> tuple[Caveat, ...]:
        return () if math.isfinite(epsilon) else (Caveat(CaveatCode.MODEL_WITHOUT_NOISE, mechanism=mechanism),)

    def account_figures(self, clip: float) -> dict:
        return {
            "pca_covariance_noise_std": self.pca.noise_std if self.pca else None,
            "em_noise_std": self.em_noise_std,
            "em_sensitivity": self.em_sensitivity,
            "sgd_noise_multiplier": self.noise_multiplier,
            "sgd_sampling_rate": float(self.sampling_rate),
            "sgd_steps": self.steps,
        }

    def manifest_section(self, plan, *, chunk_rows):
        from dpcda.schemas.manifest import P3gmMechanism

        return P3gmMechanism(
            name="p3gm",
            mode=plan.mode,
            clip=plan.clip,
            num_classes=plan.num_classes,
            samples_total=self.samples_total,
            dataset_size_dp=int(sum(plan.dp_class_sizes)) if plan.dp_class_sizes else None,
            latent_dim=self.latent_dim,
            pca_covariance_noise_std=self.pca.noise_std if self.pca else None,
            pca_epsilon_share=self.pca.share if self.pca else None,
            em={
                "components": self.components,
                "iterations": self.em_iterations,
                "noise_std": self.em_noise_std,
                "sensitivity": self.em_sensitivity,
                "epsilon_share": self.em_share,
            },
            dp_sgd={
                "sampling_rate": float(self.sampling_rate),
                "steps": self.steps,
                "noise_multiplier": self.noise_multiplier,
                "clip": self.grad_clip if math.isfinite(self.grad_clip) else None,
                "lr": self.lr,
                "epochs": self.epochs,
                "expected_batch": self.batch,
                "hidden": self.hidden,
                "encoder_hidden": self.encoder_hidden,
                "label_weight": self.label_weight,
                "per_record_check": SGD_ROW_CHECK,
            },
            sampling="z from the DP mixture prior, the row = the decoder's feature means, the label = the argmax of "
            "its label scores (mechanisms.p3gm)",
        )


def p3gm_parameters(dim: int, K: int, latent: int, hidden: int, encoder_hidden: Optional[int] = None) -> int:
    """Weights and biases of p3gm's encoder [d, e, d'] (e: ``encoder_hidden``, default h), decoder [d', h, d + K]."""
    e = hidden if encoder_hidden is None else encoder_hidden
    return dim * e + e + e * latent + latent + latent * hidden + hidden + hidden * (dim + K) + dim + K


class P3gm(Mechanism):
    """Seed 004: rows sampled from a generative model whose every fitted quantity is DP (DP-PCA, DP-EM, DP-SGD)."""

    name = "p3gm"
    composition = "sequential: the statistics, the DP-PCA covariance, DP-EM and DP-SGD over the whole dataset"
    summary = "P3GM (seed 004): a VAE with a DP-PCA encoder and a DP-EM prior, trained with DP-SGD"
    params = P3gmParams
    grouping = Grouping.DATASET
    graph = "dpcda.transforms.synthesize:FitAndSampleP3gm"
    audit_game = "dpcda.evaluation.audit.games:DpSgdStep"
    one_worker = "p3gm fits its model on one worker; raise --max-class-bytes on bigger workers"
    fits_model = True

    def budget_shares(self, privacy, params) -> list:
        """DP-EM: its iterations spend their own share alone (sigma_x 0: no noise, the non-private reference)."""
        return [
            Share(
                "dp_em",
                params.em_budget_share,
                em_sensitivity(),
                iterations=params.em_iterations,
                noise=privacy.sigma_x != 0,
            )
        ]

    def plan(self, public: Public) -> P3gmPlan:
        """DP-EM's noise comes from the budget planner (``budget_shares``); the DP-SGD noise multiplier is then
        calibrated so that everything (statistics, DP-PCA, DP-EM, DP-SGD) composes to the rest of the target."""
        from dpcda.privacy.events import DpSgdEvent

        privacy, params, budget = public.privacy, public.params, public.budget
        n = max(int(public.records), 1)
        rate = Fraction(min(params.batch, n), n)
        steps = max(1, math.ceil(params.epochs / rate))
        em = budget.get("dp_em")
        z = 0.0  # sigma_x 0: no noise, the non-private reference (epsilon infinite)
        if privacy.sigma_x != 0:
            z = calibrate_synthesis(budget, lambda s: [DpSgdEvent("dp_sgd", rate, steps, s)])
        return P3gmPlan(
            latent_dim=params.latent_dim,
            components=params.components,
            em_iterations=params.em_iterations,
            em_noise_std=em.noise_std,
            em_sensitivity=em.event.sensitivity,
            em_share=params.em_budget_share,
            sampling_rate=rate,
            steps=steps,
            noise_multiplier=z,
            grad_clip=params.grad_clip if z > 0 else math.inf,
            lr=params.lr,
            hidden=params.hidden,
            encoder_hidden=params.hidden if params.encoder_hidden is None else params.encoder_hidden,
            epochs=params.epochs,
            batch=params.batch,
            label_weight=math.sqrt(public.dim) if params.label_weight is None else float(params.label_weight),
            samples_total=public.samples,
            pca=public.pca,
        )

    def check_before_work(self, core, dim: int) -> None:
        from dpcda.mechanisms.device import pick_device

        params = core.params
        check_shapes(
            dim=dim,
            num_classes=core.data.num_classes,
            latent_dim=params.latent_dim,
            components=params.components,
            hidden=params.hidden,
            encoder_hidden=params.encoder_hidden,
            device=pick_device(core.execution.device),
        )

    def label_caveat(self) -> str:
        return (
            "p3gm: the released rows and labels are sampled from a model whose every fitted quantity is DP (the "
            "DP-PCA basis, the DP-EM mixture prior, the VAE trained with DP-SGD): sampling is post-processing."
        )

    def synthesize(self, ctx: InProcess):
        plan = ctx.plan
        spec = spec_from_plan(plan)
        x = ctx.normalized(ctx.x)
        model = fit(x, ctx.y, ctx.basis, plan.clip, spec, ctx.key, ctx.device, progress=ctx.progress)
        if ctx.on_model is not None:
            ctx.on_model(model, spec)
        for chunk, rows in sample_chunks(plan, ctx.core.execution.chunk_rows):
            f, lab = sample_rows(model, spec, rows=rows, chunk=chunk, key=ctx.key, clip=plan.clip, device=ctx.device)
            yield f, lab, None
