"""The release job: checks everything it can before work, builds the Beam graph of DESIGN.md, publishes safely.

    ReadShards -> ComputeGlobalStats -> Calibrate --(side inputs)--+
    ReadShards -> Synthesize (the mechanism's PTransform: transforms.synthesize) -> WriteSynthetic -> WriteDraftManifest

Order of a run: the inputs, config files and OUTPUT are checked (``storage.publish.prepare`` takes OUTPUT's lock and
creates the run directory); the pipeline writes the parts and a manifest draft into the run directory; the launcher
reads the draft back as the typed ``Manifest``; the declared stages (``release_stages``: evaluation, audits) return
their sections; ``pipeline.manifest.assemble`` puts the manifest together; ``storage.publish.publish`` writes it and
makes the release visible. Any failure or interrupt removes the run directory (and cancels a remote job): OUTPUT is
left as it was.
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
from typing import Callable, Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from dpcda.mechanisms import registry
from dpcda.mechanisms.base import Mechanism
from dpcda.mechanisms.plan import PlanError, load_public_stats
from dpcda.pipeline import __version__, build_commit, domain, release_ledger
from dpcda.pipeline.dataflow import check_job_options
from dpcda.pipeline.errors import ReleaseError
from dpcda.pipeline.manifest import Stage, assemble, build_manifest, read_draft, run_stages
from dpcda.privacy.noise import fresh_key, key_from_test_seed, set_threads
from dpcda.schemas.config import ReleaseConfig
from dpcda.schemas.manifest import InputInfo, Manifest, RunInfo
from dpcda.storage import publish
from dpcda.storage.build import WorkerBuild
from dpcda.storage.paths import expand_glob, is_remote, join, not_regular_files, open_file
from dpcda.storage.shards import InputError, check_finite_files, detect_format, read_shard
from dpcda.storage.tables import arrow_schema_of, label_decoding
from dpcda.transforms.calibrate import Calibrate
from dpcda.transforms.join import MixByJoin
from dpcda.transforms.read import ReadShards
from dpcda.transforms.stats import ComputeDpBasis, ComputeGlobalStats
from dpcda.transforms.table import DecodeTable
from dpcda.transforms.write import WriteDraftManifest, WriteSynthetic

log = logging.getLogger("dpcda.release")


def _noise_key(seed):
    return key_from_test_seed(seed) if seed is not None else fresh_key()


def _peek_dim(files: list[str], fmt: str, features_column: str, label_column: str, what: str) -> int:
    """Feature width of the first row of the first non-empty shard (an empty shard among others is fine)."""
    for path in files:
        for block in read_shard(path, fmt, features_column, label_column, batch_rows=1):
            dim = int(block.features.shape[1])
            if dim == 0:
                raise InputError(f"{path}: column '{features_column}' row {block.first_row}: width 0 (no features)")
            return dim
    raise InputError(f"{what}: zero rows in the {len(files)} matching file(s)")


def _input_files(pattern: str, what: str) -> list[str]:
    files = expand_glob(pattern)
    if not files:
        raise InputError(f"{pattern}: no {what} files match")
    odd = not_regular_files(files)
    if odd:
        raise InputError(
            f"{odd[0]}: not a regular file (a directory, FIFO, socket or device); match only the shard files"
        )
    return files


def synthesis_transform(mech: Mechanism) -> type:
    """The PTransform class a mechanism names (``Mechanism.graph``, ``module:Class``)."""
    module, name = mech.graph.split(":")
    return getattr(importlib.import_module(module), name)


def build_pipeline(
    p: beam.Pipeline,
    cfg: ReleaseConfig,
    files: list[str],
    fmt: str,
    dim: int,
    target: publish.Target,
    input_info: InputInfo,
    public_stats=None,
    arrow_schema=None,
):
    # The key is drawn on a worker and reaches the others as a side input: the runner keeps it for the job's
    # lifetime (docs/operations.md says where, and how to protect it).
    mech = registry.get(cfg.mechanism.name)
    key = p | "NoiseKey" >> beam.Create([cfg.seed]) | "DrawKey" >> beam.Map(_noise_key)
    blocks = p | "ReadShards" >> ReadShards(
        files,
        fmt=fmt,
        features_column=cfg.features_column,
        label_column=cfg.label_column,
        bounds=cfg.feature_bounds,
        out_of_bounds=cfg.out_of_bounds,
        num_classes=cfg.num_classes,
        width=dim,
        table=cfg.table,
    )
    stats = blocks | "ComputeGlobalStats" >> ComputeGlobalStats(cfg.feature_bounds)
    build = WorkerBuild(__version__, build_commit(), cfg.noise_threads)  # checked by every stage that draws noise
    plan = stats | "Calibrate" >> Calibrate(cfg.core, key, public_stats, expected_build=build)
    common = dict(features_column=cfg.features_column, label_column=cfg.label_column, expected_build=build)
    # The join path's groups (mechanisms.joinmix) are decided by the plan; both branches run, each on its own groups.
    joined = (
        blocks | "MixByJoin" >> MixByJoin(plan, key, chunk_rows=cfg.chunk_rows, soft_labels=cfg.soft_labels, **common)
        if mech.mixes and cfg.mixing_path != "memory"
        else None
    )
    dp_pca = cfg.mechanism.pca_components is not None
    basis = blocks | "ComputeDpBasis" >> ComputeDpBasis(plan, key, expected_build=build) if dp_pca else None
    synthesis = synthesis_transform(mech)(plan, key, cfg, basis, common, directory=target.workdir)
    synthetic = blocks | "Synthesize" >> synthesis
    if joined is not None:
        synthetic = (synthetic, joined) | "BothPaths" >> beam.Flatten()
    out_dim = mech.output_dim(cfg.mechanism, dim)
    if cfg.table is not None:  # post-processing: back to the input's columns and types
        synthetic = synthetic | "DecodeTable" >> DecodeTable(
            plan, key, cfg.table, arrow_schema, cfg.features_column, cfg.label_column, expected_build=build
        )
    files_written = synthetic | "WriteSynthetic" >> WriteSynthetic(
        target.workdir,
        out_dim,
        num_shards=cfg.output_shards,
        features_column=cfg.features_column,
        label_column=cfg.label_column,
        soft_classes=cfg.num_classes if cfg.writes_soft_labels else None,
        schema=arrow_schema if cfg.table is not None else None,
    )
    return files_written | "WriteDraftManifest" >> WriteDraftManifest(
        target.workdir,
        synthesis.stated_plan if synthesis.stated_plan is not None else plan,
        functools.partial(build_manifest, cfg, input_info, prefix=target.prefix),
        prefix=target.prefix,
    )


COUNTERS = (
    "rows_read",
    "rows_rejected",
    "values_clipped_to_bounds",
    "rows_synthesized",
    "rows_written",
    "join_record_bytes",
    "join_index_pairs",
    "join_partial_bytes",
)
DISTRIBUTIONS = ("join_block_held_bytes", "join_chunk_held_bytes")  # logged as their maximum


def _counters(result) -> dict:
    """The 'dpcda' Beam counters of a finished run, summed over steps (empty where the runner has none)."""
    from apache_beam.metrics.metric import MetricsFilter

    try:
        found = result.metrics().query(MetricsFilter().with_namespace("dpcda"))
    except Exception:  # noqa: BLE001 - metrics are best effort; some runners do not report them
        return {}
    totals = dict.fromkeys(COUNTERS, 0)
    for c in found["counters"]:
        value = c.committed if c.committed is not None else c.attempted
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + int(value or 0)
    for d in found.get("distributions", []):
        value = d.committed if d.committed is not None else d.attempted
        if d.key.metric.name in DISTRIBUTIONS and value is not None and value.count:
            name = d.key.metric.name + "_max"
            totals[name] = max(totals.get(name, 0), int(value.max))
    return totals


def _is_dataflow(options: PipelineOptions) -> bool:
    return "dataflow" in str(options.view_as(StandardOptions).runner or "").lower()


def check_launcher_options(options: PipelineOptions) -> None:
    """Options the launcher cannot honour are refused before any work."""
    flags = options.get_all_options()
    runner = flags.get("runner")
    if runner:
        from apache_beam.runners.runner import create_runner

        try:
            create_runner(runner)
        except (ValueError, ImportError) as err:
            raise ReleaseError(f"--runner={runner}: {str(err).splitlines()[0][:200]}") from None
    if flags.get("no_wait_until_finish"):
        raise ReleaseError(
            "--no_wait_until_finish: the launcher must wait for the job to publish the release "
            "(and to cancel it on an interrupt); drop the flag"
        )
    if not _is_dataflow(options):
        return
    image = flags.get("sdk_container_image")
    if not image:
        raise ReleaseError("DataflowRunner: pass --sdk_container_image (the worker image built from the Dockerfile)")
    if flags.get("setup_file") or flags.get("requirements_file"):
        raise ReleaseError(
            "DataflowRunner: --sdk_container_image already holds the code; --setup_file/"
            "--requirements_file would make every worker reinstall it over the image at start-up"
        )
    expected = f"{__version__}-{build_commit()}"
    named = image.split("@", 1)[0]  # a digest pin (name:tag@sha256:...) keeps its tag
    tag = named.rsplit(":", 1)[-1] if ":" in named.rsplit("/", 1)[-1] else ""
    if tag != expected:
        raise ReleaseError(
            f"--sdk_container_image {image}: tag '{tag}' does not match this launcher "
            f"({expected}); build and push the image of this version (docs/operations.md)"
        )


def _run_info(result, options: PipelineOptions) -> RunInfo:
    runner = str(options.view_as(StandardOptions).runner or "DirectRunner")
    job_id = console = None
    if _is_dataflow(options):
        try:
            job_id = result.job_id()
        except Exception:  # noqa: BLE001 - a runner without job ids
            job_id = None
        gcp = options.view_as(GoogleCloudOptions)
        if job_id:
            console = f"https://console.cloud.google.com/dataflow/jobs/{gcp.region}/{job_id}?project={gcp.project}"
    return RunInfo(runner=runner, job_id=job_id, console_url=console)


def _local_runner(options: PipelineOptions):
    """The runner object for ``options``, or None to let Beam build it from ``--runner``.

    A release is a batch pipeline, which Beam's DirectRunner runs on its FnApiRunner. Before that, DirectRunner tries
    the Prism runner (a binary it downloads), and every attempt leaves an empty ``beam-temp*`` directory in the
    system temp dir; a scheduled job must not leak one per run, so DirectRunner (however it is spelled) goes straight
    to the FnApiRunner, built as DirectRunner builds it: with the pipeline options in its provision info, which
    ``multi_processing`` workers read, and it honours ``--direct_running_mode`` and ``--direct_num_workers`` itself.
    """
    from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner
    from apache_beam.runners.runner import create_runner

    runner = options.view_as(StandardOptions).runner
    if runner is not None and not isinstance(create_runner(runner), SwitchingDirectRunner):
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(
        provision_info=fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    )


def run_pipeline(p: beam.Pipeline, options: PipelineOptions):
    """Runs ``p`` to the end; returns (RunInfo, result). A remote job is cancelled if the launcher is interrupted or
    fails while waiting for it."""
    from apache_beam.runners.runner import PipelineState

    result = p.run()  # the DirectRunner finishes here; Dataflow returns once the job is submitted
    info = _run_info(result, options)
    if info.job_id:
        log.info("stage=submitted job_id=%s console=%s", info.job_id, info.console_url)
    try:
        state = result.wait_until_finish()
    except BaseException:
        if info.job_id:
            log.warning("stage=cancel job_id=%s: the launcher stopped; cancelling the job", info.job_id)
            try:
                result.cancel()
            except Exception as err:  # noqa: BLE001 - report and keep the original error
                log.error("stage=cancel job_id=%s failed (%s); cancel it from the console", info.job_id, err)
        raise
    if state is not None and str(state) not in (PipelineState.DONE, "DONE", "PipelineState.DONE"):
        raise ReleaseError(f"the pipeline ended in state {state}; nothing was published")
    return info, result


def release_stages(cfg: ReleaseConfig) -> tuple[Stage, ...]:
    """The stages that add manifest sections after the pipeline, in order: the evaluation (image or table), a table
    release's quality report (always), the canary audit, the membership audit, as the config asks. Each reads the
    typed manifest; the evaluation modules take its JSON (``Manifest.model_dump(mode="json")``, what a published
    manifest.json holds)."""
    stages = []
    if cfg.eval_input and cfg.table is not None:
        from dpcda.evaluation.tabular import evaluate_table_release

        def table_utility(workdir: str, manifest: Manifest) -> dict:
            from dpcda.schemas.table import parse_table_schema
            from dpcda.storage.tables import declared_schema

            stated = manifest.model_dump(mode="json")  # the schema released with: declared, or derived with DP
            schema = parse_table_schema(declared_schema(stated["input"]["table"]), "manifest input.table")
            return evaluate_table_release(workdir, stated, cfg.eval_input, schema, test_public=cfg.eval_input_public)

        stages.append(Stage("table evaluation", "utility", table_utility))
    elif cfg.eval_input:
        from dpcda.evaluation.stage import evaluate_release

        def utility(workdir: str, manifest: Manifest) -> dict:
            return evaluate_release(
                workdir,
                manifest.model_dump(mode="json"),
                cfg.eval_input,
                runs=cfg.eval_runs,
                epochs=cfg.eval_epochs,
                test_public=cfg.eval_input_public,
            )

        stages.append(Stage("evaluation", "utility", utility))
    if cfg.table is not None:  # every table release: after the evaluation, whose classifier figures it reads
        from dpcda.evaluation.quality import quality_section

        def quality(workdir: str, manifest: Manifest) -> dict:
            return quality_section(
                workdir, manifest.model_dump(mode="json"), cfg.eval_input, test_public=cfg.eval_input_public
            )

        stages.append(Stage("quality report", "utility", quality))
    if cfg.audit:
        from dpcda.evaluation.audit import audit_section

        def audit(workdir: str, manifest: Manifest) -> dict:
            return audit_section(manifest.model_dump(mode="json"))

        stages.append(Stage("audit", "audit", audit))
    if cfg.membership_audit:  # after the canary audit: keeps its keys, adds "membership"
        from dpcda.evaluation.membership import membership_audit_section

        def membership(workdir: str, manifest: Manifest) -> dict:
            return membership_audit_section(workdir, manifest.model_dump(mode="json"), cfg.input, cfg.eval_input)

        stages.append(Stage("membership audit", "audit", membership))
    return tuple(stages)


def run_release(
    cfg: ReleaseConfig,
    beam_args: list[str],
    stages: tuple[Stage, ...] = (),
    eval_input: Optional[str] = None,
    protect: tuple[str, ...] = (),
    input_name: Optional[str] = None,
    on_published: Optional[Callable[[], None]] = None,
) -> Manifest:
    """Runs the whole release; returns the published manifest (typed). Raises on any failure, leaving OUTPUT as it
    was; a stage whose section does not fit the manifest fails at its own step, named, and nothing is published.
    ``on_published``: called once the release is published (the CLI's word on a later interrupt).

    ``protect``: more files the release must never write over (the config file); the input shards, the evaluation
    set and the normalization file are protected anyway. ``input_name``: how the manifest names the input, where
    ``cfg.input`` is not what the user gave (the Python API's private copy of an in-memory table). An exception
    raised after the release became visible (an interrupt during the old release's clean-up) carries
    ``published = True``.
    """
    t0 = time.time()
    options = PipelineOptions(beam_args)
    check_launcher_options(options)
    check_job_options(options, max_class_bytes=cfg.max_class_bytes)  # no template or dry run; Dataflow's workers
    set_threads(cfg.noise_threads)  # this process's noise threads; no output depends on the count
    files = _input_files(cfg.input, "input")
    if cfg.ledger is None:
        return _release(cfg, options, files, stages, eval_input, protect, None, t0, input_name, None, on_published)
    reservation = release_ledger.reserve(cfg)  # before any data is read
    guarded = (*protect, cfg.ledger)  # a release never writes over its ledger
    try:
        manifest = _release(
            cfg,
            options,
            files,
            stages,
            eval_input,
            guarded,
            reservation.section,
            t0,
            input_name,
            on_domain_step=lambda spent: reservation.ledger.will_charge(cfg.dataset_id, reservation.run, spent),
            on_published=on_published,
        )
    except BaseException as err:
        release_ledger.settle(reservation.ledger, cfg.dataset_id, reservation.request, err)
        raise
    release_ledger.record_published(cfg, reservation, manifest)
    return manifest


def _release(
    cfg,
    options,
    files,
    stages,
    eval_input,
    protect,
    ledger_section,
    t0,
    input_name=None,
    on_domain_step=None,
    on_published=None,
) -> Manifest:
    fmt = detect_format(files[0], cfg.input_format)
    arrow_schema = request = None
    if cfg.table is not None:  # the schema is checked against the input's Parquet footer: no row is read
        if fmt != "parquet":
            raise InputError(f"{files[0]}: a table input must be Parquet")
        arrow_schema = arrow_schema_of(files[0])
        if cfg.mechanism.derives_domain:  # what the DP domain step derives; a column it cannot, refused
            request = domain.domain_request(cfg, files, arrow_schema)
        if request is None:
            cfg.table.check_against(arrow_schema, files[0])
        arrow_schema = cfg.table.output_schema(arrow_schema)
        dim = cfg.table.encoded_width if request is None else 0  # 0: known once the domain is derived
    else:
        dim = _peek_dim(files, fmt, cfg.features_column, cfg.label_column, cfg.input)
    public_stats = None
    if cfg.normalization == "public":  # read once, here: a missing or malformed file is refused before any work
        public_stats = load_public_stats(cfg.normalization_file, dim)
    eval_files = []
    if eval_input:
        eval_files = _input_files(eval_input, "evaluation")
    if eval_input and cfg.table is not None:
        eval_schema = arrow_schema_of(eval_files[0])
        if request is None:
            cfg.table.check_against(eval_schema, eval_files[0])
        elif cfg.table.output_schema(eval_schema) != arrow_schema:
            raise InputError(f"{eval_files[0]}: the evaluation table's columns or types differ from the input's")
    elif eval_input:
        eval_dim = _peek_dim(
            eval_files, detect_format(eval_files[0], "auto"), cfg.features_column, cfg.label_column, eval_input
        )
        if eval_dim != dim:
            raise InputError(f"{eval_input}: test rows have width {eval_dim}, the input has {dim}")
        check_finite_files(eval_files, "auto", cfg.features_column, cfg.label_column)  # NaN/inf: before work
    if cfg.mechanism.pca_components is not None:  # fixed-shape per-record arithmetic, checked on public stand-ins
        from dpcda.mechanisms.dppca import check_projection

        check_projection(dim, cfg.mechanism.pca_components)
    domain_event = None
    if request is not None and not request.derive:  # the undeclared columns are booleans: public, nothing to measure
        cfg, request = domain.with_schema(cfg, domain.assemble(request, {})), None
        dim = cfg.table.encoded_width
    elif request is not None:
        domain_event = domain.plan_domain(cfg, request)  # before any row is read
    if request is None:
        registry.get(cfg.mechanism.name).check_before_work(cfg.core, dim)
    if _is_dataflow(options):
        local = [p for p in (cfg.input, cfg.output, eval_input, cfg.normalization_file) if p and not is_remote(p)]
        if local:
            raise ReleaseError(f"{local[0]}: DataflowRunner workers cannot reach local paths; use gs:// paths")
    guarded = [*files, *eval_files, *(p for p in (cfg.normalization_file, *protect) if p)]
    target = publish.prepare(cfg.output, overwrite=cfg.overwrite, inputs=guarded)
    spent = None  # once the DP domain step's job starts, what it spends: charged to the ledger whatever follows
    try:
        if request is not None:  # the DP domain step, its own job; the release then runs on its schema
            spent = domain.domain_spent(cfg, domain_event)
            if on_domain_step is not None:  # the ledger marks the reservation first: a cancel then charges it
                on_domain_step(spent)
            cfg = _derive(cfg, options, files, request, domain_event, target)
            dim = cfg.table.encoded_width
            registry.get(cfg.mechanism.name).check_before_work(cfg.core, dim)
    except BaseException as err:
        err.domain_spent = spent
        publish.abandon(target, err)
        raise
    info = InputInfo(
        pattern=input_name or cfg.input,
        format=fmt,
        features_column="(table)" if cfg.table is not None else cfg.features_column,
        label_column=cfg.table.label.name if cfg.table is not None else cfg.label_column,
        feature_dim=dim,
        table=(
            {
                **cfg.table.model_dump(mode="json"),
                # the output's schema is the input's (treated as public, docs/tables.md): stated here
                "arrow_schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in arrow_schema],
                "label_decoding": label_decoding(cfg.table, scores=registry.get(cfg.mechanism.name).label_scores),
            }
            if cfg.table is not None
            else None
        ),
    )
    log.info(
        "stage=start files=%d format=%s dim=%d mode=%s l=%d run=%s",
        len(files),
        fmt,
        dim,
        cfg.mode,
        cfg.mechanism.mixing_order,
        target.workdir,
    )
    try:
        p = beam.Pipeline(runner=_local_runner(options), options=options)
        build_pipeline(p, cfg, files, fmt, dim, target, info, public_stats, arrow_schema)
        run, result = run_pipeline(p, options)
        target.written = True  # the parts are written: from here on, a failure leaves them possibly read (GCS)
        if is_remote(target.output):  # at once, not when abandon gets to it: a second interrupt may come first
            target.exposed = True
        draft_path = join(target.workdir, publish.DRAFT)
        with open_file(draft_path) as fh:
            draft = read_draft(fh.read(), draft_path)
        counts = " ".join(f"{k}={v}" for k, v in _counters(result).items())
        log.info("stage=pipeline rows=%d %s seconds=%.1f", draft.output.rows, counts, time.time() - t0)
        sections = run_stages(stages, target.workdir, draft.model_copy(update={"run": run}))
        manifest = assemble(draft, run, sections, ledger_section)
        publish.publish(target, manifest)
        if on_published is not None:
            on_published()
    except BaseException as err:
        err.domain_spent = spent
        try:
            publish.abandon(target, err)
        finally:  # GCS: a part may have been readable; the ledger keeps counting the run (publish.exposed_in)
            err.exposed = target.exposed
        if target.published:
            err.published = True  # the CLI must not say "nothing was published"
        raise
    log.info(
        "stage=done output=%s rows=%d epsilon=%s seconds=%.1f",
        target.output,
        manifest.output.rows,
        manifest.privacy.epsilon,
        time.time() - t0,
    )
    return manifest


def _derive(cfg, options, files, request, event, target):
    """The release's config with the schema its DP domain step derived (its own Beam job, run here)."""
    p = beam.Pipeline(runner=_local_runner(options), options=options)
    key = p | "NoiseKey" >> beam.Create([cfg.seed]) | "DrawKey" >> beam.Map(_noise_key)
    build = WorkerBuild(__version__, build_commit(), cfg.noise_threads)
    path = domain.build_domain(p, key, files, request, event, cfg.domain_budget_share, target.workdir, build)
    run_pipeline(p, options)
    return domain.with_schema(cfg, domain.read_schema(path))


__all__ = [
    "ReleaseError",
    "PlanError",
    "Stage",
    "run_release",
    "release_stages",
    "build_pipeline",
    "check_launcher_options",
    "run_pipeline",
]
