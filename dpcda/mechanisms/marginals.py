"""Marginals (MST, McKenna, Miklau and Sheldon 2021; or AIM, McKenna, Mullins, Sheldon and Miklau 2022): noisy one- and
two-way counts, a graphical model fitted to them with ``mbi`` (private-pgm), and rows sampled from the model. Tables
only. AIM's adaptive rounds (``measure_aim``) spend a zCDP filter's budget (``privacy.aim``).

Neighbouring relation: add or remove one record (all its columns, the label included); the row count is private.

Codes. Every column of the table (the label last) becomes integer codes on PUBLIC bins, read off the encoded rows that
``storage.tables.encode_batch`` makes from the public ``table:`` schema: a categorical column its category's index, a
boolean 0/1, a numeric column one of ``bins`` equal bins of its declared [lower, upper] (``encoded_edges``: a value on
an edge in the bin above it, as ``evaluation.table_metrics`` bins it), a nullable column one more code for null, the
label its class index. Nothing about the bins depends on the data.

Measuring (``MarginalCounter``: count arrays merged by addition, memory independent of the rows, the core of a Beam
combiner). MST's three thirds of a zCDP budget (``privacy.marginals``): every column's one-way counts plus Gaussian
noise; the pairs of columns picked one by one by the exponential mechanism (``privacy.exponential``, exact), each
round among the pairs that join two trees of the forest picked so far, scoring a pair by the L1 distance between its
exact two-way counts and what the noisy one-way counts predict for it (independence: sensitivity 1, as a record moves
one cell by one); the picked pairs' two-way counts plus Gaussian noise (``mst-label``: and the label's pair with every
other column, chosen in advance, so not selected: measured from the same third). Only noisy counts leave ``measure``;
the exact two-way counts feed the scores only. Scores and two-way counts are taken on compressed codes
(``compression``: a column's cells whose noisy one-way count is below 3 stds merged into one, post-processing; mapped
back by ``decompress``). Noise comes from ``privacy.noise`` (``NoiseStream.gaussian``, the
rounded Gaussian whose privacy is the Gaussian mechanism's).

Fitting and sampling are post-processing of the noisy counts: ``mbi``'s mirror descent fits a graphical model on the
measured cliques (its total is the minimum-variance estimate of the uncompressed noisy counts: mbi leaves the
compressed one-way counts, weighted queries, out of it), ``synthetic_data`` draws rows in blocks of
``SAMPLE_ROWS`` as the writer takes them, so no step holds the release's N rows (mbi draws from numpy's global
generator: it is seeded from the noise stream and restored around each call), and a numeric code becomes a value
drawn uniformly inside its bin (uniforms of the noise stream); before that, a merged code (MST's compression) becomes
one of the codes merged into it, uniformly (the noise stream's uniform integers).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from fractions import Fraction
from typing import Iterator, Optional

import numpy as np

from dpcda.mechanisms import pgm
from dpcda.mechanisms.base import Calibrated, InProcess, Mechanism, PlanError
from dpcda.privacy.aim import gaussian_rho, selection_rho
from dpcda.privacy.events import AimEvent, MarginalsEvent
from dpcda.privacy.noise import NoiseStream

log = logging.getLogger(__name__)

SCORE_BITS = 10  # the one-way model's predicted counts are rounded to multiples of 2^-10 (post-processing)
MAX_CELLS = 1 << 26  # cells of every one-way and two-way count array a release holds (int64: 512 MiB)
SELECTIONS = ("mst", "mst-label", "aim")  # mst-label: MST's tree, and the label's pair with every column (public)
AIM = "aim"  # AIM's adaptive rounds (McKenna, Mullins, Sheldon, Miklau 2022), budget in privacy.aim
AIM_MAX_MODEL_SIZE = 80 * (1 << 20) // 8  # cells: AIM's default max_model_size, 80 MB of float64
AIM_ROUND_ITERS = 1000  # at most this many mirror-descent steps in a refit between AIM rounds (as AIM's)
AIM_ROUND_TOL = 1e-4  # ... stopping once the loss falls by at most this share per 50 steps, twice in a row


# ---------------------------------------------------------------- codes


@dataclasses.dataclass(frozen=True)
class Domain:
    """The public code domain: column names (the label last) and how many codes each takes."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    bins: int

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(itertools.combinations(range(len(self.names)), 2))

    @property
    def cells(self) -> int:
        one = sum(self.sizes)
        return one + sum(self.sizes[a] * self.sizes[b] for a, b in self.pairs)


def _values(col, bins: int) -> int:
    """Codes of a column's values (its null, where nullable, is the next code)."""
    return len(col.categories) if col.kind == "categorical" else 2 if col.kind == "boolean" else int(bins)


def domain_of(schema, bins: int) -> Domain:
    """Codes per column of the table schema ``schema`` at ``bins`` numeric bins (a null is one more code)."""
    names, sizes = [], []
    for col in schema.columns:
        names.append(col.name)
        sizes.append(_values(col, bins) + int(col.nullable))
    names.append(schema.label.name)
    sizes.append(schema.num_classes)
    return Domain(tuple(names), tuple(sizes), int(bins))


