"""Public rules of a table: structural facts about its domain that every released row keeps.

A rule is public, like the rest of the ``table:`` section: it comes from how the domain works (a customer without
internet service has no online backup; a total bill is never below one month's), never from the rows. Keeping it is
post-processing of the release's DP output, so it costs no budget.

Two forms, both mappings (no expression language: every name and value is checked against the declared columns):

- implication: ``{if: {COL: VALUE, ...}, then: {COL: VALUE, ...}}``. A VALUE is one of the column's values (a
  category, true/false or 0/1 for a boolean), ``null`` (the column is null), or a list of such (any of them). The
  rule holds on a row where some ``if`` condition fails or every ``then`` condition holds. A condition on a value is
  false where the column is null, unless the list names ``null``. A numeric column takes ``null`` only (its values
  are compared by the second form).
- order: ``{column: A, ">=": B}`` or ``{column: A, "<=": B}``, A a numeric column, B a numeric column or a number.
  It holds where A or B is null (nothing to compare, as SQL's CHECK), or where the comparison is true.

Refused before any work (``SchemaError``, one line): an unknown column, a value outside a column's declared values, a
null for a column that is not nullable, a comparison of a column that is not numeric, a column on both sides of one
rule, and rules that contradict the domain or each other: implications that leave a declared value (a category, a
boolean, a null of a nullable column) no possible row, or order rules that leave a numeric column no value within its
bounds.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

ORDER_OPS = (">=", "<=")
MAX_RULE_STATES = 1 << 20  # combinations of the columns one group of implications ties together, enumerated once


class Implication(BaseModel):
    """``if`` every condition of ``when`` holds, every condition of ``then`` holds. A condition: column -> the
    values (None: null) it may take."""

    model_config = ConfigDict(frozen=True)

    when: tuple[tuple[str, tuple[Any, ...]], ...]
    then: tuple[tuple[str, tuple[Any, ...]], ...]

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data):
        if isinstance(data, dict) and "when" in data:
            return data
        if not isinstance(data, dict) or set(data) != {"if", "then"}:
            raise ValueError("an implication is {if: {COLUMN: VALUE, ...}, then: {COLUMN: VALUE, ...}}")
        out = {}
        for key, field in (("if", "when"), ("then", "then")):
            side = data[key]
            if not isinstance(side, dict) or not side:
                raise ValueError(f"'{key}' must map at least one column to a value, null or a list of them")
            conds = []
            for name, value in side.items():
                values = tuple(value) if isinstance(value, list) else (value,)
                if not values:
                    raise ValueError(f"'{key}': column '{name}' lists no value")
                if any(isinstance(v, (dict, list, float)) for v in values):
                    raise ValueError(f"'{key}': column '{name}' takes a category, true/false, 0/1 or null")
                conds.append((str(name), values))
            out[field] = tuple(conds)
        return out

    @model_serializer
    def _dump(self) -> dict:
        def side(conds):
            return {name: (list(vs) if len(vs) > 1 else vs[0]) for name, vs in conds}

        return {"if": side(self.when), "then": side(self.then)}

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.when) + tuple(n for n, _ in self.then)


class Order(BaseModel):
    """``column`` ``op`` ``other`` (a numeric column's name, or a number); true where either side is null."""

    model_config = ConfigDict(frozen=True)

    column: str
    op: str
    other: str | float

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data):
        if isinstance(data, dict) and "op" in data:
            return data
        ops = [k for k in data if k in ORDER_OPS] if isinstance(data, dict) else []
        if not isinstance(data, dict) or "column" not in data or len(ops) != 1 or len(data) != 2:
            raise ValueError('an order rule is {column: A, ">=": B} or {column: A, "<=": B} (B a column or a number)')
        other = data[ops[0]]
        if isinstance(other, bool) or not isinstance(other, (str, int, float)):
            raise ValueError(f"'{ops[0]}' takes a numeric column's name or a number")
        if not isinstance(other, str) and not math.isfinite(other):
            raise ValueError(f"'{ops[0]}' takes a finite number")
        return {"column": str(data["column"]), "op": ops[0], "other": other if isinstance(other, str) else float(other)}

    @model_serializer
    def _dump(self) -> dict:
        other = self.other
        if isinstance(other, float) and other.is_integer():
            other = int(other)
        return {"column": self.column, self.op: other}

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column,) + ((self.other,) if isinstance(self.other, str) else ())

    def as_geq(self) -> tuple[str | float, str | float]:
        """(greater, smaller): the rule as ``greater >= smaller``."""
        return (self.column, self.other) if self.op == ">=" else (self.other, self.column)


def parse_rule(data) -> Implication | Order:
    if isinstance(data, (Implication, Order)):
        return data
    if isinstance(data, dict) and ("if" in data or "then" in data):
        return Implication.model_validate(data)
    if isinstance(data, dict) and "column" in data:
        return Order.model_validate(data)
    raise ValueError('a rule is {if: {...}, then: {...}} or {column: A, ">=" or "<=": B}')


