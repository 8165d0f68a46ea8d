"""Does a release on a CUDA worker publish the CPU worker's rows? One key, each mechanism, both devices, compared bit
for bit.

    python -m benchmarks.checks.device_release                       # every mechanism, CUDA against the CPU
    python -m benchmarks.checks.device_release --mechanisms dpcda --rows 2000 --device cpu   # a quick CPU self-check

Beam-free: ``release_in_process`` (the pipeline's own cores in a loop) on generated, class-dependent rows in [0, 1]
(the data's values do not matter to the identity; a device that changed any draw or any arithmetic changes rows).
For each mechanism it prints the seconds per device, whether the features, labels and label scores are the same bits,
and the largest difference where they are not. DP-CDA, DPMix, local perturbation and random projection must match;
p3gm must not be refused on the device (on a GPU its Linear products are summed in a fixed order and on the CPU by
BLAS, so its rows may differ from the CPU's in the last bits; its privacy does not depend on that: docs/privacy.md,
the bullet "On a GPU, p3gm's Linear products").
Exits 1 when a mechanism that must match does not, or when a release is refused.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from dpcda.mechanisms.device import pick_device
from dpcda.mechanisms.inprocess import first_pass, release_in_process
from dpcda.privacy.noise import key_from_test_seed
from dpcda.schemas.config import load_config

SMALL_P3GM = {"p3gm_latent_dim": 3, "p3gm_hidden": 32, "p3gm_em_iterations": 3, "p3gm_epochs": 1.0}
CONFIGS = {  # name -> (config fields, must the rows be the same bits)
    "dpcda-fixed": ({"mechanism": "dpcda", "mode": "fixed", "mixing_order": 16}, True),
    "dpcda-poisson": ({"mechanism": "dpcda", "mode": "poisson", "mixing_order": 16}, True),
    "dpmix": ({"mechanism": "dpmix", "mode": "poisson", "mixing_order": 16}, True),
    "local": ({"mechanism": "local"}, True),
    "randproj": ({"mechanism": "randproj"}, True),
    "p3gm": ({"mechanism": "p3gm", **SMALL_P3GM}, False),
}


def dataset(rows: int, dim: int, classes: int, seed: int = 0):
    """Class k is brighter on its own stripe of features (as the tests' datasets)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, rows)
    x = rng.uniform(0.0, 0.6, (rows, dim)).astype(np.float32)
    for k in range(classes):
        x[y == k, k * dim // classes : (k + 1) * dim // classes] += 0.4
    return np.clip(x, 0, 1), y.astype(np.int64)


def compare(a, b) -> str:
    if a is None and b is None:
        return "none"
    if a is None or b is None or a.shape != b.shape:
        return "shape differs"
    if a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)):
        return "same bits"
    return f"differs (max {np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))):.3g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanisms", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--dim", type=int, default=784)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--epsilon", type=float, default=10.0)
    ap.add_argument("--device", default="cuda", help="the device compared against the CPU")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    x, y = dataset(args.rows, args.dim, args.classes)
    first = first_pass(x, y)
    key = key_from_test_seed(7)
    print(f"{args.rows} rows x {args.dim}, {args.classes} classes, eps {args.epsilon}; cpu against {device}")
    print("| mechanism | cpu s | device s | features | labels | label scores | verdict |")
    print("|---|---:|---:|---|---|---|---|")
    failed = False
    for name in args.mechanisms:
        fields, must_match = CONFIGS[name]
        cfg = load_config(
            None,
            {"input": "i", "output": "o", "epsilon": args.epsilon, "num_classes": args.classes, **fields},
        )
        out, secs = {}, {}
        for dev in ("cpu", device):
            t = time.perf_counter()
            try:
                out[str(dev)] = release_in_process(x, y, cfg.core, key, first=first, device=dev)
            except Exception as e:  # a refusal is the finding: print it and go on
                out[str(dev)] = e
            secs[str(dev)] = time.perf_counter() - t
        c, d = out["cpu"], out[str(device)]
        if isinstance(c, Exception) or isinstance(d, Exception):
            where, err = ("cpu", c) if isinstance(c, Exception) else (str(device), d)
            print(f"| {name} | {secs['cpu']:.1f} | {secs[str(device)]:.1f} | - | - | - | refused on {where}: {err} |")
            failed = True
            continue
        cells = [compare(c[0], d[0]), compare(c[1], d[1]), compare(c[3], d[3])]
        same = all(s in ("same bits", "none") for s in cells)
        verdict = "same rows" if same else ("DIFFERENT ROWS" if must_match else "not refused; rows differ")
        failed |= must_match and not same
        print(f"| {name} | {secs['cpu']:.1f} | {secs[str(device)]:.1f} | {' | '.join(cells)} | {verdict} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
