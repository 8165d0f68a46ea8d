"""A table's public rules (``schemas.rules``) on decoded rows: which rows keep each rule, and the repair that makes the
mixing mechanisms' decoded rows keep them all (post-processing of released rows, no budget).

The marginals mechanism keeps the rules while it samples (``mechanisms.marginals.rules``); the mixing mechanisms'
rows are means of records plus noise, decoded column by column, so a row can break a rule. Their repair, row by row
(a row that keeps every rule is left as it is):
- implications, given the released scores (``scores_of``): a row outside a group of implications has that group's
  columns decoded again jointly, from the product of the probabilities ``sample`` decoding gave each column's values,
  restricted to the allowed combinations and renormalised (``sample``: drawn with a uniform of the noise module;
  ``argmax``: the most probable allowed combination). Redrawing only the rows outside from that restricted law is
  rejection sampling's result: the decoding conditioned on the rules. Without scores, or where they give every allowed
  combination probability 0: the allowed combination nearest the row's own (fewest columns changed; a numeric
  column is not moved from null to a value where a combination keeps it null; ties: the first in declaration order);
- order rules: a row that breaks one has the numeric columns of that group clipped, one after the other, to what the
  rules and the columns before it leave (bounds propagation, integers rounded): the smallest move of each value that
  keeps every rule.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpcda.schemas.rules import (
    Implication,
    allowed_states,
    implication_groups,
    order_groups,
    order_pairs,
    pairs_hold,
    propagate,
    state_indices,
    value_states,
)


def _columns(schema) -> dict:
    return {c.name: c for c in (*schema.columns, schema.label)}


def _values(table: pa.Table, name: str) -> pa.Array:
    arr = table.column(name).combine_chunks()
    return arr.cast(arr.type.value_type) if pa.types.is_dictionary(arr.type) else arr


def states(table: pa.Table, col) -> np.ndarray:
    """Each row's index in ``value_states(col)`` (a category, False/True, 'a number'; null last where nullable)."""
    arr = _values(table, col.name)
    null = np.asarray(arr.is_null())
    kind = getattr(col, "kind", "categorical")
    if kind == "categorical":
        lookup = pa.array(col.categories, type=arr.type)
        out = pc.index_in(arr, value_set=lookup).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    elif kind == "boolean":
        out = arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    else:
        out = np.zeros(len(arr), np.int64)
    return np.where(null, len(value_states(col)) - 1, out)