def _same(a, b) -> bool:
    """A declared value and a rule's value are the same (bool and int apart, as the schema keeps them)."""
    return type(a) is type(b) and a == b


def value_states(col) -> list:
    """The values a rule can tell apart in a column (the label is categorical): its categories, False/True, or one
    'a number' state (``NUMBER``); then None for null where nullable."""
    kind = getattr(col, "kind", "categorical")
    if kind == "categorical":
        out = list(col.categories)
    elif kind == "boolean":
        out = [False, True]
    else:
        out = [NUMBER]
    return out + ([None] if getattr(col, "nullable", False) else [])


NUMBER = "<a number>"


def state_indices(col, values: tuple, where: str) -> list[int]:
    """Indices in ``value_states(col)`` of a rule's values for ``col``; ValueError for one it cannot take."""
    states = value_states(col)
    kind = getattr(col, "kind", "categorical")
    out = []
    for v in values:
        if v is None:
            if None not in states:
                raise ValueError(f"{where}: column '{col.name}' is not nullable; a rule cannot name its null")
            out.append(states.index(None))
        elif kind == "numeric":
            raise ValueError(
                f"{where}: numeric column '{col.name}' takes null only in an implication (compare its values with "
                f'{{column: {col.name}, ">=": ...}})'
            )
        elif kind == "boolean":
            if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
                out.append(int(v))
            else:
                raise ValueError(f"{where}: boolean column '{col.name}' takes true/false or 0/1, not {v!r}")
        else:
            hit = [i for i, c in enumerate(col.categories) if _same(c, v)]
            if not hit:
                raise ValueError(f"{where}: {v!r} is not one of column '{col.name}''s declared categories")
            out.append(hit[0])
    return sorted(set(out))


def check_rules(rules: list, columns: dict) -> None:
    """ValueError (one line, naming the rule) where ``rules`` do not fit the declared ``columns`` (name -> column,
    the label included) or contradict the domain or each other."""
    for i, rule in enumerate(rules):
        where = f"rules[{i}]"
        for name in rule.columns:
            if name not in columns:
                raise ValueError(f"{where}: no column '{name}' is declared")
        if isinstance(rule, Implication):
            names = rule.columns
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{where}: column '{dup[0]}' appears twice (in if and then, or twice on one side)")
            for name, values in rule.when + rule.then:
                state_indices(columns[name], values, where)
        else:
            for name in rule.columns:
                if getattr(columns[name], "kind", "categorical") != "numeric":
                    raise ValueError(f"{where}: column '{name}' is not numeric; order rules compare numeric columns")
            if rule.other == rule.column:
                raise ValueError(f"{where}: column '{rule.column}' is compared with itself")
    _check_implications([r for r in rules if isinstance(r, Implication)], columns, rules)
    feasible_intervals([r for r in rules if isinstance(r, Order)], columns)


def implication_groups(implications: list) -> list[tuple[tuple[str, ...], list]]:
    """The implications in groups that share columns (connected components): (columns in first-seen order, rules)."""
    groups: list[tuple[list, list]] = []
    for rule in implications:
        cols = list(dict.fromkeys(rule.columns))
        hit = [g for g in groups if set(g[0]) & set(cols)]
        merged_cols, merged_rules = cols, [rule]
        for g in hit:
            merged_cols = list(dict.fromkeys(g[0] + merged_cols))
            merged_rules = g[1] + merged_rules
            groups.remove(g)
        groups.append((merged_cols, merged_rules))
    return [(tuple(c), r) for c, r in groups]


def allowed_states(names: tuple, rules: list, columns: dict) -> np.ndarray:
    """A boolean array over the product of ``value_states`` of ``names``: True where every rule of ``rules`` holds."""
    shape = tuple(len(value_states(columns[n])) for n in names)
    cells = math.prod(shape)
    if cells > MAX_RULE_STATES:
        raise ValueError(
            f"rules: implications tie columns {', '.join(names[:4])}{', ...' if len(names) > 4 else ''} together "
            f"({cells} combinations, more than {MAX_RULE_STATES}); split them or declare fewer"
        )
    ok = np.ones(shape, bool)
    axis = {n: k for k, n in enumerate(names)}
    for rule in rules:
        fires = np.ones(shape, bool)
        holds = np.ones(shape, bool)
        for conds, acc in ((rule.when, fires), (rule.then, holds)):
            for name, values in conds:
                member = np.zeros(shape[axis[name]], bool)
                member[state_indices(columns[name], values, "rules")] = True
                view = [1] * len(shape)
                view[axis[name]] = shape[axis[name]]
                acc &= member.reshape(view)
        ok &= ~fires | holds
    return ok


def _check_implications(implications: list, columns: dict, rules: list) -> None:
    for names, group in implication_groups(implications):
        ok = allowed_states(names, group, columns)
        for k, name in enumerate(names):
            possible = ok.any(axis=tuple(a for a in range(ok.ndim) if a != k))
            for s, state in enumerate(value_states(columns[name])):
                if not possible[s]:
                    what = "null" if state is None else "a number" if state is NUMBER else repr(state)
                    first = rules.index(group[0])
                    raise ValueError(
                        f"rules[{first}]: the rules leave no row where column '{name}' is {what}, a value its "
                        f"declaration allows: they contradict the domain or each other"
                    )