def codes_of(x01: np.ndarray, labels: np.ndarray, schema, bins: int) -> np.ndarray:
    """(n, columns + 1) int64 codes of encoded rows (``storage.tables.encode_batch``'s layout) and class indices."""
    x = np.asarray(x01)
    n = len(x)
    out = np.empty((n, len(schema.columns) + 1), np.int64)
    for j, (col, at) in enumerate(schema.layout()):
        width = col.width - int(col.nullable)
        if col.kind == "categorical":
            code = np.argmax(x[:, at : at + width], axis=1) if n else np.zeros(0, np.int64)
        elif col.kind == "boolean":
            code = (x[:, at] > 0.5).astype(np.int64)
        else:
            code = np.searchsorted(encoded_edges(col, bins)[1:-1], x[:, at].astype(np.float32), side="right")
        if col.nullable:
            code = np.where(x[:, at + col.width - 1] > 0.5, _values(col, bins), code)
        out[:, j] = code
    out[:, -1] = np.asarray(labels, np.int64)
    return out


def encoded(col, values: np.ndarray) -> np.ndarray:
    """Numeric values of ``col`` as ``storage.tables.encode_batch`` encodes them: float32 of (v - lower) / (upper -
    lower), computed in float64."""
    return ((np.asarray(values, np.float64) - col.lower) / (col.upper - col.lower)).astype(np.float32)


def encoded_edges(col, bins: int) -> np.ndarray:
    """The ``bins + 1`` edges of a numeric column's equal bins, ``numpy.linspace(lower, upper, bins + 1)`` in its
    values, encoded (``encoded``). A value v lies in bin b where edge b <= v < edge b + 1 (the last bin takes
    ``upper``); as the encoding is monotone, its code (``searchsorted(edges[1:-1], encoded v, "right")``) is b for every
    v on an edge or further than float32's rounding from one: ``evaluation.table_metrics``'s bins. Read off the
    encoding as ``floor(x * bins)``, a value on an edge whose encoding rounds down (70 in [0, 200]: 0.35 ->
    0.34999999) would fall into the bin below."""
    return encoded(col, np.linspace(col.lower, col.upper, bins + 1))


MAX_INTEGER_VALUES = 1 << 20  # an integer column with more values in its bounds draws inside its bin, then rounds


def integer_bins(col, bins: int) -> Optional[list]:
    """For an integer column: per bin, the encoded values of the integers in it (an empty bin gets the integer
    nearest its middle), each computed as ``storage.tables.encode_batch`` encodes it, so a decoded value rounds back to
    that integer and lies in that bin; None where the bounds hold more than MAX_INTEGER_VALUES integers."""
    lo, hi = math.ceil(col.lower), math.floor(col.upper)
    if hi - lo + 1 > MAX_INTEGER_VALUES:
        return None
    enc = encoded(col, np.arange(lo, hi + 1, dtype=np.float64))
    edges = encoded_edges(col, bins)
    code = np.searchsorted(edges[1:-1], enc, side="right")
    out = []
    for b in range(bins):
        inside = enc[code == b]
        if inside.size == 0:
            middle = (float(edges[b]) + float(edges[b + 1])) / 2
            inside = enc[[int(np.argmin(np.abs(enc.astype(np.float64) - middle)))]]
        out.append(inside)
    return out


def inside_bins(codes: np.ndarray, u: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Encoded float32 values drawn uniformly inside bins ``codes`` (``u``: uniforms in [0, 1)): edge b + u (edge b + 1
    - edge b), kept below edge b + 1 where float32 rounding would reach it (the last bin reaches 1); a bin whose edges
    are one float32 (bounds too narrow for their magnitude: it holds no value) gets its edge."""
    lo, hi = edges[codes].astype(np.float64), edges[codes + 1].astype(np.float64)
    x = (lo + u * (hi - lo)).astype(np.float32)
    below = np.nextafter(edges[codes + 1], np.float32(-np.inf))
    last = codes == len(edges) - 2
    x = np.where(last, np.minimum(x, np.float32(1.0)), np.minimum(x, below))
    return np.where(hi > lo, x, edges[codes]).astype(np.float32)


def rows_of(
    codes: np.ndarray, schema, bins: int, stream: NoiseStream, integers: frozenset = frozenset()
) -> tuple[np.ndarray, np.ndarray]:
    """Encoded float32 rows (the layout ``storage.tables.decode_rows`` reads) and labels of codes: a category one-hot,
    a boolean 0/1, a numeric code a value drawn uniformly inside its bin with ``stream``'s uniforms (a column named in
    ``integers``: one of the integers inside it, uniformly), a null code the null indicator."""
    n = len(codes)
    x = np.zeros((n, schema.encoded_width), np.float32)
    for j, (col, at) in enumerate(schema.layout()):
        c = np.asarray(codes[:, j], np.int64)
        null = c == _values(col, bins) if col.nullable else np.zeros(n, bool)
        rows = np.flatnonzero(~null)
        if col.kind == "categorical":
            x[rows, at + c[rows]] = 1.0
        elif col.kind == "boolean":
            x[rows, at] = c[rows]
        else:
            table = integer_bins(col, bins) if col.name in integers else None
            if table is None:
                x[rows, at] = inside_bins(c[rows], stream.uniform(rows.size), encoded_edges(col, bins))
            else:
                for b in np.unique(c[rows]):
                    at_b = rows[c[rows] == b]
                    x[at_b, at] = table[b][stream.uniform_int(len(table[b]), at_b.size)]
        if col.nullable:
            x[null, at + col.width - 1] = 1.0
    return x, np.asarray(codes[:, -1], np.int64)


# ---------------------------------------------------------------- counting (the combiner's core)


class MarginalCounter:
    """Every one-way and two-way count array of a ``Domain``, as one flat int64 accumulator (merged by addition)."""

    def __init__(self, domain: Domain):
        self.domain = domain
        cliques = [(i,) for i in range(len(domain.sizes))] + list(domain.pairs)
        self.cliques = tuple(cliques)
        sizes = [math.prod(domain.sizes[i] for i in cl) for cl in cliques]
        self.offsets = tuple(int(o) for o in np.concatenate([[0], np.cumsum(sizes)]))

    def create(self) -> np.ndarray:
        return np.zeros(self.offsets[-1], np.int64)

    def add(self, acc: np.ndarray, codes: np.ndarray) -> np.ndarray:
        sizes = self.domain.sizes
        for k, cl in enumerate(self.cliques):
            lo, hi = self.offsets[k], self.offsets[k + 1]
            flat = codes[:, cl[0]] if len(cl) == 1 else codes[:, cl[0]] * sizes[cl[1]] + codes[:, cl[1]]
            acc[lo:hi] += np.bincount(flat, minlength=hi - lo)
        return acc

    def merge(self, accs) -> np.ndarray:
        accs = iter(accs)
        out = np.array(next(accs), np.int64, copy=True)
        for a in accs:
            out += a
        return out

    def marginal(self, acc: np.ndarray, clique: tuple[int, ...]) -> np.ndarray:
        """The counts of ``clique`` (a column index, or a pair i < j), shaped by its columns' sizes."""
        k = self.cliques.index(tuple(clique))
        shape = tuple(self.domain.sizes[i] for i in clique)
        return acc[self.offsets[k] : self.offsets[k + 1]].reshape(shape)


