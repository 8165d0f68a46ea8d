"""Privacy events of a DP-CDA release, as frozen data.

Neighbouring relations (DESIGN.md, "Privacy model"):
- ``fixed``: replace one record's features within its class; class sizes are public.
- ``poisson``: add or remove one record, label included.

Each event holds exactly what accounting needs and converts itself to a ``dp_accounting``
``DpEvent``. Nothing here computes an epsilon; ``accounting.account`` does.
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Literal, Union

import dp_accounting

Mode = Literal["fixed", "poisson"]
MODES: tuple[str, ...] = ("fixed", "poisson")
# Records reach the mixer clipped to c (1 - CLIP_MARGIN): the margin absorbs float32 rounding of the records and
# the float64 summation of at most MAX_ROW_RECORDS of them (m^2 2^-52 <= 2^-22 < 2^-21), so the computed means
# have the sensitivities below in the bits (mechanisms.dpcda states the bound).
CLIP_MARGIN = 2.0 ** -20
MAX_ROW_RECORDS = 1 << 15


def _gaussian(noise_multiplier: float) -> dp_accounting.DpEvent:
    if not noise_multiplier > 0:
        return dp_accounting.NonPrivateDpEvent()
    return dp_accounting.GaussianDpEvent(noise_multiplier)


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
        exact = self.exact_sampling_rate
        q = float(exact)
        return math.nextafter(q, 2.0) if Fraction(q) < exact else q

    def to_dp_event(self) -> dp_accounting.DpEvent:
        if self.samples == 0:
            return dp_accounting.NoOpDpEvent()
        gauss = _gaussian(self.noise_multiplier)
        if isinstance(gauss, dp_accounting.NonPrivateDpEvent):
            return gauss
        if self.mode == "fixed":
            one = dp_accounting.SampledWithoutReplacementDpEvent(
                self.class_size, self.mixing_order, gauss)
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


Event = Union[MixingEvent, GaussianStatsEvent, NonPrivateEvent]
