"""Train the evaluation model on synthetic rows, score it on real test rows (seed 000, Table 2 protocol).

Torch and numpy only: importable without Apache Beam (a GPU image without Beam runs this).

Why the recipe looks the way it does. Synthetic rows are a mean of ``l`` clipped records plus
``N(0, sigma_x^2 I)``; at eps 10, l=4 on Fashion-MNIST the noise has L2 norm ~6 against a signal of norm <= 1,
while the real test rows are clean with norm 1. A network with BatchNorm trained on the noisy rows then meets
test activations far from its running statistics, and a naive recipe (last epoch, constant lr) lands anywhere
between 0.10 and 0.75 accuracy across seeds. What makes it stable, using no real test data for any choice:

* ``RowScale``: every row (train, validation, test alike) is rescaled to unit RMS before the network. Noisy
  training rows and clean test rows then enter the network at the same per-feature scale, so BatchNorm's
  running statistics fit both. It is a fixed part of the model, not fitted to any data.
* Adam (lr 1e-3, as the paper) with a linear warm-up and cosine decay, label smoothing 0.1 on hard labels,
  gradient-norm clipping and an exponential moving average (EMA) of the weights and BN buffers, which is what is
  evaluated: the last iterate of this fixed schedule (``selection="last"``). A stratified 10% hold-out of the
  SYNTHETIC rows is scored every epoch (curves; it weighs the probe, below; ``selection="val_score"`` keeps the epoch
  with the best proper score there). Nothing is ever chosen on real data.
* Label scores (DPMix: the mean of l one-hot labels plus Gaussian noise) are fitted AS RELEASED, up to one
  increasing affine map: the scores are standardised by the mean and standard deviation of all of them (two scalars,
  ``standardize_scores``) and the network's outputs are fitted to them by squared error (``soft_loss=
  "standardized"``), a regression as the linear probe's. The map keeps every row's argmax and commutes with the mean
  over rows, and the loss is linear in the targets up to a term free of the model, so zero-mean label noise does not
  move its minimiser; clipping at 0 and renormalising (``soft_targets``) is nonlinear and does. The argmax of such
  scores is close to arbitrary (at l = 64 the mean top score is 0.17), so no choice is made on it. Why standardised:
  at l = 64 the scores differ from 0.1 by about 0.04, and the squared error between the SOFTMAX and the raw scores
  (``soft_loss="brier"``, the recipe ``new``) asks the network for logits within a few tenths of each other, which
  Adam's fixed step size reaches slowly and unstably: on the same release and the same training seed that recipe
  scored 0.5818 (Table 3's run, one thread) and 0.7198 (re-run with two threads: the sums' order alone;
  ``benchmarks/studies/table3_release``). On a 6,000-row DPMix slice (probe 0.695) the standardised fit reached
  0.614 and 0.633 after one epoch where the softmax fit reached 0.513 and 0.581 (seeds 0 and 1), and 0.718 and
  0.681 after five against 0.688 and 0.687 (experiment log). Hard labels are untouched.
* No dropout (the Table 1 network's 0.5 is switched off, ``dropout=0.0``). A mixing release's label scores differ
  from uniform by a few hundredths; dropout 0.5 in the head shrinks a prediction that small to almost nothing. On
  DPMix, Fashion-MNIST, eps 20, l = 64 (``benchmarks/studies/dpmix_recipe``) the CNN with dropout explained 12 % of the
  variance of the exact label means of fresh test mixtures, the linear probe 31 %, the CNN without dropout 28 %; real
  test accuracy 0.30 (the recipe before: dropout, clipped targets, epoch chosen on the argmax), 0.50 (last iterate,
  squared error, dropout), 0.71 (no dropout), probe 0.73.
* The CNN's BatchNorm layers become GroupNorm (8 groups; ``norm="group"``): statistics of each row alone, no running
  statistics. A DPMix row at l = 64 is the mean of 64 images and a local-perturbation row one image under heavy noise;
  either way its conv activations look nothing like a clean test image's, so BatchNorm's running statistics of the
  training rows misplace every test activation, and what the network predicts on real rows swings from epoch to
  epoch. On DPMix, Fashion-MNIST, eps 10, l = 64 (Table 3's release 0, seed 672079, one thread) the BatchNorm network
  scored 0.6135, 0.616, 0.6603, 0.5767, 0.2186 on the real test rows after epochs 1 to 5 (last: nearly every row
  called one class), the GroupNorm network 0.6646, 0.6845, 0.6931, 0.6971, 0.6977 (probe 0.714); on local, eps 20
  (seed 188189) 0.4735 against 0.7041 (probe 0.6707). The MLP (random projections) keeps its BatchNorm.
* The linear probe stands beside the network (``Stacked``, recipe ``stacked``, the default): the network is trained
  alone, as above, to the last iterate; then the model is ``a (x W + b) + c f(x)``, ``(W, b)`` the probe's ridge fit
  to the released targets, ``f`` the network's outputs, and ``a, c >= 0`` the two weights with the least loss on the
  synthetic hold-out (``stack_weights``: cross-entropy against the released labels, or squared error against the
  standardised scores; stacked generalisation with non-negative weights). ``c = 0`` is the probe itself, so the
  hold-out can always fall back to it. Why: where a release is noisy the network fits its noise and its last
  iterate falls far below the probe (Fashion-MNIST, local perturbation, eps 10: 0.5845 against a probe of 0.6350 over
  Table 3's three releases; random projection to p = 50: 0.4318 against 0.5313). The probe's fit saw the hold-out
  rows too, which leans the weights towards it.
* Why not choose the epoch, or train from the probe: a hold-out of synthetic rows is not the real rows. A DP-CDA row
  at l = 4 is a mean of four images: on Table 3's poisson eps 10 release 0 the hold-out's cross-entropy was least
  after epoch 2 of 5 while the network's real-test accuracy rose to the last epoch (0.7546 to 0.7694), so a choice on
  the hold-out kept 0.7512. ``probed`` (``ProbeStart``: the probe's map plus the network with its last layer at zero,
  the epoch or the start with the best hold-out score kept) reads local perturbation best (0.6866 +- 0.0040 at eps 10
  over the three releases, probe 0.635) but the network then learns what separates mixtures from what is left of the
  probe: on DP-CDA fixed, eps 10, l = 16, release 0 its real-test accuracy fell from 0.7192 after epoch 1 to 0.667
  while the hold-out's score improved (``benchmarks/studies/table3_release``).
* The report's summary line names a release where the CNN still falls more than 0.02 below the probe.

``RECIPES`` names this one ``stacked``, the one before it ``grouped`` (the network alone), the one before that
``scaled`` (the Table 1 network's BatchNorm), the one before
that ``new`` (softmax squared error to the raw scores) and the one before that ``old`` (for older tables); for hard
labels ``scaled`` and ``new`` train alike
(``same_training``). Reports carry ``recipe_name``. The measurements in the bullets before ``stacked``'s were made
with the recipes before it.

Speed: the CNN runs in channels-last memory format, and under bf16 autocast where the hardware has bf16 units (any
CUDA device; CPUs with AMX): 2.4x the float32 rows/s on a 2-core Intel Xeon with AMX, where an AMD EPYC with
AVX-512 BF16 but no AMX ran bf16 at 0.65x float32, so it stays in float32 (``cpu_has_bf16``;
``benchmarks/perf/bench_train``). Weights, optimizer state, the loss and the EMA stay float32; the equal accuracy over
several releases is measured by ``benchmarks/checks/precision_check`` (results in benchmarks/results/).

Data stay resident on the device as tensors; batches are index slices of one permutation per epoch.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

from dpcda.evaluation.models import NORMS, TableOneCNN, image_shape, make_model
from dpcda.mechanisms.device import pick_device  # one device policy for mixing and training


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Training hyper-parameters. Defaults are the stable recipe the module docstring explains."""

    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_fraction: float = 0.05
    schedule: str = "cosine"  # cosine | constant
    label_smoothing: float = 0.1
    grad_clip: Optional[float] = 1.0
    ema_decay: Optional[float] = 0.995  # per step; None: evaluate the raw weights
    val_fraction: float = 0.1
    selection: str = "last"  # last | val_score (proper score on released targets) | val_accuracy (hard labels only)
    soft_loss: str = "standardized"  # standardized | brier | cross_entropy (raw scores) | clipped (clip, renormalise)
    row_scale: bool = True
    dropout: Optional[float] = 0.0  # None: the model's own (Table 1: 0.5); see the module docstring
    norm: str = "group"  # the CNN's normalisation layers: group | batch (the Table 1 network's; models.NORMS)
    eval_batch: int = 512
    precision: str = "auto"  # auto | float32 | bf16 (autocast for the forward pass; see the module docstring)
    channels_last: bool = True  # memory format of the CNN
    stack: bool = True  # the network trained alone, then a (x W + b) + c f(x), (a, c) fitted on the hold-out (Stacked)
    probe_start: bool = False  # the probe's linear map plus the network, trained from the probe (ProbeStart)

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in (0, 1) or None, got {self.ema_decay}")
        if self.selection not in ("last", "val_accuracy", "val_score"):
            raise ValueError(f"selection must be last, val_accuracy or val_score, got {self.selection!r}")
        if self.soft_loss not in ("brier", "standardized", "cross_entropy", "clipped"):
            raise ValueError(f"soft_loss must be brier, standardized, cross_entropy or clipped, got {self.soft_loss!r}")
        if self.stack and (self.probe_start or self.selection == "val_accuracy"):
            raise ValueError("stack trains the network alone (probe_start off) and keeps the last or val_score epoch")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {sorted(NORMS)}, got {self.norm!r}")
        if self.precision not in ("auto", "float32", "bf16"):
            raise ValueError(f"precision must be auto, float32 or bf16, got {self.precision!r}")