def numbers(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64, null mask) of a numeric column."""
    arr = _values(table, name)
    null = np.asarray(arr.is_null())
    return arr.cast(pa.float64(), safe=False).fill_null(0.0).to_numpy(zero_copy_only=False), null


def rule_holds(table: pa.Table, schema) -> np.ndarray:
    """(rows, rules) bool: where each of ``schema.rules`` holds on the decoded ``table``."""
    cols = _columns(schema)
    out = np.ones((table.num_rows, len(schema.rules)), bool)
    for i, rule in enumerate(schema.rules):
        if isinstance(rule, Implication):
            fires, holds = np.ones(table.num_rows, bool), np.ones(table.num_rows, bool)
            for conds, acc in ((rule.when, fires), (rule.then, holds)):
                for name, values in conds:
                    acc &= np.isin(states(table, cols[name]), state_indices(cols[name], values, "rules"))
            out[:, i] = ~fires | holds
        else:
            big, small = rule.as_geq()
            b, bn = numbers(table, big) if isinstance(big, str) else (big, False)
            s, sn = numbers(table, small) if isinstance(small, str) else (small, False)
            out[:, i] = bn | sn | (b >= s)
    return out


def scores_of(x01: np.ndarray, labels: np.ndarray, schema) -> dict:
    """Column name -> (rows, states) probabilities of its ``value_states`` as ``sample`` decoding draws them from the
    released encoded rows ``x01`` (``storage.tables.decode_rows``): a category in proportion to its positive score
    (uniform where none is), a boolean true with its score clipped to [0, 1], a null with its indicator's; the label
    from its scores (rows, K), or its class indices."""
    out = {}
    for col, at in schema.layout():
        block = np.asarray(x01[:, at : at + col.width], np.float64)
        body = block[:, : col.width - int(col.nullable)]
        if col.kind == "categorical":
            w = np.clip(body, 0.0, None)
            total = w.sum(axis=1, keepdims=True)
            p = np.where(total > 0, w / np.where(total > 0, total, 1.0), 1.0 / w.shape[1])
        elif col.kind == "boolean":
            t = np.clip(body[:, 0], 0.0, 1.0)
            p = np.stack([1.0 - t, t], axis=1)
        else:
            p = np.ones((len(block), 1))
        if col.nullable:
            null = np.clip(block[:, -1], 0.0, 1.0)[:, None]
            p = np.concatenate([p * (1.0 - null), null], axis=1)
        out[col.name] = p
    labels = np.asarray(labels)
    if labels.ndim == 2:
        w = np.clip(labels.astype(np.float64), 0.0, None)
        total = w.sum(axis=1, keepdims=True)
        out[schema.label.name] = np.where(total > 0, w / np.where(total > 0, total, 1.0), 1.0 / w.shape[1])
    else:
        out[schema.label.name] = np.eye(schema.num_classes)[labels.astype(np.int64)]
    return out


def _joint(names, numeric, allowed: np.ndarray, have: np.ndarray, rows: np.ndarray, scores: dict, draws) -> np.ndarray:
    """Allowed combinations (indices into ``allowed``) for ``rows``: drawn from the product of the columns'
    probabilities restricted to ``allowed`` (``draws``: uniforms; None: the most probable), -1 where it has no mass."""
    p = np.ones((rows.size, len(allowed)))
    for j, n in enumerate(names):
        p *= scores[n][rows][:, allowed[:, j]]
        if numeric[j]:  # a null numeric value stays null: the repair has no value to give it
            p *= ~((have[rows, j] == 1)[:, None] & (allowed[None, :, j] == 0))
    total = p.sum(axis=1)
    if draws is None:
        pick = p.argmax(axis=1)
    else:
        cdf = np.cumsum(p, axis=1)
        pick = (cdf < (draws[rows] * total)[:, None]).sum(axis=1).clip(0, len(allowed) - 1)
    return np.where(total > 0, pick, -1)


def keep_rules(table: pa.Table, schema, scores: dict | None = None, draws: np.ndarray | None = None) -> pa.Table:
    """``table`` (decoded rows) repaired so that every row keeps every rule (the module's docstring says how).
    ``scores``: ``scores_of`` the released rows; ``draws``: (rows,) uniforms (``sample`` decoding) or None."""
    if not schema.rules or not table.num_rows:
        return table
    cols = _columns(schema)
    arrays = {name: table.column(name) for name in table.column_names}
    for names, rules in implication_groups([r for r in schema.rules if isinstance(r, Implication)]):
        ok = allowed_states(names, rules, cols)
        have = np.stack([states(table, cols[n]) for n in names], axis=1)
        bad = np.flatnonzero(~ok[tuple(have.T)])
        if not bad.size:
            continue
        allowed = np.argwhere(ok)
        nulls = np.array([getattr(cols[n], "kind", "") == "numeric" for n in names])
        new = have.copy()
        pick = _joint(names, nulls, allowed, have, bad, scores, draws) if scores is not None else np.full(bad.size, -1)
        new[bad[pick >= 0]] = allowed[pick[pick >= 0]]
        for r in bad[pick < 0]:
            changed = (allowed != have[r]).sum(axis=1)
            unnull = (nulls & (have[r] == 1) & (allowed[:, :] == 0)).any(axis=1)  # numeric: state 1 is null
            cost = changed + np.where(unnull, len(names) + 1, 0)
            new[r] = allowed[int(np.argmin(cost))]
        for j, n in enumerate(names):
            rows = bad[new[bad, j] != have[bad, j]]
            if rows.size:
                arrays[n] = _set_states(table.column(n), cols[n], rows, new[rows, j])
        table = pa.Table.from_arrays([arrays[n] for n in table.column_names], schema=table.schema)
    for names, rules in order_groups(schema.rules):
        table = _keep_order(table, schema, names, rules)
    return table


def _set_states(column, col, rows: np.ndarray, new: np.ndarray) -> pa.Array:
    arr = column.combine_chunks()
    t = arr.type
    py = arr.to_pylist()
    states_ = value_states(col)
    for r, s in zip(rows, new):
        state = states_[s]
        if state is None:
            py[r] = None
        elif getattr(col, "kind", "categorical") == "numeric":
            py[r] = col.lower if py[r] is None else py[r]  # null -> a value: the lower bound (no nearer one exists)
        elif getattr(col, "kind", "categorical") == "boolean":
            py[r] = bool(state) if pa.types.is_boolean(t) else int(state)
        else:
            py[r] = state
    if pa.types.is_dictionary(t):
        return pa.array(py, type=t.value_type).dictionary_encode().cast(t)
    return pa.array(py, type=t)


def _keep_order(table: pa.Table, schema, names: list, rules: list) -> pa.Table:
    cols = _columns(schema)
    got = [numbers(table, n) for n in names]
    values = np.stack([v for v, _ in got], axis=1)
    null = np.stack([m for _, m in got], axis=1)
    pairs = order_pairs(names, rules)
    holds = pairs_hold(values, null, pairs)
    bad = np.flatnonzero(~holds)
    if not bad.size:
        return table
    integer = np.array([pa.types.is_integer(table.schema.field(n).type) for n in names])
    lo = np.tile([cols[n].lower for n in names], (bad.size, 1)).astype(np.float64)
    hi = np.tile([cols[n].upper for n in names], (bad.size, 1)).astype(np.float64)
    k = len(names)
    for j in range(k):
        propagate(lo, hi, null[bad], pairs, integer, k + 1)
        v = np.clip(values[bad, j], lo[:, j], hi[:, j])
        lo[:, j] = hi[:, j] = np.where(null[bad, j], lo[:, j], v)
    arrays = {n: table.column(n) for n in table.column_names}
    for j, n in enumerate(names):
        v = values[:, j].copy()
        v[bad] = np.where(null[bad, j], v[bad], lo[:, j])
        t = table.schema.field(n).type
        arr = pa.array(v).cast(t, safe=False)
        arrays[n] = pc.if_else(pa.array(null[:, j]), pa.nulls(len(v), type=t), arr)
    return pa.Table.from_arrays([arrays[n] for n in table.column_names], schema=table.schema)
