"""The fitted model a marginals release keeps (``model/`` beside ``synthetic/``), so that more rows can be drawn later.

What it holds, and why each part may be published (docs/tables.md, "The model"):
- the noisy measurements: each column's noisy one-way counts and their Gaussian noise std, each measured clique's
  noisy counts (on MST's compressed codes) and std; DP outputs of the release, accounted in its epsilon;
- MST's compression of the codes (post-processing of the noisy one-way counts);
- the code domain (the table schema's public or DP bins and categories), the table schema, the numeric columns whose
  Arrow type is an integer and the input's Arrow schema (public: read from the footers, metadata dropped), which
  decode codes to rows of the release's own schema;
- the fitted graphical model: mbi's log-potentials on its cliques and its total, a deterministic function of the
  noisy measurements (post-processing), so sampling needs no refit.
No row of the input and no row of the release is in it; nothing but the names below.

Format (version 1), two files, no pickle anywhere:
- ``model.json``: exactly the keys of ``_JSON_KEYS`` (the structure, the stds, the schemas, the cliques' names);
- ``arrays.npz``: numpy arrays only, loaded with ``allow_pickle=False``, named ``one_way_<i>`` (float64, column i's
  codes), ``mapping_<i>`` (int64, compressed columns), ``clique_<k>`` (float64, measured clique k), ``potential_<k>``
  (float64, model clique k) and ``arrow_schema`` (uint8: the Arrow IPC serialisation of the schema).
``load_model`` checks every name, dtype, shape and value against the domain and refuses anything else in one line
(``ModelError``); the manifest that lists the files (with their SHA-256) is checked by the reader before this.

Sampling (``sample_tables``) is post-processing of the model: mbi's ``synthetic_data`` in blocks as the release does,
MST's decompression, the table's rules kept as the release kept them (``mbi_model`` conditions the model on them,
``rules.KeptRules`` then rejects, repairs and redraws as after the release's fit; the rules are in ``table``, so the
format did not change for them), values inside their bins, then the release's decoding into Arrow; every draw comes
from ``privacy.noise`` streams under the key the caller gives (a fresh one, or a public one built from a seed).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from typing import Iterator, Optional

import numpy as np

from dpcda.mechanisms.marginals.counting import compressed_domain
from dpcda.mechanisms.marginals.domain import Domain
from dpcda.privacy.errors import DpcdaError

MODEL_DIR = "model"
MODEL_JSON = "model.json"
MODEL_ARRAYS = "arrays.npz"
MODEL_FILES = (MODEL_JSON, MODEL_ARRAYS)
FORMAT = "dpcda-marginals-model"
VERSION = 1
ESTIMATOR = "mbi MirrorDescent"
_JSON_KEYS = {"format", "version", "domain", "table", "integers", "measurements", "model"}
_MAX_JSON_BYTES = 64 << 20


class ModelError(DpcdaError, ValueError):
    """A saved model that cannot be used (missing, changed, truncated, of another format); nothing was sampled."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One noisy measurement: the clique (column names), its noisy counts (shaped by the clique's codes), the std."""

    clique: tuple[str, ...]
    counts: np.ndarray
    std: float


@dataclasses.dataclass(frozen=True)
class FittedModel:
    """A marginals release's model: everything ``sample_tables`` needs, nothing from the rows (module docstring)."""

    domain: Domain  # the columns' codes, the label last
    table: dict  # the table schema (``schemas.table.TableSchema``'s JSON)
    integers: tuple[str, ...]  # numeric columns whose Arrow type is an integer
    arrow_schema: object  # pyarrow.Schema of the release's rows (the input's, metadata dropped)
    one_way: tuple[np.ndarray, ...]  # noisy counts of each column's codes
    one_way_std: float
    mapping: dict  # column index -> its codes' compressed codes (MST), for the compressed columns only
    cliques: tuple[Measurement, ...]  # the measured cliques (MST's pairs, AIM's picks), on the compressed codes
    potentials: tuple[tuple[tuple[str, ...], np.ndarray], ...]  # mbi's log-potentials on the compressed codes
    total: float  # the model's total (DP)

    def one_way_measurements(self) -> dict[str, Measurement]:
        """Column name -> its noisy one-way counts (on the column's own codes, the label last) and their noise std:
        DP outputs of the release, publishable as they are (a quality report sets the synthetic rows beside them)."""
        return {
            name: Measurement((name,), np.array(y, np.float64), self.one_way_std)
            for name, y in zip(self.domain.names, self.one_way)
        }

    def measurements(self) -> tuple[Measurement, ...]:
        """Every noisy measurement the model was fitted to: the one-way counts, then the measured cliques (their
        codes compressed where ``mapping`` says)."""
        return (*self.one_way_measurements().values(), *self.cliques)

    @property
    def schema(self):
        from dpcda.schemas.table import parse_table_schema

        return parse_table_schema(self.table, "model.json table")


