"""Plans as the accountant sees them: the events, sigmas and epsilons of a few configurations of every mechanism and
mode, recorded so that a change in how plans are organised can be checked to change no privacy number.

``CASES`` are release configs (the flat keys every version accepts) planned on fixed first-pass statistics with a
fixed key; ``ACCOUNT`` are ``dpcda.account`` calls; ``AUDIT`` are ``evaluation.audit.run_audit`` calls (four trials:
only their calibration is recorded). ``fingerprint`` keeps what the accounting says: the events (every noise scale
and sampling rate, as the manifest's ``privacy.events``), epsilon, its components and delta breakdown, the budget's
shares. ``tests/recorded/plans.json`` was recorded at git revision 8830665:

    PYTHONPATH=DIR python -m tests.plan_record --out tests/recorded/plans.json   # DIR: a checkout of that revision

except its three ``marginals-*`` plans, re-recorded (``plan_case`` of this module, the other entries kept as they
were) when marginals stopped drawing a class histogram: its row count is the fitted model's total (post-processing),
so its plans have no ``class_histogram`` share, no adaptive event, no binomial draws, K fewer Gaussian draws, and the
whole budget in the marginals' rho.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np

TABLE = {
    "label": {"name": "y", "categories": ["a", "b", "c"]},
    "columns": [
        {"name": "v", "kind": "numeric", "lower": 0, "upper": 1},
        {"name": "w", "kind": "categorical", "categories": ["p", "q", "r", "s"]},
        {"name": "b", "kind": "boolean"},
    ],
}
BASE = {"input": "in/*.parquet", "output": "out/r", "num_classes": 3}
CASES = {
    "dpcda-fixed": {"epsilon": 2.0, "mixing_order": 4},
    "dpcda-fixed-sigma": {"sigma_x": 0.5, "epsilon": None, "mixing_order": 3},
    "dpcda-fixed-exact": {"epsilon": 3.0, "normalization": "exact", "allow_exact_normalization": True},
    "dpcda-fixed-public": {"epsilon": 3.0, "normalization": "public", "normalization_file": "stats.json"},
    "dpcda-fixed-pca": {"epsilon": 4.0, "projection": "dp-pca:4", "mixing_order": 2, "samples": 90},
    "dpcda-poisson": {"epsilon": 3.0, "mode": "poisson", "mixing_order": 4, "soft_labels": True},
    "dpcda-poisson-proportional": {"epsilon": 5.0, "mode": "poisson", "class_rows": "proportional", "samples": 200},
    "dpmix-fixed": {"mechanism": "dpmix", "epsilon": 20.0, "mixing_order": 4},
    "dpmix-poisson": {"mechanism": "dpmix", "epsilon": 20.0, "mode": "poisson", "label_noise_ratio": 0.5},
    "local": {"mechanism": "local", "epsilon": 8.0},
    "randproj": {"mechanism": "randproj", "epsilon": 8.0, "projection_dim": 6, "projection_seed": 5},
    "p3gm": {
        "mechanism": "p3gm", "epsilon": 6.0, "p3gm_latent_dim": 3, "p3gm_components": 2, "p3gm_hidden": 16,
        "p3gm_epochs": 2.0, "p3gm_batch": 30,
    },
    "marginals-mst-label": {"mechanism": "marginals", "epsilon": 2.0, "table": TABLE, "marginals_bins": 5},
    "marginals-mst": {"mechanism": "marginals", "epsilon": 2.0, "table": TABLE, "marginals_selection": "mst"},
    "marginals-aim": {"mechanism": "marginals", "epsilon": 2.0, "table": TABLE, "marginals_selection": "aim"},
}  # fmt: skip
ACCOUNT = {
    "dpcda-fixed": dict(mechanism="dpcda", class_size=6000, samples_per_class=6000, mixing_order=16, epsilon=10.0),
    "dpcda-poisson": dict(
        mechanism="dpcda", mode="poisson", class_size=6000, samples_per_class=6000, mixing_order=16, epsilon=10.0
    ),
    "dpcda-sigma": dict(mechanism="dpcda", class_size=500, samples_per_class=400, mixing_order=4, sigma_x=0.3),
    "dpcda-pca": dict(
        mechanism="dpcda", class_size=600, samples_per_class=600, epsilon=4.0, projection="dp-pca:8", feature_dim=64
    ),
    "dpcda-public": dict(
        mechanism="dpcda", class_size=600, samples_per_class=600, epsilon=4.0, normalization="public", feature_dim=9
    ),
    "dpmix": dict(mechanism="dpmix", class_size=1000, samples_per_class=800, epsilon=20.0, label_noise_ratio=0.5),
    "dpmix-poisson": dict(mechanism="dpmix", mode="poisson", class_size=1000, samples_per_class=800, epsilon=20.0),
    "local": dict(mechanism="local", class_size=100, epsilon=8.0),
    "randproj": dict(mechanism="randproj", class_size=100, epsilon=8.0, feature_dim=20, projection_dim=5),
}
ACCOUNT_KEYS = ("sigma_x", "sigma_y", "epsilon", "noise_multiplier", "sampling_rate", "components", "synthesis_epsilon")
AUDIT = {
    "dpcda-fixed": dict(mechanism="dpcda", mode="fixed", mixing_order=4, epsilon=4.0, class_size=20),
    "dpcda-poisson": dict(mechanism="dpcda", mode="poisson", mixing_order=4, epsilon=4.0, class_size=20),
    "dpmix": dict(mechanism="dpmix", mode="fixed", mixing_order=3, epsilon=6.0, class_size=12),
    "local": dict(mechanism="local", mode="fixed", mixing_order=1, epsilon=6.0),
    "randproj": dict(mechanism="randproj", mode="fixed", mixing_order=1, epsilon=6.0),
    "p3gm": dict(mechanism="p3gm", mode="poisson", mixing_order=4, epsilon=6.0, class_size=20, samples_per_class=3),
}
AUDIT_KEYS = ("sigma_x", "noise_multiplier", "sampling_rate", "accounted_epsilon", "synthesis_epsilon")


def first_pass(name: str):
    """Fixed first-pass statistics: 125 rows of 16 features in three classes, or the marginals' table's codes."""
    from dpcda.mechanisms.combiners import FirstPass, FirstPassCombiner

    rng = np.random.default_rng(11)
    y = np.repeat(np.arange(3), [40, 35, 50])
    if name.startswith("marginals"):
        dim = 1 + 4 + 1  # the encoded width of TABLE (numeric, one-hot categories, boolean)
        return FirstPass(count=len(y), sum_qu=np.zeros(dim, np.int64), sum_qv=np.zeros(dim, np.int64),
                         class_counts=np.bincount(y).astype(np.int64))  # fmt: skip
    x = rng.uniform(0.0, 1.0, (len(y), 16)).astype(np.float32)
    comb = FirstPassCombiner((0.0, 1.0))
    return comb.add(comb.create(), x, y)


def _plain(value):
    """JSON with the infinities spelled out (json has none) and tuples as lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def plan_fingerprint(plan) -> dict:
    from dpcda.privacy.composition import release_events_to_json

    acc = plan.accounting
    return _plain(
        {
            "events": release_events_to_json(acc.events),
            "epsilon": acc.epsilon,
            "components": acc.components,
            "cross_check": acc.cross_check,
            "delta_breakdown": acc.delta_breakdown,
            "accountant": acc.accountant,
            "relation": acc.relation,
            "shares": [[s.name, s.epsilon, s.delta, s.noise_std] for s in plan.budget.shares],
        }
    )


def plan_case(name: str) -> dict:
    from dpcda.mechanisms.plan import build_plan
    from dpcda.privacy.noise import key_from_test_seed
    from dpcda.schemas.config import load_config

    cfg = load_config(None, {**BASE, **CASES[name]})
    first = first_pass(name)
    stats = (np.full(first.dim, 0.5), np.full(first.dim, 0.25)) if cfg.normalization == "public" else None
    return plan_fingerprint(build_plan(first, cfg.core, key_from_test_seed(3), stats))


def account_case(name: str) -> dict:
    from dpcda.api import account

    out = account(**ACCOUNT[name])
    return _plain({k: out[k] for k in ACCOUNT_KEYS if k in out})


def audit_case(name: str) -> dict:
    from dpcda.evaluation.audit import run_audit

    out = run_audit(trials=4, seed=1, device="cpu", **AUDIT[name])
    return _plain({k: out[k] for k in AUDIT_KEYS if k in out})


def record() -> dict:
    return {
        "plans": {name: plan_case(name) for name in CASES},
        "account": {name: account_case(name) for name in ACCOUNT},
        "audit": {name: audit_case(name) for name in AUDIT},
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with open(args.out, "w") as fh:
        json.dump(record(), fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    main()
