"""The Python API: a release and an accounting from Python, through the same code as ``dpcda release`` and
``dpcda account``.

    import dpcda

    rel = dpcda.release("data/wa_churn/train/*.parquet", epsilon=10, config="examples/wa_churn.yaml", seed=None)
    rel.table          # pyarrow.Table: the synthetic rows (a table release has the input's Arrow schema)
    rel.manifest       # dict: what is guaranteed (manifest.json: the JSON of the typed schemas.manifest.Manifest)
    rel.write("releases/wa-churn-eps10")

    dpcda.account(mechanism="dpcda", class_size=6000, samples_per_class=6000, mixing_order=16, epsilon=10)

``release`` runs the Beam job (DirectRunner in this process unless ``beam_args`` say otherwise) into ``output``, or
into a private temporary folder that ``Release.write`` publishes later under the same rules as the CLI (a release
of ours only is replaced, atomically, never the input).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import weakref
from typing import Any, Optional

DEFAULT_BEAM_ARGS = ("--runner=DirectRunner", "--direct_running_mode=in_memory")


@dataclasses.dataclass
class Release:
    """A published release: its folder, its manifest and (read on first use) its rows.

    ``manifest`` is the JSON of the typed manifest (``Manifest.model_dump(mode="json")``: what manifest.json holds),
    made once from the manifest the release published; ``write`` publishes that typed manifest (editing the dict
    changes nothing that is published)."""

    directory: str
    manifest: dict
    _table: Any = dataclasses.field(default=None, repr=False)
    _typed: Any = dataclasses.field(default=None, repr=False)  # the schemas.manifest.Manifest behind ``manifest``

    @classmethod
    def of(cls, directory: str, manifest) -> Release:
        """The Release of a typed ``Manifest`` published at ``directory``."""
        return cls(directory=directory, manifest=manifest.model_dump(mode="json"), _typed=manifest)

    @property
    def table(self):
        """The synthetic rows as one pyarrow Table (the parts in order)."""
        if self._table is None:
            import pyarrow as pa

            from dpcda.storage.paths import expand_glob, join, open_file
            from dpcda.storage.shards import parquet_file

            parts = expand_glob(
                join(self.directory, self.manifest["output"].get("prefix", ""), "synthetic", "*.parquet")
            )
            tables = []
            for path in parts:
                with open_file(path) as fh:
                    tables.append(parquet_file(fh, path).read())
            self._table = pa.concat_tables(tables)
        return self._table

    def write(self, path: str, *, overwrite: bool = False) -> str:
        """Publishes this release at local folder ``path`` (the CLI's rules: an existing ``path`` is replaced only
        with ``overwrite`` and only if it is a release of ours; its parent folder is created); returns ``path``."""
        from dpcda.storage import publish
        from dpcda.storage.paths import is_remote

        if is_remote(path) or is_remote(self.directory):
            raise publish.PublishError(f"{path}: write() copies local folders; give output= to release to gs://")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        target = publish.prepare(path, overwrite=overwrite, inputs=[self.directory])
        try:
            for name in os.listdir(self.directory):
                if name in (publish.MANIFEST, publish.RUN_MARKER):
                    continue
                src, dst = os.path.join(self.directory, name), os.path.join(target.workdir, name)
                (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
            publish.publish(target, self._manifest())
        except BaseException:
            publish.abandon(target)
            raise
        return path

    def _manifest(self):
        """The typed manifest to publish: the release's own, or (a Release made from a dict) the dict validated."""
        from dpcda.schemas.manifest import Manifest

        return self._typed if self._typed is not None else Manifest.model_validate(self.manifest)


