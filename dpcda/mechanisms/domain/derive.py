"""The DP domain step's measurements (noise on the exact summaries, from the noise module) and what is read off their
outputs, down to a complete ``TableSchema``. Relation, sensitivities and accounting: ``privacy.domain``.

Everything below a measurement is post-processing of DP outputs and public facts:
- a numeric column's range (``dp_range``): on each side of zero, from its bulk (the largest noisy count inside the
  window of ``BULK_WINDOWS`` adjacent cells whose noisy sum is the most stds above zero, where that reaches
  ``BULK_STDS``), extended cell by cell towards either end while one of the next
  ``RANGE_GAP`` cells has a noisy count of at least ``RANGE_STDS`` stds (and the zero cell where it has); values
  outside it are clipped to it;
- spikes: a numeric column's values released by the thresholded counts that hold at least ``SPIKE_SHARE`` of the
  column's noisy total, at most ``MAX_SPIKES`` (the largest noisy counts); the range is widened to hold them;
- bin edges (``dp_edges``): ``QUANTILE_BINS`` quantiles of the noisy fine counts' cumulative sum (spikes not counted)
  and ``EQUAL_BINS`` equal bins of the range, together; an integer column's edges are integers and every bin holds
  an integer that is not a spike (a bin without one is merged into its neighbour);
- the range's ends drawn in inside its end bins (``trim_ends``): inside the first bin, the fine cells before the first
  one whose noisy count reaches ``RANGE_STDS`` stds (a wall of values) are left out of the range where their noisy
  sum is at most one std per square root of their number (the range still holds every spike); the last bin likewise
  from above. A bin is cut only up to such a wall, so a value the cut clips moves less than a bin's width (a range's
  end lies on its grid's cells: without this, wa_churn's first monthly_charges bin [16, 21.25) over values from 18.25
  up drew about 8 % of the column's rows below 18.25);
- categories: a string column's released values (at most ``MAX_CATEGORIES``, the largest noisy counts), every other
  value counted in an ``other`` bucket decoded as ``OTHER`` (made unique against the categories); a string column
  with no released value (near-unique: an ID, free text) is refused by name with the flag that drops it; the label's
  released values (a record with another label, or none, is left out of the synthesis).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from dpcda.mechanisms.base import PlanError
from dpcda.mechanisms.domain.grid import Fine
from dpcda.mechanisms.domain.request import DomainRequest
from dpcda.mechanisms.domain.summaries import CoarseCounter, FineCounter, value_key, value_tag
from dpcda.privacy.domain import DomainEvent
from dpcda.privacy.noise import NoiseStream
from dpcda.privacy.noise.paths import gaussian_per_path
from dpcda.schemas.table import Column, DomainStep, Label, TableSchema

# 3, not 2: an empty cell's noise passes 2 stds with probability 0.023 and each step looks at two cells, so an end
# of a range went one cell too far in about 1 release in 20 (computed): a 0/1 column's range reached [2, 3] and the
# flag came back with 2s and 3s in it (seen on a 1e6-row wa_churn-shaped table). At 3 stds, 0.00135 a cell; the
# one-way TVD at eps 1 was unchanged (seeded releases: wa_churn 0.0170/0.0164 -> 0.0170/0.0159, credit_data mean of
# three 0.0601 -> 0.0604)
RANGE_STDS = 3.0
RANGE_GAP = 2
BULK_STDS = 4.5
BULK_WINDOWS = (1, 2)
SPIKE_SHARE = 0.005
MAX_SPIKES = 32
QUANTILE_BINS = 16
EQUAL_BINS = 16
MAX_CATEGORIES = 256
OTHER = "(other)"


DRAW_CHUNK = 1 << 16  # values whose noise is drawn at once (their Python objects and stream names held together)


def noisy_values(key: bytes, column: int, counts, event: DomainEvent) -> list:
    """(column, value, noisy count) for each value of one column's table ``counts`` (``value``, ``count``) whose
    noisy count reaches the threshold; each value's noise is the first draw of its own stream ('domain', 'value',
    column, ``value_tag``), drawn ``DRAW_CHUNK`` values at a time (``privacy.noise.paths``)."""
    out = []
    for start in range(0, counts.num_rows, DRAW_CHUNK):
        part = counts.slice(start, DRAW_CHUNK)
        values = [value_key(v) for v in part.column("value").to_pylist()]
        paths = [("domain", "value", column, value_tag(v)) for v in values]
        exact = part.column("count").to_numpy(zero_copy_only=False).astype(np.float64)
        noisy = gaussian_per_path(key, paths, exact, event.values_std)
        out += [(column, v, float(n)) for v, n in zip(values, noisy) if n >= event.threshold]
    return out


def _extend(noisy: np.ndarray, start: int, step: int, tau: float) -> int:
    end = start
    while True:
        window = [end + step * k for k in range(1, RANGE_GAP + 1) if 0 <= end + step * k < len(noisy)]
        hits = [w for w in window if noisy[w] >= tau]
        if not hits:
            return end
        end = hits[-1]


def _bulk(part: np.ndarray, std: float):
    """The cell with the largest noisy count inside the window of ``BULK_WINDOWS`` adjacent cells whose noisy sum is
    the most stds above zero, if that reaches ``BULK_STDS`` (an empty side's noise does with probability about 2 x
    cells x 3.4e-6), else None."""
    best, where = -np.inf, None
    for w in BULK_WINDOWS:
        if len(part) < w:
            continue
        z = np.convolve(part, np.ones(w), mode="valid") / (std * np.sqrt(w))
        i = int(np.argmax(z))
        if z[i] > best:
            best, where = z[i], i + int(np.argmax(part[i : i + w]))
    return where if best >= BULK_STDS else None


def dp_range(coarse, noisy: np.ndarray, std: float) -> tuple[int, int]:
    """The first and last coarse cell of a column's range, from its noisy coarse counts: on each side of zero, its
    bulk (``_bulk``) extended (``_extend``); the zero cell if it reaches ``RANGE_STDS`` stds; the range from the
    lowest to the highest of those (the largest cell where none is found)."""
    tau = RANGE_STDS * std
    z = coarse.zero
    ends = [z] if noisy[z] >= tau else []
    for side in (slice(0, z), slice(z + 1, len(noisy))):
        part = noisy[side]
        bulk = _bulk(part, std) if len(part) else None
        if bulk is not None:
            ends += [side.start + _extend(part, bulk, -1, tau), side.start + _extend(part, bulk, 1, tau)]
    if not ends:
        ends = [int(np.argmax(noisy))]
    return min(ends), max(ends)


@dataclasses.dataclass(frozen=True)
class FirstPass:
    """Pass 1's DP outputs: each numeric column's range and spikes, each categorical column's and the label's
    released values (largest noisy counts first), each numeric column's noisy total."""

    ranges: dict
    spikes: dict
    values: dict
    totals: dict


