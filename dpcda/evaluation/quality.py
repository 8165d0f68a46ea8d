"""The quality report of a table release: ``evaluation/quality.json`` and two pictures, in every table release.

What it sets side by side, per column (the label included) and per column's trend of the label:

- **synthetic**: the published rows. Their shares are a function of the release, so publishing them costs nothing.
- **noisy measurement (DP)**: the release's own noisy counts (``mechanisms.marginals.noisy``: each column's one-way
  counts; the label's two-way counts with a column, where the mechanism measured that pair), clipped at 0 and
  normalised to shares (post-processing of DP outputs: always publishable). The mixing mechanisms measure no marginal:
  their report has the synthetic side only, and says so.
- **real held-out (not DP)**: only with ``--eval-input``: shares and trends of the real test rows, the distances to
  them, and a classifier's ROC AUC (trained on the synthetic rows, tested on the real ones). These are statistics of
  the test set, which the privacy guarantee does not cover; without ``--eval-input`` no real-data figure is computed.

Binning: the codes the marginals mechanism counts on (``mechanisms.marginals.domain``: a category, 0/1, a numeric
column's spikes then its bins (its declared or DP-derived edges, else equal bins of its declared bounds), one more
code for null), at the release's ``marginals_bins`` for a marginals release (the noisy counts' own codes) and at
``table_metrics.BINS`` otherwise; the rows are encoded by the public schema first (``storage.tables.encode_batch``), as
the mechanism encodes its input.

Distances: TVD (half the L1 distance of two share vectors) per column; for a label trend, the label's TVD within
each bin of the column, averaged with the reference's bin shares as weights (bins empty on either side left out).
The layout of quality.json: docs/tables.md, "Quality report".
"""

from __future__ import annotations

import json
import logging
from typing import Optional

import numpy as np
import pyarrow as pa

from dpcda.evaluation.stage import EVAL_DIR, EvaluationError
from dpcda.evaluation.table_metrics import BINS
from dpcda.evaluation.tabular import SYNTHETIC_BATCH_ROWS, synthetic_batches
from dpcda.mechanisms.marginals.domain import codes_of, domain_of
from dpcda.schemas.table import TableSchema
from dpcda.storage.paths import exists, is_remote, join, open_file
from dpcda.storage.tables import encode_batch

log = logging.getLogger("dpcda.evaluation")
QUALITY = "quality.json"
PICTURE = "quality.png"
LABEL_PICTURE = "quality_label.png"
FORMAT = 1
SOURCES = {
    "synthetic": {"legend": "synthetic", "dp": True, "what": "the published synthetic rows"},
    "noisy_measurement": {
        "legend": "noisy measurement (DP)",
        "dp": True,
        "what": "the release's own noisy counts (the mechanism's DP measurements), clipped at 0 and normalised to "
        "shares: post-processing of DP outputs",
    },
    "real": {
        "legend": "real held-out (not DP)",
        "dp": False,
        "what": "the real held-out rows given with --eval-input: NOT DP, outside the privacy guarantee",
    },
}
REAL_DATA_NOTE = (
    "figures computed on the real held-out rows (--eval-input): statistics of the test set, which the privacy "
    "guarantee does not cover (it covers the release's input records); publish them only if the test set is public"
)
NO_MEASUREMENT = "this mechanism measures no marginal (it mixes records): the synthetic side only"


def _num(v: float) -> str:
    return f"{float(v):.4g}"


def code_labels(col, bins: int) -> tuple[list[str], Optional[list[float]]]:
    """The names of a column's codes (``domain_of``'s order: values, then null) and, numeric, its bin edges: a
    categorical column's categories (and its other bucket), a numeric column's spikes (their values) then its bins
    (its declared or DP-derived ``edges``, else equal bins of its bounds)."""
    edges = None
    if col.kind == "categorical":
        names = [str(c) for c in col.categories] + ([str(col.other)] if col.other is not None else [])
    elif col.kind == "boolean":
        names = ["False", "True"]
    else:
        names = [_num(v) for v in col.spikes or ()]
        edges = list(col.edges) if col.edges is not None else np.linspace(col.lower, col.upper, bins + 1).tolist()
        if edges:
            names += [f"[{_num(a)}, {_num(b)})" for a, b in zip(edges[:-2], edges[1:-1])]
            names.append(f"[{_num(edges[-2])}, {_num(edges[-1])}]")
        else:
            edges = None  # spikes only
    if getattr(col, "nullable", False):
        names.append("null")
    return names, edges


