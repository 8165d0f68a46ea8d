"""Release-level membership audit: how much closer the release sits to its training rows than to unseen rows.

The canary audit (``evaluation.audit``) plays the mechanism's worst case on synthetic data; this audit looks at an
actual release. For a sample of the release's input rows (members) and an equal-size sample of held-out real rows
from the same distribution (non-members, the ``--eval-input`` split), it computes each row's Euclidean distance to
its nearest synthetic row in the release's normalised feature space (``normalization.json``: the z-score and L2 clip
the release applied, as ``evaluation.stage`` prepares real test rows; then the public R for ``randproj``). Table
releases publish decoded rows: the synthetic table is encoded by the release's schema (``storage.tables``) and
normalised, and the real rows take the release's whole public round trip (encode, normalise, decode with argmax,
encode, normalise), so a copied record lands where its copy does. A smaller distance means "member".

Figures: the ROC AUC of the member scores against the non-member scores; a threshold test with its false-positive
rate FP (non-member called member) and false-negative rate FN; and seed 003's bound (Kairouz et al. 2015, with the
inequality the right way round as in ``privacy.risk``)::

    epsilon >= max(ln((1 - delta - FP_hi) / FN_hi), ln((1 - delta - FN_hi) / FP_hi))

with one-sided Clopper-Pearson upper bounds at 97.5 % each (95 % together), computed by the canary audit's own
functions. The threshold is chosen on one half of the audited rows and FP, FN and the bound are measured on the other
half, so the choice does not inflate the bound. ``violation`` is true when the bound exceeds what the manifest's
claim allows this test (``test_epsilon``, below).

Why the bound applies. If training and held-out rows are exchangeable draws (an i.i.d. split), a member z and a
non-member z' of the same class can swap places, so the test's FP on z' equals its false-positive rate on z against
the release of D + z' instead of D + z. D + z and D + z' are neighbours under replace-one (``fixed``: within a class,
which is why the audit samples the same number of rows of each class on both sides), and two steps apart under
add/remove (``poisson``: remove z, add z'), where the claim covers the test as (2 eps, (1 + e^eps) delta) by group
privacy. Averaged over the rows, the test then has FN + e^eps' FP >= 1 - delta' and FP + e^eps' FN >= 1 - delta'
with (eps', delta') = (test_epsilon, test_delta) in the section. Caveats: all audited rows share one release, so the
Clopper-Pearson intervals, which treat rows as independent trials, are nominal (Steinke, Nasr and Jagielski 2023
give an exact analysis of one-run audits); the split must really be exchangeable; and a bound of 0 from a weak
attack is no evidence of privacy. The audit can expose a leaky release; it never certifies one.

Which rows are audited comes from a fixed public seed (numpy PCG64), stated in the section: the choice is
independent of the data and of the release. The figures themselves are statistics of private rows computed without
noise, so the section is marked outside the guarantee, as the ``utility`` section is when its test set is private.

Memory stays bounded: the synthetic rows stream from their Parquet parts in blocks against the audited rows (torch,
on ``mechanisms.device``'s device), and the real shards are read twice (class counts, then the chosen rows), one
block at a time.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

log = logging.getLogger("dpcda.evaluation")

DEFAULT_ROWS = 10000
QUERY_BLOCK = 2048  # audited rows per matrix product
REFERENCE_BLOCK = 8192  # synthetic rows per matrix product: a QUERY_BLOCK x REFERENCE_BLOCK float32 block is 64 MiB
SAMPLE_STREAMS = {"members": 0, "non_members": 1, "halves": 2}  # numpy seed sequences [seed, stream]

OUTSIDE_GUARANTEE = (
    "distances from private training rows (and held-out real rows) to the release, computed without noise: statistics "
    "of the private input, which the privacy guarantee does not cover (it covers the input records only through the "
    "DP release); share them only with those who may see the training data"
)
MEMBERSHIP_NOTE = (
    "release-level membership test: each audited row's Euclidean distance to its nearest synthetic row in the "
    "release's normalised feature space, smaller = member. Which rows are audited is drawn with the fixed public "
    "seed sample_seed (stratified: the same number of training and held-out rows per class), independent of the "
    "data; the figures are computed from private rows without noise and are NOT covered by the guarantee. The "
    "threshold is chosen on one half of the rows and FP, FN and the bound are evaluated on the other half. The "
    "bound (seed 003 eq. 2-6, Kairouz et al. 2015, 95 % Clopper-Pearson) assumes an exchangeable train/held-out "
    "split and treats rows, which share one release, as independent trials (nominal confidence); violation compares "
    "it with test_epsilon, the claim as it covers swapping a member for a non-member (the claimed epsilon under "
    "replace-one, twice it under add/remove). It can expose a leaky release, never certify privacy, and cannot "
    "exceed max_detectable_epsilon with this many rows"
)


# ---------------------------------------------------------------- distances


def nearest_distances(
    queries: np.ndarray,
    reference: np.ndarray | Iterable[np.ndarray],
    *,
    device="auto",
    query_block: int = QUERY_BLOCK,
    reference_block: int = REFERENCE_BLOCK,
) -> np.ndarray:
    """Euclidean distance (float64) from each row of ``queries`` (n, d) to its nearest row of ``reference``.

    ``reference`` is one (m, d) array or an iterable of such blocks, read once (a stream of Parquet parts). For each
    pair of blocks, a float32 matrix product finds the nearest reference row (argmin of ||r||^2 - 2 q.r), and that
    pair's distance is recomputed in float64, so an exact copy is at distance 0. Never holds more than one
    ``query_block`` x ``reference_block`` matrix.
    """
    import torch

    from dpcda.mechanisms.device import pick_device

    dev = pick_device(device) if isinstance(device, str) else device
    queries = np.asarray(queries)
    if queries.ndim != 2:
        raise ValueError(f"queries must be (n, d), got shape {queries.shape}")
    n, d = queries.shape
    q = torch.from_numpy(np.array(queries, np.float32)).to(dev)  # a copy: the caller's array may be read-only
    best = torch.full((n,), math.inf, dtype=torch.float64, device=dev)
    seen = 0
    blocks = [reference] if isinstance(reference, np.ndarray) else reference
    with torch.no_grad():
        for block in blocks:
            block = np.asarray(block)
            if block.ndim != 2 or block.shape[1] != d:
                raise ValueError(f"reference rows have shape {block.shape}; the queries have width {d}")
            for start in range(0, len(block), reference_block):
                r = torch.from_numpy(np.array(block[start : start + reference_block], np.float32)).to(dev)  # a copy
                r_sq = (r * r).sum(dim=1).unsqueeze(0)
                r_t = r.T
                for qs in range(0, n, query_block):
                    qb = q[qs : qs + query_block]
                    nearest = torch.addmm(r_sq, qb, r_t, beta=1.0, alpha=-2.0).argmin(dim=1)
                    exact = (qb.double() - r[nearest].double()).pow_(2).sum(dim=1)
                    torch.minimum(best[qs : qs + query_block], exact, out=best[qs : qs + query_block])
                seen += len(r)
    if seen == 0:
        raise ValueError("no reference rows")
    return best.sqrt().cpu().numpy()


# ---------------------------------------------------------------- the test


def roc_auc(member_scores: np.ndarray, non_member_scores: np.ndarray) -> float:
    """P(member score > non-member score) + P(tie) / 2 (Mann-Whitney), scores higher for members."""
    from scipy.stats import rankdata

    n1, n2 = len(member_scores), len(non_member_scores)
    ranks = rankdata(np.concatenate([member_scores, non_member_scores]))
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n2))


def membership_test(
    member_distances: np.ndarray,
    non_member_distances: np.ndarray,
    *,
    delta: float,
    claimed_epsilon: Optional[float],
    seed: int = 0,
    swap_steps: int = 1,
) -> dict:
    """AUC, the threshold test and the 95 % lower bound on epsilon from nearest-row distances.

    Each side is shuffled (public ``seed``) and halved: ``choose_threshold`` picks the test on the first halves,
    FP, FN, their Clopper-Pearson upper bounds and the bound come from the second halves. ``claimed_epsilon``
    None means no claim (infinite epsilon): never a violation.

    ``swap_steps``: how many steps of the release's neighbouring relation swap a member for a non-member: 1 under
    replace-one, 2 under add/remove (remove one, add the other). The claim (eps, delta) then covers this test as
    (k eps, delta (1 + e^eps + ... + e^((k-1) eps))) (group privacy): ``test_epsilon`` and ``test_delta``, which the
    bound uses and ``violation`` compares with.
    """
    from dpcda.evaluation.audit import (
        CONFIDENCE,
        AuditError,
        _error_counts,
        choose_threshold,
        clopper_pearson_upper,
        epsilon_lower_bound,
        max_detectable_epsilon,
    )

    members = np.asarray(member_distances, np.float64)
    non_members = np.asarray(non_member_distances, np.float64)
    if len(members) < 4 or len(non_members) < 4:
        raise AuditError(
            f"membership audit: {len(members)} member and {len(non_members)} non-member rows; at least 4 of each "
            f"are needed (two halves of two)"
        )
    rng = np.random.default_rng([seed, SAMPLE_STREAMS["halves"]])
    members, non_members = rng.permutation(members), rng.permutation(non_members)
    hm, hn = len(members) // 2, len(non_members) // 2
    # scores: higher = member
    sel_m, eval_m = -members[:hm], -members[hm:]
    sel_n, eval_n = -non_members[:hn], -non_members[hn:]
    if swap_steps < 1:
        raise AuditError(f"swap_steps must be >= 1, got {swap_steps}")
    claimed = None if claimed_epsilon is None or not math.isfinite(claimed_epsilon) else float(claimed_epsilon)
    test_epsilon, test_delta = None, float(delta)
    if claimed is not None:
        test_epsilon = swap_steps * claimed
        with np.errstate(over="ignore"):
            test_delta = float(min(1.0, delta * sum(math.exp(min(i * claimed, 700.0)) for i in range(swap_steps))))
    delta = test_delta
    alpha = (1.0 - CONFIDENCE) / 2  # two one-sided intervals, union bound
    threshold, direction = choose_threshold(sel_m, sel_n, delta, alpha)
    fp_count, fn_count = _error_counts(eval_m, eval_n, np.array([threshold]), direction)
    n_m, n_n = len(eval_m), len(eval_n)
    fp_upper = float(clopper_pearson_upper(fp_count, n_n, alpha)[0])
    fn_upper = float(clopper_pearson_upper(fn_count, n_m, alpha)[0])
    bound = float(epsilon_lower_bound(fp_upper, fn_upper, delta))
    return {
        "roc_auc": roc_auc(-members, -non_members),
        "median_distance_members": float(np.median(members)),
        "median_distance_non_members": float(np.median(non_members)),
        "threshold": float(-threshold),  # a distance; +-inf (null in JSON): no threshold beat the trivial test
        "guess_member_when": "distance below threshold" if direction > 0 else "distance above threshold",
        "fp": float(fp_count[0] / n_n),
        "fn": float(fn_count[0] / n_m),
        "advantage": float(1.0 - fp_count[0] / n_n - fn_count[0] / n_m),  # TPR - FPR
        "fp_upper": fp_upper,
        "fn_upper": fn_upper,
        "confidence": CONFIDENCE,
        "claimed_epsilon": claimed,
        "swap_steps": swap_steps,
        "test_epsilon": test_epsilon,
        "test_delta": test_delta,
        "empirical_epsilon_lower_bound": bound,
        "empirical_epsilon_point_estimate": float(epsilon_lower_bound(fp_count[0] / n_n, fn_count[0] / n_m, delta)),
        "max_detectable_epsilon": max_detectable_epsilon(n_m, n_n, delta, alpha),
        "violation": bool(test_epsilon is not None and bound > test_epsilon),
        "members": int(len(members)),
        "non_members": int(len(non_members)),
        "selection_rows": [hm, hn],
        "evaluation_rows": [n_m, n_n],
    }


# ---------------------------------------------------------------- rows of a release


def class_quotas(train_counts: np.ndarray, holdout_counts: np.ndarray, rows: int) -> np.ndarray:
    """Rows to audit per class on each side: at most ``rows`` in all, at most min(train, held-out) per class,
    shared in proportion to the held-out class sizes (largest remainders, then any spare room in class order)."""
    k = max(len(train_counts), len(holdout_counts))
    train = np.zeros(k, np.int64)
    hold = np.zeros(k, np.int64)
    train[: len(train_counts)] = train_counts
    hold[: len(holdout_counts)] = holdout_counts
    cap = np.minimum(train, hold)
    total = int(min(rows, cap.sum()))
    quota = np.zeros(k, np.int64)
    while quota.sum() < total:
        room = cap - quota
        weight = np.where(room > 0, hold, 0).astype(np.float64)
        share = (total - quota.sum()) * weight / weight.sum()
        add = np.minimum(np.floor(share).astype(np.int64), room)
        if add.sum() == 0:  # fewer rows left than classes with room: one each, largest remainder first
            order = np.argsort(-(share - np.floor(share)), kind="stable")
            add = np.zeros(k, np.int64)
            left = total - quota.sum()
            for c in order:
                if left == 0:
                    break
                if room[c] > 0:
                    add[c], left = 1, left - 1
        quota += add
    return quota


BlockSource = Callable[[], Iterator]  # a fresh iterator of storage.shards.Block each call


def _class_counts(source: BlockSource, what: str) -> np.ndarray:
    from dpcda.evaluation.audit import AuditError

    counts = np.zeros(0, np.int64)
    for block in source():
        labels = np.asarray(block.labels, np.int64)
        if len(labels) and labels.min() < 0:
            raise AuditError(f"{what}: a negative label; the membership audit needs class indices >= 0")
        c = np.bincount(labels) if len(labels) else np.zeros(0, np.int64)
        if len(c) > len(counts):
            counts = np.pad(counts, (0, len(c) - len(counts)))
        counts[: len(c)] += c
    return counts


def _pick_rows(source: BlockSource, counts: np.ndarray, quota: np.ndarray, rng: np.random.Generator):
    """(features, labels) of ``quota[k]`` rows of each class k, uniformly without replacement, in a second pass."""
    chosen = {}
    for c in np.flatnonzero(quota):
        chosen[int(c)] = np.sort(rng.choice(int(counts[c]), size=int(quota[c]), replace=False))
    seen = np.zeros(len(counts), np.int64)
    feats, labels = [], []
    for block in source():
        y = np.asarray(block.labels, np.int64)
        if not len(y):
            continue
        rank = np.empty(len(y), np.int64)
        keep = np.zeros(len(y), bool)
        for c in np.unique(y):
            rows = np.flatnonzero(y == c)
            rank[rows] = seen[c] + np.arange(len(rows))
            seen[c] += len(rows)
            if int(c) in chosen:
                keep[rows] = np.isin(rank[rows], chosen[int(c)], assume_unique=True)
        if keep.any():
            feats.append(np.asarray(block.features)[keep])
            labels.append(y[keep])
    if not feats:
        return None, None
    return np.concatenate(feats), np.concatenate(labels)


def _release_files(release_dir: str, manifest: dict, draft: bool) -> list[str]:
    """The synthetic Parquet parts: the manifest's list (paths relative to OUTPUT; in a run directory, ``draft``,
    without the run's prefix), else ``release_dir/synthetic/*.parquet``."""
    from dpcda.storage.paths import expand_glob, join

    out = manifest.get("output") or {}
    prefix = out.get("prefix", "") if draft else ""
    listed = [f["path"] for f in out.get("files") or []]
    if listed:
        return [join(release_dir, p[len(prefix) :] if prefix and p.startswith(prefix) else p) for p in listed]
    return expand_glob(join(release_dir, "synthetic", "*.parquet"))


