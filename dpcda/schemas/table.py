"""A table's public schema: which column is the label, and each feature column's kind, bounds and categories.

Everything here is *public*: the user declares it (the ``table:`` section of the config file, possibly for some
columns only), confirms a draft that ``dpcda schema infer`` wrote from the Parquet schema alone, or the release's DP
domain step derives it (``mechanisms.domain``: ranges, bin edges, spikes and categories measured with DP, its cost
recorded in ``TableSchema.domain``). Bounds and category lists read off the data without DP would not be private, so
nothing in the product derives them from the rows any other way.

The encoding (``storage.tables``) maps a row to a vector in [0, 1]^d, d = ``encoded_width``:
- numeric: one value, (clip(v, lower, upper) - lower) / (upper - lower);
- boolean: one value, 0 or 1;
- categorical: one-hot over the declared categories (and, with ``other``, one more slot for every other value);
- a nullable column adds one indicator (1: null; its other values are then 0).
A numeric column may also name bin ``edges`` (else the marginals mechanism takes equal bins of its bounds) and
``spikes``, exact values with codes of their own that decode to themselves.
Every coordinate lies in [0, 1] whatever the record, so the mechanisms' sensitivity arguments hold for the encoded
rows with feature bounds [0, 1] and width d.
"""

from __future__ import annotations

import math
from typing import Any, Literal, Optional

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from dpcda.privacy.errors import DpcdaError
from dpcda.schemas.rules import check_rules, optional_rules

Category = bool | int | str
MAX_CATEGORIES = 1 << 12
MAX_ENCODED_WIDTH = 1 << 16


class SchemaError(DpcdaError, ValueError):
    """A table schema that cannot be used: the message names the column."""


def _without_unset(handler, model, fields: tuple[str, ...]) -> dict:
    """The model's dump without ``fields`` that hold their defaults (a declared schema's JSON, and so a manifest's
    ``input.table``, reads as it did before those fields existed)."""
    out = handler(model)
    for name in fields:
        if name in out and getattr(model, name) == type(model).model_fields[name].get_default(
            call_default_factory=True
        ):
            del out[name]
    return out