def release(
    source,
    *,
    epsilon: Optional[float] = None,
    mechanism: Optional[str] = None,
    schema=None,
    config: Optional[str] = None,
    output: Optional[str] = None,
    overwrite: bool = False,
    seed: Optional[int] = None,
    beam_args: Optional[list[str]] = None,
    **options,
) -> Release:
    """Releases ``source`` (a pyarrow Table, or a glob of Parquet/TFRecord shards, local or ``gs://``).

    ``schema``: a table's declaration (a ``TableSchema``, or the ``table:`` mapping of a config file); ``config``: a
    YAML/JSON config file, as ``--config``; ``options``: any other release field (``mixing_order=16``,
    ``mode="poisson"``, ``num_classes=10``, ``eval_input=...``), as the CLI's flags. ``seed`` is for tests only: the
    release is then reproducible and NOT private (its manifest says so). Raises the CLI's one-line errors
    (``dpcda.privacy.errors.DpcdaError`` subclasses).
    """
    from dpcda.pipeline.release import release_stages, run_release
    from dpcda.schemas.config import load_config

    keep: list = []
    if not isinstance(source, str):
        source = _write_table(source, keep)
    private = output is None
    if private:
        keep.append(tempfile.mkdtemp(prefix="dpcda-release-"))
        output = os.path.join(keep[-1], "release")
    fields = dict(options, input=source, output=output, epsilon=epsilon, mechanism=mechanism, seed=seed)
    fields.update(overwrite=overwrite or None, table=schema)
    try:
        cfg = load_config(config, fields)
        manifest = run_release(
            cfg,
            list(beam_args or DEFAULT_BEAM_ARGS),
            release_stages(cfg),
            eval_input=cfg.eval_input,
            protect=(config,) if config else (),
        )
    except BaseException:
        for folder in keep:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    rel = Release.of(output, manifest)
    rel.table  # read the rows now: a temporary input or release folder goes with the Release object
    for folder in keep:
        weakref.finalize(rel, shutil.rmtree, folder, True)
    return rel