# Named recipes: "stacked" is the default; "probed" a study beside it; "grouped", "scaled", "new" and "old" are the
# recipes before it, kept to reproduce older tables (on hard labels "scaled" and "new" train alike).
RECIPES = {
    "stacked": Recipe(),
    "probed": Recipe(stack=False, probe_start=True, selection="val_score"),
    "grouped": Recipe(stack=False, selection="last"),
    "scaled": Recipe(norm="batch", stack=False, selection="last"),
    "new": Recipe(soft_loss="brier", norm="batch", stack=False, selection="last"),
    "old": Recipe(selection="val_accuracy", soft_loss="clipped", dropout=None, norm="batch", stack=False),
    # the steps between "old" and "new", for benchmarks.studies.dpmix_recipe
    "last": Recipe(soft_loss="clipped", dropout=None, norm="batch", stack=False, selection="last"),
    "last+brier": Recipe(soft_loss="brier", dropout=None, norm="batch", stack=False, selection="last"),
    "last+cross_entropy+dropout0": Recipe(soft_loss="cross_entropy", norm="batch", stack=False, selection="last"),
}


def same_training(a: Recipe, b: Recipe, soft_labels: bool) -> bool:
    """True when the two recipes train alike on a release with (``soft_labels``) or without label scores: without
    them ``soft_loss`` is never used."""
    return a == b if soft_labels else dataclasses.replace(a, soft_loss=b.soft_loss) == b


