"""Marginals (MST, McKenna, Miklau and Sheldon 2021): noisy one- and two-way counts, a graphical model fitted to them
with ``mbi`` (private-pgm), and rows sampled from the model. Tables only.

Neighbouring relation: add or remove one record (all its columns, the label included); the row count is private.

Codes. Every column of the table (the label last) becomes integer codes on PUBLIC bins, read off the encoded rows that
``storage.tables.encode_batch`` makes from the public ``table:`` schema: a categorical column its category's index, a
boolean 0/1, a numeric column one of ``bins`` equal bins of its declared [lower, upper], a nullable column one more code
for null, the label its class index. Nothing about the bins depends on the data.

Measuring (``MarginalCounter``: count arrays merged by addition, memory independent of the rows, the core of a Beam
combiner). MST's three thirds of a zCDP budget (``privacy.marginals``): every column's one-way counts plus Gaussian
noise; the pairs of columns picked one by one by the exponential mechanism (``privacy.exponential``, exact), each
round among the pairs that join two trees of the forest picked so far, scoring a pair by the L1 distance between its
exact two-way counts and what the noisy one-way counts predict for it (independence: sensitivity 1, as a record moves
one cell by one); the picked pairs' two-way counts plus Gaussian noise (``mst-label``: and the label's pair with every
other column, chosen in advance, so not selected: measured from the same third). Only noisy counts leave ``measure``;
the exact two-way counts feed the scores only. Noise comes from ``privacy.noise`` (``NoiseStream.gaussian``, the
rounded Gaussian whose privacy is the Gaussian mechanism's).

Fitting and sampling are post-processing of the noisy counts: ``mbi``'s mirror descent fits a graphical model on the
measured cliques (its total is the noisy counts' minimum-variance estimate), ``synthetic_data`` draws rows (mbi draws
from numpy's global generator: it is seeded from the noise stream for the call and restored after), and a numeric code
becomes a value drawn uniformly inside its bin (uniforms of the noise stream).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import time
from fractions import Fraction
from typing import Iterator, Optional

import numpy as np

from dpcda.mechanisms.base import Calibrated, InProcess, Mechanism, PlanError
from dpcda.privacy.events import MarginalsEvent
from dpcda.privacy.noise import NoiseStream

log = logging.getLogger(__name__)

SCORE_BITS = 10  # the one-way model's predicted counts are rounded to multiples of 2^-10 (post-processing)
MAX_CELLS = 1 << 26  # cells of every one-way and two-way count array a release holds (int64: 512 MiB)
SELECTIONS = ("mst", "mst-label")  # mst-label: MST's tree, and the label's pair with every column (a public choice)


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
            code = np.minimum(np.floor(np.clip(x[:, at].astype(np.float64), 0.0, 1.0) * bins), bins - 1)
        if col.nullable:
            code = np.where(x[:, at + col.width - 1] > 0.5, _values(col, bins), code)
        out[:, j] = code
    out[:, -1] = np.asarray(labels, np.int64)
    return out


MAX_INTEGER_VALUES = 1 << 20  # an integer column with more values in its bounds draws inside its bin, then rounds


def integer_bins(col, bins: int) -> Optional[list]:
    """For an integer column: per bin, the encoded values of the integers in it (an empty bin gets the integer
    nearest its middle), each computed as ``storage.tables.encode_batch`` encodes it, so a decoded value rounds back to
    that integer and lies in that bin; None where the bounds hold more than MAX_INTEGER_VALUES integers."""
    lo, hi = math.ceil(col.lower), math.floor(col.upper)
    if hi - lo + 1 > MAX_INTEGER_VALUES:
        return None
    k = np.arange(lo, hi + 1, dtype=np.float64)
    enc = ((k - col.lower) / (col.upper - col.lower)).astype(np.float32)
    code = np.minimum(np.floor(enc.astype(np.float64) * bins), bins - 1).astype(np.int64)
    out = []
    for b in range(bins):
        inside = enc[code == b]
        if inside.size == 0:
            middle = (b + 0.5) / bins
            inside = enc[[int(np.argmin(np.abs(enc.astype(np.float64) - middle)))]]
        out.append(inside)
    return out


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
                x[rows, at] = np.clip((c[rows] + stream.uniform(rows.size)) / bins, 0.0, 1.0)
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
    event: MarginalsEvent
    selected: tuple[tuple[str, str], ...] = ()
    estimated_total: Optional[float] = None
    fit_seconds: Optional[float] = None


@dataclasses.dataclass
class Measurements:
    """The noisy counts (DP) and the picked pairs: everything the fit may see."""

    one_way: list  # noisy count vectors, one per column
    pairs: list  # (i, j) measured: the picked ones in order, then the label's (mst-label)
    two_way: list  # noisy count arrays of those pairs, (size_i, size_j)


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

    ev = plan.event
    n = len(counter.domain.sizes)
    one_way = [NoiseStream(key, "marginals", "one-way", i).gaussian(counter.marginal(acc, (i,)), ev.one_way_std)
               for i in range(n)]  # fmt: skip
    scores = independence_scores(counter, acc, one_way)
    pairs = select_mst(scores, n, ev.round_epsilon, Bits(NoiseStream(key, "marginals", "select")))
    two_way = [
        NoiseStream(key, "marginals", "two-way", a, b).gaussian(counter.marginal(acc, (a, b)), ev.two_way_std)
        for a, b in pairs
    ]
    if plan.selection == "mst-label":  # fixed in advance: every column with the label (the last), own streams
        for a in range(n - 1):
            pairs.append((a, n - 1))
            stream = NoiseStream(key, "marginals", "label-pair", a)
            two_way.append(stream.gaussian(counter.marginal(acc, (a, n - 1)), ev.two_way_std))
    return Measurements(one_way, pairs, two_way)


# ---------------------------------------------------------------- fitting and sampling (post-processing)


def _mbi():
    import jax

    jax.config.update("jax_enable_x64", True)  # counts of large tables need float64 (mbi warns otherwise)
    jax.config.update("jax_enable_compilation_cache", False)  # many small programs: the cache only costs
    import mbi

    return mbi


def fit(measured: Measurements, plan: MarginalsPlan):
    """mbi's graphical model fitted to the noisy counts by mirror descent (``plan.iterations`` steps)."""
    mbi = _mbi()
    dom = plan.domain
    domain = mbi.Domain(list(dom.names), list(dom.sizes))
    ms = [
        mbi.LinearMeasurement(np.asarray(y, np.float64).ravel(), (dom.names[i],), stddev=plan.event.one_way_std)
        for i, y in enumerate(measured.one_way)
    ]
    ms += [
        mbi.LinearMeasurement(
            np.asarray(y, np.float64).ravel(), (dom.names[a], dom.names[b]), stddev=plan.event.two_way_std
        )
        for (a, b), y in zip(measured.pairs, measured.two_way)
    ]
    return mbi.estimation.MirrorDescent().estimate(domain, ms, iters=plan.iterations)