class Column(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    kind: Literal["numeric", "categorical", "boolean"]
    # strict: a number (an integer is one), never true/false or a string, which pydantic would read as 1.0 or 72
    lower: Optional[float] = Field(
        None, strict=True, description="numeric: public lower bound (values below are clipped)"
    )
    upper: Optional[float] = Field(
        None, strict=True, description="numeric: public upper bound (values above are clipped)"
    )
    categories: Optional[list[Category]] = Field(None, description="categorical: every value the column may hold")
    nullable: bool = Field(False, description="the column may hold nulls (encoded as an indicator)")
    loose: bool = Field(
        False,
        description="numeric: lower and upper are loose limits; the release's DP domain step derives the range, bin "
        "edges and spikes inside them (marginals only; a share of the budget)",
    )
    edges: Optional[list[float]] = Field(
        None,
        description="numeric: bin edges, lower first and upper last (a value on an edge is in the bin above it); [] "
        "with spikes: no bins. Default: the marginals mechanism's equal bins of the bounds",
    )
    spikes: Optional[list[float]] = Field(
        None, description="numeric: values (increasing, within the bounds) with codes of their own, decoded exactly"
    )
    other: Optional[str] = Field(
        None, description="categorical: a value outside the categories is counted in one more bucket, decoded as this"
    )

    @model_validator(mode="after")
    def _check(self):
        where = f"column '{self.name}'"
        if self.kind != "numeric" and (self.loose or self.edges is not None or self.spikes is not None):
            raise ValueError(f"{where}: loose, edges and spikes are for numeric columns")
        if self.kind != "categorical" and self.other is not None:
            raise ValueError(f"{where}: other is for categorical columns")
        if self.kind == "numeric":
            if self.lower is None or self.upper is None:
                raise ValueError(f"{where}: a numeric column needs public bounds lower and upper (confirm them)")
            if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
                raise ValueError(f"{where}: bounds must be finite")
            if not self.lower < self.upper:
                raise ValueError(f"{where}: bounds reversed or empty (lower {self.lower:g} >= upper {self.upper:g})")
            if not math.isfinite(self.upper - self.lower) or max(abs(self.lower), abs(self.upper)) > 1e300:
                raise ValueError(f"{where}: bounds too wide (|bounds| and upper - lower must stay finite)")
            if self.categories is not None:
                raise ValueError(f"{where}: a numeric column takes bounds, not categories")
            self._check_bins(where)
        elif self.kind == "categorical":
            if not self.categories and (self.other is None or self.categories is None):
                raise ValueError(f"{where}: a categorical column needs its public list of categories (confirm it)")
            if len(self.categories) > MAX_CATEGORIES:
                raise ValueError(f"{where}: more than {MAX_CATEGORIES} categories")
            if len({repr(c) for c in self.categories}) != len(self.categories):
                raise ValueError(f"{where}: a category is listed twice")
            if self.lower is not None or self.upper is not None:
                raise ValueError(f"{where}: a categorical column takes categories, not bounds")
            if self.other is not None and self.other in self.categories:
                raise ValueError(f"{where}: other {self.other!r} is also a category")
        elif self.lower is not None or self.upper is not None or self.categories is not None:
            raise ValueError(f"{where}: a boolean column takes neither bounds nor categories")
        return self

    def _check_bins(self, where: str) -> None:
        if self.loose and (self.edges is not None or self.spikes is not None):
            raise ValueError(f"{where}: loose limits are narrowed by the DP domain step; give no edges or spikes")
        spikes = self.spikes or []
        if any(not math.isfinite(v) for v in [*spikes, *(self.edges or [])]):
            raise ValueError(f"{where}: edges and spikes must be finite")
        if any(b <= a for a, b in zip(spikes, spikes[1:])) or (spikes and not self.lower <= spikes[0]):
            raise ValueError(f"{where}: spikes must increase and lie within the bounds")
        if spikes and not spikes[-1] <= self.upper:
            raise ValueError(f"{where}: spikes must increase and lie within the bounds")
        if self.edges is None:
            return
        if not self.edges:
            if not spikes:
                raise ValueError(f"{where}: edges [] (no bins) needs spikes")
            return
        e = self.edges
        if len(e) < 2 or e[0] != self.lower or e[-1] != self.upper or any(b <= a for a, b in zip(e, e[1:])):
            raise ValueError(f"{where}: edges must increase from lower to upper")

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        return _without_unset(handler, self, ("loose", "edges", "spikes", "other"))

    @property
    def derived(self) -> bool:
        """The DP domain step still has to derive this column's range, bins and spikes (``loose``)."""
        return self.loose

    @property
    def codes(self) -> Optional[int]:
        """Codes of a value other than null: categories (+ other), 2, or spikes + bins (None: equal bins, as many
        as the mechanism takes)."""
        if self.kind == "categorical":
            return len(self.categories) + (self.other is not None)
        if self.kind == "boolean":
            return 2
        if self.edges is None:
            return None
        return len(self.spikes or []) + max(len(self.edges) - 1, 0)

    @property
    def width(self) -> int:
        base = len(self.categories) + (self.other is not None) if self.kind == "categorical" else 1
        return base + int(self.nullable)


class Label(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    categories: Optional[list[Category]] = Field(
        None, description="the label's values; class k is categories[k] (omitted: derived by the DP domain step)"
    )
    unlisted: Literal["refuse", "drop"] = Field(
        "refuse",
        description="a record whose label is null or not a category: refused while reading (refuse), or left out of "
        "the synthesis (drop: the DP domain step's labels, which need not list every value)",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        return _without_unset(handler, self, ("unlisted",))

    @model_validator(mode="after")
    def _check(self):
        if self.categories is None:
            return self
        if len(self.categories) < 2:
            raise ValueError(f"label '{self.name}': needs its public list of at least 2 categories (confirm it)")
        if len({repr(c) for c in self.categories}) != len(self.categories):
            raise ValueError(f"label '{self.name}': a category is listed twice")
        return self


class DomainStep(BaseModel):
    """The release's DP domain step, as it ran (written by the release, never declared): its share of the zCDP
    budget, its event (``privacy.domain.DomainEvent``: noise stds, the value threshold and its delta) and the columns
    whose domain it derived. A release's budget planner composes the event with the rest."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    share: float = Field(gt=0, lt=1)
    event: dict
    derived: list[str]

    @model_validator(mode="after")
    def _check(self):
        self.to_event()
        return self

    def to_event(self):
        from dpcda.privacy.domain import DomainEvent

        try:
            return DomainEvent(**self.event)
        except TypeError as err:
            raise ValueError(f"domain.event: {err}") from None


class TableSchema(BaseModel):
    """The ``table:`` section of a release config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: Label
    columns: list[Column] = Field(
        default_factory=list,
        description="the declared columns (with marginals, an input column left out is derived by the DP domain step)",
    )
    drop: list[str] = Field(default_factory=list, description="input columns left out of the release (not read)")
    domain: Optional[DomainStep] = Field(None, description="written by the release: its DP domain step, if any")
    decoding: Literal["argmax", "sample"] = Field(
        "sample",
        description="how discrete values are read back from released scores: sample (default) draws them with "
        "probabilities from the scores (a category in proportion to its positive scores; a boolean true, or a null, "
        "with probability its score clipped to [0, 1]; the label, where the release has label scores, from them), "
        "so minorities keep their share; argmax takes the largest score (a category; a boolean or a null where its "
        "score exceeds 1/2; the label scores' argmax), which drops a value whose score stays below the others' "
        "(post-processing either way; the uniforms come from the noise module)",
    )
    rules: list[Any] = Field(
        default_factory=list,
        description="public rules every released row keeps (schemas.rules, docs/tables.md): implications "
        "{if: {COLUMN: VALUE}, then: {COLUMN: VALUE}} and order rules {column: A, '>=' or '<=': B}",
    )

    @field_validator("rules", mode="before")
    @classmethod
    def _parse_rules(cls, value):
        if value is not None and not isinstance(value, list):
            raise ValueError("rules must be a list of rules")
        out = []
        for i, rule in enumerate(value or []):
            try:
                out.append(optional_rules([rule])[0])
            except ValueError as err:  # pydantic's or ours: the rule's place and the first reason
                msg = str(err.errors()[0]["msg"]) if hasattr(err, "errors") else str(err)
                raise ValueError(f"rules[{i}]: {msg.removeprefix('Value error, ')}") from None
        return out

    @model_validator(mode="after")
    def _check(self):
        names = [c.name for c in self.columns] + [self.label.name]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"column '{dup[0]}' is declared twice (the label counts as a column)")
        both = sorted(set(names) & set(self.drop))
        if both:
            raise ValueError(f"column '{both[0]}' is both declared and dropped")
        if self.encoded_width > MAX_ENCODED_WIDTH:
            raise ValueError(f"the encoded width {self.encoded_width} exceeds {MAX_ENCODED_WIDTH}")
        self._check_rule_columns()
        check_rules(self.rules, {c.name: c for c in (*self.columns, self.label)})
        return self

    def _check_rule_columns(self) -> None:
        """A rule names declared columns on equal bins of their bounds (``mechanisms.marginals.rules``): not a label
        whose categories the DP domain step derives, nor a column with edges, spikes, an other bucket or loose
        limits."""
        named = {n for r in self.rules for n in r.columns}
        if self.label.name in named and self.label.categories is None:
            raise ValueError(f"rules: a rule on label '{self.label.name}' needs its categories declared")
        for c in self.columns:
            if c.name in named and (c.loose or c.edges is not None or c.spikes is not None or c.other is not None):
                raise ValueError(
                    f"rules: column '{c.name}' has edges, spikes, an other bucket or loose limits; a rule takes a "
                    "column on equal bins of its declared bounds"
                )

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        out = _without_unset(handler, self, ("drop", "domain"))
        if not self.rules:  # a schema without rules dumps as it did before they existed (manifests unchanged)
            out.pop("rules", None)
        else:
            out["rules"] = [r.model_dump() for r in self.rules]
        return out

    @property
    def encoded_width(self) -> int:
        return sum(c.width for c in self.columns)

    @property
    def num_classes(self) -> int:
        if self.label.categories is None:
            raise SchemaError(f"label '{self.label.name}': its categories are not declared (nor derived yet)")
        return len(self.label.categories)

    @property
    def complete(self) -> bool:
        """Every declared column and the label have their domain (nothing left for the DP domain step among them;
        input columns not declared are ``undeclared``)."""
        return self.label.categories is not None and not any(c.derived for c in self.columns)

    def undeclared(self, arrow_schema: pa.Schema) -> list[str]:
        """Input columns neither declared nor dropped, in the input's order."""
        known = {c.name for c in self.columns} | {self.label.name} | set(self.drop)
        return [n for n in arrow_schema.names if n not in known]

    def output_schema(self, arrow_schema: pa.Schema) -> pa.Schema:
        """The release's Arrow schema: the input's without the dropped columns."""
        return pa.schema([f for f in arrow_schema if f.name not in self.drop])

    def layout(self) -> list[tuple[Column, int]]:
        """(column, first encoded index) in order."""
        out, at = [], 0
        for c in self.columns:
            out.append((c, at))
            at += c.width
        return out

    def check_against(self, arrow_schema: pa.Schema, where: str) -> None:
        """Refuses a schema that does not fit the input's Arrow schema (metadata only: no row is read)."""
        names = arrow_schema.names
        declared = {c.name for c in self.columns} | {self.label.name} | set(self.drop)
        for n in names:
            if names.count(n) > 1:
                raise SchemaError(f"{where}: column '{n}' appears {names.count(n)} times; names must be unique")
        for n in [c.name for c in self.columns] + [self.label.name] + list(self.drop):
            if n not in names:
                raise SchemaError(f"{where}: table column '{n}' is declared but the input has no such column")
        extra = [n for n in names if n not in declared]
        if extra:
            raise SchemaError(
                f"{where}: input column '{extra[0]}' is not declared in the table schema (the release has the "
                f"input's columns: declare it, or drop it from the input)"
            )
        for c in self.columns:
            _check_type(c.kind, arrow_schema.field(c.name).type, f"{where}: column '{c.name}'")
            if c.kind == "numeric":
                _check_bounds_fit(c, arrow_schema.field(c.name).type, f"{where}: column '{c.name}'")
            if c.nullable and not arrow_schema.field(c.name).nullable:
                raise SchemaError(f"{where}: column '{c.name}' is declared nullable, but the input's field is not")
        _check_type("categorical", arrow_schema.field(self.label.name).type, f"{where}: label '{self.label.name}'")
        for c in (*self.columns, self.label):
            t = arrow_schema.field(c.name).type
            for v in [*(c.categories or ()), *([c.other] if getattr(c, "other", None) is not None else [])]:
                if not _category_fits(v, t):
                    raise SchemaError(f"{where}: column '{c.name}': declared category {v!r} does not fit type {t}")


def encode_numeric(col: Column, values) -> np.ndarray:
    """Numeric values of ``col`` as ``storage.tables.encode_batch`` encodes them: float32 of (v - lower) / (upper -
    lower), computed in float64 (before the clip to [0, 1])."""
    return ((np.asarray(values, np.float64) - col.lower) / (col.upper - col.lower)).astype(np.float32)


def is_temporal(t: pa.DataType) -> bool:
    """A date or timestamp: released as the integer it is stored as (days, milliseconds or its unit since the
    epoch), decoded back to its type."""
    return pa.types.is_date(t) or pa.types.is_timestamp(t)


def physical_integer(t: pa.DataType) -> pa.DataType:
    """The integer type a numeric column's values are counted and decoded in: itself, or a temporal type's storage."""
    if pa.types.is_date32(t):
        return pa.int32()
    if is_temporal(t):
        return pa.int64()
    return t


def _fits(kind: str, t: pa.DataType) -> bool:
    return {
        "numeric": pa.types.is_integer(t) or pa.types.is_floating(t) or is_temporal(t),
        "boolean": pa.types.is_boolean(t) or pa.types.is_integer(t),
        "categorical": pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_integer(t)
        or pa.types.is_boolean(t)
        or pa.types.is_dictionary(t),
    }[kind]


def _check_type(kind: str, t: pa.DataType, where: str) -> None:
    if not _fits(kind, t):
        raise SchemaError(f"{where}: declared {kind}, but its type is {t}")


def _int_range(t: pa.DataType) -> tuple[int, int]:
    bits = t.bit_width
    return (0, 2**bits - 1) if pa.types.is_unsigned_integer(t) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _category_fits(v, t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return isinstance(v, str)
    if pa.types.is_boolean(t):
        return isinstance(v, bool)
    if pa.types.is_integer(t):
        lo, hi = _int_range(t)
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    return False


FLOAT_MAX = {16: 65504.0, 32: 3.4028234663852886e38, 64: 1.7976931348623157e308}


def _check_bounds_fit(c: Column, t: pa.DataType, where: str) -> None:
    """Decoded values lie in [lower, upper]; that interval must be representable in the column's type."""
    t = physical_integer(t)
    if pa.types.is_integer(t):
        lo, hi = _int_range(t)
        if math.ceil(c.lower) > math.floor(c.upper):
            raise SchemaError(f"{where}: bounds [{c.lower:g}, {c.upper:g}] hold no integer, but the type is {t}")
        if math.ceil(c.lower) < lo or math.floor(c.upper) > hi:
            raise SchemaError(f"{where}: bounds [{c.lower:g}, {c.upper:g}] exceed the range of its type {t}")
    elif pa.types.is_floating(t) and max(abs(c.lower), abs(c.upper)) > FLOAT_MAX[t.bit_width]:
        raise SchemaError(f"{where}: bounds [{c.lower:g}, {c.upper:g}] exceed the range of its type {t}")


def parse_table_schema(data: dict, where: str = "table") -> TableSchema:
    from pydantic import ValidationError

    try:
        return TableSchema(**data)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        raise SchemaError(f"{where}{'.' + loc if loc else ''}: {msg}") from None
    except TypeError as err:
        raise SchemaError(f"{where}: must be a mapping with label and columns ({err})") from None


def infer_draft(arrow_schema: pa.Schema, label: Optional[str]) -> dict:
    """A draft ``table:`` section from the Arrow schema alone (types, names and nullability; no row is read).

    Bounds and categories are left empty on purpose: the user must fill them from public knowledge. A release with
    the draft as it is refuses to start and names the first column to confirm. Every column is drafted ``nullable:
    true`` unless its Arrow field is not nullable (the footer's schema, public): ``nullable: false`` is public
    knowledge about the domain (a null is impossible whoever is in the table), never a fact read off the rows (their
    null counts), which the manifest would publish with no guarantee covering it.
    """
    columns = []
    unreleasable = [f for f in arrow_schema if f.name != label and not _has_a_kind(f.type)]
    if unreleasable:  # the release refuses an undeclared column, and no kind takes these: drafting one would mislead
        f = unreleasable[0]
        raise SchemaError(
            f"column '{f.name}' has type {str(f.type)[:80]}, which no kind releases (numeric, boolean, categorical: "
            f"numbers, booleans, strings, dictionaries); {len(unreleasable)} such column(s) "
            f"({', '.join(u.name for u in unreleasable[:5])}): drop them from the input, or flatten them first"
        )
    for f in arrow_schema:
        if f.name == label:
            continue
        t = f.type
        if pa.types.is_boolean(t):
            col = {"name": f.name, "kind": "boolean"}
        elif pa.types.is_integer(t) or pa.types.is_floating(t):
            col = {"name": f.name, "kind": "numeric", "lower": None, "upper": None}
        else:
            col = {"name": f.name, "kind": "categorical", "categories": []}
        col["nullable"] = bool(f.nullable)  # the footer's schema (public); false only from public knowledge
        columns.append(col)
    return {"label": {"name": label or "CHOOSE_THE_LABEL_COLUMN", "categories": []}, "columns": columns}


def _has_a_kind(t: pa.DataType) -> bool:
    """Whether a column of Arrow type ``t`` can be declared with some kind (``check_against``'s rule)."""
    return any(_fits(kind, t) for kind in ("numeric", "boolean", "categorical"))