def table_codes(table: pa.Table, schema: TableSchema, bins: int, what: str) -> np.ndarray:
    """(rows, columns + 1) codes of a table's rows (the label last), encoded by the public schema."""
    block = encode_batch(table, schema, what, 0)
    return codes_of(block.features, block.labels, schema, bins)


class CodeCounts:
    """Per column (the label last), the count of each code and of each (code, class) pair, summed over the batches of
    a table as they are read: memory set by the code domain, not the rows (a release's rows are read once, in
    batches of ``SYNTHETIC_BATCH_ROWS``)."""

    def __init__(self, sizes: tuple, k: int):
        self.sizes, self.k, self.rows = sizes, k, 0
        self.counts = [np.zeros(s, np.int64) for s in sizes]
        self.joint = [np.zeros(s * k, np.int64) for s in sizes]

    def add(self, codes: np.ndarray) -> "CodeCounts":
        self.rows += len(codes)
        for j, s in enumerate(self.sizes):
            self.counts[j] += np.bincount(codes[:, j], minlength=s)[:s]
            self.joint[j] += np.bincount(codes[:, j] * self.k + codes[:, -1], minlength=s * self.k)[: s * self.k]
        return self

    def shares(self, j: int) -> np.ndarray:
        return self.counts[j] / max(self.rows, 1)

    def label_rates(self, j: int) -> list:
        """Per code of column j, the label's class shares among its rows (None where it has no row)."""
        joint = self.joint[j].reshape(self.sizes[j], self.k).astype(np.float64)
        n = joint.sum(axis=1)
        return [(joint[b] / n[b]).tolist() if n[b] > 0 else None for b in range(self.sizes[j])]


def batches_of(table_or_batches):
    """A table's record batches, or the batches (or tables) given."""
    if isinstance(table_or_batches, pa.Table):
        return table_or_batches.to_batches(max_chunksize=SYNTHETIC_BATCH_ROWS)
    return table_or_batches


REAL_DECIMALS = 3  # real-data shares and rates are rounded: exact fractions k/n would give away the test rows' count


def real_figures(values) -> list:
    """Shares or rates of the real held-out rows as published (not DP): rounded to ``REAL_DECIMALS`` decimals, so
    the exact fractions (whose common denominator is the number of test rows, unpublished without
    ``--eval-input-public``) are not written."""
    return np.round(np.asarray(values, np.float64), REAL_DECIMALS).tolist()


def clipped_shares(counts) -> tuple[np.ndarray, float]:
    """Noisy counts clipped at 0 and normalised (uniform where nothing is left), and the clipped total."""
    c = np.maximum(np.asarray(counts, np.float64), 0.0)
    total = float(c.sum())
    return (c / total if total > 0 else np.full(len(c), 1.0 / len(c))), total


