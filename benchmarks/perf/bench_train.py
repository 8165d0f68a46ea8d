"""Training throughput of the evaluation CNN on this machine: rows/s and achieved GFLOP/s against a measured peak.

    python -m benchmarks.perf.bench_train                     # every variant, 3 timed epochs' worth of steps each
    python -m benchmarks.perf.bench_train --variants base bf16 --steps 200
    python -m benchmarks.perf.bench_train --first-command             # the README's first command's evaluation, timed
    python -m benchmarks.perf.bench_train --first-command --isa avx2  # the same on the kernels of an AVX2-only CPU

Every run prints the kernel path it took (torch's CPU capability, the CPU's flags, bf16 or float32: bf16 autocast
only where the CPU has bf16 units, ``evaluation.train.cpu_has_bf16``). ``--isa avx2`` re-runs this module with torch's
dispatch and oneDNN held to AVX2 (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``): the code path of an AVX2-only
CPU on this one (clock and cache stay this machine's).

FLOPs per training row are counted by torch's FlopCounterMode on one forward and backward pass of the Table 1 CNN
(what one training row costs; the optimizer, EMA and data path are not counted). The peak is a float32 (and a bf16)
2048 x 2048 matmul measured in the same run, so the percentages are relative to what this machine does at its best
in each precision. Variants change only how the same computation runs (memory format, precision, batch shape); the
recipe of ``evaluation.train`` decides which one a release uses.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time

import torch
from torch import nn

from dpcda.evaluation.models import TableOneCNN
from dpcda.evaluation.train import RowScale

VARIANTS = {
    # name: (channels_last, bf16 autocast, batch size)
    "base": (False, False, 256),
    "channels_last": (True, False, 256),
    "bf16": (False, True, 256),
    "bf16+channels_last": (True, True, 256),
    "bf16+channels_last b512": (True, True, 512),
}


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 20) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def flops_per_row(batch: int = 64) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    model = nn.Sequential(RowScale(), TableOneCNN((1, 28, 28), 10))
    x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
    with FlopCounterMode(display=False) as counter:
        nn.functional.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / batch


def time_variant(channels_last: bool, bf16: bool, batch: int, steps: int) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(RowScale(), TableOneCNN((1, 28, 28), 10))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    x, y = torch.randn(batch * 8, 784), torch.randint(0, 10, (batch * 8,))
    model.train()

    def step(i):
        sl = slice((i % 8) * batch, (i % 8 + 1) * batch)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(model(x[sl]).float(), y[sl])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for i in range(5):
        step(i)
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps * batch / (time.perf_counter() - t)


RECIPES = {
    # the recipe as it was (float32, contiguous memory, 4096-row inference batches) and as it is now
    "before: float32, contiguous, eval batch 4096": dict(precision="float32", channels_last=False, eval_batch=4096),
    "now: bf16 autocast, channels-last, eval batch 512": dict(precision="bf16", channels_last=True, eval_batch=512),
}


def time_recipe(rows: int, epochs: int, **recipe) -> float:
    """rows/s of the whole ``evaluation.train.train_and_score`` on random 28x28 rows: the data path, EMA, gradient
    clipping, the synthetic hold-out every epoch and the final test pass included."""
    import numpy as np

    from dpcda.evaluation.train import Recipe, train_and_score

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(rows, 784)).astype(np.float32), rng.integers(0, 10, rows)
    xt, yt = rng.normal(size=(10000, 784)).astype(np.float32), rng.integers(0, 10, 10000)
    t = time.perf_counter()
    res = train_and_score(
        x, y, xt, yt, num_classes=10, epochs=epochs, device="cpu", progress=False, recipe=Recipe(**recipe)
    )
    return res["train_rows"] * epochs / (time.perf_counter() - t)


FIRST_COMMAND_ROWS = 60000  # the first command releases T = 60,000 rows; the evaluation trains on 90 % of them
FIRST_COMMAND_EPOCHS = 5


def time_first_command(rows: int, epochs: int) -> dict:
    """Wall seconds of ``train_and_score`` as the first command runs it (default recipe, one run, 10,000 test rows,
    the linear probe included) on random 28 x 28 rows: speed does not depend on the values."""
    import numpy as np

    from dpcda.evaluation.train import train_and_score

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(rows, 784)).astype(np.float32), rng.integers(0, 10, rows)
    xt, yt = rng.normal(size=(10000, 784)).astype(np.float32), rng.integers(0, 10, 10000)
    t = time.perf_counter()
    res = train_and_score(x, y, xt, yt, num_classes=10, epochs=epochs, device="cpu", progress=False)
    wall = time.perf_counter() - t
    return {"seconds": wall, "rows_per_s": res["train_rows"] * epochs / wall, "probe_s": res["probe"]["seconds"]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--first-command",
        action="store_true",
        help=f"only time the first command's evaluation ({FIRST_COMMAND_ROWS:,} rows x {FIRST_COMMAND_EPOCHS} epochs)",
    )
    ap.add_argument("--rows", type=int, default=FIRST_COMMAND_ROWS, help="with --first-command: synthetic rows")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native", help="avx2: the kernels of an AVX2-only CPU")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=150, help="timed training steps per variant")
    ap.add_argument("--epoch-rows", type=int, default=60000, help="rows of the whole-recipe timing (0: skip it)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of each whole-recipe timing")
    ap.add_argument("--repeats", type=int, default=2, help="alternating whole-recipe runs of each recipe")
    args = ap.parse_args(argv)
    if args.isa == "avx2" and os.environ.get("ATEN_CPU_CAPABILITY") != "avx2":
        env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
        argv = sys.argv[1:] if argv is None else list(argv)
        raise SystemExit(subprocess.call([sys.executable, "-m", "benchmarks.perf.bench_train", *argv], env=env))
    from dpcda.evaluation.train import kernel_path

    path = kernel_path()
    print(
        f"kernel path: torch CPU capability {path['torch_cpu_capability']}, CPU flags {' '.join(path['cpu_flags'])}, "
        f"{path['precision']}, {path['threads']} threads"
        + (f", limited by {' '.join(f'{k}={v}' for k, v in path['limits'].items())}" if path["limits"] else "")
    )
    if args.first_command:
        got = time_first_command(args.rows, FIRST_COMMAND_EPOCHS)
        print(
            f"first command's evaluation: {args.rows:,} rows ({int(args.rows * 0.9):,} trained) x "
            f"{FIRST_COMMAND_EPOCHS} epochs + probe: {got['seconds']:.1f} s, {got['rows_per_s']:,.0f} training rows/s "
            f"(probe {got['probe_s']:.1f} s); 1-min load average at the end {os.getloadavg()[0]:.2f}"
        )
        trained, ep, rate = int(FIRST_COMMAND_ROWS * 0.9), FIRST_COMMAND_EPOCHS, got["rows_per_s"]
        print(
            f"at this rate the first command's {trained:,} training rows x {ep} epochs take {trained * ep / rate:.0f} "
            f"s; 90 s holds {90 * rate / ep:,.0f} training rows per epoch"
        )
        return
    fl = flops_per_row()
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {fl / 1e6:.1f} MFLOP per training row "
        f"(forward + backward); matmul peak {peak32:.0f} GFLOP/s float32, {peak16:.0f} GFLOP/s bf16\n"
    )
    print("| variant | batch | rows/s | GFLOP/s | % of float32 peak | % of this precision's peak | vs base |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    base = None
    for name in args.variants:
        cl, bf16, batch = VARIANTS[name]
        rows = time_variant(cl, bf16, batch, args.steps)
        base = base or (rows if name == "base" else None)
        gflops = rows * fl / 1e9
        rel = f"{rows / base:.2f}x" if base else "-"
        print(
            f"| {name} | {batch} | {rows:,.0f} | {gflops:.0f} | {100 * gflops / peak32:.0f} % | "
            f"{100 * gflops / (peak16 if bf16 else peak32):.0f} % | {rel} |",
            flush=True,
        )
    if args.epoch_rows:
        print(
            f"\nThe whole recipe (evaluation.train.train_and_score: {args.epochs} epochs of "
            f"{int(args.epoch_rows * 0.9):,} training rows, EMA, hold-out and test passes included), "
            f"{args.repeats} alternating runs each:\n"
        )
        print("| recipe | rows/s (each run) | mean | vs before |")
        print("|---|---|---:|---:|")
        got = {name: [] for name in RECIPES}
        for _ in range(args.repeats):
            for name, recipe in RECIPES.items():
                got[name].append(time_recipe(args.epoch_rows, args.epochs, **recipe))
        first = None
        for name, values in got.items():
            mean = sum(values) / len(values)
            first = first or mean
            print(f"| {name} | {', '.join(f'{v:,.0f}' for v in values)} | {mean:,.0f} | {mean / first:.2f}x |")


if __name__ == "__main__":
    main()
