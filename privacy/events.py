"""Privacy events of a DP-CDA release, as frozen data.

Neighbouring relations (DESIGN.md, "Privacy model"):
- ``fixed``: replace one record's features within its class; class sizes are public.
- ``poisson``: add or remove one record, label included.

Each event holds exactly what accounting needs and converts itself to a ``dp_accounting``
``DpEvent``. Nothing here computes an epsilon; ``accounting.account`` does.
"""
from __future__ import annotations

import dataclasses
from typing import Literal, Union

import dp_accounting

Mode = Literal["fixed", "poisson"]
MODES: tuple[str, ...] = ("fixed", "poisson")


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
    def sampling_rate(self) -> float:
        return min(1.0, self.mixing_order / max(self.class_size, 1))

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
