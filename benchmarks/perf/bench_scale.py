"""The two mixing paths at scale: in memory (one class on one worker) and plan-and-join (mechanisms.joinmix).

    python -m benchmarks.perf.bench_scale                     # generated tables of 2e5 and 2e6 rows (d = 64, 2 classes)
    python -m benchmarks.perf.bench_scale --fashion --runs 3  # + Fashion-MNIST, join path against in memory, accuracy
    ... --sizes 200000 --skip-generated                       # pick what runs

Every release is the real CLI (``dpcda release``, DirectRunner in_memory, eps 10, fixed) in its own process, so its
wall time and peak RSS (``/usr/bin/time``'s maximum resident set) are its own. The join path's Beam counters give the
shuffle's payload (records, index pairs, partial sums) and the most one worker held at once in each join; the
table puts them beside what the design says they should be: N d 8 bytes of records, T l index pairs, at most
T min(l, ceil(N_k / R)) d 8 bytes of partial sums.

On the DirectRunner every PCollection lives in the one process, so the process's peak RSS grows with N on both paths;
the per-worker figure of the join path is the held-bytes maximum, which must not grow with N_k (on Dataflow the
shuffle is on disk, and that is what a worker holds).

Writes benchmarks/results/bench_scale.md (rows are added as they finish).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.files import RESULTS, ROOT, write_text

OUT = os.path.join(RESULTS, "bench_scale.md")
OUT_PATH = [OUT]  # --out
DPCDA = [sys.executable, "-m", "dpcda.pipeline.cli"]


def generate(directory: str, rows: int, dim: int, shard_rows: int = 200_000) -> str:
    """Two classes of ``rows / 2`` records each, d features in [0, 1] (class 1 brighter), in Parquet shards."""
    from dpcda.storage.shards import write_parquet

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(0)
    for s, start in enumerate(range(0, rows, shard_rows)):
        n = min(shard_rows, rows - start)
        y = (np.arange(start, start + n) % 2).astype(np.int64)
        x = np.clip(rng.uniform(0, 0.7, (n, dim)) + 0.3 * y[:, None], 0, 1).astype(np.float32)
        write_parquet(os.path.join(directory, f"part-{s:05d}.parquet"), x, y)
    return os.path.join(directory, "*.parquet")


def release(args: list, out: str) -> dict:
    """Runs ``dpcda release ARGS --output OUT`` under /usr/bin/time; wall s, peak RSS MiB, counters, manifest."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    res = subprocess.run(
        ["/usr/bin/time", "-f", "MAXRSS_KB=%M", *DPCDA, "release", *map(str, args), "--output", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    if res.returncode != 0:
        raise RuntimeError(f"release failed ({res.returncode}): {res.stderr[-2000:]}")
    rss = int(re.search(r"MAXRSS_KB=(\d+)", res.stderr).group(1)) / 1024
    line = next((ln for ln in res.stderr.splitlines() if "stage=pipeline" in ln), "")
    counters = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)(?=\s|$)", line)}
    with open(os.path.join(out, "manifest.json")) as fh:
        manifest = json.load(fh)
    return {"wall": wall, "rss": rss, "counters": counters, "manifest": manifest}


