"""The whole P3GM fit and its sampling (``mechanisms.p3gm``, step 4): DP-EM then DP-SGD, the checks before any
row is read, and rows drawn from the fitted model (post-processing)."""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from dpcda.mechanisms.dpcda import canonical_order
from dpcda.mechanisms.dppca import check_projection, project_rows
from dpcda.mechanisms.p3gm.em import _check_em, fit_prior, public_start
from dpcda.mechanisms.p3gm.spec import MogPrior, P3gmModel, P3gmSpec
from dpcda.mechanisms.p3gm.training import sgd_threads, train_vae
from dpcda.mechanisms.p3gm.vae import _prior_tensors, feature_scale, init_state, latent_scale
from dpcda.privacy.noise import NoiseStream

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
    sgd_threads(params, dim, spec, _prior_tensors(public_start(components, latent_dim), latent_dim, dev))


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