def membership_audit(
    release_dir: str,
    manifest: dict,
    train_glob: str,
    holdout_glob: str,
    *,
    rows: int = DEFAULT_ROWS,
    seed: int = 0,
    device: str = "auto",
    draft: bool = False,
) -> dict:
    """The ``membership`` figures of one release (a published ``release_dir``, or a run directory with ``draft``).

    ``rows``: at most this many training rows and as many held-out rows (fewer when a class has fewer rows on one
    side). ``seed``: the public seed of which rows are audited and of the two halves.
    """
    from dpcda.evaluation.audit import AuditError
    from dpcda.evaluation.stage import NORMALIZATION, EvaluationError, _find_normalization, _read_json
    from dpcda.mechanisms.device import pick_device
    from dpcda.mechanisms.plan import normalize
    from dpcda.storage.paths import expand_glob
    from dpcda.storage.shards import InputError, finite_blocks, read_shard

    t0 = time.time()
    if rows < 4:
        raise AuditError(f"rows: the membership audit needs at least 4 rows per side, got {rows}")
    train_files, holdout_files = expand_glob(train_glob), expand_glob(holdout_glob)
    for pattern, files, what in ((train_glob, train_files, "training"), (holdout_glob, holdout_files, "held-out")):
        if not files:
            raise InputError(f"{pattern}: no {what} files match")
    shared = sorted(set(train_files) & set(holdout_files))
    if shared:
        raise AuditError(f"{shared[0]}: listed as both training and held-out data; the held-out rows must be unseen")
    inp = manifest.get("input") or {}
    mech = manifest.get("mechanism") or {}
    priv = manifest.get("privacy") or {}
    fc, lc = inp.get("features_column", "features"), inp.get("label_column", "label")
    norm = _read_json(_find_normalization(release_dir, {"normalization": {}} if draft else manifest))
    mean, std = (np.asarray(norm[k], np.float32) for k in ("mean", "std"))
    clip, bounds = float(norm["clip"]), tuple(norm["feature_bounds"])
    synthetic_files = _release_files(release_dir, manifest, draft)
    if not synthetic_files:
        raise EvaluationError(f"{release_dir}: no synthetic Parquet files")

    table = None
    if inp.get("table"):
        from dpcda.schemas.table import parse_table_schema
        from dpcda.storage.tables import arrow_schema_of, declared_schema, decode_rows, encode_batch, read_table_parquet

        table = parse_table_schema(declared_schema(inp["table"]), "manifest input.table")

        def reader(files):
            return lambda: (b for p in files for b in read_table_parquet(p, table))

        # The release publishes decoded rows: real rows take the same public round trip (normalise, decode with
        # argmax, encode, normalise) before they meet the re-encoded synthetic rows, so a copied record meets itself.
        arrow_schema = arrow_schema_of(train_files[0])  # the output's schema is the input's
        argmax_table = table.model_copy(update={"decoding": "argmax"})
        # A release that decodes by sampling drew each category from its row's scores: no test can know those draws,
        # so real rows take the most likely one (argmax), the best guess of where a copied record lands.
        decoded_how = (
            "decoded (argmax) and re-encoded as the released rows were"
            if table.decoding == "argmax"
            else "decoded by argmax (the release sampled each category from its scores: its draws are secret) and "
            "re-encoded"
        )
        space = (
            "table rows encoded by the release's schema (storage.tables), then normalization.json; real rows also "
            + decoded_how
        )
    else:

        def reader(files):
            return lambda: (b for p in files for b in finite_blocks(read_shard(p, "auto", fc, lc), fc))

        space = "normalization.json (z-score, L2 clip)"
    from dpcda.mechanisms import registry

    projection = registry.get(mech["name"]).test_projection(manifest) if mech.get("name") else None
    if projection is not None:  # randproj: the public R, rebuilt from the manifest
        space += ", then the release's public random projection R"

    def to_space(x: np.ndarray, labels: np.ndarray, where: str) -> np.ndarray:
        if x.shape[1] != mean.shape[0]:
            raise EvaluationError(f"{where}: rows have width {x.shape[1]}, {NORMALIZATION} has {mean.shape[0]}")
        z = normalize(x, mean, std, clip, bounds)
        if table is not None:  # as transforms.table decodes a released block
            x01 = z.astype(np.float64) * np.asarray(norm["std"], np.float64) + np.asarray(norm["mean"], np.float64)
            decoded = decode_rows(x01, labels, argmax_table, arrow_schema)
            z = normalize(encode_batch(decoded, table, where, 0).features, mean, std, clip, bounds)
        return z if projection is None else (z.astype(np.float64) @ projection).astype(np.float32)

    train_src, holdout_src = reader(train_files), reader(holdout_files)
    train_counts = _class_counts(train_src, train_glob)
    holdout_counts = _class_counts(holdout_src, holdout_glob)
    quota = class_quotas(train_counts, holdout_counts, rows)
    if quota.sum() < 4:
        raise AuditError(
            f"{holdout_glob}: too few held-out rows in the training data's classes to audit (at least 4 are needed)"
        )
    k = len(quota)
    train_counts = np.pad(train_counts, (0, k - len(train_counts)))
    holdout_counts = np.pad(holdout_counts, (0, k - len(holdout_counts)))
    xm, ym = _pick_rows(train_src, train_counts, quota, np.random.default_rng([seed, SAMPLE_STREAMS["members"]]))
    xn, yn = _pick_rows(
        holdout_src, holdout_counts, quota, np.random.default_rng([seed, SAMPLE_STREAMS["non_members"]])
    )
    xm, xn = to_space(xm, ym, train_glob), to_space(xn, yn, holdout_glob)

    def synthetic_blocks():
        if table is not None:
            for p in synthetic_files:
                for b in read_table_parquet(p, table):
                    yield normalize(b.features, mean, std, clip, bounds)
        else:
            for p in synthetic_files:
                for b in read_shard(p, "parquet", fc, lc):
                    yield b.features

    dev = pick_device(device)
    counted = []

    def counting(blocks):
        for b in blocks:
            if b.shape[1] != xm.shape[1]:
                raise EvaluationError(
                    f"{release_dir}: synthetic rows have width {b.shape[1]}; the audited rows have {xm.shape[1]}"
                )
            counted.append(len(b))
            yield b

    dist = nearest_distances(np.concatenate([xm, xn]), counting(synthetic_blocks()), device=dev)
    relation = str(priv.get("neighbouring_relation") or "")
    steps = 2 if "add" in relation and "remove" in relation else 1  # add/remove: a swap is two steps
    test = membership_test(
        dist[: len(xm)],
        dist[len(xm) :],
        delta=float(priv.get("delta", 0.0)),
        claimed_epsilon=priv.get("epsilon"),
        seed=seed,
        swap_steps=steps,
    )
    result = {
        "kind": "nearest synthetic row distance",
        "outside_guarantee": OUTSIDE_GUARANTEE,
        "note": MEMBERSHIP_NOTE,
        "space": space,
        "sample_seed": int(seed),
        "sampling": (
            "per class the same number of training (member) and held-out (non-member) rows, uniformly without "
            "replacement, numpy PCG64 with the public seed sample_seed"
        ),
        "neighbouring_relation": priv.get("neighbouring_relation"),
        **test,
        "synthetic_rows": int(sum(counted)),
        "device": dev.type,
        "wall_seconds": time.time() - t0,
    }
    log.info(
        "stage=membership_audit members=%d auc=%.4f bound=%.3f claimed=%s seconds=%.1f",
        result["members"],
        result["roc_auc"],
        result["empirical_epsilon_lower_bound"],
        result["claimed_epsilon"],
        result["wall_seconds"],
    )
    return result


