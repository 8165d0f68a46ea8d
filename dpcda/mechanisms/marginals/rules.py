"""The table's public rules (``schemas.rules``) kept by the marginals mechanism: every released row satisfies every
rule. Post-processing of the fitted model and its draws: no budget, nothing read from the rows.

Codes first. Each group of rules that share columns becomes one table over those columns' codes (``Group``): an
implication group from the rules' values (a numeric column: null or not), an order group from its bins (a combination
of bins is allowed where values inside them can satisfy every order rule at once: ``schemas.rules`` bounds
propagation, integers rounded). Then, in order:

1. Conditioning (``constrain``): the groups become mbi ``Constraint`` s on the fit's domain (compressed codes: a merged
   cell is allowed where one of its cells is). The final fit runs under them and the model's cliques take each
   group's columns, so mbi's sampler draws from the model with the forbidden cells at zero probability, renormalised:
   the model conditioned on the rules. A group whose clique would grow the model's junction tree past
   ``MAX_GROWTH`` is left to step 3.
2. Decompression (``keep_codes``): a merged code (MST's compression) becomes one of its codes uniformly among those
   that keep the rules given the rest of the row (``decompress`` without rules: uniformly among all).
3. Rejection: a row still outside the rules (a group left out of step 1) is replaced by a fresh draw from the model
   that keeps them (up to ``RESAMPLE_ROUNDS`` rounds), which is the same conditioning in distribution; a row still
   left (a model that gives the allowed cells almost no mass) takes the allowed combination nearest its own (fewest
   columns changed, the first in code order).

Values last (``keep_values``): a numeric value is drawn inside its code's bin (``domain.rows_of``). A row whose drawn
values break an order rule has the values of that rule's columns drawn again, one column after the other, each
uniformly within its bin and within what the rules and the columns drawn before it leave (bounds propagation, so a
value always remains); the bins, and so every code-level marginal, are unchanged. Float32 encoding may round a
decoded tie the wrong way: such a value moves by float32 steps until the decoded values keep the rule.

Null: an implication's condition on a value is false where the column is null (unless the rule names null); an
order rule holds where either side is null.

Absent residual codes (``residual.absent_codes``: a null or other bucket with no noisy mass) join as one-column groups
that forbid them, kept by the same steps, except where forbidding one would make a value of some column unreachable
under the rules (a rule that needs the code): that one stays allowed.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from dpcda.mechanisms.base import PlanError
from dpcda.mechanisms.marginals.domain import Domain, _values, encoded, integer_bins
from dpcda.privacy.noise import NoiseStream
from dpcda.schemas.rules import (
    Implication,
    allowed_states,
    implication_groups,
    order_groups,
    order_pairs,
    pairs_hold,
    propagate,
    value_states,
)

MAX_GROUP_CELLS = 1 << 22  # code combinations of one group of rules (a boolean table)
MAX_GROWTH = 4  # a group conditions the model where its junction tree grows at most this factor (plus 2^20 cells)
RESAMPLE_ROUNDS = 64
NUDGE_STEPS = 64
INSET = 1e-5  # of a bin's width: a float value drawn for the rules stays this far inside its bin


class Group:
    """Rules over columns ``cols`` (indices in the code domain, ascending) as a table ``allowed`` over their codes."""

    def __init__(self, cols: tuple, allowed: np.ndarray):
        order = sorted(range(len(cols)), key=lambda j: cols[j])
        self.cols, self.allowed = tuple(cols[j] for j in order), np.transpose(allowed, order)

    def holds(self, codes: np.ndarray) -> np.ndarray:
        return self.allowed[tuple(codes[:, c] for c in self.cols)]


def _columns(schema) -> list:
    return [*schema.columns, schema.label]


def _state_of_code(col, bins: int) -> np.ndarray:
    """Code -> index in ``schemas.rules.value_states`` (numeric: 0 for every bin, 1 for null)."""
    kind = getattr(col, "kind", "categorical")  # the label has no kind: categorical
    n = _values(col, bins) if hasattr(col, "kind") else len(col.categories)
    states = np.zeros(n, np.int64) if kind == "numeric" else np.arange(n)
    if getattr(col, "nullable", False):
        states = np.append(states, len(value_states(col)) - 1)
    return states


def code_intervals(col, bins: int, integer: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per code of a numeric column (null excluded; ``domain.numeric_codes``' order: its spikes, then its bins): the
    values [low, high] a row with that code can decode to: a spike itself; the integers of the bin for an integer
    column, else the bin's values a little inside its edges (declared, derived or ``bins`` equal ones; ``INSET``), so
    that a rule's bound on an edge (monthly <= 120, an edge) leaves the bin above no value rather than the edge
    alone."""
    spikes = np.asarray(col.spikes or [], np.float64)
    table = integer_bins(col, bins) if integer and col.edges != [] else None
    if col.edges == []:  # spikes only
        lo, hi = np.zeros(0), np.zeros(0)
    elif table is not None:
        ints = [np.round(col.lower + t.astype(np.float64) * (col.upper - col.lower)) for t in table]
        lo, hi = np.array([i.min() for i in ints]), np.array([i.max() for i in ints])
    else:
        edges = np.asarray(col.edges, np.float64) if col.edges else np.linspace(col.lower, col.upper, bins + 1)
        lo, hi = edges[:-1].copy(), edges[1:].copy()
        inset = (hi - lo) * INSET  # clear of the edges by more than float32's steps: a value keeps its bin
        lo, hi = lo + inset, hi - inset
    return np.concatenate([spikes, lo]), np.concatenate([spikes, hi])


