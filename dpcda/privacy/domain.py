"""The DP domain step of a table release: its three measurements, their calibration and their event.

Neighbouring relation: add or remove one record (all its columns, the label included); the row count is private.
The step measures only the columns whose domain the user did not declare (``schemas.table``), and a record holds one
value (or a null) in each column. Noise comes from ``privacy.noise`` (``NoiseStream.gaussian``: the Gaussian
mechanism's output rounded to a public grid, post-processing of the Gaussian mechanism).

Measurements (``mechanisms.domain`` computes the exact counts, draws the noise and post-processes the outputs):

1. ``coarse``: per numeric column, the counts of its values on a PUBLIC grid of cells fixed by the column's Arrow
   type (zero, and each binade [2^e, 2^(e+1)) of either sign within the type's limits), plus N(0, s_c^2) per cell.
   A record lies in at most one cell of a column (none when null), so adding or removing it moves one count by one:
   L2 sensitivity 1 per column, ``GaussianDpEvent(s_c)`` per column. Its output chooses each column's range.
2. ``values``: per measured column (categorical, numeric and the label), the count of every value that occurs, plus
   N(0, s_v^2); a value is released (with its noisy count) only where the noisy count reaches the threshold t.
   Adding or removing a record moves one count per column by one: for the values present in both neighbours this is
   the Gaussian mechanism with L2 sensitivity 1 per column, ``GaussianDpEvent(s_v)`` per column. A value present in
   one neighbour only (count 1) is released with probability at most q = P[1 + s_v Z >= t - g/2] (g: the noise
   grid, the rounding can move a draw by g/2), and a record brings at most k such values (k = columns measured), so
   the event E that none of them is released has probability at least 1 - k q = 1 - delta_v (``threshold_delta``).
   Conditioned on E the output is the Gaussian part alone, so the whole release (this step composed, adaptively,
   with every later zCDP measurement) satisfies, for every event S, with (eps, delta_acc) the zCDP part's guarantee
   from the RDP accountant: P[M(D') in S] <= e^eps P[M(D) in S] + delta_acc + delta_v (D' the larger neighbour) and
   P[M(D) in S] <= e^eps P[M(D') in S] + delta_acc + e^eps delta_v (coupling the two runs on the shared noise; this
   is approximate zCDP, Bun and Steinke 2016, section 8). The release therefore reserves ``reserved_delta`` >= e^eps
   delta_v of its delta for this term (``threshold_delta`` is computed at the target epsilon, which the release never
   exceeds); dp_accounting has no event for it, so this module is where it is written, and
   ``privacy.accounting.account`` subtracts it from the accountant's delta.
3. ``fine``: per numeric column, the counts on a PUBLIC grid of cells inside the column's range (an output of 1.), the
   values released as spikes by 2. left out (chosen by DP outputs, so the grid is public), plus N(0, s_f^2) per cell:
   L2 sensitivity 1 per column, ``GaussianDpEvent(s_f)`` per column. Its output chooses the bin edges and draws
   the range's ends in to the first and last cells of values inside the end bins (post-processing).

The three are zCDP Gaussians (each ``1 / (2 s^2)`` per column); their share of the release's zCDP budget is split by
``SHARES`` among the measurements the table needs, and ``DomainEvent`` holds the stds. The later measurements depend
on the earlier outputs (adaptive composition, which zCDP and RDP allow).
"""

from __future__ import annotations

import dataclasses
import math

import dp_accounting

from dpcda.privacy.noise import grid_for

# The domain step's zCDP budget, split between its measurements (renormalised over those a table needs).
SHARES = {"coarse": 0.3, "values": 0.45, "fine": 0.25}

# Gaussian draws the value counts may take, counted per measured column for the sampler's delta bound: an upper bound
# on the distinct values one column of any table can hold (the bound changes the sampler's term by a factor of it,
# 2^-174 per draw, so its size is immaterial).
MAX_VALUES_PER_COLUMN = 1 << 48


def normal_tail(z: float) -> float:
    """P[Z >= z] for a standard normal Z (``math.erfc``: relative error a few ulps)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def threshold_delta(std: float, threshold: float, columns: int) -> float:
    """delta_v of the value counts: ``columns`` times the probability that a value held by one record only (count 1)
    reaches ``threshold`` with N(0, std^2) noise rounded to ``grid_for(std)``; rounded up by a relative 1e-9 for the
    tail's floating-point error."""
    if columns == 0:
        return 0.0
    z = (threshold - grid_for(std) / 2.0 - 1.0) / std
    return columns * normal_tail(z) * (1.0 + 1e-9)