def from_fit(measured, fitted, domain: Domain, table, arrow_schema, integers) -> FittedModel:
    """The ``FittedModel`` of a release: its measurements (``plan.Measurements``, the noisy counts only), mbi's fitted
    model, the plan's code domain, the table schema, the Arrow schema and integer columns of its rows."""
    names = domain.names
    cliques = tuple(
        Measurement(tuple(names[i] for i in cl), np.array(y, np.float64), float(std))
        for cl, y, std in zip(measured.pairs, measured.two_way, measured.stds)
    )
    pots = tuple(  # mbi names the columns by index (``estimation.columns``); the model names them
        (tuple(names[i] for i in cl), np.array(fitted.potentials[cl].values, np.float64))
        for cl in fitted.potentials.cliques
    )
    return FittedModel(
        domain=domain,
        table=table.model_dump(mode="json") if hasattr(table, "model_dump") else dict(table),
        integers=tuple(sorted(integers)),
        arrow_schema=arrow_schema,
        one_way=tuple(np.array(y, np.float64).ravel() for y in measured.one_way),
        one_way_std=float(measured.one_way_std),
        mapping={int(i): np.array(m, np.int64) for i, m in measured.mapping.items()},
        cliques=cliques,
        potentials=pots,
        total=float(fitted.total),
    )


# ---------------------------------------------------------------- writing and reading


def model_files(fm: FittedModel) -> dict[str, bytes]:
    """File name -> bytes of the saved model (``MODEL_FILES``)."""
    import pyarrow as pa

    arrays = {f"one_way_{i}": np.asarray(y, np.float64) for i, y in enumerate(fm.one_way)}
    arrays.update({f"mapping_{i}": np.asarray(m, np.int64) for i, m in sorted(fm.mapping.items())})
    arrays.update({f"clique_{k}": np.asarray(m.counts, np.float64) for k, m in enumerate(fm.cliques)})
    arrays.update({f"potential_{k}": np.asarray(v, np.float64) for k, (_, v) in enumerate(fm.potentials)})
    schema = pa.schema(fm.arrow_schema).remove_metadata()
    arrays["arrow_schema"] = np.frombuffer(schema.serialize().to_pybytes(), np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "domain": {"names": list(fm.domain.names), "sizes": list(fm.domain.sizes), "bins": fm.domain.bins},
        "table": fm.table,
        "integers": list(fm.integers),
        "measurements": {
            "one_way_std": fm.one_way_std,
            "compressed": sorted(int(i) for i in fm.mapping),
            "cliques": [{"clique": list(m.clique), "std": m.std} for m in fm.cliques],
        },
        "model": {"estimator": ESTIMATOR, "cliques": [list(cl) for cl, _ in fm.potentials], "total": fm.total},
    }
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    return {MODEL_JSON: text.encode(), MODEL_ARRAYS: buf.getvalue()}