def decoded_values(col, x32: np.ndarray, integer: bool) -> np.ndarray:
    """What ``storage.tables.decode_rows`` makes of a numeric column's encoded values (tested against it)."""
    value = col.lower + np.clip(np.asarray(x32).astype(np.float64), 0.0, 1.0) * (col.upper - col.lower)
    if integer:
        lo, hi = np.ceil(col.lower), np.floor(col.upper)
        value = np.clip(np.round(value), lo, hi) if lo <= hi else np.full_like(value, lo)
    return value


class OrderGroup:
    """Numeric columns tied by order rules: their codes' intervals and the rules between them."""

    def __init__(self, names: list, rules: list, schema, dom: Domain, integers: frozenset):
        cols = _columns(schema)
        self.names = names
        self.index = [dom.names.index(n) for n in names]
        self.cols = [cols[i] for i in self.index]
        self.integer = np.array([n in integers for n in names])
        self.bins = dom.bins
        self.intervals = [code_intervals(c, dom.bins, n in integers) for c, n in zip(self.cols, names)]
        self.pairs = order_pairs(names, rules)  # (big, small): a position or a constant

    def bounds(self, codes: np.ndarray):
        """(lo, hi, null) per row and column of the group, from the columns' codes (rows, k)."""
        n, k = codes.shape
        lo, hi, null = np.zeros((n, k)), np.zeros((n, k)), np.zeros((n, k), bool)
        for j, (col, (clo, chi)) in enumerate(zip(self.cols, self.intervals)):
            nb = len(clo)
            null[:, j] = codes[:, j] >= nb
            c = np.minimum(codes[:, j], nb - 1)
            lo[:, j], hi[:, j] = clo[c], chi[c]
        return lo, hi, null

    def table(self, dom: Domain) -> np.ndarray:
        shape = tuple(dom.sizes[i] for i in self.index)
        if math.prod(shape) > MAX_GROUP_CELLS:
            raise PlanError(
                f"rules: order rules tie {', '.join(self.names)} together ({math.prod(shape)} combinations of bins, "
                f"more than {MAX_GROUP_CELLS}); lower --marginals-bins or declare fewer"
            )
        combos = np.indices(shape).reshape(len(shape), -1).T
        lo, hi, null = self.bounds(combos)
        return propagate(lo, hi, null, self.pairs, self.integer, len(self.names) + 1).reshape(shape)

    def holds(self, values: np.ndarray, null: np.ndarray) -> np.ndarray:
        return pairs_hold(values, null, self.pairs)


