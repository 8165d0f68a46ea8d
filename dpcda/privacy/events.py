"""Privacy events of a release, as frozen data: one class per mechanism's synthesis step, plus statistics.

Neighbouring relations (DESIGN.md, "Privacy model"):
- ``fixed``: replace one record. DP-CDA, local perturbation and random projection: its features, within its class
  (class sizes public). DPMix: features and label, anywhere in the dataset (the dataset size public).
- ``poisson``: add or remove one record, label included.

Each event holds exactly what accounting needs and converts itself to a ``dp_accounting``
``DpEvent``. Nothing here computes an epsilon; ``accounting.account`` does.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Literal

import dp_accounting

Mode = Literal["fixed", "poisson"]
MODES: tuple[str, ...] = ("fixed", "poisson")
# Records reach the mixer clipped to c (1 - CLIP_MARGIN): the margin absorbs float32 rounding of the records and
# the float64 summation of at most MAX_ROW_RECORDS of them (m^2 2^-52 <= 2^-22 < 2^-21), so the computed means
# have the sensitivities below in the bits (mechanisms.dpcda states the bound).
CLIP_MARGIN = 2.0**-20
MAX_ROW_RECORDS = 1 << 15


def _gaussian(noise_multiplier: float) -> dp_accounting.DpEvent:
    if not noise_multiplier > 0:
        return dp_accounting.NonPrivateDpEvent()
    return dp_accounting.GaussianDpEvent(noise_multiplier)


def _rate_up(exact: Fraction) -> float:
    """A sampling rate as a float for the accountant, rounded up (never below the rate the sampler uses)."""
    q = float(exact)
    return math.nextafter(q, 2.0) if Fraction(q) < exact else q


@dataclasses.dataclass(frozen=True)
class MixingEvent:
    """``samples`` synthetic rows of one class, each the mean of ``mixing_order`` records plus noise.

    fixed: exactly ``l`` distinct records of the class (``class_size`` = N_k, public), replace-one
    sensitivity of the mean is ``2c/l``, so ``z = sigma_x * l / (2c)``.
    poisson: each record joins with probability ``q = min(1, l / class_size)`` where ``class_size``
    is the DP estimate N_k_hat; the sum is divided by ``l``, add/remove sensitivity ``c/l``, so
    ``z = sigma_x * l / c``.
    """

    mode: Mode
    class_size: int
    samples: int
    mixing_order: int
    clip: float
    sigma_x: float

    @property
    def noise_multiplier(self) -> float:
        if self.mode == "fixed":
            return self.sigma_x * self.mixing_order / (2.0 * self.clip)
        return self.sigma_x * self.mixing_order / self.clip

    @property
    def exact_sampling_rate(self) -> Fraction:
        """q = min(1, l / class_size) as an exact fraction: what the mixer samples with."""
        n = max(int(self.class_size), 1)
        return Fraction(min(int(self.mixing_order), n), n)

    @property
    def sampling_rate(self) -> float:
        """q as a float for the accountant, rounded up (never below the rate the mixer uses)."""
        return _rate_up(self.exact_sampling_rate)

    def to_dp_event(self) -> dp_accounting.DpEvent:
        if self.samples == 0:
            return dp_accounting.NoOpDpEvent()
        gauss = _gaussian(self.noise_multiplier)
        if isinstance(gauss, dp_accounting.NonPrivateDpEvent):
            return gauss
        if self.mode == "fixed":
            one = dp_accounting.SampledWithoutReplacementDpEvent(self.class_size, self.mixing_order, gauss)
        else:
            one = dp_accounting.PoissonSampledDpEvent(self.sampling_rate, gauss)
        return dp_accounting.SelfComposedDpEvent(one, self.samples)


@dataclasses.dataclass(frozen=True)
class GaussianStatsEvent:
    """One Gaussian release of a vector of bounded sums (normalisation moments or class counts).

    ``sensitivity`` is the L2 sensitivity under the mode's relation, ``noise_std`` the std of the
    noise added to each coordinate.
    """

    name: str
    noise_std: float
    sensitivity: float

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return _gaussian(self.noise_multiplier)


@dataclasses.dataclass(frozen=True)
class NonPrivateEvent:
    """A release of exact private data (e.g. ``--normalization exact``): no finite epsilon."""

    name: str

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.NonPrivateDpEvent()


def _rows_event(mode: Mode, one: dp_accounting.DpEvent, n: int, l: int, q: float, samples: int):
    if isinstance(one, dp_accounting.NonPrivateDpEvent):
        return one
    if mode == "fixed":
        row = dp_accounting.SampledWithoutReplacementDpEvent(n, l, one)
    else:
        row = dp_accounting.PoissonSampledDpEvent(q, one)
    return dp_accounting.SelfComposedDpEvent(row, samples)


@dataclasses.dataclass(frozen=True)
class DpmixEvent:
    """DPMix (seed 001): ``samples`` rows, each the mean of ``l`` records of the WHOLE dataset, features and one-hot
    labels, plus N(0, sigma_x^2 I) on the features and N(0, sigma_y^2 I) on the label scores.

    Labels cross classes here, so they cost privacy: the row (mean features, mean one-hot) moves by at most
    (2c/l, sqrt(2)/l) under replace-one and (c/l, 1/l) under add/remove, and the two noises whiten it into one
    Gaussian of noise multiplier ``l / sqrt(4c^2/sigma_x^2 + 2/sigma_y^2)`` (fixed) or
    ``l / sqrt(c^2/sigma_x^2 + 1/sigma_y^2)`` (poisson). fixed: l of ``dataset_size`` without replacement.
    """

    mode: Mode
    dataset_size: int
    samples: int
    mixing_order: int
    clip: float
    sigma_x: float
    sigma_y: float

    @property
    def noise_multiplier(self) -> float:
        if not (self.sigma_x > 0 and self.sigma_y > 0):
            return 0.0
        fx, fy = (4.0, 2.0) if self.mode == "fixed" else (1.0, 1.0)
        return self.mixing_order / math.sqrt(fx * self.clip**2 / self.sigma_x**2 + fy / self.sigma_y**2)

    @property
    def exact_sampling_rate(self) -> Fraction:
        n = max(int(self.dataset_size), 1)
        return Fraction(min(int(self.mixing_order), n), n)

    @property
    def sampling_rate(self) -> float:
        return _rate_up(self.exact_sampling_rate)

    def to_dp_event(self) -> dp_accounting.DpEvent:
        if self.samples == 0:
            return dp_accounting.NoOpDpEvent()
        return _rows_event(
            self.mode,
            _gaussian(self.noise_multiplier),
            max(self.dataset_size, 1),
            self.mixing_order,
            self.sampling_rate,
            self.samples,
        )


# Random projection's gain (``projection_gain``): LAPACK's largest singular value s of R is backward stable, within
# p(d, p) eps s of ||R||_2, p a "modestly growing function" of the shape that LAPACK does not state (Users' Guide,
# section 4.9; its own error estimate takes p = 1). The gain is s (1 + SVD_ALLOWANCE); together with the clip margin
# (records at c (1 - 2^-20)) the sensitivity holds while s is within 2^-22 of the norm, i.e. p(d, p) <= 2^31. A
# textbook worst case for Householder bidiagonalisation is a small multiple of d p^1.5: MAX_PROJECTION_ENTRIES keeps
# that below 2^27.5. Measured (long-double power iteration): s within 10 ulps at 784 x 100, 3072 x 256 and 784 x 784.
SVD_ALLOWANCE = 2.0**-30
MAX_PROJECTION_ENTRIES = 1 << 22  # d p at most: randproj refuses larger projections
GAIN_BITS = 20  # the gain is rounded up to this many significant bits: the same value on every CPU


def projection_gain(spectral_norm: float) -> float:
    """An upper bound on ||R||_2 from LAPACK's estimate ``spectral_norm`` (``numpy.linalg.norm(R, 2)``), the same on
    every CPU: the estimate times 1 + SVD_ALLOWANCE, rounded up to GAIN_BITS significant bits.

    The estimate's last bits depend on the CPU's BLAS kernels (one ulp between an Intel Xeon and an AMD EPYC); two
    estimates a few ulps apart give one gain unless a grid point of 2^-20 relative spacing lies between them, about
    2^-30 of the time. With records clipped to c (1 - CLIP_MARGIN) a computed row fl(x R) moves by at most
    2 c (1 - 2^-21) ||R||_2 + 2 gamma_d sqrt(p) c ||R||_2 (gamma_d = d 2^-53 / (1 - d 2^-53); gamma_d sqrt(p) is
    about 2^-31 at most for d p <= MAX_PROJECTION_ENTRIES), which is at most 2 c gain while
    s >= ||R||_2 (1 - 2^-22): the sensitivity ``PerturbEvent`` uses (see SVD_ALLOWANCE for the SVD's error)."""
    s = float(spectral_norm)
    if not (math.isfinite(s) and 2.0**-1000 < s < 2.0**1000):
        raise ValueError(
            f"projection_gain: the spectral norm must be finite and positive (2^-1000 to 2^1000), got {spectral_norm!r}"
        )
    up = s * (1.0 + SVD_ALLOWANCE)  # rounded to nearest: still above s (1 + 2^-31)
    step = math.ldexp(1.0, math.frexp(up)[1] - GAIN_BITS)  # up = m 2^e, m in [1/2, 1): the grid 2^(e - 20)
    return math.ceil(up / step) * step


@dataclasses.dataclass(frozen=True)
class PerturbEvent:
    """Local perturbation and random projection: each record appears in exactly ONE released row,
    ``gain * x + N(0, sigma_x^2 I)`` in effect (``gain`` = an upper bound on the projection's operator norm,
    ``projection_gain``; 1 without one).

    Replace-one within class (labels and class sizes public and released as they are): the row moves by at most
    ``2 c gain``, so one Gaussian of noise multiplier ``sigma_x / (2 c gain)``; the other rows do not change
    (parallel composition over records). Add/remove is not offered: a row per record publishes the count.
    """

    clip: float
    sigma_x: float
    gain: float = 1.0
    component = "perturbation"

    @property
    def noise_multiplier(self) -> float:
        return self.sigma_x / (2.0 * self.clip * self.gain)

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return _gaussian(self.noise_multiplier)


@dataclasses.dataclass(frozen=True)
class IteratedGaussianEvent:
    """``iterations`` adaptive Gaussian releases of the same bounded statistics (DP-EM's sufficient statistics).

    Each iteration adds N(0, noise_std^2) to every coordinate of statistics of L2 sensitivity ``sensitivity`` under
    add/remove: one Gaussian of multiplier ``noise_std / sensitivity``, self-composed ``iterations`` times (the
    later iterations may depend on the earlier outputs: composition covers that).
    """

    name: str
    iterations: int
    noise_std: float
    sensitivity: float

    @property
    def noise_multiplier(self) -> float:
        return self.noise_std / self.sensitivity

    def to_dp_event(self) -> dp_accounting.DpEvent:
        if self.iterations == 0:
            return dp_accounting.NoOpDpEvent()
        gauss = _gaussian(self.noise_multiplier)
        if isinstance(gauss, dp_accounting.NonPrivateDpEvent):
            return gauss
        return dp_accounting.SelfComposedDpEvent(gauss, self.iterations)


@dataclasses.dataclass(frozen=True)
class DpSgdEvent:
    """``steps`` steps of DP-SGD under add/remove: each step's batch holds every record independently with
    probability ``sampling_rate`` (Poisson sampling, as the sampler in ``mechanisms.dpsgd`` draws it), the
    per-example gradients are clipped to L2 norm C and summed, and N(0, (noise_multiplier C)^2 I) is added.
    """

    name: str
    sampling_rate: Fraction
    steps: int
    noise_multiplier: float
    component = "dp_sgd"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        if self.steps == 0:
            return dp_accounting.NoOpDpEvent()
        gauss = _gaussian(self.noise_multiplier)
        if isinstance(gauss, dp_accounting.NonPrivateDpEvent):
            return gauss
        one = dp_accounting.PoissonSampledDpEvent(_rate_up(Fraction(self.sampling_rate)), gauss)
        return dp_accounting.SelfComposedDpEvent(one, self.steps)


@dataclasses.dataclass(frozen=True)
class MarginalsEvent:
    """A marginal-based synthesis (MST), under add/remove: noisy counts, and exponential-mechanism selection rounds.

    ``one_way`` marginals (every column's), then ``rounds`` exponential-mechanism rounds at ``round_epsilon`` (each
    picks one pair of columns; the scores have sensitivity 1), then ``two_way`` marginals (the picked pairs). A record
    lies in exactly one cell of a marginal, so adding or removing it moves each marginal by 1 in L2: each is one
    Gaussian of noise multiplier its std. A round at epsilon is epsilon-DP and epsilon^2/8-zCDP (the exponential
    mechanism is epsilon-bounded range: Cesar and Rogers 2021), a ``ZCDpEvent``; dp_accounting's RDP accountant
    composes both.
    """

    name: str
    one_way: int
    one_way_std: float
    rounds: int
    round_epsilon: float
    two_way: int
    two_way_std: float
    component = "marginals"

    @property
    def round_rho(self) -> float:
        """epsilon^2/8, rounded up."""
        return math.nextafter(self.round_epsilon**2 / 8.0, math.inf) if self.round_epsilon > 0 else 0.0

    @property
    def rho(self) -> float:
        """The zCDP of the whole event (informational: the accountant composes the parts)."""
        if not (self.one_way_std > 0 and self.two_way_std > 0) or not self.round_epsilon > 0:
            return math.inf
        return (
            self.one_way / (2 * self.one_way_std**2)
            + self.rounds * self.round_rho
            + self.two_way / (2 * self.two_way_std**2)
        )

    @property
    def noise_multiplier(self) -> float:
        """Of the one Gaussian with the same zCDP (1 / sqrt(2 rho)); informational."""
        return 1.0 / math.sqrt(2.0 * self.rho) if math.isfinite(self.rho) and self.rho > 0 else 0.0

    def to_dp_event(self) -> dp_accounting.DpEvent:
        parts = []
        for count, event in (
            (self.one_way, _gaussian(self.one_way_std)),
            (self.rounds, dp_accounting.ZCDpEvent(self.round_rho) if self.round_epsilon > 0 else None),
            (self.two_way, _gaussian(self.two_way_std)),
        ):
            if count == 0:
                continue
            if event is None or isinstance(event, dp_accounting.NonPrivateDpEvent):
                return dp_accounting.NonPrivateDpEvent()
            parts.append(dp_accounting.SelfComposedDpEvent(event, count))
        return dp_accounting.ComposedDpEvent(parts) if parts else dp_accounting.NoOpDpEvent()


@dataclasses.dataclass(frozen=True)
class AimEvent:
    """AIM under add/remove: a zCDP filter of cap ``rho`` over its one-way measurement and adaptive rounds
    (``privacy.aim``'s module doc): accounted as ``ZCDpEvent(rho)``, the RDP curve of any sequence of rounds the
    filter lets through."""

    name: str
    rho: float
    one_way: int
    component = "marginals"

    @property
    def noise_multiplier(self) -> float:
        """Of the one Gaussian with the same zCDP (1 / sqrt(2 rho)); informational."""
        return 1.0 / math.sqrt(2.0 * self.rho) if self.rho > 0 else 0.0

    def to_dp_event(self) -> dp_accounting.DpEvent:
        if not (self.rho > 0 and math.isfinite(self.rho)):
            return dp_accounting.NonPrivateDpEvent()
        return dp_accounting.ZCDpEvent(self.rho)


Event = (
    MixingEvent
    | DpmixEvent
    | PerturbEvent
    | GaussianStatsEvent
    | NonPrivateEvent
    | IteratedGaussianEvent
    | DpSgdEvent
    | MarginalsEvent
    | AimEvent
)