def cpu_flags() -> set:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return set(fh.read().split())
    except OSError:
        return set()


def cpu_has_bf16() -> bool:
    """True where bf16 autocast is faster than float32: the CPU has AMX (its bf16 tiles), and neither torch's kernel
    dispatch (``ATEN_CPU_CAPABILITY``) nor oneDNN (``ONEDNN_MAX_CPU_ISA``) is held below it. AVX-512 BF16 alone is
    not enough: on a 2-core AMD EPYC with AVX-512 BF16 and no AMX, the first command's evaluation ran at 2,691
    training rows/s under bf16 autocast against 4,126 in float32 (``python -m benchmarks.perf.bench_train
    --first-command``, and the same with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE``, one after the other on the idle box);
    on the Intel Xeon with AMX, bf16 gave 2.4x float32. On an AVX2-only CPU bf16 is emulated and slower still."""
    if "amx_bf16" not in cpu_flags():
        return False
    if not torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512"):
        return False
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return isa == "ALL" or "AMX" in isa


def kernel_path(recipe: Optional["Recipe"] = None, device: str = "cpu") -> dict:
    """What the evaluation runs on here: torch's CPU kernel level, the CPU's vector flags, bf16 or float32."""
    dev = torch.device(device)
    flags = cpu_flags()
    return {
        "device": str(dev),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}),
        "precision": "bf16 autocast" if use_bf16(recipe or Recipe(), dev) else "float32",
        "limits": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ},
        "threads": torch.get_num_threads(),
    }


def use_bf16(recipe: "Recipe", device: torch.device) -> bool:
    if recipe.precision != "auto":
        return recipe.precision == "bf16"
    return device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16())


