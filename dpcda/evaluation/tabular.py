"""Evaluation of a table release: train on synthetic, test on real (scikit-learn), and fidelity figures.

- Utility: logistic regression and gradient boosting (``HistGradientBoostingClassifier``) trained on the synthetic
  table, tested on the real test table: accuracy and ROC AUC (one-vs-rest macro average for more than 2 classes).
- Marginals (``evaluation.table_metrics``): every column's and every pair's distance on the public schema's
  discretisation, the label's pairs apart, the label base rate, and one summary score (``fidelity``); headlined
  beside ROC AUC and balanced accuracy (accuracy is kept, not headlined: on a skewed label it rewards the majority).
- Fidelity against the real test table: per column, the total variation distance of the value frequencies
  (categorical and boolean; null counts as a value) or the Kolmogorov-Smirnov statistic (numeric; plus the gap in
  null rates); and the mean absolute gap between the two tables' correlation matrices of the encoded columns.
- A picture of each column's real and synthetic marginals.

Both tables are encoded by the release's public schema (``storage.tables``), so the models see the same columns.
"""

from __future__ import annotations

import io
import json
import logging
import math
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpcda.evaluation.stage import EVAL_DIR, TEST_DATA_NOTE, EvaluationError
from dpcda.evaluation.table_metrics import table_metrics
from dpcda.schemas.table import TableSchema
from dpcda.storage.paths import expand_glob, is_remote, join, open_file
from dpcda.storage.tables import encode_batch

log = logging.getLogger("dpcda.evaluation")
REPORT = "report.json"
MARGINALS = "marginals.png"
MODELS = ("logistic_regression", "gradient_boosting")


def read_tables(pattern: str, what: str) -> pa.Table:
    files = expand_glob(pattern)
    if not files:
        raise EvaluationError(f"{pattern}: no {what} files match")
    parts = []
    for f in files:
        with open_file(f) as fh:
            parts.append(pq.read_table(io.BytesIO(fh.read()) if is_remote(f) else fh).replace_schema_metadata(None))
    try:
        return pa.concat_tables(parts)
    except pa.ArrowInvalid as err:
        raise EvaluationError(f"{pattern}: the {what} files differ in schema ({err})") from None


SYNTHETIC_BATCH_ROWS = 1 << 16


def synthetic_batches(pattern: str):
    """The record batches of the release's synthetic Parquet files, read one file and one batch at a time."""
    files = expand_glob(pattern)
    if not files:
        raise EvaluationError(f"{pattern}: no synthetic files match")
    for f in files:
        with open_file(f) as fh:
            src = io.BytesIO(fh.read()) if is_remote(f) else fh  # one part file at a time
            for batch in pq.ParquetFile(src).iter_batches(batch_size=SYNTHETIC_BATCH_ROWS):
                yield batch.replace_schema_metadata(None)


EVAL_ROWS = 1_000_000  # an evaluation that needs the synthetic rows together reads at most this many (every k-th)