def first_pass(request: DomainRequest, coarse_acc: np.ndarray, kept: list, event: DomainEvent, key: bytes) -> FirstPass:
    """Ranges and spikes of the numeric columns, values of the others, from the exact coarse counts (noised here)
    and the released (column, value, noisy count) triples ``kept``."""
    counter = CoarseCounter(request)
    ranges, totals = {}, {}
    for j, d in enumerate(request.numeric):
        stream = NoiseStream(key, "domain", "coarse", d.name.encode().hex())
        noisy = stream.gaussian(counter.column(coarse_acc, j).astype(np.float64), event.coarse_std)
        first, last = dp_range(d.coarse, noisy, event.coarse_std)
        ranges[d.name] = d.coarse.range_of(first, last)
        totals[d.name] = float(noisy.sum())
    found: dict = {}
    for j, value, noisy in sorted(kept, key=lambda k: (k[0], -k[2], repr(k[1]))):
        found.setdefault(request.counted[j].name, []).append((value, noisy))
    spikes, values = {}, {}
    for d in request.derive:
        if d.kind != "numeric":
            values[d.name] = [v for v, _ in found.get(d.name, [])[:MAX_CATEGORIES]]
            continue
        limits = d.coarse.limits or (-math.inf, math.inf)
        floor = SPIKE_SHARE * max(totals[d.name], 0.0)
        big = [float(v) for v, n in found.get(d.name, []) if n >= floor and limits[0] <= v <= limits[1]]
        spikes[d.name] = sorted(big[:MAX_SPIKES])
        if spikes[d.name]:  # the range holds its spikes
            lo, hi = ranges[d.name]
            ranges[d.name] = (min(lo, spikes[d.name][0]), max(hi, spikes[d.name][-1]))
    return FirstPass(ranges, spikes, values, totals)