class RowScale(nn.Module):
    """x -> x / rms(x): every row at unit root-mean-square, so noisy and clean rows share one scale."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + self.eps)


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
    ``(a, c)`` fitted on the synthetic hold-out (``stack_weights``; stacked generalisation). ``c = 0``: the probe."""

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


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, val_idx): ``fraction`` of every class (at least one row when the class has two or more)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]  # grouped by class, random within
    classes, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
    n_val = np.where(counts >= 2, np.maximum(1, np.floor(counts * fraction)), 0).astype(np.int64)
    if fraction == 0:
        n_val[:] = 0
    rank = np.arange(len(order)) - np.repeat(starts, counts)
    is_val = rank < np.repeat(n_val, counts)
    return np.sort(order[~is_val]), np.sort(order[is_val])


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch: int, autocast: bool) -> torch.Tensor:
    model.eval()
    out = []
    for i in range(0, len(x), batch):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            out.append(model(x[i : i + batch]).float().argmax(dim=1))
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long, device=x.device)


class _EMA:
    """Exponential moving average of parameters and float buffers (BN running stats) in a shadow model."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.shadow = copy.deepcopy(model).eval()
        for p in self.shadow.parameters():
            p.requires_grad_(False)
        self.steps = 0
        src, dst = model.state_dict(), self.shadow.state_dict()  # tensors sharing storage with the modules
        self._float = [(dst[k], src[k]) for k in dst if dst[k].dtype.is_floating_point]
        self._other = [(dst[k], src[k]) for k in dst if not dst[k].dtype.is_floating_point]

    @torch.no_grad()
    def update(self) -> None:
        self.steps += 1
        d = min(self.decay, (1 + self.steps) / (10 + self.steps))  # short warm-up: early weights forgotten fast
        torch._foreach_lerp_([a for a, _ in self._float], [b for _, b in self._float], 1.0 - d)
        for a, b in self._other:
            a.copy_(b)


def effective_batch_size(rows: int, batch_size: int, min_steps: int = 32, floor: int = 16) -> int:
    """``batch_size``, made smaller on small data so an epoch still has about ``min_steps`` steps."""
    return max(1, min(batch_size, max(floor, rows // min_steps)))


def _lr_factor(step: int, total: int, recipe: Recipe) -> float:
    warm = max(1, int(recipe.warmup_fraction * total))
    if step < warm:
        return (step + 1) / warm
    if recipe.schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def soft_targets(scores: np.ndarray) -> np.ndarray:
    """Released noisy label scores -> class distributions: negative scores clipped to 0, rows normalised (a row with
    no positive score becomes uniform). Post-processing of the release; only ``soft_loss="clipped"`` uses it (the
    nonlinear map biases the targets: E[clip(s)] != E[s])."""
    t = np.clip(np.asarray(scores, np.float64), 0.0, None)
    total = t.sum(axis=1, keepdims=True)
    return np.where(total > 0, t / np.where(total > 0, total, 1.0), 1.0 / t.shape[1]).astype(np.float32)


def standardize_scores(scores: np.ndarray) -> np.ndarray:
    """Released label scores -> ``(scores - m) / s``, ``m`` and ``s`` the mean and standard deviation of ALL the
    scores (two scalars): one increasing affine map, so every row keeps its argmax and the map commutes with the
    mean over rows (zero-mean label noise stays zero-mean). Post-processing of the release; ``soft_loss=
    "standardized"`` fits the network's outputs to these values by squared error (a regression, as the linear
    probe's)."""
    m, s = score_moments(scores)
    return ((np.asarray(scores, np.float64) - m) / s).astype(np.float32)


def score_moments(scores: np.ndarray) -> tuple[float, float]:
    """(mean, standard deviation) of all the released scores, the map ``standardize_scores`` applies (std 1 where
    every score is equal)."""
    t = np.asarray(scores, np.float64)
    s = float(t.std())
    return float(t.mean()), (s if s > 0 else 1.0)