# ---------------------------------------------------------------- the plan and the measurements


@dataclasses.dataclass(frozen=True)
class MarginalsPlan:
    """What the fit needs (public or DP): the domain, the budget's split, the fit's settings; ``selected`` (the
    measured pairs) and the fit's figures are filled in once the synthesis has run (the plan the manifest states)."""

    selection: str
    domain: Domain
    iterations: int
    rho: float
    event: MarginalsEvent | AimEvent
    selected: tuple[tuple[str, ...], ...] = ()
    estimated_total: Optional[float] = None
    fit_seconds: Optional[float] = None
    max_model_size: Optional[int] = None  # aim: the model's size cap in cells
    aim: Optional[dict] = None  # aim: the rounds as run (DP: chosen from public inputs and DP outputs)

    def noise_stds(self) -> dict:
        """Name -> Gaussian noise std of the counts (the manifest states each one's grid); aim: each distinct std its
        rounds used, once they have run."""
        if self.selection != AIM:
            return {"marginals_one_way": self.event.one_way_std, "marginals_two_way": self.event.two_way_std}
        rec = self.aim or {}
        stds = sorted({r["noise_std"] for r in rec.get("rounds", [])}, reverse=True)
        one = {"marginals_one_way": rec["one_way_noise_std"]} if "one_way_noise_std" in rec else {}
        return {**one, **{f"marginals_aim_std_{k}": s for k, s in enumerate(stds)}}


@dataclasses.dataclass
class Measurements:
    """The noisy counts (DP) and the picked pairs: everything the fit may see."""

    one_way: list  # noisy count vectors, one per column
    pairs: list  # (i, j) measured: the picked ones in order, then the label's (mst-label); aim: its cliques in order
    two_way: list  # noisy count arrays of those pairs, (size_i, size_j) on the compressed codes (mst: ``mapping``)
    one_way_std: float = 0.0
    stds: list = dataclasses.field(default_factory=list)  # per entry of two_way
    model: object = None  # aim: the model fitted between rounds (the last fit starts from it)
    record: Optional[dict] = None  # aim: the rounds as run
    # mst: the compression (``compression``), the codes the pairs were measured on
    mapping: dict = dataclasses.field(default_factory=dict)


class _DisjointSet:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def independence_scores(counter: MarginalCounter, acc: np.ndarray, one_way: list) -> dict:
    """Pair -> integer score, in units of 2^-SCORE_BITS: the L1 distance between the exact two-way counts and the
    counts the noisy one-way counts predict under independence, those rounded to the unit first (post-processing of
    DP counts, so the score's sensitivity stays exactly 1 count = 2^SCORE_BITS units)."""
    totals = [max(float(v.sum()), 0.0) for v in one_way]
    total = float(np.mean(totals)) if totals else 0.0
    probs = []
    for v in one_way:
        p = np.maximum(np.asarray(v, np.float64), 0.0)
        s = p.sum()
        probs.append(p / s if s > 0 else np.full(len(p), 1.0 / len(p)))
    unit = float(1 << SCORE_BITS)
    scores = {}
    for a, b in counter.domain.pairs:
        predicted = np.rint(total * np.outer(probs[a], probs[b]) * unit).astype(np.int64)
        exact = counter.marginal(acc, (a, b)).astype(np.int64) << SCORE_BITS
        scores[(a, b)] = int(np.abs(exact - predicted).sum())
    return scores


def select_mst(scores: dict, columns: int, round_epsilon: float, bits) -> list:
    """MST's selection: ``columns - 1`` exponential-mechanism rounds, each among the pairs that join two trees of the
    forest picked so far (a spanning tree at the end)."""
    from dpcda.privacy.exponential import exponential_mechanism

    forest = _DisjointSet(columns)
    picked = []
    eps, sensitivity = Fraction(round_epsilon), Fraction(1 << SCORE_BITS)
    for _ in range(columns - 1):
        candidates = [e for e in scores if forest.find(e[0]) != forest.find(e[1])]
        i = exponential_mechanism([scores[e] for e in candidates], epsilon=eps, sensitivity=sensitivity, bits=bits)
        a, b = candidates[i]
        forest.union(a, b)
        picked.append((a, b))
    return picked