def _integer_bins(edges: list, lo: float, hi: float, spikes: set) -> list:
    """Integer edges where every bin ([e_i, e_(i+1)), the last with hi) holds a non-spike integer; [] if none."""
    inner = sorted({float(math.ceil(e)) for e in edges[1:-1] if lo < math.ceil(e) < hi})
    cuts = [lo, *inner, hi]

    def holds(a: float, b: float, last: bool) -> bool:
        top = b if last else b - 1
        return top - a + 1 > len([s for s in spikes if a <= s <= top])

    out: list = []
    for a, b in zip(cuts, cuts[1:]):
        if out and not holds(out[-1][0], out[-1][1], False):
            out[-1][1] = b  # the previous bin held none: merge it into this one
        else:
            out.append([a, b])
    if not holds(out[-1][0], out[-1][1], True):
        if len(out) == 1:
            return []
        last = out.pop()
        out[-1][1] = last[1]
    return [out[0][0], *(b for _, b in out)]


def dp_edges(fine: Fine, noisy: np.ndarray) -> list:
    """A numeric column's bin edges (module doc), from its noisy fine counts (its spikes not counted)."""
    lo, hi = fine.lo, fine.hi
    edges = {lo + (hi - lo) * k / EQUAL_BINS for k in range(1, EQUAL_BINS)}
    cum = np.maximum.accumulate(np.cumsum(noisy))
    total = float(cum[-1]) if len(cum) else 0.0
    if total > 0:
        for k in range(1, QUANTILE_BINS):
            b = int(np.searchsorted(cum, k / QUANTILE_BINS * total, side="left")) + 1
            if b < fine.cells:
                edges.add(fine.boundary(b))
    inner = sorted(e for e in edges if lo < e < hi)
    if fine.integer:
        return _integer_bins([lo, *inner, hi], lo, hi, set(fine.spikes))
    return [lo, *inner, hi]


def _cut(run: np.ndarray, std: float) -> int:
    """How many leading cells of ``run`` (noisy counts) to leave out: those before its first cell of at least
    ``RANGE_STDS`` stds, up to the last whose cumulative noisy sum is at most std x sqrt(cells); 0 without such a
    cell."""
    wall = np.flatnonzero(run >= RANGE_STDS * std)
    if not wall.size:
        return 0
    head = np.cumsum(run[: wall[0]])
    ok = np.flatnonzero(head <= std * np.sqrt(np.arange(1, head.size + 1)))
    return int(ok[-1]) + 1 if ok.size else 0


def trim_ends(fine: Fine, noisy: np.ndarray, edges: list, std: float) -> list:
    """``edges`` with the range's ends drawn in (module doc) from the column's noisy fine counts (std ``std``)."""
    if len(edges) < 2:
        return list(edges)
    cells = np.arange(fine.cells)
    start = np.array([fine.boundary(int(c)) for c in cells]) if not fine.per_integer else fine.lo + cells
    stop = np.array([fine.boundary(int(c) + 1) for c in cells]) if not fine.per_integer else start + 1.0
    spikes = np.asarray(fine.spikes, np.float64)
    counted = ~np.isin(start, spikes) if fine.per_integer else np.ones(fine.cells, bool)
    out = [float(e) for e in edges]
    first = np.flatnonzero(counted & (start >= out[0]) & (stop <= (out[1] if len(out) > 2 else np.inf)))
    k = _cut(noisy[first], std)
    if k:
        c = first[k]
        lo = float(start[c]) if fine.per_integer or not fine.integer else float(math.ceil(start[c]))
        out[0] = min([lo, *spikes[spikes < lo]])
    last = np.flatnonzero(counted & (start >= (out[-2] if len(out) > 2 else out[0])))
    k = _cut(noisy[last][::-1], std)
    if k:
        c = last[-1 - k]
        if fine.per_integer:
            hi = float(start[c])
        else:
            hi = float(stop[c]) if not fine.integer else float(math.ceil(stop[c]) - 1)
        out[-1] = max([hi, *spikes[spikes > hi]])
    if fine.integer:  # an end that met its bin's inner edge (the bin's one value left) merges that bin into the next
        out = _integer_bins(out, out[0], out[-1], set(fine.spikes)) if out[0] < out[-1] else []
    if len(out) < 2 or not all(a < b for a, b in zip(out, out[1:])):
        return [float(e) for e in edges]  # never expected: a cut stops at a wall inside its bin
    return out