def load_model(files: dict[str, bytes], where: str = MODEL_DIR) -> FittedModel:
    """The ``FittedModel`` of saved ``files`` (name -> bytes), every part checked; ModelError naming ``where`` and
    what is wrong otherwise (one line)."""

    def bad(what: str) -> ModelError:
        return ModelError(f"{where}: {what}; the model was changed or is incomplete, nothing was sampled")

    if set(files) != set(MODEL_FILES):
        raise bad(f"expected the files {', '.join(MODEL_FILES)}")
    if len(files[MODEL_JSON]) > _MAX_JSON_BYTES:
        raise bad(f"{MODEL_JSON} is too large")
    try:
        doc = json.loads(files[MODEL_JSON])
    except (ValueError, UnicodeDecodeError):
        raise bad(f"{MODEL_JSON} is not JSON") from None
    if not isinstance(doc, dict) or set(doc) != _JSON_KEYS:
        raise bad(f"{MODEL_JSON} does not hold exactly the keys {', '.join(sorted(_JSON_KEYS))}")
    if doc["format"] != FORMAT or doc["version"] != VERSION:
        raise bad(f"{MODEL_JSON} is not {FORMAT} version {VERSION}")
    arrays = _read_arrays(files[MODEL_ARRAYS], bad)
    try:
        return _parse(doc, arrays)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise bad(_first_line(err)) from None


def _read_arrays(data: bytes, bad) -> dict:
    import zipfile

    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError):
        raise bad(f"{MODEL_ARRAYS} is not a numpy archive of plain arrays") from None


def _first_line(err: Exception) -> str:
    text = (str(err).splitlines() or [type(err).__name__])[0]
    return text[:200] or type(err).__name__


def _names(value, known: set, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v in known for v in value):
        raise ValueError(f"{what}: expected column names of the domain")
    if len(set(value)) != len(value):
        raise ValueError(f"{what}: a column named twice")
    return tuple(value)


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what}: expected a finite number")
    return float(value)


def _array(arrays: dict, name: str, dtype, shape: tuple) -> np.ndarray:
    a = arrays.get(name)
    if a is None or a.dtype != np.dtype(dtype) or a.shape != shape:
        raise ValueError(f"{name}: expected {np.dtype(dtype).name} of shape {shape}")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise ValueError(f"{name}: a value that is not finite")
    return a