def measure(counter: MarginalCounter, acc: np.ndarray, plan: MarginalsPlan, key: bytes) -> Measurements:
    """The noisy one-way counts, the picked pairs, their noisy two-way counts (the only outputs that see the data)."""
    from dpcda.privacy.exponential import Bits

    if plan.selection == AIM:
        return measure_aim(counter, acc, plan, key)
    ev = plan.event
    n = len(counter.domain.sizes)
    one_way = [NoiseStream(key, "marginals", "one-way", i).gaussian(counter.marginal(acc, (i,)), ev.one_way_std)
               for i in range(n)]  # fmt: skip
    mapping = compression(one_way, ev.one_way_std)
    small = CompressedCounter(counter, mapping)
    scores = independence_scores(small, acc, [small.one_way(i, y) for i, y in enumerate(one_way)])
    pairs = select_mst(scores, n, ev.round_epsilon, Bits(NoiseStream(key, "marginals", "select")))
    two_way = [
        NoiseStream(key, "marginals", "two-way", a, b).gaussian(small.marginal(acc, (a, b)), ev.two_way_std)
        for a, b in pairs
    ]
    if plan.selection == "mst-label":  # fixed in advance: every column with the label (the last), own streams
        for a in range(n - 1):
            pairs.append((a, n - 1))
            stream = NoiseStream(key, "marginals", "label-pair", a)
            two_way.append(stream.gaussian(small.marginal(acc, (a, n - 1)), ev.two_way_std))
    return Measurements(one_way, pairs, two_way, ev.one_way_std, [ev.two_way_std] * len(pairs), mapping=mapping)


COMPRESS_SIGMAS = 3.0  # MST's domain compression: a one-way cell whose noisy count is below 3 stds is merged


def compression(one_way: list, std: float) -> dict:
    """MST's domain compression (McKenna, Miklau and Sheldon 2021, Section 4; private-pgm's ``compress_domain``),
    post-processing of the noisy one-way counts: column index -> (its codes -> compressed codes), the codes whose
    noisy count is at least ``COMPRESS_SIGMAS`` stds kept in order and the others merged into one last code. A column
    with every code kept is left out. The pairs are then selected and measured on the compressed codes: cells a noisy
    count cannot tell from empty stop taking noise of their own (and mass in the fit)."""
    out = {}
    for i, y in enumerate(one_way):
        keep = np.asarray(y, np.float64) >= COMPRESS_SIGMAS * std
        if keep.all():
            continue
        m = np.full(len(keep), int(keep.sum()), np.int64)
        m[keep] = np.arange(int(keep.sum()))
        out[i] = m
    return out


class CompressedCounter:
    """A ``MarginalCounter``'s exact marginals on compressed codes (``compression``): each count summed into its
    compressed cell (a record still adds 1 to one cell of each marginal: the sensitivities are the uncompressed
    ones)."""

    def __init__(self, counter: "MarginalCounter", mapping: dict):
        self.counter, self.mapping = counter, mapping
        self.domain = compressed_domain(counter.domain, mapping)

    def _compress(self, table: np.ndarray, clique: tuple) -> np.ndarray:
        for axis, col in enumerate(clique):
            if col in self.mapping:
                m = self.mapping[col]
                moved = np.moveaxis(table, axis, 0)
                out = np.zeros((int(m.max()) + 1, *moved.shape[1:]), table.dtype)
                np.add.at(out, m, moved)
                table = np.moveaxis(out, 0, axis)
        return table

    def marginal(self, acc: np.ndarray, clique: tuple) -> np.ndarray:
        return self._compress(self.counter.marginal(acc, clique), clique)

    def one_way(self, col: int, noisy: np.ndarray) -> np.ndarray:
        """A noisy one-way count vector summed into the compressed cells (the merged cell's noise std grows)."""
        return self._compress(np.asarray(noisy, np.float64), (col,))


# ---------------------------------------------------------------- AIM selection


def aim_candidates(columns: int) -> dict:
    """AIM's candidates and weights for the workload of every pair of columns (the label's pairs among them): the
    workload's downward closure (every pair, every column), a clique weighted by how many columns it shares with the
    workload's cliques (AIM's ``compile_workload``: a pair 2 (d - 1), a column d - 1). Cliques larger than pairs are
    not candidates (the combiner counts one- and two-way marginals; the workload is two-way)."""
    workload = list(itertools.combinations(range(columns), 2))
    closure = [(i,) for i in range(columns)] + workload
    return {cl: sum(len(set(cl) & set(w)) for w in workload) for cl in closure}


def merged(mbi, ms: list) -> list:
    """Measurements of one clique merged into one by inverse-variance weighting (their L2 loss is the same up to a
    constant, so is the fit; so is mbi's minimum-variance total): the fit's program is the same while no new clique
    is measured, and mbi compiles it once."""
    groups: dict = {}
    for m in ms:
        groups.setdefault(m.clique, []).append(m)
    out = []
    for clique, group in groups.items():
        if len(group) == 1:
            out.append(group[0])
            continue
        w = [1.0 / float(m.stddev) ** 2 for m in group]
        y = sum(wi * np.asarray(m.noisy_measurement, np.float64) for wi, m in zip(w, group)) / sum(w)
        out.append(mbi.LinearMeasurement(y, clique, stddev=1.0 / math.sqrt(sum(w))))
    return out