class KeptRules:
    """The rules of ``schema`` on the code domain ``dom`` (``integers``: numeric columns of an integer type)."""

    def __init__(self, schema, dom: Domain, integers: frozenset = frozenset(), absent: Optional[dict] = None):
        self.schema, self.dom, self.integers = schema, dom, integers
        cols = {c.name: c for c in _columns(schema)}
        groups = []
        for names, rules in implication_groups([r for r in schema.rules if isinstance(r, Implication)]):
            states = allowed_states(names, rules, cols)
            index = tuple(_state_of_code(cols[n], dom.bins) for n in names)
            groups.append(Group(tuple(dom.names.index(n) for n in names), states[np.ix_(*index)]))
        self.orders = [OrderGroup(names, rules, schema, dom, integers) for names, rules in order_groups(schema.rules)]
        groups += [Group(tuple(o.index), o.table(dom)) for o in self.orders]
        self.groups = _merged(groups, dom)
        self.absent = {}
        for col, codes in sorted((absent or {}).items()):  # ``residual.absent_codes``: one column's codes forbidden
            allowed = np.ones(dom.sizes[col], bool)
            allowed[list(codes)] = False
            joined = _merged([*self.groups, Group((col,), allowed)], dom)
            want = _reachable(self.groups, dom)
            want[col] &= allowed
            if all(np.array_equal(a, b) for a, b in zip(_reachable(joined, dom), want)):
                self.groups, self.absent[col] = joined, tuple(codes)
            # else a rule needs the code (``{if: {a: x}, then: {b: null}}``: b's null absent would forbid a's x, a
            # value of the column): it stays allowed
        self.stated = {"conditioned": [], "resampled_rows": 0, "repaired_rows": 0, "values_redrawn": 0}

    # ---- step 1: the model conditioned on the rules
    def constrain(self, mbi, domain, mapping: dict, cliques: list) -> list:
        """mbi ``Constraint`` s on the fit's (compressed) ``domain`` for the groups whose cliques keep the model's
        junction tree within ``MAX_GROWTH`` of the one on ``cliques`` (the measured cliques, names)."""
        from dpcda.mechanisms.pgm import model_cells

        names, sizes = list(domain.attributes), list(domain.shape)
        base = [tuple(names.index(a) for a in cl) for cl in cliques]
        limit = MAX_GROWTH * model_cells(sizes, base) + (1 << 20)
        out, taken = [], list(base)
        for g in self.groups:
            if model_cells(sizes, taken + [g.cols]) > limit:
                continue
            taken.append(g.cols)
            small = self._compressed(g, mapping)
            sub = domain.project([names[c] for c in g.cols])
            out.append(mbi.Constraint(sub, valid=np.argwhere(small)))
            self.stated["conditioned"].append([names[c] for c in g.cols])
        return out

    @staticmethod
    def sampled_under(model, constraints: list):
        """The model fitted under ``constraints``, its potentials taking each constraint's clique as well, so that
        mbi's sampler (its junction tree is the potentials') draws every constrained column with the others."""
        cliques = list(model.potentials.cliques)
        extra = [c.domain.attributes for c in constraints if c.domain.attributes not in cliques]
        return model.replace(potentials=model.potentials.expand(cliques + extra))

    def resampler(self, model, key: bytes, mapping: dict, weights=None) -> Callable[[int], np.ndarray]:
        """n -> (n, columns) fresh decompressed codes from ``model`` (mbi's sampler, seeded from the noise stream
        ("marginals", "rules-resample"), one sequence across calls)."""
        from dpcda.mechanisms.marginals.estimation import columns, decompress
        from dpcda.privacy.noise import NumpyGlobalState

        generator = NumpyGlobalState(NoiseStream(key, "marginals", "rules-resample"))
        spread = NoiseStream(key, "marginals", "rules-decompress")

        def draw(n: int) -> np.ndarray:
            with generator:
                cols = model.synthetic_data(rows=n).to_dict()
            codes = np.stack([np.asarray(cols[i], np.int64) for i in columns(self.dom)], axis=1)
            return decompress(codes, mapping, spread, weights)

        return draw

    def _compressed(self, g: Group, mapping: dict) -> np.ndarray:
        maps = [mapping.get(c, np.arange(self.dom.sizes[c])) for c in g.cols]
        out = np.zeros(tuple(int(m.max()) + 1 for m in maps), bool)
        idx = np.indices(g.allowed.shape).reshape(len(g.cols), -1)
        np.logical_or.at(out, tuple(m[i] for m, i in zip(maps, idx)), g.allowed.ravel())
        return out

    # ---- steps 2 and 3
    def keep_codes(
        self, codes: np.ndarray, mapping: dict, resample: Callable[[int], np.ndarray], stream: NoiseStream
    ) -> np.ndarray:
        """Codes (decompressed) with every row inside the rules: merged codes redrawn among those that keep them,
        then rows outside them replaced by fresh draws that keep them, then the nearest allowed combination."""
        codes = np.array(codes, np.int64, copy=True)
        for g in self.groups:
            self._redecompress(g, codes, mapping, stream)
        bad = np.flatnonzero(~self.holds(codes))
        rounds = 0
        while bad.size and rounds < RESAMPLE_ROUNDS:
            fresh = resample(max(256, 4 * bad.size))
            fresh = np.array(fresh, np.int64)
            for g in self.groups:
                self._redecompress(g, fresh, mapping, stream)
            fresh = fresh[self.holds(fresh)][: bad.size]
            codes[bad[: len(fresh)]] = fresh
            self.stated["resampled_rows"] += len(fresh)
            bad = bad[len(fresh) :]
            rounds += 1
        for g in self.groups:
            self._repair(g, codes, bad)
        return codes

    def holds(self, codes: np.ndarray) -> np.ndarray:
        ok = np.ones(len(codes), bool)
        for g in self.groups:
            ok &= g.holds(codes)
        return ok

    def _redecompress(self, g: Group, codes: np.ndarray, mapping: dict, stream: NoiseStream) -> None:
        merged = [c for c in g.cols if c in mapping]
        if not merged:
            return
        bad = np.flatnonzero(~g.holds(codes))
        if not bad.size:
            return
        maps = [mapping.get(c, np.arange(self.dom.sizes[c])) for c in g.cols]
        allowed = np.argwhere(g.allowed)  # (cells, k) original codes
        small = np.stack([m[allowed[:, j]] for j, m in enumerate(maps)], axis=1)
        row_small = np.stack([m[codes[bad, c]] for m, c in zip(maps, g.cols)], axis=1)
        for cell in np.unique(row_small, axis=0):
            rows = bad[np.all(row_small == cell, axis=1)]
            choices = allowed[np.all(small == cell, axis=1)]
            if not len(choices):
                continue  # the merged cell holds no allowed combination: rejection decides
            pick = choices[stream.uniform_int(len(choices), rows.size)]
            codes[np.ix_(rows, g.cols)] = pick

    def _repair(self, g: Group, codes: np.ndarray, rows: np.ndarray) -> None:
        rows = rows[~g.holds(codes[rows])] if rows.size else rows
        if not rows.size:
            return
        allowed = np.argwhere(g.allowed)
        for r in rows:
            changed = (allowed != codes[r, list(g.cols)]).sum(axis=1)
            codes[r, list(g.cols)] = allowed[int(np.argmin(changed))]
        self.stated["repaired_rows"] += int(rows.size)

    # ---- values
    def keep_values(self, x: np.ndarray, codes: np.ndarray, stream: NoiseStream) -> np.ndarray:
        """Encoded rows (``domain.rows_of``) whose numeric values keep every order rule, the codes unchanged."""
        layout = dict((c.name, at) for c, at in self.schema.layout())
        for o in self.orders:
            at = [layout[n] for n in o.names]
            sub = codes[:, o.index]
            lo, hi, null = o.bounds(sub)
            values = np.stack(
                [decoded_values(c, x[:, a], n in self.integers) for c, a, n in zip(o.cols, at, o.names)], axis=1
            )
            bad = np.flatnonzero(~o.holds(values, null))
            if bad.size:
                values[bad] = _draw_in_order(o, lo[bad], hi[bad], null[bad], stream)
                self.stated["values_redrawn"] += int(bad.size)
                for j, (c, a) in enumerate(zip(o.cols, at)):
                    live = bad[~null[bad, j]]
                    x[live, a] = encoded(c, values[live, j])
            _nudge(o, x, at, null, self.integers)
        return x