def _write_table(table, keep: list) -> str:
    """A pyarrow Table (or anything ``pyarrow.table`` takes) as one Parquet shard in a private folder; its glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = table if isinstance(table, pa.Table) else pa.table(table)
    folder = tempfile.mkdtemp(prefix="dpcda-input-")
    keep.append(folder)
    pq.write_table(table, os.path.join(folder, "part-00000-of-00001.parquet"))
    return os.path.join(folder, "*.parquet")


def account(
    mechanism: str = "dpcda",
    *,
    class_size: int,
    epsilon: Optional[float] = None,
    sigma_x: Optional[float] = None,
    mode: Optional[str] = None,
    samples_per_class: Optional[int] = None,
    mixing_order: Optional[int] = None,
    clip: float = 1.0,
    delta: float = 1e-5,
    label_noise_ratio: float = 1.0,
    feature_dim: Optional[int] = None,
    num_classes: Optional[int] = None,
    projection_dim: Optional[int] = None,
    projection_seed: Optional[int] = None,
    normalization: Optional[str] = None,
    projection: Optional[str] = None,
    normalization_budget_share: Optional[float] = None,
    histogram_budget_share: Optional[float] = None,
    pca_budget_share: Optional[float] = None,
    table_columns: Optional[int] = None,
    derived_numeric: int = 0,
    derived_categorical: int = 0,
    domain_budget_share: Optional[float] = None,
    **p3gm_knobs,
) -> dict:
    """Calibrates (``epsilon``) or accounts (``sigma_x``) one group's synthesis of ``mechanism`` without data, after
    the shares of the budget a release with the same settings spends first (the class histogram in poisson mode, the
    normalisation moments unless ``normalization`` is public or exact, the DP-PCA covariance with a ``projection``),
    as the release's budget planner splits it: what ``dpcda account`` prints, as a dict. ``class_size`` is N_k
    (dpcda), the dataset size (dpmix, p3gm) or any size (local, randproj); ``samples_per_class`` is T_k (dpcda) or T
    (dpmix). ``feature_dim`` d gives the statistics' noise stds (their sensitivities depend on it) and is needed with
    a projection."""
    import pydantic

    from dpcda.mechanisms import registry
    from dpcda.mechanisms.plan import group_events, release_budget
    from dpcda.privacy.accounting import RELATION_WORDS, ReleaseEvents
    from dpcda.privacy.accounting import account as account_events
    from dpcda.privacy.budget import calibrate_synthesis
    from dpcda.privacy.calibration import CalibrationError
    from dpcda.schemas.config import ReleaseConfig, release_settings

    fields = ReleaseConfig.model_fields
    entry = registry.get(mechanism)
    mode = mode or (entry.modes[0] if len(entry.modes) == 1 else fields["mode"].get_default())
    mixing_order = mixing_order if mixing_order is not None else fields["mixing_order"].get_default()
    projection_dim = projection_dim if projection_dim is not None else fields["projection_dim"].get_default()
    projection_seed = projection_seed if projection_seed is not None else fields["projection_seed"].get_default()
    if (epsilon is None) == (sigma_x is None):
        raise CalibrationError("give exactly one of --epsilon or --sigma-x")
    shares = dict(
        normalization=normalization,
        projection=projection,
        normalization_budget_share=normalization_budget_share,
        histogram_budget_share=histogram_budget_share,
        pca_budget_share=pca_budget_share,
    )
    from dpcda.schemas.mechanism_params import PARAMS

    if PARAMS[entry.name].needs_table:
        if table_columns is None:
            raise CalibrationError(
                f"{mechanism}: its budget is split over the table's columns; give --table-columns (and, for the DP "
                "domain step, --derived-numeric and --derived-categorical)"
            )
        from dpcda.pipeline.domain import account_table

        return account_table(
            epsilon=epsilon,
            delta=delta,
            columns=table_columns,
            numeric=derived_numeric,
            categorical=derived_categorical,
            share=domain_budget_share,
            histogram_budget_share=histogram_budget_share,
        )
    if entry.fits_model:
        return _account_model(
            entry, class_size, epsilon, sigma_x, delta, clip, feature_dim, num_classes, {**p3gm_knobs, **shares}
        )
    if samples_per_class is None and entry.mixes:
        raise CalibrationError(f"{mechanism}: give --samples-per-class")
    if mode not in entry.modes:
        raise CalibrationError(f"mode: {mechanism} offers mode {' or '.join(entry.modes)} only")
    if mode == "fixed" and entry.mixes and class_size < mixing_order:
        raise CalibrationError(
            f"class_size {class_size} < mixing_order {mixing_order}: fixed mode "
            f"needs at least l records per {'class' if entry.groups == 'class' else 'dataset'}"
        )
    _check_like_a_release(mechanism, mode, epsilon, sigma_x, delta, clip, num_classes, shares)
    settings = release_settings(
        mechanism=mechanism,
        mode=mode,
        epsilon=epsilon,
        sigma_x=sigma_x,
        delta=delta,
        clip=clip,
        **shares,
        **{
            name: value
            for name, value in dict(
                projection_dim=projection_dim, projection_seed=projection_seed, label_noise_ratio=label_noise_ratio
            ).items()
            if name in PARAMS[entry.name].own_flat()  # another mechanism's knob is not read (as before)
        },
    )
    try:
        knobs = settings.mechanism_params  # the mechanism's model checks its knobs (e.g. label_noise_ratio > 0)
    except pydantic.ValidationError as err:
        raise CalibrationError("; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in err.errors())) from None
    if knobs.pca_components is not None and feature_dim is None:
        raise CalibrationError("projection: give --feature-dim d (the DP-PCA covariance's sensitivity depends on it)")
    gain = 1.0
    if entry.projects:
        if feature_dim is None:
            raise CalibrationError(f"{mechanism}: give --feature-dim d (the projection's norm depends on it)")
        _, gain = entry.projection(knobs, feature_dim)
    # without d the statistics' noise multipliers are planned at sensitivity sqrt(2) (d = 1): the same multipliers
    planned = release_budget(settings.privacy, knobs, feature_dim or 1)
    events = group_events(
        mechanism,
        mode,
        group_size=class_size,
        samples=samples_per_class,
        mixing_order=mixing_order,
        clip=clip,
        label_noise_ratio=entry.label_noise_ratio(knobs),
        gain=gain,
    )
    sigma = sigma_x if sigma_x is not None else calibrate_synthesis(planned, events, scale=clip)
    evs = tuple(events(sigma))
    acc = account_events(
        ReleaseEvents(mode, planned.shared, evs, planned.adaptive), delta, relation=entry.relation(mode)
    )
    ev = evs[0]
    notes = [
        "sigma_x as a release with these settings calibrates it: after the shares above (--normalization public or "
        "exact and no --projection leave the synthesis alone)"
    ]
    if mode == "poisson":
        notes.append(
            "poisson: a release takes N_k, and so q and T_k, from its DP class histogram; this is for N_k = "
            "class_size, and the histogram's share is accounted alone (adaptive composition)"
        )
    if settings.normalization == "exact":
        notes.append("normalization exact: such a release is NOT end-to-end DP (end_to_end_dp: false)")
    if sigma_x is not None and planned.shares:
        notes.append(f"sigma_x given: the shares are of the reference budget epsilon={planned.budget_epsilon:g}")
    return {
        "mechanism": mechanism,
        "mode": mode,
        "normalization": settings.normalization,
        "shares": {s.name: _share(s, feature_dim is not None) for s in planned.shares},
        "synthesis_epsilon": planned.synthesis_epsilon,
        "sigma_x": sigma,
        "sigma_x_over_c": sigma / clip,
        **({"sigma_y": getattr(ev, "sigma_y")} if entry.label_noise_ratio(knobs) is not None else {}),
        **({"projection_norm": gain} if entry.projects else {}),
        "epsilon": acc.epsilon,
        "delta": delta,
        "target_epsilon": epsilon,
        "accountant": acc.accountant,
        "noise_multiplier": ev.noise_multiplier,
        "sampling_rate": getattr(ev, "sampling_rate", 1.0),
        "neighbouring_relation": RELATION_WORDS[entry.relation(mode)],
        "components": acc.components,
        "cross_check": acc.cross_check,
        "delta_breakdown": acc.delta_breakdown,
        "note": "; ".join(notes),
    }


def _share(share, with_std: bool) -> dict:
    """One planned share as ``dpcda account`` prints it (the noise std only where d was given)."""
    out = {"epsilon": share.epsilon, "delta": share.delta, "noise_multiplier": share.noise_multiplier}
    if with_std:
        out["noise_std"] = share.noise_std
    if share.adaptive:
        out["adaptive"] = True
    return out


def _stand_in_config(**fields):
    """The ``ReleaseConfig`` of a release with ``fields``, checked as a release checks it (ConfigError, one line),
    with stand-ins for what account reads no data from: the input, the output and a public statistics file."""
    from dpcda.schemas.config import load_config

    normalization = fields.get("normalization")
    return load_config(
        None,
        dict(
            input="(account)",
            output="(account)",
            normalization_file="(account)" if normalization == "public" else None,
            allow_exact_normalization=True if normalization == "exact" else None,
            **fields,
        ),
    )


def _check_like_a_release(mechanism, mode, epsilon, sigma_x, delta, clip, num_classes, shares) -> None:
    """CalibrationError where a release with these settings would be refused by its config (the same one-line
    message): account prints only what a release would run."""
    from dpcda.privacy.calibration import CalibrationError
    from dpcda.schemas.config import ConfigError

    try:
        _stand_in_config(
            mechanism=mechanism,
            mode=mode,
            epsilon=epsilon,
            sigma_x=sigma_x,
            delta=delta,
            clip=clip,
            num_classes=num_classes or 2,  # a stand-in where K is not given: no check here depends on it
            **shares,
        )
    except ConfigError as err:
        raise CalibrationError(str(err)) from None


def _account_model(entry, n, epsilon, sigma_x, delta, clip, d, K, knobs) -> dict:
    """A fitted model's whole chain (p3gm) as a release would plan it for a dataset of N rows, d features and K
    classes: the plan's own calibration runs on public stand-ins for the data (N spread over the classes, zero feature
    sums): nothing here is computed a second way."""
    import numpy as np

    from dpcda.mechanisms.combiners import FirstPass
    from dpcda.mechanisms.plan import build_plan
    from dpcda.privacy.calibration import CalibrationError
    from dpcda.privacy.noise import fresh_key

    if d is None or K is None:
        raise CalibrationError(
            f"{entry.name}: give --feature-dim d and --num-classes K (the covariance and model sizes)"
        )
    if sigma_x not in (None, 0):
        raise CalibrationError(f"{entry.name}: --sigma-x takes 0 only (no noise); give --epsilon")
    given = {k: v for k, v in knobs.items() if v is not None}
    # the user's statistics file: public stand-ins here
    public_stats = (np.zeros(d), np.ones(d)) if given.get("normalization") == "public" else None
    cfg = _stand_in_config(
        mechanism=entry.name, epsilon=epsilon, sigma_x=sigma_x, delta=delta, clip=clip, num_classes=K, **given
    )
    first = FirstPass(
        count=n,
        sum_qu=np.zeros(d, np.int64),
        sum_qv=np.zeros(d, np.int64),
        class_counts=np.array([n // K + (k < n % K) for k in range(K)], np.int64),
    )
    plan = build_plan(first, cfg.core, fresh_key(), public_stats)
    acc, p = plan.accounting, plan.p3gm
    return {
        "mechanism": entry.name,
        "mode": plan.mode,
        "normalization": cfg.normalization,
        "shares": {s.name: _share(s, True) for s in plan.budget.shares},
        "epsilon": acc.epsilon,
        "delta": delta,
        "target_epsilon": epsilon,
        "accountant": acc.accountant,
        "neighbouring_relation": acc.relation,
        "pca_covariance_noise_std": plan.pca_noise_std,
        "em_noise_std": p.em_noise_std,
        "em_sensitivity": p.em_sensitivity,
        "sgd_noise_multiplier": p.noise_multiplier,
        "sgd_sampling_rate": float(p.sampling_rate),
        "sgd_steps": p.steps,
        "components": acc.components,
        "cross_check": acc.cross_check,
        "delta_breakdown": acc.delta_breakdown,
        "note": "planned as a release plans: from a DP class histogram of the stand-in counts (N spread over K), so "
        "q, the steps and z vary slightly from run to run, as they do between releases",
    }


__all__ = ["Release", "release", "account"]