def aim_scores(exact: dict, estimated: dict, weights: dict, std: float) -> dict:
    """Clique -> integer score in units of 2^-SCORE_BITS: AIM's w_r (||M_r(D) - M_r(p_hat)||_1 - sqrt(2/pi) sigma n_r),
    the model's counts and the bias rounded to the unit first (post-processing of DP outputs and public numbers), so a
    record moves a score by at most w_r units of 2^SCORE_BITS: the sensitivity is max w_r * 2^SCORE_BITS."""
    unit = float(1 << SCORE_BITS)
    scores = {}
    for cl, w in weights.items():
        x = np.asarray(exact[cl], np.int64) << SCORE_BITS
        est = np.asarray(estimated[cl], np.float64)
        if not np.isfinite(est).all():  # the model is DP: refusing on it says nothing about the records
            raise PlanError(f"marginals: the fitted model's counts on {cl} are not finite; nothing was published")
        # clipped to [0, 2^52] units (post-processing), so every cell's |x - xhat| is exact in int64 whatever the model
        xhat = np.rint(np.clip(est * unit, 0.0, float(1 << 52))).astype(np.int64)
        bias = int(round(math.sqrt(2.0 / math.pi) * std * x.size * unit))
        scores[cl] = int(w) * (_exact_sum(np.abs(x - xhat)) - bias)
    return scores


def _exact_sum(v: np.ndarray) -> int:
    """The sum of non-negative int64 values below 2^63, exactly: their high and low 32 bits summed apart (each sum
    stays below 2^63 for fewer than 2^31 values), then joined in Python's integers."""
    v = v.ravel()
    return (int((v >> 32).sum()) << 32) + int((v & 0xFFFFFFFF).sum())


def measure_aim(counter: MarginalCounter, acc: np.ndarray, plan: MarginalsPlan, key: bytes) -> Measurements:
    """AIM (McKenna, Mullins, Sheldon, Miklau 2022, private-pgm's examples/aim.py): the noisy one-way counts, then
    rounds until the budget is spent (``privacy.aim.AimSchedule``, a zCDP filter): each picks a clique among the
    candidates whose model fits ``size_limit`` (the cap scaled by the share of rho spent so far; a clique the model
    already covers always fits) with the exact exponential mechanism on ``aim_scores``, measures its counts with
    Gaussian noise, refits the model (``pgm.Model``: mbi's mirror descent in numpy, warm-started, up to
    ``AIM_ROUND_ITERS`` steps, to ``AIM_ROUND_TOL``: the anneal test below needs a converged refit; a short one barely
    moves when sigma is small, and anneals on that) and anneals (halves sigma, doubles epsilon) when the refit moved
    that marginal by at most sqrt(2/pi) sigma n_r in L1. Only noisy counts and the picks leave; the exact counts feed
    the scores only."""
    from dpcda.privacy.aim import AimSchedule
    from dpcda.privacy.exponential import Bits, exponential_mechanism

    dom = plan.domain
    n = len(dom.sizes)
    names = dom.names
    sched = AimSchedule(plan.rho, n)
    one_way = [
        NoiseStream(key, "marginals", "aim-one-way", i).gaussian(counter.marginal(acc, (i,)), sched.one_way_std)
        for i in range(n)
    ]
    ms = [((i,), np.asarray(y, np.float64), sched.one_way_std) for i, y in enumerate(one_way)]
    model = pgm.Model(dom.sizes, [(i,) for i in range(n)], pgm.min_variance_total(ms))
    model.fit(ms, AIM_ROUND_ITERS, AIM_ROUND_TOL)
    weights = aim_candidates(n)
    max_weight = max(weights.values())
    cap = plan.max_model_size or AIM_MAX_MODEL_SIZE
    bits = Bits(NoiseStream(key, "marginals", "aim-select"))
    picked, two_way, stds, rounds = [], [], [], []
    cells_of, cells = None, {}  # the model's cliques -> candidate -> cells of the model with it (public: the picks)
    while not sched.done:
        rnd = sched.next_round()
        size_limit = cap * float(sched.filter.spent / sched.filter.cap)
        covered = {sub for cl in model.cliques for r in (1, 2) for sub in itertools.combinations(cl, r)}
        if tuple(model.cliques) != cells_of:  # the sizes change only when a new clique enters the model
            cells_of, cells = tuple(model.cliques), {}
        for cl in weights:
            if cl not in cells and cl not in covered:
                cells[cl] = pgm.model_cells(dom.sizes, [*model.cliques, cl])
        small = [cl for cl in weights if cl in covered or cells[cl] <= size_limit]
        est = {cl: model.marginal(cl) for cl in small}
        scores = aim_scores(
            {cl: counter.marginal(acc, cl) for cl in small},
            est,
            {cl: weights[cl] for cl in small},
            rnd.std,
        )
        i = exponential_mechanism(
            [scores[cl] for cl in small],
            epsilon=rnd.epsilon,
            sensitivity=Fraction(max_weight << SCORE_BITS),
            bits=bits,
        )
        cl = small[i]
        cl_names = tuple(names[j] for j in cl)
        y = NoiseStream(key, "marginals", "aim-round", len(rounds)).gaussian(counter.marginal(acc, cl), rnd.std)
        picked.append(cl)
        two_way.append(y)
        stds.append(rnd.std)
        ms.append((cl, np.asarray(y, np.float64), rnd.std))
        before = est[cl]
        model = pgm.Model(dom.sizes, [*model.cliques, cl], pgm.min_variance_total(ms), model.theta)
        model.fit(ms, AIM_ROUND_ITERS, AIM_ROUND_TOL)
        after = model.marginal(cl)
        anneal = bool(np.abs(after - before).sum() <= math.sqrt(2.0 / math.pi) * rnd.std * before.size)
        if anneal and not rnd.last:
            sched.anneal()
        rounds.append(
            {
                "clique": list(cl_names),
                "epsilon": float(rnd.epsilon),
                "noise_std": rnd.std,
                "rho": float(rnd.rho),
                "candidates": len(small),
                "fit_steps": model.steps,
                "annealed": anneal and not rnd.last,
            }
        )
        log.info(
            "stage=marginals aim round=%d clique=%s std=%.3g anneal=%s steps=%d cells=%d",
            len(rounds),
            cl_names,
            rnd.std,
            anneal,
            model.steps,
            model.cells,
        )
    record = {
        "planned_rounds": sched.planned_rounds,
        "rounds_run": len(rounds),
        "annealing_steps": sched.annealed,
        "one_way_noise_std": sched.one_way_std,
        "rho_cap": plan.rho,
        "rho_spent": float(sched.filter.spent),
        "rho_one_way": float(n * gaussian_rho(sched.one_way_std)),
        "rho_selection": float(sum(selection_rho(r.epsilon) for r in sched.rounds)),
        "rho_measurement": float(sum(gaussian_rho(r.std) for r in sched.rounds)),
        "max_model_size_cells": cap,
        "round_iterations": AIM_ROUND_ITERS,
        "round_tolerance": AIM_ROUND_TOL,
        "rounds": rounds,
    }
    return Measurements(one_way, picked, two_way, sched.one_way_std, stds, warm_start(model, dom), record)