def tvd(p, q) -> float:
    return float(0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def noisy_label_rates(pair: dict, size: int, k: int) -> tuple[list, list]:
    """Per code of the column, the label's class shares in the noisy two-way counts (clipped at 0, normalised per
    code); None for a code merged with others by MST's compression (it has no count of its own) or with nothing
    left after clipping. A class merged in the label's compression: its share None (that code is dropped). And per
    code, one cell's noise std over the code's clipped total (the scale of a share's noise, roughly)."""
    counts = np.maximum(np.asarray(pair["counts"], np.float64), 0.0)
    col_map = pair["column_codes"] or list(range(size))
    lab_map = pair["label_codes"] or list(range(k))
    merged_col = max(col_map) if pair["column_codes"] else None
    merged_lab = max(lab_map) if pair["label_codes"] else None
    out, stds = [], []
    for b in range(size):
        row = counts[col_map[b]]
        total = float(row.sum())
        if col_map[b] == merged_col or total <= 0:
            out.append(None)
            stds.append(None)
            continue
        out.append([None if lab_map[c] == merged_lab else float(row[lab_map[c]] / total) for c in range(k)])
        stds.append(float(pair["std"]) / total)
    return out, stds


def trend_tvd(rates: list, reference: list, weights) -> Optional[float]:
    """The label's TVD within each code, averaged with ``weights`` (the reference's code shares) over the codes both
    sides have (a class share None on either side: that class left out of the code's TVD)."""
    num = den = 0.0
    for r, q, w in zip(rates, reference, weights):
        if r is None or q is None or w <= 0:
            continue
        num += w * 0.5 * sum(abs(a - b) for a, b in zip(r, q) if a is not None and b is not None)
        den += w
    return num / den if den > 0 else None


def _spread(values: dict) -> dict:
    """Mean, max and the column at the max of ``column -> distance`` (None values left out)."""
    kept = {k: v for k, v in values.items() if v is not None}
    if not kept:
        return {"mean": None, "max": None, "worst_column": None, "columns": 0}
    worst = max(kept, key=kept.get)
    return {
        "mean": float(np.mean(list(kept.values()))),
        "max": kept[worst],
        "worst_column": worst,
        "columns": len(kept),
    }


def quality_report(
    synth: pa.Table,
    schema: TableSchema,
    *,
    noisy: Optional[dict] = None,
    real: Optional[pa.Table] = None,
    classifier: Optional[dict] = None,
    release: Optional[dict] = None,
) -> dict:
    """quality.json's content (module doc): the synthetic rows' shares and label trends beside the noisy measurements
    (``noisy``: ``mechanisms.marginals.noisy.noisy_summary``'s, or None) and, only where ``real`` is given, the real
    rows' (with ``classifier``: the AUC figures, ``classifier_section``). ``synth``: a table, or its record batches
    (read one at a time: the report's memory does not grow with the rows)."""
    bins = int(noisy["domain"]["bins"]) if noisy else BINS
    dom = domain_of(schema, bins)
    if noisy and list(noisy["domain"]["sizes"]) != list(dom.sizes):
        raise EvaluationError("the noisy measurements' codes do not match the release's schema; nothing was published")
    k = schema.num_classes
    cols = [*schema.columns, schema.label]
    cs = CodeCounts(dom.sizes, k)
    for batch in batches_of(synth):  # the synthetic rows, batch by batch: a release may hold 10^7 of them
        cs.add(table_codes(batch, schema, bins, "synthetic"))
    cr = (
        CodeCounts(dom.sizes, k).add(table_codes(real, schema, bins, "evaluation test set"))
        if real is not None
        else None
    )
    one_way = {m["column"]: m for m in (noisy or {}).get("one_way", [])}
    pairs = {m["column"]: m for m in (noisy or {}).get("label_pairs", [])}
    columns, trends = [], []
    tvd_noisy, tvd_real, trend_noisy, trend_real = {}, {}, {}, {}
    for j, col in enumerate(cols):
        size = dom.sizes[j]
        labels, edges = code_labels(col, bins) if j < len(schema.columns) else ([str(c) for c in col.categories], None)
        numeric = {"edges": edges} if edges is not None else {}
        if getattr(col, "kind", None) == "numeric" and col.spikes:
            numeric["spikes"] = [float(v) for v in col.spikes]
        entry = {
            "name": col.name,
            "role": "feature" if j < len(schema.columns) else "label",
            "kind": getattr(col, "kind", "categorical"),
            "codes": labels,
            **numeric,
            "synthetic": cs.shares(j).tolist(),
        }
        distances = {}
        if col.name in one_way:
            m = one_way[col.name]
            noisy_shares, total = clipped_shares(m["counts"])
            entry["noisy_measurement"] = noisy_shares.tolist()
            entry["noisy_measurement_std"] = float(m["std"]) / total if total > 0 else None
            distances["synthetic_vs_noisy_measurement"] = tvd_noisy[col.name] = tvd(entry["synthetic"], noisy_shares)
        if cr is not None:
            entry["real"] = real_figures(cr.shares(j))
            distances["synthetic_vs_real"] = tvd_real[col.name] = tvd(entry["synthetic"], entry["real"])
            if "noisy_measurement" in entry:
                distances["noisy_measurement_vs_real"] = tvd(entry["noisy_measurement"], entry["real"])
        entry["tvd"] = distances
        columns.append(entry)
        if j == len(schema.columns):
            break
        trend = {"name": col.name, "codes": labels, **numeric}
        trend["synthetic"] = cs.label_rates(j)
        t = {}
        if col.name in pairs:
            trend["noisy_measurement"], trend["noisy_measurement_std"] = noisy_label_rates(pairs[col.name], size, k)
            w = entry.get("noisy_measurement", entry["synthetic"])
            t["synthetic_vs_noisy_measurement"] = trend_noisy[col.name] = trend_tvd(
                trend["synthetic"], trend["noisy_measurement"], w
            )
        elif noisy:
            trend["noisy_measurement"] = None
            trend["why_no_noisy_measurement"] = "the mechanism did not measure this column's pair with the label"
        if cr is not None:
            trend["real"] = [None if r is None else real_figures(r) for r in cr.label_rates(j)]
            t["synthetic_vs_real"] = trend_real[col.name] = trend_tvd(trend["synthetic"], trend["real"], entry["real"])
        trend["tvd"] = t
        trends.append(trend)
    summary = {
        "synthetic_rows": cs.rows,
        "one_way_tvd_synthetic_vs_noisy_measurement": _spread(tvd_noisy) if noisy else None,
        "label_trend_tvd_synthetic_vs_noisy_measurement": _spread(trend_noisy) if noisy else None,
    }
    sources = {"synthetic": SOURCES["synthetic"]}
    sources["noisy_measurement"] = SOURCES["noisy_measurement"] if noisy else {"absent": NO_MEASUREMENT}
    out = {
        "format": FORMAT,
        "release": release or {},
        "binning": {
            "bins": bins,
            "numeric": "a numeric column's spikes first (values with a code of their own, listed in 'spikes'), then "
            f"its bins: its declared or DP-derived 'edges', else {bins} equal bins of its declared [lower, upper] (a "
            "value on an edge in the bin above it; the last bin takes upper)",
            "null": "a nullable column's null is a code of its own",
            "encoding": "every table encoded by the public schema first, as the release encodes its input",
        },
        "sources": sources,
        "real_data": cr is not None,
        "columns": columns,
        "label_trends": {
            "label": schema.label.name,
            "classes": [str(c) for c in schema.label.categories],
            "what": "per column code, the label's class shares among the rows with that code (None: no row, or a "
            "code the noisy measurement merged with others); distance: the label's TVD within each code, averaged "
            "with the reference's code shares",
            "columns": trends,
        },
        "summary": summary,
    }
    if cr is not None:
        sources["real"] = SOURCES["real"]
        out["outside_guarantee"] = REAL_DATA_NOTE
        summary["real_held_out_not_dp"] = {
            "one_way_tvd_synthetic_vs_real": _spread(tvd_real),
            "label_trend_tvd_synthetic_vs_real": _spread(trend_real),
            **({"roc_auc": classifier["roc_auc"]} if classifier else {}),
        }
        if classifier:
            out["classifier"] = classifier
    return out


def classifier_section(models: dict, seed: int = 0) -> dict:
    """The AUC figures (``evaluation.tabular.train_on_synthetic``'s ``models``) with what was trained and how."""
    from dpcda.evaluation.tabular import MODELS, _model

    def settings(name):
        params = _model(name, seed).get_params()
        return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in params.items()}

    estimators = {"logistic_regression": "LogisticRegression", "gradient_boosting": "HistGradientBoostingClassifier"}
    return {
        "dp": False,
        "trained_on": "the synthetic rows",
        "tested_on": "the real held-out rows (not DP)",
        "features": "every column encoded by the public schema: categories one-hot, booleans 0/1, numbers scaled "
        "to [0, 1] of their declared bounds, a null indicator per nullable column",
        "roc_auc": models["gradient_boosting"]["roc_auc"],
        "roc_auc_of": "gradient_boosting",
        "roc_auc_averaging": "binary; one-vs-rest macro average for more than 2 classes",
        "models": {
            name: {"estimator": f"scikit-learn {estimators[name]}", "settings": settings(name), **models[name]}
            for name in MODELS
        },
    }