def target_loss(logits: torch.Tensor, targets: torch.Tensor, kind: str) -> torch.Tensor:
    """Mean loss of ``logits`` against released label scores ``targets`` (rows, K), used as released.

    ``brier``: squared error between the softmax and the scores; ``cross_entropy`` (and ``clipped``, whose targets
    ``soft_targets`` made): -sum_k t_k log p_k. Both are linear in the targets up to a term that does not depend on the
    model, so zero-mean label noise leaves their expectation's minimiser where the noise-free scores put it (proper
    scores for the mean label)."""
    if kind == "brier":
        return (torch.softmax(logits, dim=1) - targets).pow(2).sum(dim=1).mean()
    if kind == "standardized":  # targets from standardize_scores; the outputs themselves are the fit
        return (logits - targets).pow(2).mean()
    return -(targets * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch: int, autocast: bool) -> torch.Tensor:
    model.eval()
    out = []
    for i in range(0, len(x), batch):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            out.append(model(x[i : i + batch]).float())
    return torch.cat(out) if out else torch.empty(0, device=x.device)


def train_one(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    val_x: torch.Tensor,
    val_y: torch.Tensor,
    *,
    num_classes: int,
    input_shape,
    epochs: int,
    seed: int,
    recipe: Recipe,
    device: torch.device,
    progress=None,
    test_x: Optional[torch.Tensor] = None,
    test_y: Optional[torch.Tensor] = None,
    train_soft: Optional[torch.Tensor] = None,
    val_soft: Optional[torch.Tensor] = None,
    model_kind: Optional[str] = None,
    start: Optional[tuple[np.ndarray, np.ndarray]] = None,
):
    """One training run; returns (model to score, curves dict). ``test_*`` only feed an informational curve.

    ``train_soft`` / ``val_soft`` (rows, K): released label scores, fitted with ``recipe.soft_loss`` instead of
    ``train_y`` and scored on the hold-out with the same loss (``val_score``). ``start``: (W, b), the linear map the
    model starts from when ``recipe.probe_start`` (``ProbeStart``), fitted to the targets as ``train_soft`` holds
    them (else to one-hot labels, and put on the cross-entropy's scale by ``logit_scale``)."""
    torch.manual_seed(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    net = make_model(input_shape, num_classes, kind=model_kind, dropout=recipe.dropout, norm=recipe.norm)
    model = nn.Sequential(RowScale(), net) if recipe.row_scale else net
    if recipe.probe_start:
        if start is None:
            raise ValueError("recipe.probe_start needs the probe's fit (start=(W, b))")
        model = ProbeStart(model, *start)
        if train_soft is None:
            z = model.linear(train_x.cpu())
            model.scale.data.fill_(logit_scale(z, train_y.cpu(), recipe.label_smoothing))
    model = model.to(device)
    if isinstance(net, TableOneCNN) and recipe.channels_last:
        model = model.to(memory_format=torch.channels_last)
    autocast = use_bf16(recipe, device)
    opt = torch.optim.Adam(
        model.parameters(),
        lr=recipe.lr,
        weight_decay=recipe.weight_decay,
        fused=device.type == "cuda" or None,
        foreach=None if device.type == "cuda" else True,
    )
    n = len(train_y)
    batch_size = effective_batch_size(n, recipe.batch_size)
    steps_per_epoch = max(1, math.ceil(n / batch_size))
    total = steps_per_epoch * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, total, recipe))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)
    soft_kind = recipe.soft_loss
    ema = _EMA(model, recipe.ema_decay) if recipe.ema_decay else None
    curves = {"train_loss": [], "val_accuracy": [], "val_score": [], "lr": []}
    if test_x is not None:
        curves["test_accuracy"] = []
    best, best_state, best_epoch = math.inf, None, epochs - 1
    if len(val_y) and recipe.selection == "val_score" and recipe.probe_start:  # the start itself is a candidate
        scored = ema.shadow if ema is not None else model
        best = _val_score(scored, val_x, val_y, val_soft, recipe, autocast)
        best_state, best_epoch = {k: v.detach().clone() for k, v in scored.state_dict().items()}, -1
    curves["start_val_score"] = best if best_epoch == -1 else float("nan")
    weights = z_val = None
    if recipe.stack:
        if start is None:
            raise ValueError("recipe.stack needs the probe's fit (start=(W, b))")
        w0, b0 = (torch.as_tensor(np.asarray(v, np.float32), device=device) for v in start)
        z_val = val_x.reshape(len(val_x), -1).float() @ w0 + b0
        curves["stack_weights"] = []
        if len(val_y) and recipe.selection == "val_score":  # the probe alone is a candidate
            weights, best = stack_weights(z_val, None, val_y, val_soft)
            best_epoch = -1
            curves["start_val_score"] = best
    for epoch in range(epochs):
        model.train()
        perm = torch.randperm(n, device=device, generator=gen)
        total_loss = torch.zeros((), device=device)
        for i in range(steps_per_epoch):
            idx = perm[i * batch_size : (i + 1) * batch_size]
            if len(idx) < 2 and n >= 2:  # BatchNorm needs two rows; a lone last row is dropped
                continue
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                logits = model(train_x[idx]).float()
            if train_soft is not None:
                loss = target_loss(logits, train_soft[idx], soft_kind)
            else:
                loss = loss_fn(logits, train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if recipe.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
            opt.step()
            sched.step()
            if ema is not None:
                ema.update()
            total_loss += loss.detach() * len(idx)
            if progress is not None:
                progress.update(len(idx))
        scored = ema.shadow if ema is not None else model
        curves["train_loss"].append(float(total_loss) / n)
        curves["lr"].append(float(opt.param_groups[0]["lr"]))
        val_acc = val_score = float("nan")
        if len(val_y):
            logits = predict_logits(scored, val_x, recipe.eval_batch, autocast)
            val_acc = float((logits.argmax(dim=1) == val_y).float().mean())
            val_score = _val_score(scored, val_x, val_y, val_soft, recipe, autocast, logits)
            if recipe.stack:
                epoch_weights, val_score = stack_weights(z_val, logits, val_y, val_soft)
                curves["stack_weights"].append(epoch_weights)
        curves["val_accuracy"].append(val_acc)
        curves["val_score"].append(val_score)
        if test_x is not None:
            curves["test_accuracy"].append(
                float((predict(scored, test_x, recipe.eval_batch, autocast) == test_y).float().mean())
            )
        if len(val_y) and recipe.selection != "last":
            crit = -val_acc if recipe.selection == "val_accuracy" else val_score
            if crit < best:
                best, best_epoch = crit, epoch
                best_state = {k: v.detach().clone() for k, v in scored.state_dict().items()}
                if recipe.stack:
                    weights = epoch_weights
        if progress is not None:
            progress.set_postfix(loss=f"{curves['train_loss'][-1]:.3f}", val=f"{val_score:.3f}")
    scored = ema.shadow if ema is not None else model
    if best_state is not None:
        scored.load_state_dict(best_state)
    if recipe.stack:
        if recipe.selection == "last" and curves["stack_weights"]:
            weights = curves["stack_weights"][-1]
        a, c = weights if weights is not None else (0.0, 1.0)  # no hold-out: the network alone
        scored = Stacked(scored if best_epoch >= 0 else None, *start, a, c).to(device)
        curves["kept_weights"] = [a, c]
    curves["selected_epoch"] = best_epoch
    curves["batch_size"] = batch_size
    return scored, curves


def _val_score(model, val_x, val_y, val_soft, recipe: Recipe, autocast: bool, logits=None) -> float:
    """The synthetic hold-out's proper score (lower is better): ``recipe.soft_loss`` against the released label
    scores, else cross-entropy without smoothing against the labels."""
    if logits is None:
        logits = predict_logits(model, val_x, recipe.eval_batch, autocast)
    if val_soft is not None:
        return float(target_loss(logits, val_soft, recipe.soft_loss))
    return float(nn.functional.cross_entropy(logits, val_y))


def as_tensors(x, y, device):
    """(float32 features, int64 labels) as tensors on ``device``."""
    return (
        torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).to(device),
        torch.as_tensor(np.asarray(y, dtype=np.int64)).to(device),
    )