def warm_start(model, dom: Domain):
    """The rounds' last model (``pgm.Model``) as mbi's potentials, the last fit's starting point."""
    mbi = _mbi()
    import jax.numpy as jnp

    domain = mbi.Domain(list(dom.names), list(dom.sizes))
    tables = {cl: mbi.Factor(domain.project(cl), jnp.asarray(v)) for cl, v in model.potentials_for(dom.names).items()}
    return mbi.CliqueVector(domain, list(tables), tables)


# ---------------------------------------------------------------- fitting and sampling (post-processing)


def _mbi():
    return pgm.load_mbi()


def fit(measured: Measurements, plan: MarginalsPlan):
    """mbi's graphical model fitted to the noisy counts by mirror descent (``plan.iterations`` steps)."""
    mbi = _mbi()
    dom = plan.domain
    full = mbi.Domain(list(dom.names), list(dom.sizes))
    small = compressed_domain(dom, measured.mapping)
    domain = mbi.Domain(list(small.names), list(small.sizes))
    names = {dom.names[i]: m for i, m in measured.mapping.items()}
    ms = [  # a compressed one-way count: the merged cell's sum, weighted by mbi (WeightedQuery) for its larger std
        mbi.LinearMeasurement(np.asarray(y, np.float64).ravel(), (dom.names[i],), stddev=measured.one_way_std).compress(
            names, full
        )
        for i, y in enumerate(measured.one_way)
    ]
    ms += [
        mbi.LinearMeasurement(np.asarray(y, np.float64).ravel(), tuple(dom.names[i] for i in cl), stddev=std)
        for cl, y, std in zip(measured.pairs, measured.two_way, measured.stds)
    ]
    return mbi.estimation.MirrorDescent().estimate(
        domain, merged(mbi, ms), iters=plan.iterations, warm_start=measured.model
    )


SAMPLE_ROWS = 1 << 18  # rows mbi draws in one call: the sampling holds this many rows, not the release's


def sample_codes(model, rows: int, plan: MarginalsPlan, key: bytes, block_rows: int = SAMPLE_ROWS):
    """(<= block_rows, columns) blocks of codes, ``rows`` in all, drawn from the fitted model by mbi, one call per
    block (each block its own randomized rounding of the model's marginals), so memory does not grow with ``rows``.
    mbi draws from numpy's global generator: ``privacy.noise.NumpyGlobalState`` seeds it from the noise stream for the
    first block, carries it from block to block and restores the caller's state around each call (post-processing)."""
    from dpcda.privacy.noise import NumpyGlobalState

    generator = NumpyGlobalState(NoiseStream(key, "marginals", "sample"))
    for lo in range(0, rows, block_rows):
        with generator:
            data = model.synthetic_data(rows=min(block_rows, rows - lo))
        cols = data.to_dict()
        yield np.stack([np.asarray(cols[name], np.int64) for name in plan.domain.names], axis=1)


def compressed_domain(dom: Domain, mapping: dict) -> Domain:
    """``dom`` with each compressed column's size its compressed one (``compression``)."""
    return dataclasses.replace(
        dom, sizes=tuple(int(mapping[i].max()) + 1 if i in mapping else s for i, s in enumerate(dom.sizes))
    )


def decompress(codes: np.ndarray, mapping: dict, stream: NoiseStream) -> np.ndarray:
    """Codes of the compressed domain back to the column's own: a kept code to its code, the merged code to one of the
    codes merged into it, uniformly (``stream``'s uniform integers), as private-pgm's ``reverse_data`` does."""
    out = np.array(codes, np.int64, copy=True)
    for col, m in sorted(mapping.items()):
        kept, merged_codes = np.flatnonzero(m < m.max()), np.flatnonzero(m == m.max())  # kept: in compressed order
        c = codes[:, col]
        rare = np.flatnonzero(c == m.max())
        out[c < m.max(), col] = kept[c[c < m.max()]]
        out[rare, col] = merged_codes[stream.uniform_int(len(merged_codes), rare.size)]
    return out