_GLOBAL_RNG = threading.Lock()


def sample_codes(model, rows: int, plan: MarginalsPlan, key: bytes) -> np.ndarray:
    """(rows, columns) codes drawn from the fitted model by mbi (numpy's global generator, seeded from the noise
    stream for this call and restored after: post-processing)."""
    seed = NoiseStream(key, "marginals", "sample").words(8).view(np.uint32)
    with _GLOBAL_RNG:  # two samplings in one process (Beam worker threads) never interleave their draws
        state = np.random.get_state()
        try:
            np.random.seed(seed)
            data = model.synthetic_data(rows=rows)
        finally:
            np.random.set_state(state)
    cols = data.to_dict()
    return np.stack([np.asarray(cols[name], np.int64) for name in plan.domain.names], axis=1)


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
    codes = sample_codes(model, plan.samples_total, mp, key)
    names = mp.domain.names
    stated = dataclasses.replace(
        mp,
        selected=tuple((names[a], names[b]) for a, b in measured.pairs),
        estimated_total=float(model.total),
        fit_seconds=round(time.time() - start, 2),
    )
    log.info("stage=marginals fitted cliques=%d seconds=%.1f", len(measured.pairs), time.time() - start)
    values = NoiseStream(key, "marginals", "values")

    def chunks():
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
        "sequential: the one-way counts, the selection rounds and the selected pairs' counts (one zCDP budget), after "
        "the class histogram (adaptive)"
    )
    summary = "marginals (MST): noisy one- and two-way counts on public bins, a graphical model (mbi) sampled"
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
        _, chunks = fit_and_sample(acc, plan, schema, ctx.key, chunk_rows, integers)
        for x, y in chunks:
            yield x, y, None

    def manifest_section(self, plan, *, chunk_rows, common, postprocessing, projection):
        from dpcda.schemas.manifest import MarginalsMechanism

        mp: MarginalsPlan = plan.marginals
        ev = mp.event
        return MarginalsMechanism(
            name="marginals",
            mode=plan.mode,
            selection=mp.selection,
            num_classes=plan.num_classes,
            samples_total=plan.samples_total,
            dataset_size_dp=int(sum(plan.dp_class_sizes)) if plan.dp_class_sizes else None,
            bins=mp.domain.bins,
            columns={n: s for n, s in zip(mp.domain.names, mp.domain.sizes)},
            rho=mp.rho,
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
            sampling="mbi's synthetic_data (randomized rounding of the model's marginals); a numeric code becomes a "
            "value uniform inside its bin",
        )
