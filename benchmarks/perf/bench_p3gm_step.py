"""Seconds per DP-SGD step of p3gm's VAE at Fashion-MNIST's shapes, optionally paired against another git revision.

    python -m benchmarks.perf.bench_p3gm_step [--steps 30] [--repeats 2] [--threads 1] [--compare-to REV]

Rows are public stand-ins (random unit rows, 60,000 x 784, 10 classes), the spec is the release's default (hidden
1000, latent 10, expected batch 300, z 1.4), so the step does what a release's step does: the Poisson batch, the
forward and backward passes (in fixed 64-row blocks since mechanisms.rowwise), ghost clipping, 1.6 M noise draws and
Adam. ``--compare-to REV`` checks REV out into a temporary git worktree and times both trees alternately, each run in
its own process, so a change's cost is read in one run on one machine state.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from fractions import Fraction


def one_run(steps: int, threads: int) -> float:
    """Seconds per step of ``steps`` DP-SGD steps (mechanisms.p3gm of whatever tree is first on sys.path)."""
    import numpy as np
    import torch

    from dpcda.mechanisms import p3gm
    from dpcda.privacy.noise import NoiseStream, public_key

    torch.set_num_threads(threads)
    n, d, classes = 60_000, 784, 10
    stream = NoiseStream(public_key("bench-p3gm-step", 0), "rows")
    x = stream.gaussian(np.zeros((n, d)), 1.0)
    x *= 0.999 / np.linalg.norm(x, axis=1, keepdims=True)
    y = stream.uniform_int(classes, n).astype(np.int64)
    basis, _ = np.linalg.qr(stream.gaussian(np.zeros((d, 10)), 1.0))
    spec = p3gm.P3gmSpec(
        em_noise_std=1.0, sampling_rate=Fraction(300, n), steps=steps, noise_multiplier=1.4, expected_batch=300
    )
    xhat = p3gm.project_rows(x, basis, 1.0)
    k, dl = spec.components, spec.latent_dim  # any fixed prior will do for timing the steps (public names only)
    prior = p3gm.MogPrior(weights=np.full(k, 1.0 / k), means=np.zeros((k, dl)), variances=np.full((k, dl), 1.0 / dl))
    p3gm.train_vae(x, y, xhat, prior, spec, bytes(32), "cpu", clip=1.0, basis=basis)  # warm-up (and checks)
    t0 = time.perf_counter()
    p3gm.train_vae(x, y, xhat, prior, spec, bytes(range(32)), "cpu", clip=1.0, basis=basis)
    return (time.perf_counter() - t0) / steps


def _in_process(tree: str, steps: int, threads: int) -> float:
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, os.path.abspath(__file__), "--single", "--steps", str(steps), "--threads", str(threads)]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["seconds_per_step"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compare-to", metavar="REV")
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.single:
        print(json.dumps({"seconds_per_step": one_run(args.steps, args.threads)}))
        return
    # imported here: --single runs this file against another revision's tree, which may not have it
    from benchmarks.paired import HERE, print_paired, revision_tree

    if args.compare_to:
        with revision_tree(args.compare_to, "bench-p3gm-step-") as (ref, _):
            times = _alternate({args.compare_to: ref, "this tree": HERE}, args)
    else:
        times = _alternate({"this tree": HERE}, args)
    print_paired(
        f"p3gm DP-SGD step, Fashion-MNIST shapes (60,000 x 784, hidden 1000, latent 10, expected batch 300), "
        f"{args.threads} thread(s), {args.steps} steps per run, {args.repeats} alternating runs each",
        times,
        "s/step",
        3,
    )


def _alternate(trees: dict[str, str], args) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            times[name].append(_in_process(tree, args.steps, args.threads))
            print(f"{name}: {times[name][-1]:.3f} s/step", file=sys.stderr, flush=True)
    return times


if __name__ == "__main__":
    main()