def fit_and_sample(
    acc: np.ndarray, plan, schema, key: bytes, chunk_rows: int, integers: frozenset = frozenset()
) -> tuple[MarginalsPlan, Iterator[tuple[np.ndarray, np.ndarray]]]:
    """The stated ``MarginalsPlan`` (picked pairs, the model's total) and (encoded rows, labels) chunks of the plan's
    ``samples_total`` rows, from the exact counts ``acc`` (``MarginalCounter``). ``integers``: the numeric columns
    whose Arrow type is an integer (their values are drawn among the integers of their bin)."""
    mp: MarginalsPlan = plan.marginals
    counter = MarginalCounter(mp.domain)
    start = time.time()
    measured = measure(counter, acc, mp, key)
    del acc  # from here on only noisy counts
    model = fit(measured, mp)
    names = mp.domain.names
    stated = dataclasses.replace(
        mp,
        selected=tuple(tuple(names[i] for i in cl) for cl in measured.pairs),
        aim=measured.record,
        estimated_total=float(model.total),
        fit_seconds=round(time.time() - start, 2),
    )
    log.info("stage=marginals fitted cliques=%d seconds=%.1f", len(measured.pairs), time.time() - start)
    values, spread = NoiseStream(key, "marginals", "values"), NoiseStream(key, "marginals", "decompress")
    block_rows = max(1, SAMPLE_ROWS // chunk_rows) * chunk_rows  # blocks cut where the chunks are cut

    def chunks():  # lazy: the rows are drawn block by block as the writer takes them
        for codes in sample_codes(model, plan.samples_total, mp, key, block_rows):
            codes = decompress(codes, measured.mapping, spread)
            for lo in range(0, len(codes), chunk_rows):
                yield rows_of(codes[lo : lo + chunk_rows], schema, mp.domain.bins, values, integers)

    return stated, chunks()


def label_pairs(selection: str, columns: int) -> int:
    """Two-way marginals measured without selection: the label's pair with every other column (``mst-label``)."""
    return columns - 1 if selection == "mst-label" else 0


def integer_columns(source: str, table) -> frozenset:
    """Numeric columns of the table whose type in the input's Parquet footer (public, read without a row) is an
    integer."""
    import pyarrow as pa

    from dpcda.storage.paths import expand_glob
    from dpcda.storage.tables import arrow_schema_of

    files = expand_glob(source)
    if not files:
        return frozenset()
    arrow = arrow_schema_of(files[0])
    names = {c.name for c in table.columns if c.kind == "numeric"}
    return frozenset(f.name for f in arrow if f.name in names and pa.types.is_integer(f.type))


# ---------------------------------------------------------------- the registry entry


class Marginals(Mechanism):
    """Rows sampled from a graphical model fitted to noisy one- and two-way counts (MST selection), tables only."""

    name = "marginals"
    composition = (
        "sequential: the one-way counts, the selection rounds and the selected pairs' counts (one zCDP budget; "
        "selection aim: adaptive rounds under a zCDP filter capped at that budget), after the class histogram "
        "(adaptive)"
    )
    summary = "marginals (MST or AIM): noisy one- and two-way counts on public bins, a graphical model (mbi) sampled"
    modes = ("poisson",)
    groups = "dataset"
    graph = "dpcda.transforms.marginals:FitAndSampleMarginals"
    audit_game = "marginal-counts"  # no canary game yet: the config refuses --audit
    fits_model = True
    normalizes = False
    accountant = "rdp"

    def calibrate(self, events, budget, *, params, data, **_) -> Calibrated:
        """rho calibrated so that the whole release (its events, RDP) spends what the budget planner
        (``privacy.budget.BudgetPlan``) left after the histogram."""
        from dpcda.privacy.marginals import calibrate

        dom = domain_of(data.table, params.bins)
        n = len(dom.sizes)
        if params.selection == AIM:
            from dpcda.privacy.aim import calibrate as calibrate_aim

            aim_event = calibrate_aim(
                target_epsilon=budget.synthesis_epsilon,
                delta=budget.accountant_delta,
                one_way=n,
                shared=budget.shared,
                stated_delta=budget.delta,
            )
            plan = MarginalsPlan(
                selection=AIM,
                domain=dom,
                iterations=params.iters,
                rho=aim_event.rho,
                event=aim_event,
                max_model_size=params.max_model_size or AIM_MAX_MODEL_SIZE,
            )
            return Calibrated(sigma_x=0.0, per_group=(aim_event,), marginals=plan)
        event = calibrate(
            target_epsilon=budget.synthesis_epsilon,
            delta=budget.accountant_delta,
            one_way=n,
            rounds=n - 1,
            two_way=label_pairs(params.selection, n) + n - 1,
            shared=budget.shared,
            stated_delta=budget.delta,
        )
        plan = MarginalsPlan(
            selection=params.selection, domain=dom, iterations=params.iters, rho=event.rho, event=event
        )
        return Calibrated(sigma_x=0.0, per_group=(event,), marginals=plan)

    def synthesis_events(self, mode, **_) -> list:
        """The marginals' events depend on the table's columns: ``calibrate`` makes them, not a sigma_x."""
        raise TypeError("marginals: its events come from calibrate() (the table's columns), not from a sigma_x")

    def extra_draws(self, calibrated: Calibrated, *, dim: int, num_classes: int) -> int:
        """Gaussian draws: every one-way cell, and at most the largest two-way arrays the picks can reach."""
        dom = calibrated.marginals.domain
        n = len(dom.sizes)
        if calibrated.marginals.selection == AIM:  # at most planned_rounds rounds (privacy.aim.AimSchedule)
            from dpcda.privacy.aim import ROUNDS_PER_COLUMN

            largest = max(dom.sizes[a] * dom.sizes[b] for a, b in dom.pairs) if n > 1 else max(dom.sizes)
            return sum(dom.sizes) + ROUNDS_PER_COLUMN * n * largest
        pair_cells = sorted((dom.sizes[a] * dom.sizes[b] for a, b in dom.pairs), reverse=True)
        label = sum(dom.sizes[a] * dom.sizes[-1] for a in range(n - 1))
        return sum(dom.sizes) + sum(pair_cells[: n - 1]) + label * (label_pairs(calibrated.marginals.selection, n) > 0)

    def check_before_work(self, core, dim: int) -> None:
        dom = domain_of(core.data.table, core.params.bins)
        if dom.cells > MAX_CELLS:
            raise PlanError(
                f"marginals: the one- and two-way counts of this table take {dom.cells} cells at "
                f"marginals_bins={core.params.bins}, more than {MAX_CELLS}; lower --marginals-bins or drop columns"
            )

    def label_caveat(self) -> str:
        return (
            "marginals: the rows and labels are sampled from a graphical model fitted to noisy one- and two-way counts "
            "on the schema's public bins (sampling is post-processing); the row count is a DP estimate."
        )

    def synthesize(self, ctx: InProcess):
        plan, schema = ctx.plan, ctx.core.data.table
        mp = plan.marginals
        counter = MarginalCounter(mp.domain)
        acc = counter.add(counter.create(), codes_of(ctx.x, ctx.y, schema, mp.domain.bins))
        chunk_rows, integers = ctx.core.execution.chunk_rows, integer_columns(ctx.core.data.source, schema)
        stated, chunks = fit_and_sample(acc, plan, schema, ctx.key, chunk_rows, integers)
        ctx.stated_plan = dataclasses.replace(plan, marginals=stated)  # the picks, as the Beam path states them
        for x, y in chunks:
            yield x, y, None

    def manifest_section(self, plan, *, chunk_rows, common, postprocessing, projection):
        from dpcda.schemas.manifest import MarginalsMechanism

        mp: MarginalsPlan = plan.marginals
        ev = mp.event
        if mp.selection == AIM:
            return self._aim_section(plan, mp)
        return MarginalsMechanism(
            **self._shared_fields(plan, mp),
            rho_split={
                "one_way": ev.one_way / (2 * ev.one_way_std**2),
                "selection": ev.rounds * ev.round_rho,
                "two_way": ev.two_way / (2 * ev.two_way_std**2),
            },
            one_way_noise_std=ev.one_way_std,
            two_way_noise_std=ev.two_way_std,
            selection_rounds=ev.rounds,
            round_epsilon=ev.round_epsilon,
            cliques=[list(p) for p in mp.selected],
            fit={"estimator": "mbi MirrorDescent", "iterations": mp.iterations, "total": mp.estimated_total},
            sampling="mbi's synthetic_data (randomized rounding of the model's marginals) on the compressed codes (a "
            "column's cells whose noisy one-way count is below 3 stds merged into one); a merged code becomes one of "
            "its codes, uniformly; a numeric code becomes a value uniform inside its bin",
        )

    @staticmethod
    def _shared_fields(plan, mp: MarginalsPlan) -> dict:
        """The manifest fields every selection states alike."""
        return dict(
            name="marginals",
            mode=plan.mode,
            selection=mp.selection,
            num_classes=plan.num_classes,
            samples_total=plan.samples_total,
            dataset_size_dp=int(sum(plan.dp_class_sizes)) if plan.dp_class_sizes else None,
            bins=mp.domain.bins,
            columns={n: s for n, s in zip(mp.domain.names, mp.domain.sizes)},
            rho=mp.rho,
        )

    @staticmethod
    def _aim_section(plan, mp: MarginalsPlan):
        from dpcda.schemas.manifest import MarginalsMechanism

        rec = mp.aim or {}
        rounds = rec.get("rounds", [])
        first = rounds[0] if rounds else {}
        return MarginalsMechanism(
            **Marginals._shared_fields(plan, mp),
            rho_split={
                "one_way": rec.get("rho_one_way", 0.0),
                "selection": rec.get("rho_selection", 0.0),
                "two_way": rec.get("rho_measurement", 0.0),
                "unspent": mp.rho - rec.get("rho_spent", 0.0),
            },
            one_way_noise_std=rec.get("one_way_noise_std", 0.0),
            two_way_noise_std=first.get("noise_std", 0.0),
            selection_rounds=len(rounds),
            round_epsilon=first.get("epsilon", 0.0),
            cliques=[list(c) for c in mp.selected],
            fit={
                "estimator": "mbi MirrorDescent",
                "iterations": mp.iterations,
                "round_estimator": "dpcda.mechanisms.pgm (mbi's mirror descent, junction tree and model size in numpy)",
                "round_iterations": rec.get("round_iterations"),
                "round_tolerance": rec.get("round_tolerance"),
                "total": mp.estimated_total,
            },
            sampling="mbi's synthetic_data (randomized rounding of the model's marginals); a numeric code becomes a "
            "value uniform inside its bin",
            aim={
                "workload": "every pair of columns (the label's pair with every column among them), weighted as AIM's "
                "compile_workload; candidates: those pairs and every column (the workload's downward closure; no "
                "clique larger than a pair)",
                "max_model_size_cells": mp.max_model_size,
                **{k: v for k, v in rec.items() if k != "max_model_size_cells"},
            },
        )
