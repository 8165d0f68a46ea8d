"""Evaluation models: seed 000's Table 1 CNN (any C x H x W image) and a small MLP for flat tabular rows.

Torch only (no Beam), so a GPU image without Beam can import it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import nn

MIN_IMAGE_SIDE = 8  # a square width d = s*s is read as an s x s image from s = 8 (d = 64) up


# The CNN's normalisation layers: "batch" is the Table 1 network's BatchNorm (running statistics of the training
# rows); "group" is GroupNorm over 8 groups of channels, statistics of each row alone (evaluation.train's Recipe.norm).
NORMS = {"batch": nn.BatchNorm2d, "group": lambda channels: nn.GroupNorm(8, channels)}


class TableOneCNN(nn.Module):
    """Seed 000 Table 1: two conv blocks (conv, ReLU, BN, max-pool) then FC 100, FC 100, FC K.

    For 1x28x28 this is exactly the paper's network (flatten 64*7*7 = 3136). Other image shapes keep the
    same layers; the flatten size follows from the two 2x2 pools (floor division, as PyTorch pools).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, dropout: float = 0.5, norm: str = "batch"):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {sorted(NORMS)}, got {norm!r}")
        c, h, w = (int(v) for v in input_shape)
        if h < 4 or w < 4:
            raise ValueError(f"input_shape {tuple(input_shape)}: images need H, W >= 4 for two 2x2 pools")
        self.input_shape = (c, h, w)
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, kernel_size=5, stride=1, padding=2),
            nn.ReLU(),
            NORMS[norm](32),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(32, 64, kernel_size=3, stride=1, padding=1),
            nn.ReLU(),
            NORMS[norm](64),
            nn.MaxPool2d(2, 2),
        )
        self.flat_dim = 64 * (h // 2 // 2) * (w // 2 // 2)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(self.flat_dim, 100),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(100, 100),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(100, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.input_shape)  # rows arrive flat (n, C*H*W)
        return self.classifier(self.features(x))


class RowScale(nn.Module):
    """x -> x / rms(x): every row at unit root-mean-square, so noisy and clean rows share one scale."""

    def __init__(self, eps: float = 1e-8):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1)
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + self.eps)


class TabularMLP(nn.Module):
    """Flat features: d -> 256 -> 100 -> K with ReLU, BN and dropout (the CNN's head, without the convs)."""

    def __init__(self, dim: int, num_classes: int, hidden: int = 256, dropout: float = 0.5):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.ReLU(),
            nn.BatchNorm1d(hidden),
            nn.Dropout(dropout),
            nn.Linear(hidden, 100),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(100, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], -1))


def image_shape(dim: int, input_shape: Optional[Sequence[int]] = None) -> Optional[tuple[int, int, int]]:
    """(C, H, W) for rows of width ``dim``: the given shape (checked), 1 x s x s when dim is a square with
    s >= ``MIN_IMAGE_SIDE``, else None. Small squares (4, 9, 16, ...) are far likelier tabular than images."""
    if input_shape is not None:
        shape = tuple(int(v) for v in input_shape)
        if len(shape) == 2:
            shape = (1, *shape)
        if len(shape) != 3 or math.prod(shape) != dim:
            raise ValueError(f"input_shape {tuple(input_shape)} does not hold rows of width {dim}")
        return shape  # type: ignore[return-value]
    side = math.isqrt(dim)
    if side * side == dim and side >= MIN_IMAGE_SIDE:
        return (1, side, side)
    return None


def make_model(
    input_shape, num_classes: int, kind: Optional[str] = None, dropout: Optional[float] = None, norm: str = "batch"
) -> nn.Module:
    """Table 1 CNN when ``input_shape`` is an image (C, H, W) / (H, W), or a square width d >= 64; else the MLP.

    ``input_shape`` may be an int (the row width d) or a shape tuple. ``kind`` "mlp" or "cnn" overrides the guess
    (random projections have square widths but are not images). ``dropout``: None keeps each model's default (0.5).
    ``norm``: the CNN's normalisation layers (``NORMS``); the MLP keeps its own.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if isinstance(input_shape, int):
        dim, given = input_shape, None
    else:
        given = tuple(int(v) for v in input_shape)
        dim = math.prod(given)
        if len(given) == 1:
            given = None
    if kind not in (None, "mlp", "cnn"):
        raise ValueError(f"model kind must be mlp or cnn, got {kind!r}")
    shape = image_shape(dim, given)
    extra = {} if dropout is None else {"dropout": float(dropout)}
    if kind == "mlp" or (shape is None and kind is None):
        return TabularMLP(dim, num_classes, **extra)
    if shape is None:
        raise ValueError(f"rows of width {dim} are not an image; the CNN cannot take them")
    return TableOneCNN(shape, num_classes, norm=norm, **extra)