def _draw_in_order(o: OrderGroup, lo, hi, null, stream: NoiseStream) -> np.ndarray:
    """Values for rows whose bins allow the rules: column by column, uniform within what is left."""
    k = lo.shape[1]
    lo, hi = lo.copy(), hi.copy()
    for j in range(k):
        if not propagate(lo, hi, null, o.pairs, o.integer, k + 1).all():
            raise RuntimeError("rules: a row's bins leave its order rules no value (the code step keeps them)")
        u = stream.uniform(len(lo))
        if o.integer[j]:
            v = lo[:, j] + np.minimum(np.floor(u * (hi[:, j] - lo[:, j] + 1)), hi[:, j] - lo[:, j])
        else:
            v = lo[:, j] + u * (hi[:, j] - lo[:, j])
        lo[:, j] = hi[:, j] = np.where(null[:, j], lo[:, j], v)
    return lo


def _nudge(o: OrderGroup, x: np.ndarray, at: list, null: np.ndarray, integers: frozenset) -> None:
    """Float32 steps where encoding rounded a decoded value across a rule's bound."""
    for _ in range(NUDGE_STEPS):
        values = np.stack([decoded_values(c, x[:, a], n in integers) for c, a, n in zip(o.cols, at, o.names)], axis=1)
        bad = ~o.holds(values, null)
        if not bad.any():
            return
        for big, small in o.pairs:
            b = values[:, big] if isinstance(big, int) else big
            s = values[:, small] if isinstance(small, int) else small
            rows = bad & (b < s)
            if isinstance(big, int):
                rows &= ~null[:, big]
                x[rows, at[big]] = np.nextafter(x[rows, at[big]], np.float32(2.0))
            if isinstance(small, int):
                rows &= ~null[:, small]
                x[rows, at[small]] = np.nextafter(x[rows, at[small]], np.float32(-1.0))
    raise RuntimeError("rules: float32 rounding of the encoded values keeps breaking an order rule")