def synthetic_sample(pattern: str, rows: int, cap: int = EVAL_ROWS) -> tuple[pa.Table, int]:
    """The synthetic table of ``rows`` rows in the files of ``pattern``, or, above ``cap`` rows, every k-th of them
    (k = ceil(rows / cap); a systematic sample of the released rows, themselves a DP output), read one batch at a
    time; and k."""
    step = max(1, -(-int(rows) // int(cap)))
    if step == 1:
        return read_tables(pattern, "synthetic"), 1
    parts, seen = [], 0
    for batch in synthetic_batches(pattern):
        parts.append(batch.take(pa.array(np.arange((-seen) % step, batch.num_rows, step))))
        seen += batch.num_rows
    try:
        return pa.Table.from_batches(parts), step
    except pa.ArrowInvalid as err:
        raise EvaluationError(f"{pattern}: the synthetic files differ in schema ({err})") from None


def _model(name: str, seed: int):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    if name == "logistic_regression":
        return LogisticRegression(max_iter=2000)
    return HistGradientBoostingClassifier(random_state=seed)


def _scores(model, x: np.ndarray, k: int) -> np.ndarray:
    """Class probabilities over all k classes (a class absent from training gets 0)."""
    proba = np.zeros((len(x), k))
    proba[:, model.classes_.astype(int)] = model.predict_proba(x)
    return proba


def train_on_synthetic(xs: np.ndarray, ys: np.ndarray, xt: np.ndarray, yt: np.ndarray, k: int, seed: int = 0) -> dict:
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score

    out = {}
    for i, name in enumerate(MODELS, 1):
        t0 = time.time()
        log.info("stage=evaluate step=%d/%d training %s on %d synthetic rows", i, len(MODELS) + 2, name, len(ys))
        if len(np.unique(ys)) < 2:  # nothing to learn: the constant prediction
            proba = np.zeros((len(xt), k))
            proba[:, int(ys[0]) if len(ys) else 0] = 1.0
        else:
            proba = _scores(_model(name, seed).fit(xs, ys), xt, k)
        acc = float((proba.argmax(axis=1) == yt).mean())
        try:
            if k == 2:
                auc = float(roc_auc_score(yt, proba[:, 1]))
            else:
                auc = float(roc_auc_score(yt, proba, multi_class="ovr", average="macro", labels=list(range(k))))
        except ValueError:  # a single class in the test set
            auc = None
        balanced = float(balanced_accuracy_score(yt, proba.argmax(axis=1)))
        out[name] = {"roc_auc": auc, "balanced_accuracy": balanced, "accuracy": acc}
        log.info("stage=evaluate %s done in %.1f s", name, time.time() - t0)
    return out


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    if not len(a) or not len(b):
        return 1.0 if len(a) != len(b) else 0.0
    grid = np.union1d(a, b)
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def _tvd(a: list, b: list) -> float:
    keys = {repr(v) for v in a} | {repr(v) for v in b}
    ca = {key: 0 for key in keys}
    cb = dict(ca)
    for v in a:
        ca[repr(v)] += 1
    for v in b:
        cb[repr(v)] += 1
    return 0.5 * sum(abs(ca[key] / max(len(a), 1) - cb[key] / max(len(b), 1)) for key in keys)


def column_distances(real: pa.Table, synth: pa.Table, schema: TableSchema) -> dict:
    out = {}
    for col in (*schema.columns, schema.label):
        r, s = real.column(col.name).to_pylist(), synth.column(col.name).to_pylist()
        if getattr(col, "kind", "categorical") == "numeric":
            rv = np.array([v for v in r if v is not None], float)
            sv = np.array([v for v in s if v is not None], float)
            null_gap = abs((len(r) - len(rv)) / max(len(r), 1) - (len(s) - len(sv)) / max(len(s), 1))
            out[col.name] = {"metric": "ks", "distance": _ks(rv, sv), "null_rate_gap": null_gap}
        else:
            out[col.name] = {"metric": "tvd", "distance": _tvd(r, s)}
    return out


def correlation_gap(xr: np.ndarray, xs: np.ndarray) -> float:
    """Mean |corr_real - corr_synth| over pairs of encoded columns (a constant column correlates 0)."""

    def corr(x):
        x = x - x.mean(axis=0)
        sd = np.sqrt((x**2).mean(axis=0))
        z = np.divide(x, sd, out=np.zeros_like(x), where=sd > 1e-12)
        return (z.T @ z) / len(x)

    if xr.shape[1] < 2:
        return 0.0
    iu = np.triu_indices(xr.shape[1], 1)
    return float(np.abs(corr(xr.astype(np.float64))[iu] - corr(xs.astype(np.float64))[iu]).mean())


def write_marginals(path: str, real: pa.Table, synth: pa.Table, schema: TableSchema, max_columns: int = 24) -> str:
    from dpcda.evaluation.report import _pyplot

    plt = _pyplot()
    cols = [*schema.columns, schema.label][:max_columns]
    ncol = 4
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 2.6 * nrow), squeeze=False)
    for ax, col in zip(axes.flat, cols):
        r, s = real.column(col.name).to_pylist(), synth.column(col.name).to_pylist()
        if getattr(col, "kind", "categorical") == "numeric":
            rv = [v for v in r if v is not None]
            sv = [v for v in s if v is not None]
            bins = np.linspace(col.lower, col.upper, 31)
            ax.hist(rv, bins=bins, alpha=0.5, density=True, label="real")
            ax.hist(sv, bins=bins, alpha=0.5, density=True, label="synthetic")
        else:
            cats = [*(col.categories or [False, True])]
            if any(v is None for v in r + s):
                cats.append(None)
            pos = np.arange(len(cats))
            fr = [sum(v == c for v in r) / max(len(r), 1) for c in cats]
            fs = [sum(v == c for v in s) / max(len(s), 1) for c in cats]
            ax.bar(pos - 0.2, fr, 0.4, label="real")
            ax.bar(pos + 0.2, fs, 0.4, label="synthetic")
            ax.set_xticks(pos, [str(c)[:12] for c in cats], rotation=30, fontsize=7)
        ax.set_title(col.name, fontsize=9)
    for ax in list(axes.flat)[len(cols) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    with open_file(path, "wb") as fh:
        fh.write(buf.getvalue())
    return path


def evaluate_tables(synth: pa.Table, test: pa.Table, schema: TableSchema, seed: int = 0) -> dict:
    """The figures of one synthetic table against the real test table (both with the schema's columns)."""
    schema.check_against(test.schema, "evaluation test set")
    if not synth.num_rows:
        raise EvaluationError("the release has no rows to train on")
    bs = encode_batch(synth, schema, "synthetic", 0)
    bt = encode_batch(test, schema, "test", 0)
    models = train_on_synthetic(bs.features, bs.labels, bt.features, bt.labels, schema.num_classes, seed)
    t0 = time.time()
    log.info("stage=evaluate step=%d/%d column distances and correlations", len(MODELS) + 1, len(MODELS) + 2)
    cols = column_distances(test, synth, schema)
    marginals = table_metrics(test, synth, schema)
    gap = correlation_gap(bt.features, bs.features)
    log.info("stage=evaluate column figures done in %.1f s", time.time() - t0)
    return {
        "fidelity": marginals["fidelity"],
        "roc_auc": models["gradient_boosting"]["roc_auc"],
        "balanced_accuracy": models["gradient_boosting"]["balanced_accuracy"],
        "label_base_rate_gap": marginals["base_rate"]["max_gap"],
        "models": models,
        "accuracy": models["gradient_boosting"]["accuracy"],
        "marginals": marginals,
        "column_distance_mean": float(np.mean([c["distance"] for c in cols.values()])),
        "correlation_gap": gap,
        "columns": cols,
    }


def _write_outputs(out: str, figures: dict, test: pa.Table, synth: pa.Table, schema: TableSchema) -> str:
    if not is_remote(out):
        import os

        os.makedirs(out, exist_ok=True)
    log.info("stage=evaluate step=%d/%d drawing the marginals", len(MODELS) + 2, len(MODELS) + 2)
    write_marginals(join(out, MARGINALS), test, synth, schema)
    path = join(out, REPORT)
    with open_file(path, "wb") as fh:
        fh.write((json.dumps({**figures, "test_rows": test.num_rows}, indent=2) + "\n").encode())
    return path


def evaluate_table_dir(release_dir: str, manifest: dict, test_glob: str, out: str, seed: int = 0) -> dict:
    """``dpcda evaluate`` on a published table release."""
    from dpcda.schemas.table import parse_table_schema
    from dpcda.storage.tables import declared_schema

    declared = declared_schema(manifest["input"]["table"])
    schema = parse_table_schema(declared, "manifest input.table")
    prefix = manifest["output"].get("prefix", "").rstrip("/")
    parts = (release_dir, prefix, "synthetic", "*.parquet") if prefix else (release_dir, "synthetic", "*.parquet")
    synth = _temporal_as_integers(read_tables(join(*parts), "synthetic"))
    test = _temporal_as_integers(read_tables(test_glob, "evaluation"))
    figures = evaluate_tables(synth, test, schema, seed)
    path = _write_outputs(out, figures, test, synth, schema)
    return {**figures, "accuracy_mean": figures["accuracy"], "accuracy_std": 0.0, "path": path}


def _temporal_as_integers(table: pa.Table) -> pa.Table:
    """Date and timestamp columns as the integers they are stored as (the numbers a numeric column of the schema
    encodes and bins them as: ``schemas.table.physical_integer``)."""
    from dpcda.schemas.table import is_temporal, physical_integer

    for i, f in enumerate(table.schema):
        if is_temporal(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(physical_integer(f.type)))
    return table


def evaluate_table_release(
    workdir: str, manifest: dict, test_glob: str, schema: TableSchema, *, test_public: bool = False, seed: int = 0
) -> dict:
    """Release stage for a table release: writes ``evaluation/report.json`` and ``marginals.png`` into the run
    directory and returns the manifest's ``utility`` section (``manifest``: the manifest so far as JSON)."""
    synth, step = synthetic_sample(join(workdir, "synthetic", "*.parquet"), manifest["output"]["rows"])
    synth = _temporal_as_integers(synth)
    test = _temporal_as_integers(read_tables(test_glob, "evaluation"))
    figures = evaluate_tables(synth, test, schema, seed)
    _write_outputs(join(workdir, EVAL_DIR), figures, test, synth, schema)
    prefix = manifest["output"].get("prefix", "")
    return {
        "kind": "table",
        "accuracy_mean": figures["accuracy"],
        "accuracy_std": 0.0,
        "runs": 1,
        "fidelity": figures["fidelity"],
        "roc_auc": figures["roc_auc"],
        "balanced_accuracy": figures["balanced_accuracy"],
        "label_base_rate_gap": figures["label_base_rate_gap"],
        "two_way_tvd_label_mean": figures["marginals"]["two_way_tvd_label_mean"],
        "models": figures["models"],
        "column_distance_mean": figures["column_distance_mean"],
        "correlation_gap": figures["correlation_gap"],
        "report": f"{prefix}{EVAL_DIR}/{REPORT}",
        "marginals": f"{prefix}{EVAL_DIR}/{MARGINALS}",
        "test_set_public": test_public,
        "synthetic_rows_evaluated": synth.num_rows,
        **({"synthetic_sample": f"every {step}th row (at most {EVAL_ROWS:,} rows)"} if step > 1 else {}),
        **({"test_rows": test.num_rows} if test_public else {"outside_guarantee": TEST_DATA_NOTE}),
    }