def _distinct_encodings(values: list, lo: float, hi: float, edges: bool = False) -> list:
    """Increasing ``values`` less those whose float32 encoding in [lo, hi] repeats the one kept before (codes could
    not tell them apart); ``edges``: the first and last values (lo and hi) are kept, and an inner one that encodes as
    hi is dropped."""
    if not values:
        return []
    enc = ((np.asarray(values, np.float64) - lo) / (hi - lo)).astype(np.float32)
    out, last = [values[0]], enc[0]
    for v, e in zip(values[1:], enc[1:]):
        if e != last and not (edges and e == enc[-1] and v != values[-1]):
            out.append(v)
            last = e
    if edges and out[-1] != values[-1]:
        out.append(values[-1])
    return [float(v) for v in out]


def other_value(categories: list) -> str:
    """``OTHER``, with a '*' added until it is none of the categories."""
    out = OTHER
    while out in categories:
        out += "*"
    return out


def complete(
    request: DomainRequest,
    first: FirstPass,
    fine_acc: np.ndarray,
    fines: dict,
    event: DomainEvent,
    key: bytes,
    share: float,
) -> TableSchema:
    """The complete table schema: the declared columns as declared, the undeclared booleans, the derived columns from
    the DP outputs (pass 2's exact fine counts are noised here), in the input's order; its ``domain`` record states
    the step."""
    counter = FineCounter(request, fines)
    derived = {}
    for j, d in enumerate(request.numeric):
        stream = NoiseStream(key, "domain", "fine", d.name.encode().hex())
        noisy = stream.gaussian(counter.column(fine_acc, j).astype(np.float64), event.fine_std)
        lo, hi = first.ranges[d.name]
        raw = trim_ends(fines[d.name], noisy, dp_edges(fines[d.name], noisy), event.fine_std)
        if raw:
            lo, hi = raw[0], raw[-1]
        spikes = _distinct_encodings(first.spikes[d.name], lo, hi)
        edges = _distinct_encodings(raw, lo, hi, edges=True)
        derived[d.name] = Column(
            name=d.name, kind="numeric", lower=lo, upper=hi, nullable=d.nullable, edges=edges, spikes=spikes or None
        )
        if not edges and not spikes:  # never expected: an integer range holds a non-spike integer or a spike
            raise PlanError(f"domain: column '{d.name}' got neither bins nor spikes")
    unreleased = [d.name for d in request.derive if d.kind == "categorical" and not first.values[d.name]]
    if unreleased:  # post-processing of DP outputs: every value of these columns would be "other"
        names = ", ".join(f"'{n}'" for n in unreleased)
        raise PlanError(
            f"column {names}: the DP domain step released none of its values (near-unique: an ID or free text, or "
            f"values too rare for the budget; every value would be '{OTHER}'); leave it out with --drop-columns "
            f"{','.join(unreleased)}, or declare its categories in table:"
        )
    label = request.declared.label
    for d in request.derive:
        if d.kind == "categorical":
            cats = sorted(first.values[d.name], key=str)
            derived[d.name] = Column(
                name=d.name, kind="categorical", categories=cats, other=other_value(cats), nullable=d.nullable
            )
        elif d.kind == "label":
            cats = sorted(first.values[d.name], key=lambda v: (str(type(v)), v))
            if len(cats) < 2:
                raise PlanError(
                    f"label '{d.name}': the DP domain step released {len(cats)} of its values (a value is released "
                    "when its noisy count passes the threshold the budget sets); declare its categories, or raise "
                    "epsilon or --domain-budget-share"
                )
            label = Label(name=d.name, categories=cats, unlisted="drop")
    step = DomainStep(share=share, event=dataclasses.asdict(event), derived=[d.name for d in request.derive])
    return assemble(request, derived, label, step)


def assemble(request: DomainRequest, derived: dict, label: Optional[Label] = None, step=None) -> TableSchema:
    """The complete schema from the declared columns, the undeclared booleans (and a boolean label: its categories are
    public), and the ``derived`` ones, in the input's order; without a derived column, no DP step: ``assemble(request,
    {})`` completes a table whose undeclared columns are all public."""
    label = label or request.declared.label
    if request.label_categories is not None:
        label = Label(name=label.name, categories=request.label_categories, unlisted="drop")
    declared = {c.name: c for c in request.declared.columns}
    booleans = {c.name: c for c in request.booleans}
    order = [n for n in request.order if n != label.name and n not in request.declared.drop]
    columns = [derived.get(n) or booleans.get(n) or declared[n] for n in order]
    if not columns:
        raise PlanError("table: the input has no column besides the label")
    return TableSchema(
        label=label,
        columns=columns,
        drop=list(request.declared.drop),
        domain=step,
        decoding=request.declared.decoding,
        rules=list(request.declared.rules),  # public, on declared columns only: kept as declared
    )
