"""What the evaluation fits and what it holds out: released label scores made targets, the loss against them, and the
stratified hold-out of SYNTHETIC rows that weighs the models (never a real row). Why: docs/evaluation.md.
"""

from __future__ import annotations

import numpy as np
import torch


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


def as_tensors(x, y, device):
    """(float32 features, int64 labels) as tensors on ``device``."""
    return (
        torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).to(device),
        torch.as_tensor(np.asarray(y, dtype=np.int64)).to(device),
    )


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