PROBE_MARGIN = 0.02  # the CNN below the linear probe by more than this is called out in the summary


def recipe_name(recipe: Recipe) -> str:
    """The recipe in words, for reports."""
    pick = {
        "last": "the last iterate of a fixed schedule",
        "val_accuracy": "the epoch with the best accuracy on the synthetic hold-out's labels",
        "val_score": "the epoch with the best proper score on the synthetic hold-out's released targets",
    }[recipe.selection]
    soft = {
        "brier": "squared error to the released scores as released",
        "standardized": "squared error of the outputs to the released scores standardised by one affine map",
        "cross_entropy": "cross-entropy to the released scores as released",
        "clipped": "cross-entropy to the scores clipped at 0 and renormalised",
    }[recipe.soft_loss]
    norm = {"group": "GroupNorm in place of the CNN's BatchNorm", "batch": "the CNN's BatchNorm"}[recipe.norm]
    start = "; the linear probe's map plus the network, started at the probe" if recipe.probe_start else ""
    if recipe.stack:
        start = "; the linear probe's map beside the network, weights (>= 0) fitted on the synthetic hold-out"
    return (
        f"Adam lr {recipe.lr:g}, {recipe.schedule} schedule, EMA {recipe.ema_decay}; {norm}{start}; "
        f"model kept: {pick}; hard labels: cross-entropy (smoothing {recipe.label_smoothing:g}); "
        f"soft label scores: {soft}"
    )


