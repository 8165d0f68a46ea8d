"""How a marginals release's memory and time grow with the table's size: columns and bins, against the footprint the
release checks before any row is read (``dpcda.mechanisms.marginals.limits``).

    python -m benchmarks.perf.bench_marginals_size                         # the grid below, 300 rows
    python -m benchmarks.perf.bench_marginals_size --cases 25x20 50x20 11nx1024 --rows 300

A case ``CxB`` is a generated table of C columns besides the label (cycling numeric, 5 categories, boolean, 3
categories) at ``--marginals-bins B``; ``Cn`` makes every column numeric. Rows are drawn with numpy from a fixed seed
(generated public data). Each release is the product's CLI (``dpcda release --mechanism marginals --epsilon 1
--marginals-iters 100``, the default selection mst-label, DirectRunner, a TEST seed) in its own process under
``nice -n 10``, measured as ``bench_table_scale.measured_run`` measures (wall s; peak RSS of the process tree, polled
every 0.2 s; CPU s of the children from ``resource``). A refused case prints the release's one line and its exit
status. Columns: the case, columns with the label, count cells, the model cells bound, the footprint (GiB), the
measured peak RSS (GiB) and its ratio to the footprint, wall s, CPU s, and the exit status. Writes
benchmarks/results/bench_marginals_size.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.files import RESULTS, write_text
from benchmarks.perf.bench_table_scale import measured_run

OUT = os.path.join(RESULTS, "bench_marginals_size.md")
CASES = ["10x20", "25x20", "50x20", "100x20", "127x20", "200x20", "11nx64", "11nx256", "11nx512", "11nx768", "11nx1024"]
KINDS = ("numeric", "categorical5", "boolean", "categorical3")


def parse_case(case: str) -> tuple[int, bool, int]:
    """(columns besides the label, all numeric, bins) of ``CxB`` or ``CnxB``."""
    cols, bins = case.split("x")
    numeric = cols.endswith("n")
    return int(cols.rstrip("n")), numeric, int(bins)


def schema_of(columns: int, numeric: bool) -> dict:
    cols = []
    for i in range(columns):
        kind = "numeric" if numeric else KINDS[i % len(KINDS)]
        if kind == "numeric":
            cols.append({"name": f"c{i}", "kind": "numeric", "lower": 0.0, "upper": 1.0})
        elif kind == "boolean":
            cols.append({"name": f"c{i}", "kind": "boolean"})
        else:
            k = int(kind[-1])
            cols.append({"name": f"c{i}", "kind": "categorical", "categories": [f"v{j}" for j in range(k)]})
    return {"label": {"name": "y", "categories": ["a", "b"]}, "columns": cols}


def write_table(folder: str, schema: dict, rows: int, seed: int = 0) -> str:
    """``rows`` rows of ``schema`` as one Parquet file under ``folder``; returns its glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    data = {}
    for col in schema["columns"]:
        if col["kind"] == "numeric":
            data[col["name"]] = pa.array(rng.random(rows))
        elif col["kind"] == "boolean":
            data[col["name"]] = pa.array(rng.random(rows) < 0.3)
        else:
            data[col["name"]] = pa.array(rng.choice(col["categories"], rows).tolist(), type=pa.string())
    data["y"] = pa.array(rng.choice(["a", "b"], rows).tolist(), type=pa.string())
    os.makedirs(folder, exist_ok=True)
    pq.write_table(pa.table(data), os.path.join(folder, "part-0.parquet"))
    return os.path.join(folder, "*.parquet")


def footprint_of(schema: dict, bins: int, chunk_rows: int = 4096):
    from dpcda.mechanisms.marginals import domain_of
    from dpcda.mechanisms.marginals.limits import footprint
    from dpcda.schemas.table import parse_table_schema

    table = parse_table_schema(schema)
    return footprint(domain_of(table, bins), table.encoded_width, "mst-label", None, chunk_rows)


def run_case(case: str, rows: int, work: str, timeout: float) -> str:
    import yaml

    columns, numeric, bins = parse_case(case)
    schema = schema_of(columns, numeric)
    fp = footprint_of(schema, bins)
    folder = os.path.join(work, case)
    shutil.rmtree(folder, ignore_errors=True)
    inp = write_table(os.path.join(folder, "in"), schema, rows)
    cfg = os.path.join(folder, "config.yaml")
    Path(cfg).write_text(yaml.safe_dump({"mechanism": "marginals", "table": schema}))  # in the temporary folder
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = measured_run(
        [sys.executable, "-m", "dpcda.pipeline.cli", "release", "--config", cfg, "--input", inp, "--output",
         os.path.join(folder, "out"), "--epsilon", "1", "--marginals-bins", bins, "--marginals-iters", "100",
         "--seed", "1"],
        timeout=timeout,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    status = "timed out" if r["timed_out"] else str(r["rc"])
    note = ""
    if r["rc"] not in (0, None) and not r["timed_out"]:
        note = next((ln for ln in r["stderr"].splitlines() if ln.startswith("dpcda: error:")), "")
    rss = r["rss_tree"] / 1024
    gib = fp.bytes / (1 << 30)
    return (
        f"| {case} | {fp.columns} | {fp.count_cells:,} | {fp.model_cells:,} | {gib:.2f} | {rss:.2f} | "
        f"{rss / gib:.2f} | {r['wall']:.1f} | {cpu:.1f} | {status} | {note} |"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=CASES)
    p.add_argument("--rows", type=int, default=300)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    command = "python -m benchmarks.perf.bench_marginals_size " + " ".join(
        ["--cases", *args.cases, "--rows", str(args.rows)]
    )
    head = [
        "# marginals: memory and time against the table's size",
        "",
        f"`{command}` (load at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores).",
        "",
        "| case | columns | count cells | model cells (bound) | footprint GiB | peak RSS GiB | RSS / footprint | "
        "wall s | CPU s | exit | refusal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    lines = []
    with tempfile.TemporaryDirectory(prefix="bench-marginals-size-") as work:
        for case in args.cases:
            lines.append(run_case(case, args.rows, work, args.timeout))
            print(lines[-1], flush=True)
            write_text(args.out, "\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