def _reachable(groups: list, dom: Domain) -> list[np.ndarray]:
    """Per column of ``dom``, the codes some allowed combination of ``groups`` holds (every code of a column that no
    group names)."""
    out = [np.ones(s, bool) for s in dom.sizes]
    for g in groups:
        for j, c in enumerate(g.cols):
            out[c] &= g.allowed.any(axis=tuple(k for k in range(len(g.cols)) if k != j))
    return out


def _merged(groups: list, dom: Domain) -> list:
    """Groups that share a column joined into one (their tables ANDed over the union of columns)."""
    out: list = []
    for g in groups:
        for h in [h for h in out if set(h.cols) & set(g.cols)]:
            out.remove(h)
            g = _join(g, h, dom)
        out.append(g)
    return out


def _join(a: Group, b: Group, dom: Domain) -> Group:
    cols = tuple(sorted(set(a.cols) | set(b.cols)))
    shape = tuple(dom.sizes[c] for c in cols)
    if math.prod(shape) > MAX_GROUP_CELLS:
        raise PlanError(f"rules: the rules tie {len(cols)} columns together ({math.prod(shape)} combinations of codes)")

    def spread(g: Group) -> np.ndarray:  # g.cols ascending, as cols
        return g.allowed.reshape([dom.sizes[c] if c in g.cols else 1 for c in cols])

    return Group(cols, np.broadcast_to(spread(a) & spread(b), shape).copy())


def kept_rules(
    schema, dom: Domain, integers: frozenset = frozenset(), absent: Optional[dict] = None
) -> Optional[KeptRules]:
    """The rules of ``schema`` on ``dom`` and the residual codes ``absent`` (``residual.absent_codes``) as rules that
    forbid them, or None where there are neither."""
    return KeptRules(schema, dom, integers, absent) if getattr(schema, "rules", None) or absent else None