def membership_audit_section(
    workdir: str, manifest: dict, train_glob: str, holdout_glob: str, *, rows: int = DEFAULT_ROWS, seed: int = 0
) -> dict:
    """Release stage (``Stage("membership audit", "audit", ...)``, after the canary audit's stage when both run):
    evaluates the run directory ``workdir`` and returns the whole ``audit`` section, the canary audit's keys (if any)
    beside ``membership``. ``manifest``: the manifest so far as JSON (``Manifest.model_dump(mode="json")``)."""
    from dpcda.evaluation.audit import json_safe

    result = membership_audit(workdir, manifest, train_glob, holdout_glob, rows=rows, seed=seed, draft=True)
    return {**(manifest.get("audit") or {}), "membership": json_safe(result)}


# ---------------------------------------------------------------- CLI


TABLE_KEYS = (
    "members",
    "non_members",
    "synthetic_rows",
    "roc_auc",
    "median_distance_members",
    "median_distance_non_members",
    "threshold",
    "guess_member_when",
    "fp",
    "fn",
    "fp_upper",
    "fn_upper",
    "advantage",
    "claimed_epsilon",
    "test_epsilon",
    "test_delta",
    "empirical_epsilon_lower_bound",
    "max_detectable_epsilon",
    "empirical_epsilon_point_estimate",
    "violation",
    "sample_seed",
    "device",
    "wall_seconds",
)