def _mib(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def generated_rows(sizes, dim, l, work, R) -> list[str]:
    lines = []
    for n in sizes:
        inp = generate(os.path.join(work, f"gen{n}"), n, dim)
        for path in ("memory", "join"):
            print(f"generated N={n:,}: {path} path ...", file=sys.stderr, flush=True)
            r = release(
                ["--input", inp, "--epsilon", 10, "--mixing-order", l, "--mixing-path", path, "--output-shards", 4]
                + (["--join-block-rows", R] if path == "join" else []),
                os.path.join(work, f"out-{n}-{path}"),
            )
            c, m = r["counters"], r["manifest"]
            T = m["output"]["rows"]
            nk = n // 2
            expect = f"{_mib(n * dim * 8)} / {T * l:,} / {_mib(T * min(l, math.ceil(nk / R)) * dim * 8)}"
            got = (
                f"{_mib(c.get('join_record_bytes', 0))} / {c.get('join_index_pairs', 0):,} / "
                f"{_mib(c.get('join_partial_bytes', 0))}"
                if path == "join"
                else "-"
            )
            held = (
                f"{_mib(c.get('join_block_held_bytes_max', 0))} / {_mib(c.get('join_chunk_held_bytes_max', 0))}"
                if path == "join"
                else f"{_mib(nk * (12 * dim + 8))} (one class)"
            )
            label = f"{path} (R = {R:,})" if path == "join" else path
            lines.append(
                f"| generated, N = {n:,} (N_k = {nk:,}), d = {dim}, l = {l} | {label} | {r['wall']:.1f} | "
                f"{T / r['wall']:,.0f} | {r['rss']:,.0f} | {held} | {got} | {expect if path == 'join' else '-'} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
            write(lines, [], out=OUT_PATH[0])
    return lines


def fashion_rows(runs: int, work: str, data: str) -> list[str]:
    common = [
        "--input", f"{data}/train/*.parquet", "--epsilon", 10, "--mixing-order", 16, "--lowpass", 16,
        "--eval-input", f"{data}/test/*.parquet", "--eval-epochs", 5,
    ]  # fmt: skip
    lines = []
    for path, extra in (("memory", ["--mixing-path", "memory"]), ("join", ["--max-class-bytes", "9M"])):
        accs, eps, walls, paths = [], set(), [], None
        for run in range(runs):
            print(f"fashion-mnist: {path} path, release {run + 1}/{runs} ...", file=sys.stderr, flush=True)
            r = release([*common, *extra], os.path.join(work, f"fm-{path}"))
            m = r["manifest"]
            accs.append(m["utility"]["accuracy_mean"])
            eps.add(m["privacy"]["epsilon"])
            walls.append(r["wall"])
            paths = sorted(set(m["mechanism"]["mixing_paths"]))
            assert m["output"]["rows"] == 60000
        lines.append(
            f"| {path} ({'/'.join(paths)}) | {runs} | {', '.join(f'{a:.4f}' for a in accs)} | {np.mean(accs):.4f} +- "
            f"{np.std(accs, ddof=1) if runs > 1 else 0:.4f} | {', '.join(f'{e:.4f}' for e in sorted(eps))} | "
            f"{np.mean(walls):.0f} |"
        )
        print(lines[-1], file=sys.stderr, flush=True)
        write([], lines, out=OUT_PATH[0])
    return lines


def write(gen_lines, fm_lines, command=None, out=OUT):
    text = (
        f"Generated by `{command or ' '.join(['python -m benchmarks.perf.bench_scale', *sys.argv[1:]])}` on this "
        "2-core CPU (DirectRunner in_memory; other jobs may have shared the machine, see the experiment log).\n\n"
    )
    if gen_lines:
        text += (
            "| data | path | wall s | rows/s | peak RSS MiB (process) | held MiB: join block / chunk (memory: "
            "one class) | shuffle: records MiB / index pairs / partial sums MiB | design bound |\n"
            "|---|---|---:|---:|---:|---|---|---|\n" + "\n".join(gen_lines) + "\n\n"
        )
    if fm_lines:
        text += (
            "Fashion-MNIST, fixed, eps 10, l = 16, `--lowpass 16`, evaluation CNN 5 epochs; join path forced by "
            "`--max-class-bytes 9M` (a class of 6,000 rows needs 54 MiB in memory).\n\n"
            "| path | releases | accuracy each | mean +- std | epsilon | wall s (with evaluation) |\n"
            "|---|---:|---|---|---|---:|\n" + "\n".join(fm_lines) + "\n"
        )
    write_text(out, text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--mixing-order", type=int, default=4)
    ap.add_argument(
        "--join-block-rows",
        type=int,
        default=65536,
        help="R for the generated tables (below both classes' sizes, so a join block is full at both sizes)",
    )
    ap.add_argument("--skip-generated", action="store_true")
    ap.add_argument("--fashion", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist"))
    ap.add_argument("--out", default=OUT, help="the markdown file written")
    args = ap.parse_args(argv)
    OUT_PATH[0] = args.out
    work = tempfile.mkdtemp(prefix="bench-scale-")
    try:
        gen = (
            []
            if args.skip_generated
            else generated_rows(args.sizes, args.dim, args.mixing_order, work, args.join_block_rows)
        )
        fm = fashion_rows(args.runs, work, args.data) if args.fashion else []
        write(gen, fm, out=args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(open(args.out).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
