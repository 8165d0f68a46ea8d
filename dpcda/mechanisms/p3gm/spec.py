"""P3GM's public settings (``P3gmSpec``), the fitted model's types, and the fit's fixed shapes and floors
(``mechanisms.p3gm`` says what each step spends)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Optional

import numpy as np

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
