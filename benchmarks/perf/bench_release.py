"""Release of full Fashion-MNIST: the Beam job (DirectRunner) beside a bare single-process implementation.

    python -m benchmarks.perf.bench_release [--data data/fashion-mnist] [--repeats 1]
    python -m benchmarks.perf.bench_release --compare-to REV --repeats 3   # this tree vs git revision REV, paired

``--compare-to`` checks REV out into a temporary git worktree and runs the Beam job (in_memory) from both trees,
alternating, so a change's cost is measured in one run on one machine state.

Both run the same steps on the same shards: read Parquet, first-pass statistics, DP calibration,
z-score + clip, per-class mixing, Parquet out. The bare one is ``mechanisms.inprocess.release_in_process``, the
same Beam-free cores in a plain loop (pyarrow + numpy + torch, no Beam), so the gap is what Beam costs. Each variant
runs in its own process; wall time and peak RSS (ru_maxrss of that process) are reported. Target: Beam within 2x of
bare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.paired import HERE, print_paired, revision_tree

BARE = r"""
import glob, os, sys, json
import numpy as np, pyarrow.parquet as pq
from dpcda.schemas.config import load_config
from dpcda.privacy.noise import key_from_test_seed
from dpcda.storage.shards import read_parquet, block_table
from dpcda.mechanisms.inprocess import release_in_process
cfg = load_config(None, json.loads(sys.argv[1]))
blocks = [b for p in sorted(glob.glob(cfg.input)) for b in read_parquet(p, "features", "label", 16384)]
x, y = np.concatenate([b.features for b in blocks]), np.concatenate([b.labels for b in blocks])
feats, labels, plan, _ = release_in_process(x, y, cfg.core, key_from_test_seed(cfg.seed))
os.makedirs(os.path.join(cfg.output, "synthetic"), exist_ok=True)
pq.write_table(block_table(feats, labels), os.path.join(cfg.output, "synthetic", "part-00000.parquet"))
"""


def _run(cmd: list[str]) -> tuple[float, float]:
    t = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - t
    err = proc.stderr.read()
    if status != 0:
        raise RuntimeError(f"{cmd[:4]} failed:\n{err[-3000:]}")
    return wall, usage.ru_maxrss / 1024.0


def _release_cmd(train: str, out: str, epsilon: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dpcda.pipeline.cli",
        "release",
        "--input",
        train,
        "--output",
        out,
        "--epsilon",
        str(epsilon),
        "--seed",
        "0",
        "--runner=DirectRunner",
        "--direct_running_mode=in_memory",
    ]


def compare(rev: str, train: str, epsilon: float, repeats: int) -> None:
    """The in_memory Beam release from this tree and from git revision ``rev``, alternating."""
    train = os.path.abspath(train)
    times: dict[str, list[float]] = {rev: [], "this tree": []}
    with revision_tree(rev, "bench-release-") as (ref_tree, tmp):
        for r in range(repeats):
            for name, tree in ((rev, ref_tree), ("this tree", HERE)):
                out = os.path.join(tmp, f"out-{r}-{len(times[name])}-{name.replace(' ', '_')}")
                cwd = os.getcwd()
                os.chdir(tree)  # python -m imports the package of the working directory first
                try:
                    wall, rss = _run(_release_cmd(train, out, epsilon))
                finally:
                    os.chdir(cwd)
                times[name].append(wall)
                print(f"{name}: {wall:.1f} s, peak RSS {rss:.0f} MiB", file=sys.stderr, flush=True)
                shutil.rmtree(out, ignore_errors=True)
    print_paired(
        f"Full Fashion-MNIST release, Beam DirectRunner in_memory (60,000 rows, d = 784, l = 4, eps = {epsilon:g}), "
        f"{os.cpu_count()} cores, {repeats} alternating runs each",
        times,
        "wall s",
        1,
    )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--epsilon", type=float, default=10.0)
    ap.add_argument("--compare-to", metavar="REV", help="git revision to time against (in_memory Beam job only)")
    args = ap.parse_args(argv)
    train = os.path.join(args.data, "train", "*.parquet")
    if args.compare_to:
        compare(args.compare_to, train, args.epsilon, args.repeats)
        return
    tmp = tempfile.mkdtemp(prefix="bench-release-")
    fields = {"input": train, "epsilon": args.epsilon, "mixing_order": 4, "seed": 0}
    variants = {
        "beam DirectRunner in_memory": lambda out: _release_cmd(train, out, args.epsilon),
        "beam DirectRunner multi_processing x2": lambda out: [
            sys.executable,
            "-m",
            "dpcda.pipeline.cli",
            "release",
            "--input",
            train,
            "--output",
            out,
            "--epsilon",
            str(args.epsilon),
            "--seed",
            "0",
            "--runner=DirectRunner",
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ],
        "bare numpy/pyarrow (same cores, no Beam)": lambda out: [
            sys.executable,
            "-c",
            BARE,
            json.dumps({**fields, "output": out}),
        ],
    }
    rows = []
    try:
        for name, make in variants.items():
            for r in range(args.repeats):
                out = os.path.join(tmp, f"out-{len(rows)}")
                wall, rss = _run(make(out))
                rows.append((name, wall, rss))
                print(f"{name}: {wall:.1f} s, peak RSS {rss:.0f} MiB", file=sys.stderr, flush=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    bare = min(w for n, w, _ in rows if n.startswith("bare"))
    print(
        f"\nFull Fashion-MNIST release (60,000 rows, d = 784, l = 4, eps = {args.epsilon:g}), {os.cpu_count()} cores\n"
    )
    print("| variant | wall s | peak RSS MiB | wall / bare |")
    print("|---|---:|---:|---:|")
    for name, wall, rss in rows:
        print(f"| {name} | {wall:.1f} | {rss:.0f} | {wall / bare:.2f} |")


if __name__ == "__main__":
    main()
