"""P3GM's core (``mechanisms.p3gm``) on Fashion-MNIST: seconds per stage and a quick utility check.

    python -m benchmarks.p3gm_smoke                                   # the non-private and the DP fit, paper settings
    python -m benchmarks.p3gm_smoke --modes dp --threads 2 --label-weight 1 --lr 1e-3

An experiment of the core alone, NOT a release: the rows are z-scored with their EXACT means and stds and clipped to
norm 1, and the basis is the exact (non-private) top-10 PCA basis of those rows; only DP-EM and DP-SGD are private
here. Paper settings (seed 004, Table IV and Section VI): d' = 10, 3 components, 20 EM iterations, expected batch
q N = 300, 4 epochs (4 / q steps), hidden 1000, lr 1e-3, C = 1; DP mode: z = 1.4 and sigma_e = ``--em-noise-std``;
non-private mode: no noise, no clipping. Each fit samples 60,000 rows; a scikit-learn LogisticRegression trained on
them is scored on the real test shards (normalised the same way). Prints a table (seconds per stage: DP-EM, DP-SGD
and the part of it spent drawing noise ("noise s"), sampling; accuracy) and writes it to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from fractions import Fraction

import numpy as np
import torch

import dpcda.mechanisms.p3gm as p3gm
from dpcda.mechanisms.dppca import project_rows
from dpcda.privacy.events import CLIP_MARGIN
from dpcda.privacy.noise import key_from_test_seed
from dpcda.storage.shards import read_all

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "fashion-mnist")


def load(split: str, data: str = DATA) -> tuple[np.ndarray, np.ndarray]:
    block = read_all(sorted(glob.glob(os.path.join(data, split, "*.parquet"))))
    return block.features.astype(np.float64), block.labels.astype(np.int64)


def normalizer(x: np.ndarray, clip: float):
    """Exact z-score (experiment only) and the clip to norm ``clip (1 - CLIP_MARGIN)``."""
    mean, std = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-3)

    def apply(rows):
        z = (rows - mean) / std
        norms = np.linalg.norm(z, axis=1, keepdims=True)
        return z * np.minimum(1.0, clip * (1 - CLIP_MARGIN) / np.maximum(norms, 1e-300))

    return apply


def exact_basis(x: np.ndarray, k: int) -> np.ndarray:
    _, vecs = np.linalg.eigh(x.T @ x)
    return np.ascontiguousarray(vecs[:, ::-1][:, :k])


class NoiseTimer:
    """Wraps ``mechanisms.p3gm.noisy_sum`` to time the DP-SGD noise draws."""

    def __init__(self):
        self.seconds, self.inner = 0.0, p3gm.noisy_sum

    def __call__(self, *a, **k):
        t = time.perf_counter()
        out = self.inner(*a, **k)
        self.seconds += time.perf_counter() - t
        return out


def logistic_accuracy(fx, fy, tx, ty, max_iter: int) -> float:
    from sklearn.linear_model import LogisticRegression

    if len(np.unique(fy)) < 2:
        return float(np.mean(ty == fy[0]))
    clf = LogisticRegression(max_iter=max_iter)
    clf.fit(fx, fy)
    return float(clf.score(tx, ty))


def head_accuracy(state, spec, basis, clip, tx, ty) -> float:
    """The decoder's label head on the real test rows' projections (z = sqrt(d') V^T x / clip): a diagnostic."""
    z = project_rows(tx, basis, clip) / clip * p3gm.latent_scale(spec.latent_dim)
    _, logits = p3gm.decode(state, z, dim=tx.shape[1], device="cpu")
    return float(np.mean(logits.argmax(dim=1).numpy() == ty))


def run(mode: str, args, x, y, basis, tx, ty, key) -> dict:
    n = len(y)
    rate = Fraction(min(args.batch, n), n)
    private = mode == "dp"
    spec = p3gm.P3gmSpec(
        latent_dim=args.latent_dim,
        components=args.components,
        em_iterations=args.em_iterations,
        hidden=args.hidden,
        em_noise_std=args.em_noise_std if private else 0.0,
        sampling_rate=rate,
        steps=args.steps or int(np.ceil(args.epochs / rate)),
        noise_multiplier=args.noise_multiplier if private else 0.0,
        grad_clip=args.grad_clip if private else float("inf"),
        lr=args.lr,
        num_classes=10,
        label_weight=args.label_weight,
        expected_batch=float(args.batch),
        decoder_start=args.decoder_start,
    )
    timer = NoiseTimer()
    p3gm.noisy_sum = timer
    try:
        t0 = time.perf_counter()
        xhat = project_rows(x, basis, args.clip) / args.clip
        prior = p3gm.fit_prior(xhat, spec, key)
        t1 = time.perf_counter()

        def progress(step, steps, loss):
            if step % args.log_every == 0 or step == steps:
                print(f"  [{mode}] step {step}/{steps} batch loss {loss:.2f} ({time.perf_counter() - t1:.0f} s)")

        state = p3gm.train_vae(
            x, y, xhat, prior, spec, key, args.device, clip=args.clip, basis=basis, progress=progress
        )
        t2 = time.perf_counter()
        model = p3gm.P3gmModel(prior=prior, state=state)
        feats, labels = [], []
        for chunk in range(-(-args.samples // args.chunk_rows)):
            rows = min(args.chunk_rows, args.samples - chunk * args.chunk_rows)
            f, lab = p3gm.sample_rows(model, spec, rows=rows, chunk=chunk, key=key, clip=args.clip, device=args.device)
            feats.append(f)
            labels.append(lab)
        t3 = time.perf_counter()
    finally:
        p3gm.noisy_sum = timer.inner
    fx, fy = np.concatenate(feats), np.concatenate(labels)
    acc = logistic_accuracy(fx, fy, tx, ty, args.max_iter)
    return {
        "mode": mode,
        "steps": spec.steps,
        "em_s": t1 - t0,
        "sgd_s": t2 - t1,
        "noise_s": timer.seconds,
        "sample_s": t3 - t2,
        "label_share": np.bincount(fy, minlength=10) / len(fy),
        "accuracy": acc,
        "head": head_accuracy(state, spec, basis, args.clip, tx, ty),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["nonprivate", "dp"], choices=["nonprivate", "dp"])
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--rows", type=int, default=0, help="use the first ROWS training rows (0: all)")
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--latent-dim", type=int, default=10)
    ap.add_argument("--components", type=int, default=3)
    ap.add_argument("--em-iterations", type=int, default=20)
    ap.add_argument("--em-noise-std", type=float, default=30.0)
    ap.add_argument("--hidden", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=300)
    ap.add_argument("--epochs", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=0, help="override 4 / q")
    ap.add_argument("--noise-multiplier", type=float, default=1.4)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--label-weight", type=float, default=None, help="default: sqrt(d) (mechanisms.p3gm)")
    ap.add_argument("--decoder-start", default=p3gm.P3gmSpec.decoder_start, choices=["public", "pca"])
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--chunk-rows", type=int, default=4096)
    ap.add_argument("--max-iter", type=int, default=300, help="LogisticRegression iterations")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0, help="test key (a benchmark: fixed, reproducible)")
    ap.add_argument("--log-every", type=int, default=200)
    ap.add_argument("--real-baseline", action="store_true", help="also score LogisticRegression on the real rows")
    ap.add_argument("--out", default=None, help="append the table to this markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    rx, ry = load("train", args.data)
    if args.rows:
        rx, ry = rx[: args.rows], ry[: args.rows]
    tx, ty = load("test", args.data)
    norm = normalizer(rx, args.clip)
    x, test = norm(rx), norm(tx)
    basis = exact_basis(x, args.latent_dim)
    key = key_from_test_seed(args.seed)
    lines = [
        f"N = {len(ry)}, d = {x.shape[1]}, clip {args.clip}, d' {args.latent_dim}, components {args.components}, "
        f"EM iterations {args.em_iterations}, hidden {args.hidden}, batch {args.batch}, lr {args.lr}, "
        f"label_weight {args.label_weight}, decoder start {args.decoder_start}, threads {args.threads}",
        "",
        "| mode | z | sigma_e | steps | DP-EM s | DP-SGD s | noise s | sample 60k s | LogReg acc | label head acc |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    if args.real_baseline:
        acc = logistic_accuracy(x, ry, test, ty, args.max_iter)
        lines.insert(2, f"LogisticRegression on the real (normalised) rows: {acc:.4f}")
    for mode in args.modes:
        r = run(mode, args, x, ry, basis, test, ty, key)
        z, se = (args.noise_multiplier, args.em_noise_std) if mode == "dp" else (0, 0)
        lines.append(
            f"| {mode} | {z} | {se} | {r['steps']} | {r['em_s']:.1f} | {r['sgd_s']:.1f} | {r['noise_s']:.1f} | "
            f"{r['sample_s']:.1f} | {r['accuracy']:.4f} | {r['head']:.4f} |"
        )
        print(f"  [{mode}] sampled label shares: {np.round(r['label_share'], 3).tolist()}")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(table + "\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
