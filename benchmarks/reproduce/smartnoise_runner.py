"""Runs a smartnoise-synth synthesizer (MST or AIM) on a Parquet table, in smartnoise-synth's own venv.

    VENV/bin/python benchmarks/reproduce/smartnoise_runner.py --train T.parquet --schema S.json --synth mst \
        --epsilon 1 --out O.parquet

Imports nothing of this product (smartnoise-synth pins its own numpy and torch). ``S.json`` is the table's declared
schema (``schemas.table``): numeric columns are clamped and binned into 20 bins inside their declared bounds,
categorical and boolean columns label-encoded; no budget is spent on inferring bounds (preprocessor_eps 0).
benchmarks/reproduce/tabular_table.py calls it and evaluates the output like our releases.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True)
    ap.add_argument("--schema", required=True)
    ap.add_argument("--synth", choices=["mst", "aim"], required=True)
    ap.add_argument("--epsilon", type=float, required=True)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--bins", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    # imported after the arguments: --help works without smartnoise-synth, which lives in a venv of its own
    import pandas as pd
    from snsynth import Synthesizer
    from snsynth.transform import BinTransformer, LabelTransformer

    with open(args.schema) as fh:
        schema = json.load(fh)
    df = pd.read_parquet(args.train)
    constraints = {}
    for col in schema["columns"]:
        name, nullable = col["name"], bool(col.get("nullable"))
        if col["kind"] == "numeric":
            lo, hi = float(col["lower"]), float(col["upper"])
            # clamped here: a ChainTransformer reports its members' cardinalities concatenated, which MST refuses
            df[name] = df[name].astype("float64").clip(lo, hi)
            constraints[name] = BinTransformer(bins=args.bins, lower=lo, upper=hi, nullable=nullable)
        else:
            df[name] = df[name].astype("object")
            constraints[name] = LabelTransformer(nullable=nullable)
    df[schema["label"]["name"]] = df[schema["label"]["name"]].astype("object")
    constraints[schema["label"]["name"]] = LabelTransformer(nullable=False)
    t0 = time.time()
    synth = Synthesizer.create(args.synth, epsilon=args.epsilon, delta=args.delta, verbose=False)
    out = synth.fit_sample(df, transformer=constraints, preprocessor_eps=0.0)
    out.to_parquet(args.out, index=False)
    print(json.dumps({"rows": len(out), "seconds": time.time() - t0}))


if __name__ == "__main__":
    main()