def _parse(doc: dict, arrays: dict) -> FittedModel:
    import pyarrow as pa

    from dpcda.schemas.table import parse_table_schema

    dom = doc["domain"]
    if not isinstance(dom, dict) or set(dom) != {"names", "sizes", "bins"}:
        raise ValueError("domain: expected names, sizes and bins")
    names = dom["names"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError("domain.names: expected column names")
    sizes = dom["sizes"]
    if not isinstance(sizes, list) or len(sizes) != len(names) or len(set(names)) != len(names):
        raise ValueError("domain: one size per column, each column once")
    if not all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 1 << 24 for s in sizes):
        raise ValueError("domain.sizes: expected positive integers")
    bins = dom["bins"]
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError("domain.bins: expected a positive integer")
    domain = Domain(tuple(names), tuple(sizes), bins)
    known = set(names)
    table = parse_table_schema(doc["table"], "table")
    from dpcda.mechanisms.marginals.domain import domain_of

    if domain_of(table, bins) != domain:
        raise ValueError("domain: not the table schema's codes")
    integers = doc["integers"]
    if not isinstance(integers, list) or not all(isinstance(n, str) and n in known for n in integers):
        raise ValueError("integers: expected column names of the domain")
    meas = doc["measurements"]
    if not isinstance(meas, dict) or set(meas) != {"one_way_std", "compressed", "cliques"}:
        raise ValueError("measurements: expected one_way_std, compressed and cliques")
    one_way_std = _number(meas["one_way_std"], "measurements.one_way_std")
    compressed = meas["compressed"]
    if not isinstance(compressed, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(names) for i in compressed
    ):
        raise ValueError("measurements.compressed: expected column indices")
    one_way = tuple(_array(arrays, f"one_way_{i}", np.float64, (s,)) for i, s in enumerate(sizes))
    mapping = {}
    for i in sorted(set(compressed)):
        m = _array(arrays, f"mapping_{i}", np.int64, (sizes[i],))
        top = int(m.max())
        if m.min() < 0 or not np.array_equal(m[m < top], np.arange(int((m < top).sum()))):
            raise ValueError(f"mapping_{i}: not a compression of the column's codes")
        mapping[i] = m
    small = compressed_domain(domain, mapping)
    size_of = dict(zip(small.names, small.sizes))
    cliques = meas["cliques"]
    if not isinstance(cliques, list):
        raise ValueError("measurements.cliques: expected a list")
    measured = []
    for k, c in enumerate(cliques):
        if not isinstance(c, dict) or set(c) != {"clique", "std"}:
            raise ValueError(f"measurements.cliques[{k}]: expected clique and std")
        cl = _names(c["clique"], known, f"measurements.cliques[{k}]")
        std = _number(c["std"], f"measurements.cliques[{k}].std")
        y = _array(arrays, f"clique_{k}", np.float64, tuple(size_of[n] for n in cl))
        measured.append(Measurement(cl, y, std))
    fit = doc["model"]
    if not isinstance(fit, dict) or set(fit) != {"estimator", "cliques", "total"} or fit["estimator"] != ESTIMATOR:
        raise ValueError(f"model: expected the estimator ({ESTIMATOR}), cliques and total")
    if not isinstance(fit["cliques"], list):
        raise ValueError("model.cliques: expected a list")
    potentials = []
    for k, c in enumerate(fit["cliques"]):
        cl = _names(c, known, f"model.cliques[{k}]")
        potentials.append((cl, _array(arrays, f"potential_{k}", np.float64, tuple(size_of[n] for n in cl))))
    total = _number(fit["total"], "model.total")
    raw = arrays.get("arrow_schema")
    if raw is None or raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError("arrow_schema: expected uint8 bytes")
    try:
        arrow = pa.ipc.read_schema(pa.py_buffer(raw.tobytes()))
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"arrow_schema: not an Arrow schema ({_first_line(err)})") from None
    if sorted(arrow.names) != sorted(names):
        raise ValueError("arrow_schema: not the domain's columns")
    expected = {f"one_way_{i}" for i in range(len(names))} | {f"mapping_{i}" for i in mapping}
    expected |= {f"clique_{k}" for k in range(len(measured))} | {f"potential_{k}" for k in range(len(potentials))}
    expected.add("arrow_schema")
    if set(arrays) != expected:
        extra = sorted(set(arrays) - expected)
        raise ValueError(f"{MODEL_ARRAYS}: unexpected array {extra[0]}" if extra else f"{MODEL_ARRAYS}: arrays missing")
    return FittedModel(
        domain=domain,
        table=doc["table"],
        integers=tuple(integers),
        arrow_schema=arrow,
        one_way=one_way,
        one_way_std=one_way_std,
        mapping=mapping,
        cliques=tuple(measured),
        potentials=tuple(potentials),
        total=total,
    )


# ---------------------------------------------------------------- sampling


def kept_rules_of(fm: FittedModel):
    """The table's public rules and its absent residual codes (``rules.KeptRules`` on the model's domain, from the
    saved noisy one-way counts: ``residual.absent_codes``) as the release kept them, or None where it had neither."""
    return _sampling_rules(fm)[0]


def _sampling_rules(fm: FittedModel):
    """``residual.sampling_rules`` from the saved noisy one-way counts, as the release took them."""
    from dpcda.mechanisms.marginals.residual import sampling_rules

    return sampling_rules(fm.schema, fm.domain, frozenset(fm.integers), fm.one_way, fm.one_way_std)


