"""What the DP domain step has to derive, decided before any row is read: from the input's Arrow schema (public) and
the user's declarations (public) only. No footer statistic is read here (dictionary page sizes, value, null and
distinct counts, min/max are functions of the rows): a near-unique string column (an ID, free text) is refused after
the DP step, from its DP output (``derive.complete``).

Every input column that the ``table:`` section neither declares nor drops is derived by its Arrow type: a boolean is
a boolean (its values are public), an integer, float, date or timestamp a numeric column (range, bins and spikes
from DP), a string a categorical column (categories from DP, the rest in an "other" bucket); the label's categories
likewise (a boolean label's are public). A declared numeric column with ``loose: true`` has its range, bins and
spikes derived inside its limits. Anything else is refused by name, with the flag that leaves it out.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pyarrow as pa

from dpcda.mechanisms.domain.grid import Coarse, Fine
from dpcda.schemas.table import Column, SchemaError, TableSchema, is_temporal, physical_integer


@dataclasses.dataclass(frozen=True)
class Derived:
    """One column whose domain the step derives: ``kind`` numeric or categorical (``label``: the label's
    categories), its Arrow type, and for numeric columns the coarse grid (declared loose limits included)."""

    name: str
    kind: str  # numeric, categorical or label
    type: pa.DataType
    nullable: bool
    coarse: Optional[Coarse] = None

    @property
    def integer(self) -> bool:
        return pa.types.is_integer(physical_integer(self.type))


@dataclasses.dataclass(frozen=True)
class DomainRequest:
    """The columns to derive (in the input's order, the label last), the declared schema they complete, and the
    columns whose domain is public without a measurement (undeclared booleans, a boolean label)."""

    declared: TableSchema
    derive: tuple[Derived, ...]
    booleans: tuple[Column, ...]
    order: tuple[str, ...]  # the input's columns
    label_categories: Optional[list] = None  # a boolean label's

    @property
    def numeric(self) -> tuple[Derived, ...]:
        return tuple(d for d in self.derive if d.kind == "numeric")

    @property
    def counted(self) -> tuple[Derived, ...]:
        """The columns whose values are counted and thresholded: every derived column (categories, the label's,
        numeric spikes)."""
        return self.derive

    @property
    def coarse_cells(self) -> int:
        return sum(d.coarse.cells for d in self.numeric)

    @property
    def fine_cells(self) -> int:
        return Fine(0.0, 1.0, False).cells * len(self.numeric)

    @property
    def empty(self) -> bool:
        return not self.derive and not self.booleans and self.label_categories is None


def supported(t: pa.DataType) -> Optional[str]:
    """The kind an undeclared column of type ``t`` gets, or None where it cannot be synthesised."""
    if pa.types.is_dictionary(t):
        return "categorical" if pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type) else None
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or is_temporal(t):
        return "numeric"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "categorical"
    return None


def request(declared: TableSchema, arrow: pa.Schema) -> DomainRequest:
    """The domain step's work for ``declared`` (a table: section, possibly partial) on an input of schema ``arrow``;
    SchemaError, naming the column and the flag that leaves it out, for a column whose type cannot be synthesised."""
    names = arrow.names
    for n in names:
        if names.count(n) > 1:
            raise SchemaError(f"input: column '{n}' appears {names.count(n)} times; names must be unique")
    for n in [*(c.name for c in declared.columns), declared.label.name, *declared.drop]:
        if n not in names:
            raise SchemaError(f"table column '{n}' is declared but the input has no such column")
    derive, booleans = [], []
    for name in declared.undeclared(arrow):
        field = arrow.field(name)
        kind = supported(field.type)
        if kind is None:
            raise SchemaError(
                f"column '{name}': type {field.type} cannot be synthesised (integers, floats, booleans, strings, dates "
                f"and timestamps can); leave it out with --drop-columns {name}"
            )
        if kind == "boolean":
            booleans.append(Column(name=name, kind="boolean", nullable=field.nullable))
        elif kind == "numeric":
            derive.append(Derived(name, kind, field.type, field.nullable, Coarse.of(field.type)))
        else:
            derive.append(Derived(name, kind, field.type, field.nullable))
    for c in declared.columns:
        if c.loose:
            field = arrow.field(c.name)
            if supported(field.type) != "numeric":
                raise SchemaError(
                    f"column '{c.name}': declared numeric with loose limits, but its type is {field.type}"
                )
            limits = (float(c.lower), float(c.upper))
            derive.append(Derived(c.name, "numeric", field.type, c.nullable, Coarse.of(field.type, limits)))
    label_categories = None
    if declared.label.categories is None:
        t = arrow.field(declared.label.name).type
        kind = supported(t)
        if kind == "boolean":
            label_categories = [False, True]
        elif kind == "categorical" or pa.types.is_integer(t):
            derive.append(Derived(declared.label.name, "label", t, True))
        else:
            raise SchemaError(
                f"label '{declared.label.name}': type {t}; a label is a string, integer or boolean column (or declare "
                "its categories)"
            )
    order = {n: i for i, n in enumerate(names)}
    derive.sort(key=lambda d: (d.kind == "label", order[d.name]))
    return DomainRequest(declared, tuple(derive), tuple(booleans), tuple(names), label_categories)