def read_noisy(workdir: str) -> Optional[dict]:
    """The noisy measurements' draft the pipeline left in the run directory (``storage.publish.MEASURED``), or None."""
    from dpcda.storage.publish import MEASURED

    path = join(workdir, MEASURED)
    if not exists(path):
        return None
    with open_file(path) as fh:
        return json.loads(fh.read())


def write_quality(out: str, report: dict, schema: TableSchema) -> None:
    """Writes ``out/quality.json`` with the pictures (``quality_plot``) and their panels listed in it."""
    from dpcda.evaluation.quality_plot import draw_distributions, draw_label_trends

    if not is_remote(out):
        import os

        os.makedirs(out, exist_ok=True)
    panels = draw_distributions(join(out, PICTURE), report)
    trend_panels = draw_label_trends(join(out, LABEL_PICTURE), report)
    report["pictures"] = [
        {"file": PICTURE, "shows": "each column's shares, one panel per column (the label last)", "panels": panels},
        {
            "file": LABEL_PICTURE,
            "shows": f"the share of each class of '{schema.label.name}' by each column's codes, one panel per column",
            "panels": trend_panels,
        },
    ]
    with open_file(join(out, QUALITY), "wb") as fh:
        fh.write((json.dumps(report, indent=1, allow_nan=False) + "\n").encode())