def format_table(result: dict) -> str:
    lines = []
    for key in TABLE_KEYS:
        v = result.get(key)
        if v is None and key == "claimed_epsilon":
            v = "none (infinite epsilon)"
        lines.append(f"{key:>30}: {v:.4g}" if isinstance(v, float) else f"{key:>30}: {v}")
    lines.append(f"{'':>30}  OUTSIDE THE GUARANTEE: {OUTSIDE_GUARANTEE}")
    return "\n".join(lines)


def cmd_audit_release(args, beam_args) -> int:
    """``dpcda audit-release``: prints the figures; exit status 1 when the bound exceeds the claimed epsilon."""
    from dpcda.evaluation.audit import AuditError, json_safe
    from dpcda.evaluation.stage import _read_json
    from dpcda.storage.paths import exists, join
    from dpcda.storage.publish import MANIFEST

    path = join(args.release, MANIFEST)
    if not exists(path):
        raise AuditError(f"{args.release}: no {MANIFEST}; not a complete release")
    manifest = _read_json(path)
    result = membership_audit(
        args.release, manifest, args.train, args.holdout, rows=args.rows, seed=args.seed, device=args.device
    )
    print(json.dumps(json_safe(result), indent=2) if args.json else format_table(result))
    return 1 if result["violation"] else 0


def add_parser(subparsers):
    """The ``audit-release`` subcommand (light: imports nothing heavy)."""
    p = subparsers.add_parser(
        "audit-release",
        allow_abbrev=False,
        help="membership audit of a release: training vs held-out rows' distance to the nearest synthetic row "
        "(outside the guarantee)",
    )
    p.add_argument("--release", required=True, help="release directory (holds manifest.json)")
    p.add_argument("--train", required=True, help="glob of the release's input shards (the members)")
    p.add_argument("--holdout", required=True, help="glob of held-out real shards, never in the input (non-members)")
    p.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="rows audited on each side (at most)")
    p.add_argument("--seed", type=int, default=0, help="public seed of which rows are audited")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--json", action="store_true")
    return p