def mbi_model(fm: FittedModel):
    """mbi's ``MarkovRandomField`` of the saved potentials and total (its marginals by mbi's message passing), on the
    compressed codes, as the release's fit returned it, its columns named by index as the release's
    (``estimation.columns``: a seed draws the same rows in every process). Where the table declares rules, the model
    is conditioned on them as the release's was: mbi keeps a fit's constraints beside its potentials, not in them
    (the saved potentials are finite), so the same ``Constraint`` s are rebuilt by ``KeptRules.constrain`` from what
    the release built them from (the table's rules, the domain, the compression and the measured cliques)."""
    from dpcda.mechanisms.marginals.estimation import _mbi, columns

    mbi = _mbi()
    import jax.numpy as jnp

    small = compressed_domain(fm.domain, fm.mapping)
    index = {name: i for i, name in enumerate(small.names)}
    domain = mbi.Domain(columns(small), list(small.sizes))
    cliques = [tuple(index[n] for n in cl) for cl, _ in fm.potentials]
    tables = {cl: mbi.Factor(domain.project(cl), jnp.asarray(v)) for cl, (_, v) in zip(cliques, fm.potentials)}
    potentials = mbi.CliqueVector(domain, cliques, tables)
    kept, constraints = kept_rules_of(fm), ()
    if kept:  # the release's fit: its one-way cliques and measured cliques (``estimation.fit``)
        measured = [(i,) for i in columns(small)] + [tuple(index[n] for n in m.clique) for m in fm.cliques]
        constraints = tuple(kept.constrain(mbi, domain, fm.mapping, measured))
    if not constraints:
        marginals = mbi.marginal_oracles.message_passing_stable(potentials, fm.total)
        return mbi.MarkovRandomField(potentials=potentials, marginals=marginals, total=fm.total)
    marginals = mbi.marginal_oracles.message_passing_shafer_shenoy(potentials, fm.total, constraints=constraints)
    model = mbi.MarkovRandomField(potentials=potentials, marginals=marginals, total=fm.total, constraints=constraints)
    return kept.sampled_under(model, constraints)


def sample_tables(fm: FittedModel, rows: int, key: bytes, part_rows: int, model=None) -> Iterator:
    """pyarrow Tables of ``rows`` rows in all (at most ``part_rows`` each) drawn from the model, with the release's
    Arrow schema: mbi's randomized rounding block by block (``estimation.sample_codes``), MST's decompression, the
    table's rules kept as the release kept them after its fit (``rules.KeptRules``: the rules' decompression,
    rejection and repair of codes, then order rules on values), values inside their bins (``domain.rows_of``) and the
    release's decoding (``storage.tables.decode_rows``). Every draw is from a ``privacy.noise`` stream under ``key``.
    ``model``: ``mbi_model(fm)`` (conditioned on the rules), where the caller keeps one."""
    from dpcda.mechanisms.marginals.domain import rows_of
    from dpcda.mechanisms.marginals.estimation import decompress, sample_codes
    from dpcda.privacy.noise import NoiseStream
    from dpcda.storage.tables import decode_rows, decode_uniforms

    schema = fm.schema
    model = mbi_model(fm) if model is None else model  # ``model``: ``mbi_model(fm)``, made once by the caller
    values, spread = NoiseStream(key, "model-sample", "values"), NoiseStream(key, "model-sample", "decompress")
    integers = frozenset(fm.integers)
    arrow = fm.arrow_schema
    kept, weights = _sampling_rules(fm)  # as the release's (``synthesis``)
    if kept:  # as ``synthesis.fit_and_sample`` after the fit
        again = kept.resampler(model, key, fm.mapping, weights)
        rule_draws = NoiseStream(key, "model-sample", "rules")
    for k, codes in enumerate(sample_codes(model, rows, _Names(fm.domain), key, part_rows)):
        codes = decompress(codes, fm.mapping, spread, weights)
        if kept:
            codes = kept.keep_codes(codes, fm.mapping, again, rule_draws)
        x, y = rows_of(codes, schema, fm.domain.bins, values, integers)
        if kept:
            x = kept.keep_values(x, codes, rule_draws)
        uniforms = decode_uniforms(key, f"model-sample-{k}", len(x), schema) if schema.decoding == "sample" else None
        yield decode_rows(x, y, schema, arrow, uniforms=uniforms)


@dataclasses.dataclass(frozen=True)
class _Names:
    """What ``estimation.sample_codes`` reads of a plan: its domain."""

    domain: Domain


def describe(fm: Optional[FittedModel] = None) -> str:
    """The manifest's words for what ``model/`` holds."""
    return (
        "the release's noisy measurements (each column's one-way counts and each measured clique's counts, with "
        "their Gaussian noise std: DP, accounted in this release), MST's compression of the codes and the fitted "
        "graphical model (mbi's log-potentials and total: post-processing of them), the code domain, the table "
        "schema and the rows' Arrow schema (public or DP); no row of the input or of the release"
    )
