"""Our per-column fidelity figures against sdmetrics' on the same pair of tables.

    python -m benchmarks.checks.sdmetrics_check [--venv DIR]

evaluation/tabular.py computes, per column, the total variation distance (categories) and the Kolmogorov-Smirnov
statistic (numbers) itself, because sdmetrics would replace our pandas (it pins pandas < 3). This script checks
them against sdmetrics' ``TVComplement`` and ``KSComplement`` (1 - distance) from a venv of its own, created in DIR
if missing (pip install sdmetrics==0.32.0 pyarrow), on wa_churn's real test table and one DP-CDA release of its
training table. Prints one row per column and exits non-zero if any column differs by more than 1e-9.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import pyarrow.parquet as pq

from benchmarks.reproduce.tabular_table import METHODS, load, one_release
from dpcda.evaluation.tabular import column_distances
from dpcda.schemas.table import parse_table_schema

SDM = """
import json, sys
import pandas as pd
from sdmetrics.single_column import KSComplement, TVComplement
real, synth, cols = pd.read_parquet(sys.argv[1]), pd.read_parquet(sys.argv[2]), json.loads(sys.argv[3])
out = {}
for name, kind in cols.items():
    metric = KSComplement if kind == "numeric" else TVComplement
    r, s = real[name], synth[name]
    if kind != "numeric":  # sdmetrics drops nulls; count them as a value, as we do
        r, s = r.astype(object).where(r.notna(), "<null>"), s.astype(object).where(s.notna(), "<null>")
    out[name] = 1.0 - metric.compute(real_data=r, synthetic_data=s)
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=os.path.join(tempfile.gettempdir(), "dpcda-sdmetrics-venv"))
    args = ap.parse_args(argv)
    python = os.path.join(args.venv, "bin", "python")
    if not os.path.exists(os.path.join(args.venv, ".installed")):
        subprocess.run([sys.executable, "-m", "venv", args.venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "sdmetrics==0.32.0", "pyarrow"], check=True)
        open(os.path.join(args.venv, ".installed"), "w").close()
    train, test, conf = load("wa_churn")
    schema = parse_table_schema(conf["table"])
    synth = one_release(train, test, conf, METHODS["dpcda fixed, sample decoding"], 10.0, 1, return_table=True)
    ours = column_distances(test, synth, schema)
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(test, os.path.join(tmp, "real.parquet"))
        pq.write_table(synth, os.path.join(tmp, "synth.parquet"))
        kinds = {c.name: c.kind for c in schema.columns} | {schema.label.name: "categorical"}
        real_path, synth_path = os.path.join(tmp, "real.parquet"), os.path.join(tmp, "synth.parquet")
        res = subprocess.run(
            [python, "-c", SDM, real_path, synth_path, json.dumps(kinds)], capture_output=True, text=True, check=True
        )
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    print("| column | metric | ours | sdmetrics | difference |\n|---|---|---|---|---|")
    worst = 0.0
    for name, d in ours.items():
        gap = abs(d["distance"] - theirs[name])
        worst = max(worst, gap)
        print(f"| {name} | {d['metric']} | {d['distance']:.6f} | {theirs[name]:.6f} | {gap:.1e} |")
    print(f"largest difference: {worst:.1e}")
    return 0 if worst <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
