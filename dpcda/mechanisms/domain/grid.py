"""The public grids of the DP domain step: coarse cells fixed by a column's type, fine cells inside a DP range.

Coarse cells (``Coarse``): zero, and every binade [2^e, 2^(e+1)) of either sign that the column's type can hold, cut
in ``SUBCELLS`` equal cells (an integer type: e from 0 to its bit width less one; a float type: e from
``FLOAT_EXPONENTS``' smallest, where smaller magnitudes join the zero cell, to its largest, where larger ones join
the top cell: a float column's range stays within 2^128), within the column's loose limits where it declares some
(values outside them are clipped to them first). Nothing about the cells depends on the data. A value lies in
exactly one cell.

Fine cells (``Fine``): inside a range [lo, hi] that the coarse step chose (a DP output), the integers themselves
where an integer column's range holds at most ``FINE_CELLS`` of them, else ``FINE_CELLS`` equal cells; the values
chosen as spikes (a DP output) are left out, so the cells are public too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import numpy as np
import pyarrow as pa

from dpcda.schemas.table import FLOAT_MAX, physical_integer

# binade exponents of float columns: |v| < 2^lowest joins the zero cell; the highest keeps |bounds| below 1e300
FLOAT_EXPONENTS = {16: (-24, 15), 32: (-32, 127), 64: (-32, 127)}
FINE_CELLS = 64
SUBCELLS = 1


def _float_below(n: int) -> float:
    """The largest float64 at most the integer ``n`` (2^63 - 1 is not one)."""
    f = float(n)
    return f if int(f) <= n else math.nextafter(f, 0.0)


@dataclasses.dataclass(frozen=True)
class Coarse:
    """The coarse cells of one column, in increasing order of value: the negative cells, a zero cell, the positive
    cells (``signed``: negatives too). The binade [2^e, 2^(e+1)) of exponents ``low``..``high`` is cut into
    ``SUBCELLS`` equal cells (an integer column's first binades into as many as they hold integers: {1}, {2}, {3});
    ``integer``: the values are integers (cells' bounds are then integers too)."""

    low: int
    high: int
    signed: bool
    integer: bool
    limits: Optional[tuple[float, float]] = None  # the declared loose limits, or None
    top: float = math.inf  # the largest value the cells reach (the type's, or 2^(high + 1) for a float)
    bottom: float = -math.inf  # the smallest

    @classmethod
    def of(cls, t: pa.DataType, limits: Optional[tuple[float, float]] = None) -> "Coarse":
        t = physical_integer(t)
        if pa.types.is_integer(t):
            bits = t.bit_width
            if pa.types.is_signed_integer(t):  # |v| <= 2^(bits - 1): -2^(bits - 1) joins the bottom cell
                return cls(0, bits - 2, True, True, limits, _float_below(2 ** (bits - 1) - 1), -float(2 ** (bits - 1)))
            return cls(0, bits - 1, False, True, limits, _float_below(2**bits - 1), 0.0)
        low, high = FLOAT_EXPONENTS[t.bit_width]
        top = min(FLOAT_MAX[t.bit_width], math.ldexp(1.0, high + 1))
        return cls(low, high, True, False, limits, top, -top)

    def _subs(self, e: int) -> int:
        return min(SUBCELLS, 2**e) if self.integer else SUBCELLS

    @functools.cached_property
    def _starts(self) -> np.ndarray:
        """The first cell (counted from the zero cell, less one) of each exponent's binade, and the cells in all."""
        return np.concatenate([[0], np.cumsum([self._subs(e) for e in range(self.low, self.high + 1)])])

    @property
    def side(self) -> int:
        return int(self._starts[-1])

    @property
    def cells(self) -> int:
        return (2 * self.side if self.signed else self.side) + 1

    @property
    def zero(self) -> int:
        return self.side if self.signed else 0

    def index(self, v: np.ndarray) -> np.ndarray:
        """The cell of each finite float64 value (clipped to the loose limits first)."""
        v = np.asarray(v, np.float64)
        if self.limits is not None:
            v = np.clip(v, *self.limits)
        mag = np.abs(v)
        _, exp = np.frexp(np.where(mag > 0, mag, 1.0))
        raw = exp.astype(np.int64) - 1
        e = np.clip(raw, self.low, self.high)
        subs = np.minimum(SUBCELLS, np.left_shift(1, np.clip(e, 0, 62))) if self.integer else np.full(e.shape, SUBCELLS)
        frac = np.ldexp(mag, -e.astype(np.int32))  # in [1, 2) inside the exponents' span
        sub = np.clip(np.floor((frac - 1.0) * subs), 0, subs - 1).astype(np.int64)
        sub = np.where(raw > self.high, subs - 1, sub)  # larger magnitudes join the top cell
        offset = self._starts[e - self.low] + sub + 1
        cell = np.where(v > 0, self.zero + offset, self.zero - offset)
        return np.where((mag == 0) | (raw < self.low), self.zero, cell).astype(np.int64)

    def _bounds(self, k: int) -> tuple[float, float]:
        """(smallest, largest) magnitude of positive cell k (1: the first), the largest exclusive for floats."""
        i = int(np.searchsorted(self._starts, k - 1, side="right")) - 1
        e, sub = self.low + i, k - 1 - int(self._starts[i])
        n = self._subs(e)
        if self.integer:
            lo = 2**e + sub * 2**e // n
            return float(lo), float(2**e + (sub + 1) * 2**e // n - 1)
        return math.ldexp(1.0 + sub / n, e), math.ldexp(1.0 + (sub + 1) / n, e)

    def lower(self, cell: int) -> float:
        """The smallest value of ``cell``."""
        k = int(cell) - self.zero
        if k == 0:
            return 0.0
        if k > 0:
            return self._bounds(k)[0]
        return self.bottom if -k == self.side else -self._bounds(-k)[1]

    def upper(self, cell: int) -> float:
        """The largest value of ``cell`` (a float cell: its open end)."""
        k = int(cell) - self.zero
        if k == 0:
            return 0.0
        if k < 0:
            return -self._bounds(-k)[0]
        return self.top if k == self.side else self._bounds(k)[1]

    def range_of(self, first: int, last: int) -> tuple[float, float]:
        """[lower of ``first``, upper of ``last``] within the loose limits; widened to hold more than one value."""
        lo, hi = self.lower(first), self.upper(last)
        if self.limits is not None:
            lo, hi = max(lo, self.limits[0]), min(hi, self.limits[1])
            if not lo < hi:
                lo, hi = self.limits
        if not lo < hi:  # one value only (a zero cell): a unit range above it, or below at the top
            lo, hi = (lo, lo + 1.0) if lo + 1.0 <= self.top else (hi - 1.0, hi)
        return lo, hi


@dataclasses.dataclass(frozen=True)
class Fine:
    """The fine cells of one column inside [lo, hi]: the integers (``step`` 1) or ``FINE_CELLS`` equal cells."""

    lo: float
    hi: float
    integer: bool
    spikes: tuple[float, ...] = ()

    @property
    def per_integer(self) -> bool:
        return self.integer and self.hi - self.lo + 1 <= FINE_CELLS

    @property
    def cells(self) -> int:
        return int(self.hi - self.lo + 1) if self.per_integer else FINE_CELLS

    def index(self, v: np.ndarray) -> np.ndarray:
        """The cell of each value (clipped to [lo, hi]); -1 for a spike (not counted)."""
        v = np.clip(np.asarray(v, np.float64), self.lo, self.hi)
        if self.per_integer:
            cell = np.rint(v - self.lo).astype(np.int64)
        else:
            cell = np.floor((v - self.lo) / (self.hi - self.lo) * FINE_CELLS).astype(np.int64)
        cell = np.clip(cell, 0, self.cells - 1)
        if self.spikes:
            cell = np.where(np.isin(v, np.asarray(self.spikes, np.float64)), -1, cell)
        return cell

    def boundary(self, b: int) -> float:
        """The value where cell b starts (b = cells: hi)."""
        if b >= self.cells:
            return self.hi
        if self.per_integer:
            return self.lo + b
        return self.lo + (self.hi - self.lo) * b / FINE_CELLS
