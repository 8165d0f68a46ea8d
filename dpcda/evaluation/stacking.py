"""The linear probe beside the network: ``Stacked`` (the default ``a (x W + b) + c f(x)``, weights fitted on the
synthetic hold-out by ``stack_weights``), ``ProbeStart`` (the ``probed`` study: the network trained from the probe's
map), and what each part weighs in the stacked output (``stack_shares``). Why: docs/evaluation.md.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import nn


class ProbeMap(nn.Module):
    """The linear probe's map ``x W + b`` of the rows as released (its ridge fit to the synthetic rows' targets).
    ``W`` and ``b`` are buffers (not trained); the map runs in float32 whatever the autocast."""

    def __init__(self, w: np.ndarray, b: np.ndarray):
        super().__init__()
        self.register_buffer("w", torch.as_tensor(np.asarray(w, np.float32)))
        self.register_buffer("b", torch.as_tensor(np.asarray(b, np.float32)))

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return torch.addmm(self.b, x.reshape(x.shape[0], -1).float(), self.w)

    forward = linear


class ProbeStart(ProbeMap):
    """``scale * (x W + b) + body(x)``: the probe's map plus the network, whose last layer starts at zero, so training
    starts from the probe's outputs and the network learns what the linear map leaves. ``scale`` is one trained
    scalar."""

    def __init__(self, body: nn.Module, w: np.ndarray, b: np.ndarray, scale: float = 1.0):
        super().__init__(w, b)
        self.body = body
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        last = [m for m in body.modules() if isinstance(m, nn.Linear)][-1]
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.linear(x) + self.body(x).float()


class Stacked(ProbeMap):
    """``a (x W + b) + c body(x)``: the probe's linear map and a network trained alone, both fixed, in the proportions
    ``(a, c)`` fitted on the synthetic hold-out (``stack_weights``; stacked generalisation). ``c = 0``: the probe (the
    network is kept beside it all the same, for its own figure: ``network_of``)."""

    def __init__(self, body: Optional[nn.Module], w: np.ndarray, b: np.ndarray, a: float, c: float):
        super().__init__(w, b)
        self.body = body
        self.a, self.c = float(a), float(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.a * self.linear(x)
        return out if self.body is None or self.c == 0 else out + self.c * self.body(x).float()


def stack_weights(z: torch.Tensor, f: Optional[torch.Tensor], y: torch.Tensor, soft: Optional[torch.Tensor]):
    """((a, c), loss): the weights ``a, c >= 0`` of ``a z + c f`` with the least hold-out loss, and that loss (weights
    kept non-negative, as stacked regressions keep them: a negative weight on a model cancels what it shares with the
    other on a few hundred rows, and reads clean rows wrongly). ``soft`` given: the squared error to it
    (``soft_loss="standardized"``; least squares, closed form, on each subset of the two); else the cross-entropy
    against ``y`` (convex in the weights: L-BFGS in float64 on their logarithms). ``f`` None: the probe alone."""
    cols = [z.double()] + ([] if f is None else [f.double()])
    if soft is not None:
        t = soft.double().reshape(-1)
        best = None
        for use in ([0], [1], [0, 1])[: 1 if f is None else 3]:
            a = torch.stack([cols[i].reshape(-1) for i in use], dim=1)
            coef = torch.linalg.lstsq(a, t[:, None]).solution[:, 0]
            if (coef < 0).any():
                continue
            loss = float((a @ coef - t).pow(2).mean())
            if best is None or loss < best[1]:
                full = [0.0] * len(cols)
                for i, v in zip(use, coef.tolist()):
                    full[i] = v
                best = (full, loss)
        weights, loss = best if best is not None else ([0.0] * len(cols), float(t.pow(2).mean()))
    else:
        u = torch.zeros(len(cols), dtype=torch.float64, requires_grad=True)  # weights exp(u), from 1
        opt = torch.optim.LBFGS([u], lr=1.0, max_iter=200, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(sum(w * v for w, v in zip(u.exp(), cols)), y)
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            coef = u.exp()
            loss = float(nn.functional.cross_entropy(sum(w * v for w, v in zip(coef, cols)), y))
        weights = coef.tolist()
    return (weights[0], weights[1] if f is not None else 0.0), loss


@torch.no_grad()
def logit_scale(z: torch.Tensor, y: torch.Tensor, smoothing: float, iters: int = 60) -> float:
    """The ``a >= 0`` minimising the (label-smoothed) cross-entropy of logits ``a * z`` against labels ``y``: the
    loss is convex in ``a``, so bisection on its derivative. A probe's outputs are fitted to one-hot targets by
    squared error; this puts them on the cross-entropy's scale before training."""
    k = z.shape[1]
    t = torch.full_like(z, smoothing / k)
    t[torch.arange(len(y), device=z.device), y] += 1.0 - smoothing

    def slope(a: float) -> float:
        return float(((torch.softmax(a * z, dim=1) - t) * z).sum(dim=1).mean())

    lo, hi = 0.0, 1.0
    while slope(hi) < 0 and hi < 1e6:
        lo, hi = hi, hi * 2.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def network_of(model: nn.Module) -> Optional[nn.Module]:
    """The network alone inside a trained model: a ``Stacked`` model's network; None for ``ProbeStart`` (its network
    learned what the probe's map leaves, so it has no figure of its own); else the model itself."""
    if isinstance(model, Stacked):
        return model.body
    if isinstance(model, ProbeStart):
        return None
    return model


@torch.no_grad()
def stack_shares(z: torch.Tensor, f: torch.Tensor, a: float, c: float) -> Optional[dict]:
    """Each part's share of the stacked output ``a z + c f`` on the rows given (the synthetic hold-out):
    ``{"probe": a s(z) / (a s(z) + c s(f)), "network": c s(f) / (...)}``, ``s`` the root-mean-square of the outputs
    centred per row. The probe's outputs (a ridge fit to one-hot labels or to the scores) and the network's logits
    come on different scales, so the raw ``a, c`` do not compare; a per-row shift changes no prediction, hence the
    centring. None where both terms are 0 (no rows)."""

    def spread(v: torch.Tensor) -> float:
        v = v.double()
        return float((v - v.mean(dim=1, keepdim=True)).pow(2).mean().sqrt()) if v.numel() else 0.0

    probe, network = a * spread(z), c * spread(f)
    total = probe + network
    if not total > 0:
        return None
    return {"probe": probe / total, "network": network / total}