def quality_section(workdir: str, manifest: dict, eval_input: Optional[str], *, test_public: bool = False) -> dict:
    """Release stage of every table release: writes ``evaluation/quality.json`` and its pictures into the run
    directory and returns the manifest's ``utility`` section with a ``quality`` entry (the section so far kept:
    the table evaluation's, whose classifier figures the report takes when ``eval_input`` is given)."""
    from dpcda.evaluation.tabular import read_tables, synthetic_sample, train_on_synthetic
    from dpcda.schemas.table import parse_table_schema
    from dpcda.storage.tables import declared_schema

    schema = parse_table_schema(declared_schema(manifest["input"]["table"]), "manifest input.table")
    synth_files = join(workdir, "synthetic", "*.parquet")
    synth = synthetic_batches(synth_files)  # read again batch by batch by the report: never the whole table at once
    noisy = read_noisy(workdir)
    utility = dict(manifest.get("utility") or {})
    real = classifier = None
    if eval_input:
        real = read_tables(eval_input, "evaluation")
        models = utility.get("models")
        if models is None:  # a classifier trained on the synthetic rows (every k-th above EVAL_ROWS): asked for
            rows, _ = synthetic_sample(synth_files, manifest["output"]["rows"])
            bs, bt = encode_batch(rows, schema, "synthetic", 0), encode_batch(real, schema, "test", 0)
            models = train_on_synthetic(bs.features, bs.labels, bt.features, bt.labels, schema.num_classes)
        classifier = classifier_section(models)
    mech = manifest["mechanism"]
    release = {
        "mechanism": mech["name"],
        **({"selection": mech["selection"]} if "selection" in mech else {}),
        "epsilon": manifest["privacy"]["epsilon"],
        "delta": manifest["privacy"]["delta"],
        "rows": manifest["output"]["rows"],
    }
    report = quality_report(synth, schema, noisy=noisy, real=real, classifier=classifier, release=release)
    write_quality(join(workdir, EVAL_DIR), report, schema)
    prefix = manifest["output"].get("prefix", "")
    s = report["summary"]
    entry = {
        "report": f"{prefix}{EVAL_DIR}/{QUALITY}",
        "pictures": [f"{prefix}{EVAL_DIR}/{p['file']}" for p in report["pictures"]],
        "compared_with": [
            report["sources"][k]["legend"]
            for k in ("noisy_measurement", "real")
            if k in report["sources"] and "legend" in report["sources"][k]
        ],  # fmt: skip
        "one_way_tvd_mean_vs_noisy_measurement": (s["one_way_tvd_synthetic_vs_noisy_measurement"] or {}).get("mean"),
    }
    if real is not None:
        entry["real_held_out_not_dp"] = {
            "one_way_tvd_mean": s["real_held_out_not_dp"]["one_way_tvd_synthetic_vs_real"]["mean"],
            "roc_auc": classifier["roc_auc"],
            **({"test_rows": real.num_rows} if test_public else {"outside_guarantee": REAL_DATA_NOTE}),
        }
    log.info("stage=quality report=%s real_data=%s", entry["report"], real is not None)
    return {**utility, "quality": entry}