def value_threshold(std: float, delta_v: float, columns: int) -> float:
    """The smallest threshold t (to 1e-9 of std) whose ``threshold_delta`` is at most ``delta_v``: a new value is then
    released with probability at most delta_v / columns."""
    if not (std > 0 and 0 < delta_v < 1 and columns >= 1):
        raise ValueError(f"value_threshold: std {std}, delta {delta_v}, columns {columns}")
    lo, hi = 0.0, 64.0  # in stds above 1 + g/2: the tail at 64 stds is far below any delta here
    while normal_tail(hi) * columns >= delta_v:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if columns * normal_tail(mid) * (1.0 + 1e-9) <= delta_v:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-9:
            break
    t = 1.0 + grid_for(std) / 2.0 + hi * std
    if threshold_delta(std, t, columns) > delta_v:  # never expected: the search's end is on the safe side
        raise AssertionError("value_threshold: the threshold misses its delta")
    return t


@dataclasses.dataclass(frozen=True)
class DomainEvent:
    """The DP domain step under add/remove: ``coarse``, ``values`` and ``fine`` columns measured with Gaussian noise
    of those stds (module doc), and value counts released above ``threshold``, whose term delta_v =
    ``values_delta`` is covered by ``reserved_delta`` (at least e^epsilon delta_v for the release's target epsilon).
    ``gaussian_draws``: an upper bound on the noise draws (the sampler's delta term)."""

    name: str
    coarse: int
    coarse_std: float
    values: int
    values_std: float
    threshold: float
    values_delta: float
    fine: int
    fine_std: float
    reserved_delta: float
    gaussian_draws: int
    component = "domain"

    @property
    def rho(self) -> float:
        """The zCDP of the Gaussian part (informational: the accountant composes the parts)."""
        return sum(n / (2.0 * s * s) for n, s in self._parts())

    @property
    def noise_multiplier(self) -> float:
        """Of the one Gaussian with the same zCDP (1 / sqrt(2 rho)); informational."""
        return 1.0 / math.sqrt(2.0 * self.rho) if self.rho > 0 else 0.0

    def _parts(self):
        return [(n, s) for n, s in ((self.coarse, self.coarse_std), (self.values, self.values_std),
                                    (self.fine, self.fine_std)) if n]  # fmt: skip

    def covers(self, epsilon: float) -> bool:
        """The threshold term e^epsilon delta_v fits the reserved delta."""
        return math.exp(min(epsilon, 700.0)) * self.values_delta <= self.reserved_delta

    def to_dp_event(self) -> dp_accounting.DpEvent:
        parts = []
        for n, s in self._parts():
            if not s > 0:
                return dp_accounting.NonPrivateDpEvent()
            parts.append(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), n))
        return dp_accounting.ComposedDpEvent(parts) if parts else dp_accounting.NoOpDpEvent()


def split_domain(
    rho: float,
    *,
    coarse: int,
    values: int,
    fine: int,
    reserved_delta: float,
    epsilon: float,
    coarse_cells: int = 0,
    fine_cells: int = 0,
    name: str = "domain",
) -> DomainEvent:
    """The event that spends ``rho`` (zCDP) on the domain step: ``SHARES`` renormalised over the measurements with
    columns, each column's std sqrt(columns / (2 rho_part)); the value threshold chosen so that e^epsilon delta_v is
    at most ``reserved_delta``. ``coarse_cells``/``fine_cells``: the cells of all columns' grids (noise draws)."""
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"domain: rho must be positive and finite, got {rho}")
    if not (reserved_delta > 0 and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("domain: a positive reserved delta and a finite target epsilon are needed")
    counts = {"coarse": coarse, "values": values, "fine": fine}
    used = sum(SHARES[k] for k, n in counts.items() if n)
    stds = {k: math.sqrt(n / (2.0 * rho * SHARES[k] / used)) if n else 0.0 for k, n in counts.items()}
    delta_v = reserved_delta * math.exp(-min(epsilon, 700.0)) * (1.0 - 1e-9)
    threshold = value_threshold(stds["values"], delta_v, values) if values else 0.0
    event = DomainEvent(
        name=name,
        coarse=coarse,
        coarse_std=stds["coarse"],
        values=values,
        values_std=stds["values"],
        threshold=threshold,
        values_delta=threshold_delta(stds["values"], threshold, values) if values else 0.0,
        fine=fine,
        fine_std=stds["fine"],
        reserved_delta=reserved_delta,
        gaussian_draws=coarse_cells + fine_cells + values * MAX_VALUES_PER_COLUMN,
    )
    if not event.covers(epsilon):  # never expected: delta_v was set below the reserve
        raise AssertionError("domain: the threshold term exceeds its reserved delta")
    return event