def feasible_intervals(orders: list, columns: dict) -> dict:
    """Column -> [low, high]: the values each numeric column of ``orders`` can take within its bounds while every
    order rule holds (bounds propagation, complete for rules of the form a >= b and a >= c); ValueError where one is
    left none."""
    lo = {n: columns[n].lower for r in orders for n in r.columns}
    hi = {n: columns[n].upper for r in orders for n in r.columns}
    pairs = [r.as_geq() for r in orders]
    for _ in range(len(lo) + 1):
        changed = False
        for big, small in pairs:
            s_lo = small if not isinstance(small, str) else lo[small]
            b_hi = big if not isinstance(big, str) else hi[big]
            if isinstance(big, str) and s_lo > lo[big]:
                lo[big], changed = s_lo, True
            if isinstance(small, str) and b_hi < hi[small]:
                hi[small], changed = b_hi, True
        if not changed:
            break
    for n in lo:
        if lo[n] > hi[n]:
            first = next(i for i, r in enumerate(orders) if n in r.columns)
            raise ValueError(
                f"rules: the order rules leave column '{n}' no value within its bounds [{columns[n].lower:g}, "
                f"{columns[n].upper:g}] (first named by order rule {first}): they contradict the domain or each other"
            )
    return {n: (lo[n], hi[n]) for n in lo}


def order_closure(orders: list) -> list[tuple]:
    """Every (greater, smaller) the order rules imply through chains (a >= b and b >= c: a >= c; a >= b and b >= 5:
    a >= 5), where one side at least is a column: values within given intervals satisfy every rule at once where
    they can satisfy each of these pairs (the intervals' bounds propagation, ``feasible_intervals``)."""
    pairs = {r.as_geq() for r in orders}
    nodes = sorted({n for p in pairs for n in p}, key=repr)
    for mid in nodes:  # Floyd-Warshall: the middle node outermost
        for a in nodes:
            if (a, mid) in pairs:
                pairs |= {(a, b) for b in nodes if b != a and (mid, b) in pairs}
    return sorted((p for p in pairs if isinstance(p[0], str) or isinstance(p[1], str)), key=repr)


def propagate(lo, hi, null, pairs, integer, passes: int):
    """Bounds propagation of ``pairs`` ((big, small): column positions or constants) over rows: lo/hi (rows, k)
    narrowed in place; a pair with a null side is void. Feasible rows: lo <= hi everywhere."""
    for _ in range(passes):
        for big, small in pairs:
            if isinstance(big, int) and isinstance(small, int):
                live = ~null[:, big] & ~null[:, small]
                lo[:, big] = np.where(live, np.maximum(lo[:, big], lo[:, small]), lo[:, big])
                hi[:, small] = np.where(live, np.minimum(hi[:, small], hi[:, big]), hi[:, small])
            elif isinstance(big, int):
                lo[:, big] = np.where(null[:, big], lo[:, big], np.maximum(lo[:, big], small))
            else:
                hi[:, small] = np.where(null[:, small], hi[:, small], np.minimum(hi[:, small], big))
        lo[:, integer] = np.ceil(lo[:, integer])
        hi[:, integer] = np.floor(hi[:, integer])
    return np.all((lo <= hi) | null, axis=1)


def pairs_hold(values: np.ndarray, null: np.ndarray, pairs: list) -> np.ndarray:
    """Rows (values, null: (rows, k)) where every (big, small) of ``pairs`` (positions or constants) holds: true
    where either side is null."""
    ok = np.ones(len(values), bool)
    for big, small in pairs:
        b = values[:, big] if isinstance(big, int) else big
        s = values[:, small] if isinstance(small, int) else small
        void = np.zeros(len(values), bool)
        for side in (big, small):
            if isinstance(side, int):
                void |= null[:, side]
        ok &= void | (b >= s)
    return ok


def order_pairs(names: list, rules: list) -> list:
    """The order rules of a group as (big, small) pairs of positions in ``names`` or constants."""
    pos = {n: k for k, n in enumerate(names)}
    return [tuple(pos[s] if isinstance(s, str) else float(s) for s in r.as_geq()) for r in rules]


def order_groups(rules: list) -> list:
    """Order rules in groups of the columns they tie (a constant ties nothing): (column names, rules)."""
    groups: list = []
    for r in [r for r in rules if isinstance(r, Order)]:
        cols = list(r.columns)
        hit = [g for g in groups if set(g[0]) & set(cols)]
        names, rs = cols, [r]
        for g in hit:
            names, rs = list(dict.fromkeys(g[0] + names)), g[1] + rs
            groups.remove(g)
        groups.append((names, rs))
    return groups


def optional_rules(value: Optional[list]) -> list:
    return [parse_rule(r) for r in (value or [])]