def summary(accuracy: float, probe: Optional[dict]) -> str:
    """One line for the report: the CNN's accuracy, and whether it falls below the linear probe."""
    if probe is None or not math.isfinite(probe["accuracy"]):
        return f"CNN accuracy {accuracy:.4f}"
    gap = probe["accuracy"] - accuracy
    if gap > PROBE_MARGIN:
        return (
            f"CNN accuracy {accuracy:.4f} is BELOW the linear probe's {probe['accuracy']:.4f} by {gap:.4f} "
            f"(more than {PROBE_MARGIN}): the release carries signal the CNN's training recipe does not reach"
        )
    return f"CNN accuracy {accuracy:.4f}; linear probe {probe['accuracy']:.4f} (CNN within {PROBE_MARGIN} or above)"


def train_and_score(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    num_classes: int,
    input_shape: Optional[Sequence[int]] = None,
    runs: int = 1,
    epochs: int = 10,
    device: str = "auto",
    seed: int = 0,
    progress: bool = True,
    recipe: Optional[Recipe] = None,
    track_test: bool = False,
    soft_labels: Optional[np.ndarray] = None,
    model: Optional[str] = None,
    probe: bool = True,
) -> dict:
    """Trains ``runs`` models (seeds ``seed .. seed+runs-1``) on synthetic rows and scores them on real rows.

    Model choice (the epoch kept) uses only a held-out slice of the synthetic rows. ``soft_labels`` (rows, K): the
    release's label scores, fitted as class distributions (``soft_targets``); the hard labels are their argmax and
    serve the synthetic hold-out. ``model``: None (CNN for images, else the MLP), "cnn" or "mlp". ``track_test`` adds a
    per-epoch real-test accuracy curve for diagnosis only; it never influences the model reported.
    Returns accuracy per run, mean, std (population, ddof=0), per-class accuracy and confusion matrix (mean
    over runs, rows = true class; each run's own counts sit in ``curves``), per-run curves, device, wall time.
    """
    if runs < 1 or epochs < 1:
        raise ValueError(f"runs and epochs must be >= 1, got runs={runs} epochs={epochs}")
    train_x, test_x = np.asarray(train_x), np.asarray(test_x)
    train_y, test_y = np.asarray(train_y, np.int64), np.asarray(test_y, np.int64)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be (n, d) with the same d: train {train_x.shape}, test {test_x.shape}")
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise ValueError("features and labels differ in length")
    for name, y in (("train", train_y), ("test", test_y)):
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{name} labels must lie in [0, {num_classes}); found {y.min()}..{y.max()}")
    recipe = recipe or Recipe()
    dim = train_x.shape[1]
    shape = tuple(input_shape) if input_shape is not None else dim
    resolved = image_shape(dim, shape if isinstance(shape, tuple) and len(shape) > 1 else None)
    dev = pick_device(device)
    t0 = time.time()
    tr_idx, val_idx = stratified_split(train_y, recipe.val_fraction, seed)
    x_tr, y_tr = as_tensors(train_x[tr_idx], train_y[tr_idx], dev)
    soft_tr = soft_val = None
    if soft_labels is not None:
        scores = np.asarray(soft_labels, np.float32)
        if scores.shape != (len(train_y), num_classes):
            raise ValueError(f"soft_labels must be (rows, {num_classes}), got {scores.shape}")
        if recipe.soft_loss == "clipped":
            scores = soft_targets(scores)
        elif recipe.soft_loss == "standardized":
            scores = standardize_scores(scores)
        soft_tr = torch.as_tensor(np.ascontiguousarray(scores[tr_idx])).to(dev)
        soft_val = torch.as_tensor(np.ascontiguousarray(scores[val_idx])).to(dev)
    x_val, y_val = as_tensors(train_x[val_idx], train_y[val_idx], dev)
    x_te, y_te = as_tensors(test_x, test_y, dev)
    selected = start = None
    if probe or recipe.probe_start or recipe.stack:
        from dpcda.evaluation.probe import released_targets, select_ridge

        selected = select_ridge(train_x, released_targets(train_y, soft_labels, num_classes), val_idx)
    if recipe.probe_start or recipe.stack:
        w, b = selected["whole"]  # the probe itself (its fit saw the hold-out too: a lean towards keeping it)
        if soft_labels is not None:
            if recipe.soft_loss != "standardized":
                raise ValueError(f"the probe fits label scores standardised, not soft_loss={recipe.soft_loss!r}")
            m, s = score_moments(soft_labels)  # the ridge fit of the standardised scores: the same map, rescaled
            w, b = w / s, (b - m) / s
        start = (w, b)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=runs * epochs * len(tr_idx),
            unit="row",
            unit_scale=True,
            file=sys.stderr,
            desc=f"evaluate {runs}x{epochs} epochs on {dev.type}",
            leave=False,
        )
    accs, curves, confusions = [], [], []
    try:
        for r in range(runs):
            trained, c = train_one(
                x_tr,
                y_tr,
                x_val,
                y_val,
                num_classes=num_classes,
                input_shape=shape,
                epochs=epochs,
                seed=seed + r,
                recipe=recipe,
                device=dev,
                progress=bar,
                test_x=x_te if track_test else None,
                test_y=y_te if track_test else None,
                train_soft=soft_tr,
                val_soft=soft_val,
                model_kind=model,
                start=start,
            )
            pred = predict(trained, x_te, recipe.eval_batch, use_bf16(recipe, dev))
            pairs = (y_te * num_classes + pred).cpu().numpy()
            confusions.append(np.bincount(pairs, minlength=num_classes**2).reshape(num_classes, num_classes))
            accs.append(float((pred == y_te).float().mean()) if len(y_te) else float("nan"))
            curves.append({"seed": seed + r, "accuracy": accs[-1], **c, "confusion_matrix": confusions[-1].tolist()})
    finally:
        if bar is not None:
            bar.close()
    probe_result = None
    if probe:
        from dpcda.evaluation.probe import linear_probe

        probe_result = linear_probe(
            train_x, train_y, test_x, test_y, num_classes=num_classes, scores=soft_labels, selected=selected
        )
    # Mean over runs: sums to the number of test rows, and its diagonal over the row sums is the per-class
    # accuracy averaged over runs (every run sees the same test rows). Counts (ints) when runs == 1.
    confusion = np.mean(confusions, axis=0)
    row_sums = confusion.sum(axis=1)
    per_class = np.where(row_sums > 0, np.diag(confusion) / np.maximum(row_sums, 1), np.nan)
    confusion_out = confusion.astype(np.int64).tolist() if runs == 1 else np.round(confusion, 6).tolist()
    return {
        "summary": summary(float(np.mean(accs)), probe_result),
        "accuracy_mean": float(np.mean(accs)),
        "accuracy_std": float(np.std(accs)),
        "accuracies": accs,
        "per_class_accuracy": [float(v) for v in per_class],
        "confusion_matrix": confusion_out,
        "curves": curves,
        "runs": runs,
        "epochs": epochs,
        "seeds": [seed + r for r in range(runs)],
        "model": type(make_model(shape, num_classes, kind=model)).__name__,
        "soft_labels": soft_labels is not None,
        "input_shape": list(resolved) if resolved else [dim],
        "recipe": dataclasses.asdict(recipe),
        "recipe_name": recipe_name(recipe),
        "probe": probe_result,
        "device": str(dev) if dev.type != "cuda" else f"cuda ({torch.cuda.get_device_name(dev)})",
        "kernel_path": kernel_path(recipe, str(dev)) if dev.type == "cpu" else None,
        "wall_seconds": time.time() - t0,
        "train_rows": int(len(tr_idx)),
        "val_rows": int(len(val_idx)),
        "test_rows": int(len(test_y)),
        "num_classes": num_classes,
    }
