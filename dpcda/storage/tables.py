"""Tables in and out: Parquet record batches <-> encoded blocks, by a public ``schemas.table.TableSchema``.

``encode_batch`` maps each row to [0, 1]^d (see ``schemas.table`` for the layout) and the label to its class index;
``decode_rows`` maps released rows back to a table with the input's Arrow schema. Decoding is post-processing of
released values; nothing here reads data it is not given.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpcda.schemas.table import Column, SchemaError, TableSchema, encode_numeric, is_temporal, physical_integer
from dpcda.storage.paths import open_file
from dpcda.storage.shards import Block, InputError, _one_line, parquet_file


def arrow_schema_of(path: str) -> pa.Schema:
    """The Arrow schema of a Parquet file, from its footer (no row is read); metadata dropped."""
    try:
        with open_file(path) as fh:
            pf = parquet_file(fh, path)
            # field metadata too: the output schema is this one, and metadata may carry statistics of the rows
            return pa.schema([f.remove_metadata() for f in pf.schema_arrow])
    except (pa.ArrowException, OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable Parquet shard ({_one_line(err)})") from None


def _values(col: pa.Array) -> pa.Array:
    if pa.types.is_dictionary(col.type):
        return col.cast(col.type.value_type)
    return col


def _category_codes(
    col: pa.Array, categories: list, path: str, name: str, first_row: int, unlisted: str = "refuse"
) -> np.ndarray:
    """Index of each value in ``categories`` (-1 for null); a value outside the list is refused, by row only
    (``unlisted`` "refuse"), coded ``len(categories)`` (``"other"``: the column's other bucket) or -2 (``"drop"``)."""
    values = _values(col)
    lookup = pa.array(categories, type=values.type) if len(values) else pa.array([], type=values.type)
    codes = pc.index_in(values, value_set=lookup)
    out = codes.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    outside = (out < 0) & ~np.asarray(values.is_null())
    if unlisted != "refuse":
        out[outside] = len(categories) if unlisted == "other" else -2
        return out
    missing = np.flatnonzero(outside)
    if missing.size:  # the value itself is private: name the row and the rule only
        raise InputError(
            f"{path}: column '{name}' row {first_row + int(missing[0])}: a value outside the declared categories"
        )
    return out


def encode_batch(batch: pa.RecordBatch | pa.Table, schema: TableSchema, path: str, first_row: int) -> Block:
    n = batch.num_rows
    x = np.zeros((n, schema.encoded_width), dtype=np.float32)
    for col, at in schema.layout():
        arr = batch.column(col.name)
        arr = _values(arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr)  # a dictionary's nulls
        null = np.asarray(arr.is_null()) if arr.null_count else np.zeros(n, bool)
        if null.any() and not col.nullable:
            raise InputError(
                f"{path}: column '{col.name}' row {first_row + int(np.flatnonzero(null)[0])}: missing value "
                f"(the schema says the column is not nullable)"
            )
        if col.kind == "categorical":
            unlisted = "other" if col.other is not None else "refuse"
            codes = _category_codes(arr, col.categories, path, col.name, first_row, unlisted)
            rows = np.flatnonzero(codes >= 0)
            x[rows, at + codes[rows]] = 1.0
        else:
            v = as_float64(arr).fill_null(0.0).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(~np.isfinite(v) & ~null)
            if bad.size:
                raise InputError(f"{path}: column '{col.name}' row {first_row + int(bad[0])}: NaN or infinite")
            if col.kind == "boolean":
                odd = np.flatnonzero((v != 0) & (v != 1) & ~null)
                if odd.size:
                    raise InputError(f"{path}: column '{col.name}' row {first_row + int(odd[0])}: not 0/1 or a bool")
                x[:, at] = np.where(null, 0.0, v)
            else:
                scaled = (np.clip(v, col.lower, col.upper) - col.lower) / (col.upper - col.lower)
                x[:, at] = np.where(null, 0.0, scaled)
        if col.nullable:
            x[:, at + col.width - 1] = null
    label = schema.label
    labels = _category_codes(
        _combined(batch.column(label.name)), label.categories, path, label.name, first_row, label.unlisted
    )
    if label.unlisted == "drop":  # null or unlisted labels: left out of the synthesis (their number is not stated)
        keep = labels >= 0
        return Block(x[keep], labels[keep], path, first_row)
    missing = np.flatnonzero(labels < 0)
    if missing.size:
        raise InputError(f"{path}: column '{label.name}' row {first_row + int(missing[0])}: missing label")
    return Block(x, labels, path, first_row)


def as_float64(arr: pa.Array) -> pa.Array:
    """A numeric column's values as float64: a date or timestamp as the integer it is stored as. Unsafe on purpose:
    an integer beyond 2^53 rounds to a nearby float (clipped to the bounds later; a safe cast would fail with the
    private value in its message)."""
    if is_temporal(arr.type):
        arr = arr.cast(physical_integer(arr.type))
    return arr.cast(pa.float64(), safe=False)


def _combined(arr):
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def read_table_parquet(path: str, schema: TableSchema, batch_rows: int = 65536) -> Iterator[Block]:
    """Encoded blocks of a Parquet table (only the declared columns are read)."""
    try:
        with open_file(path) as fh:
            pf = parquet_file(fh, path)
            schema.check_against(pf.schema_arrow, path)
            names = [c.name for c in schema.columns] + [schema.label.name]  # the dropped columns are not read
            row = 0
            for batch in pf.iter_batches(batch_size=batch_rows, columns=names):
                yield encode_batch(batch, schema, path, row)
                row += batch.num_rows
    except (InputError, SchemaError):
        raise
    except (pa.ArrowException, OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable Parquet shard ({_one_line(err)})") from None


def check_columns(path: str, names: list[str], schema: pa.Schema) -> None:
    """InputError naming the first of ``names`` that shard ``path``'s ``schema`` lacks."""
    missing = [n for n in names if n not in schema.names]
    if missing:
        raise InputError(f"{path}: column '{missing[0]}' is missing (every shard has the first one's columns)")


def read_columns(path: str, names: list[str], batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """The record batches of a Parquet table's columns ``names`` (nothing else is read)."""
    try:
        with open_file(path) as fh:
            pf = parquet_file(fh, path)
            check_columns(path, names, pf.schema_arrow)
            yield from pf.iter_batches(batch_size=batch_rows, columns=names)
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable Parquet shard ({_one_line(err)})") from None


def draws_per_row(schema: TableSchema) -> int:
    """Uniforms ``sample`` decoding needs per row: one per categorical or boolean column, one per null indicator."""
    return sum((c.kind != "numeric") + int(c.nullable) for c in schema.columns)


def decode_uniforms(key: bytes, tag: str, rows: int, schema: TableSchema) -> np.ndarray:
    """(rows, draws_per_row) uniforms in [0, 1) from the noise module, for ``sample`` decoding of one block."""
    from dpcda.privacy.noise import NoiseStream

    n = draws_per_row(schema)
    words = NoiseStream(key, "table-decode", tag).words(rows * n)
    return ((words >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(rows, n)


# what a release adds beside the declared schema in its manifest's input.table (readers take the rest as the schema)
STATED_BY_RELEASE = ("arrow_schema", "label_decoding", "domain")


def declared_schema(stated: dict) -> dict:
    """The declared ``table:`` section of a manifest's ``input.table`` (without what the release added to it)."""
    return {k: v for k, v in stated.items() if k not in STATED_BY_RELEASE}


def label_uniforms(key: bytes, tag: str, rows: int) -> np.ndarray:
    """(rows,) uniforms in [0, 1) for drawing hard labels from released label scores (``sample`` decoding of a
    release with label scores, DPMix's); their own stream, ("table-label", tag), apart from every other draw."""
    from dpcda.privacy.noise import NoiseStream

    words = NoiseStream(key, "table-label", tag).words(rows)
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def draw_from_scores(scores: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Index drawn for each row with probabilities proportional to its scores clipped at 0 (uniform where none is
    positive), by inversion of the uniforms ``u`` (rows,): post-processing of released scores."""
    w = np.clip(np.asarray(scores, np.float64), 0.0, None)
    total = w.sum(axis=1, keepdims=True)
    w = np.where(total > 0, w / np.where(total > 0, total, 1.0), 1.0 / w.shape[1])
    return (np.cumsum(w, axis=1) < u[:, None]).sum(axis=1).clip(0, w.shape[1] - 1)


def label_decoding(schema: TableSchema, *, scores: bool) -> str:
    """How a table release's label column is read back, in the manifest's words (``input.table.label_decoding``)."""
    if not scores:
        return "the class each row was made for (its mixed records' class, or the argmax of its noisy label scores)"
    if schema.decoding == "sample":
        return (
            "drawn from the released (noisy, mixed) label scores clipped at 0 and renormalised (uniform where none "
            "is positive), with uniforms from the noise module's stream ('table-label', block): post-processing"
        )
    return "the argmax of the released (noisy, mixed) label scores: post-processing"


def _decode_column(col: Column, block: np.ndarray, u: Optional[np.ndarray], t: pa.DataType) -> pa.Array:
    """Released encoded values of one column (rows, width) -> an Arrow array of type ``t``. ``u``: None (argmax
    decoding) or (rows, draws) uniforms for this column (its value, then its null indicator)."""
    if col.nullable:
        ind = np.clip(block[:, -1].astype(np.float64), 0.0, 1.0)
        null = u[:, -1] < ind if u is not None else ind > 0.5  # the null draw is the column's last
    else:
        null = np.zeros(len(block), bool)
    body = block[:, : col.width - int(col.nullable)]
    if col.kind == "categorical":
        if u is not None:
            idx = draw_from_scores(body, u[:, 0])
        else:
            idx = body.argmax(axis=1)
        values = [*col.categories, *([col.other] if col.other is not None else [])]
        cats = pa.array(values, type=t.value_type if pa.types.is_dictionary(t) else t)
        out = cats.take(pa.array(idx))
        return _with_nulls(out, null, t)
    v = body[:, 0].astype(np.float64)
    if col.kind == "boolean":
        bits = u[:, 0] < np.clip(v, 0.0, 1.0) if u is not None else v > 0.5
        out = pa.array(bits) if pa.types.is_boolean(t) else pa.array(bits.astype(np.int64)).cast(t)
        return _with_nulls(out, null, t)
    value = col.lower + np.clip(v, 0.0, 1.0) * (col.upper - col.lower)
    store = physical_integer(t)
    if pa.types.is_integer(store):
        lo, hi = np.ceil(col.lower), np.floor(col.upper)
        value = np.clip(np.round(value), lo, hi) if lo <= hi else np.full_like(value, lo)
    if col.spikes:  # a spike's code was written as its encoding: it decodes to the spike itself, exactly
        x32 = body[:, 0].astype(np.float32)
        for s, e in zip(col.spikes, encode_numeric(col, col.spikes)):
            value = np.where(x32 == e, s, value)
    if store != t:  # a date or timestamp: its integer, then the type (in range: check_against compared bounds)
        ints = pa.array(np.round(value).astype(np.int64)).cast(store)
        return _with_nulls(ints.cast(t), null, t)
    return _with_nulls(pa.array(value).cast(t), null, t)  # in range: check_against compared bounds and type


def _with_nulls(arr: pa.Array, null: np.ndarray, t: pa.DataType) -> pa.Array:
    if pa.types.is_dictionary(t) and not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode().cast(t)
    if null.any():
        arr = pc.if_else(pa.array(null), pa.nulls(len(arr), type=arr.type), arr)
    return arr


def decode_rows(
    x01: np.ndarray,
    labels: np.ndarray,
    schema: TableSchema,
    arrow_schema: pa.Schema,
    *,
    uniforms: Optional[np.ndarray] = None,
    label_draws: Optional[np.ndarray] = None,
) -> pa.Table:
    """Released rows in encoded units ([0, 1] scale, before clipping) and class indices -> a table whose Arrow
    schema is ``arrow_schema`` (the input's). ``uniforms`` (``decode_uniforms``) drive ``sample`` decoding.

    ``labels`` may be (rows, K) released label scores (DPMix's): ``sample`` decoding draws each hard label from them
    with the uniforms ``label_draws`` (``label_uniforms``), so the labels' base rate follows the scores; ``argmax``
    takes their argmax."""
    arrays = {}
    k = 0
    sample = schema.decoding == "sample"
    if sample and (uniforms is None or uniforms.shape != (len(x01), draws_per_row(schema))):
        raise ValueError(f"sample decoding needs ({len(x01)}, {draws_per_row(schema)}) uniforms (decode_uniforms)")
    for col, at in schema.layout():
        t = arrow_schema.field(col.name).type
        n = (col.kind != "numeric") + int(col.nullable)
        u = uniforms[:, k : k + n] if sample else None
        k += n
        arrays[col.name] = _decode_column(col, x01[:, at : at + col.width], u, t)
    lt = arrow_schema.field(schema.label.name).type
    labels = np.asarray(labels)
    if labels.ndim == 2 and sample:
        if label_draws is None or label_draws.shape != (len(labels),):
            raise ValueError(f"sample decoding of label scores needs ({len(labels)},) uniforms (label_uniforms)")
        labels = draw_from_scores(labels, label_draws)
    elif labels.ndim == 2:
        labels = labels.argmax(axis=1)
    cats = pa.array(schema.label.categories, type=lt.value_type if pa.types.is_dictionary(lt) else lt)
    arrays[schema.label.name] = _with_nulls(cats.take(pa.array(labels.astype(np.int64))), np.zeros(0, bool), lt)
    return pa.Table.from_arrays([arrays[name] for name in arrow_schema.names], schema=arrow_schema)
