"""Release job configuration: one frozen pydantic model, validated before anything runs.

Loaded from a YAML/JSON ``--config`` file and overridden by command-line flags. Runner flags stay in Beam's
``PipelineOptions`` and never appear here. Its ``mechanism`` is the release's mechanism's own model
(``schemas.mechanism_params``: ``{name: p3gm, epochs: 3}``); every other spelling of a setting (sections of a file,
the flat keys of older files and of the flags, ``p3gm_epochs``) is translated at the edge, in one place
(``schemas.config_keys``). The cross-field rules are ``schemas.config_rules``'. The Beam-free cores receive
``ReleaseConfig.core`` (``schemas.settings``: the privacy and mechanism parameters and the few public facts they need),
never the config itself.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from dpcda.schemas import config_rules, strict_yaml
from dpcda.schemas.config_keys import (  # noqa: F401 - the config's edge, as its users import it
    SECTION_KEY,
    SECTIONS,
    ConfigError,
    default_mechanism,
    flatten_sections,
    mechanism_keys,
    nest,
    table_fields,
)
from dpcda.schemas.mechanism_params import MechanismParams, names
from dpcda.schemas.settings import CoreSettings, DataParams, ExecutionParams, PostprocessParams, PrivacyParams
from dpcda.schemas.table import TableSchema

MAX_CLASSES = 1 << 16


def mechanism_names() -> tuple[str, ...]:
    """The mechanisms a config may name (``schemas.mechanism_params.PARAMS``; ``mechanisms.registry`` has the same)."""
    return names()


MECHANISM_NAMES: tuple[str, ...] = names()  # the built-in ones (tests/test_registry.py checks the registry agrees)

EVAL_RUNS_MAX, EVAL_EPOCHS_MAX = 20, 100  # the evaluation's bounds (dpcda evaluate --runs, --epochs too)
AUDIT_MAX_TRIALS = 1_000_000  # dpcda audit --trials: the game holds every trial's projections (a card runs 400,000)
CONFIG_MAX_BYTES = 1 << 20  # a config file is read only below this size


class ReleaseConfig(BaseModel):
    """A release's settings: where the data is and goes, the privacy target, the mechanism (its own model), the
    post-processing, how the work is cut, the evaluation and the ledger."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(description="glob of input shards, local or gs://")
    output: str = Field(description="release directory, local or gs://")
    input_format: Literal["auto", "parquet", "tfrecord"] = Field("auto", description="format of the input shards")
    features_column: str = Field("features", description="name of the features column")
    label_column: str = Field("label", description="name of the label column")

    mechanism: SerializeAsAny[MechanismParams] = Field(
        description=(
            "the mechanism and its parameters: a name and, in a config file, its parameters "
            "(mechanism: {name: dpcda, mixing_order: 16}); default marginals for a table input, dpcda for other rows"
        ),
    )
    mode: Optional[Literal["fixed", "poisson"]] = Field(
        None,  # never None once validated: the mechanism's default (config_keys.nest)
        description=(
            "fixed: exactly l records per row, replace-one relation; poisson: each record with probability q, "
            "add/remove relation (docs/privacy.md). Default: fixed, or the mechanism's only mode (p3gm and "
            "marginals: poisson)"
        ),
    )
    clip: float = Field(
        1.0,
        ge=1e-6,
        le=1e6,
        description="c: L2 clip norm after the z-score (from 1e-6: rows stay above float32's floor)",
    )
    epsilon: Optional[float] = Field(None, gt=0, description="target epsilon (calibrates sigma_x)")
    sigma_x: Optional[float] = Field(
        None, ge=0, le=1e12, description=("explicit feature noise std (instead of epsilon; 0: no noise, not private)")
    )
    delta: float = Field(1e-5, gt=0, lt=1, description="delta of the (epsilon, delta) guarantee")
    num_classes: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_CLASSES,
        description=("K (required in poisson mode, with dpmix and with soft labels; default: largest label + 1)"),
    )

    feature_bounds: tuple[float, float] = Field((0.0, 1.0), description="lo,hi: declared bounds of the raw features")
    out_of_bounds: Literal["clip", "refuse"] = Field("clip", description="features outside the bounds: clip or refuse")
    normalization: Literal["dp", "public", "exact"] = Field(
        "dp",
        description=(
            "z-score statistics: dp (noisy, a share of the budget), public (--normalization-file) or exact (not DP)"
        ),
    )
    normalization_file: Optional[str] = Field(
        None, description=('JSON {"mean": [...], "std": [...]} for normalization public')
    )
    allow_exact_normalization: bool = Field(
        False, description=("allow normalization exact (the manifest then says end_to_end_dp: false)")
    )
    normalization_budget_share: float = Field(0.05, gt=0, lt=1, description="share of epsilon for the z-score")
    histogram_budget_share: float = Field(
        0.01, gt=0, lt=1, description=("share of epsilon (and of delta) for the class counts in poisson mode")
    )
    pca_budget_share: float = Field(0.1, gt=0, lt=0.5, description="share of epsilon for the DP-PCA covariance")
    min_std: float = Field(0.01, gt=0, description="std floor, as a fraction of the feature range")

    soft_labels: bool = Field(
        False,
        description=(
            "also write LABEL_soft: the K label scores e_k + N(0, sigma_y^2 I) whose argmax is LABEL "
            "(needs num_classes)"
        ),
    )
    lowpass: Optional[int] = Field(
        None,
        ge=1,
        description=(
            "post-processing: project every released row onto its 2-D DCT frequencies u + v < K (per channel of "
            "image_shape); public and data-independent, so privacy is unchanged"
        ),
    )
    image_shape: Optional[tuple[int, ...]] = Field(
        None, description="H,W or C,H,W of the features for --lowpass or --denoise (default: square, H = W = sqrt(d))"
    )
    denoise: Optional[float] = Field(
        None,
        gt=0,
        description=(
            "post-processing (DPMix's denoising): Gaussian blur of each released image row with this std in pixels; "
            "public and data-independent, so privacy is unchanged"
        ),
    )
    chunk_rows: int = Field(4096, ge=1, le=1 << 20, description="synthetic rows per noise chunk")
    max_class_bytes: Optional[int] = Field(
        None,
        ge=1,
        description=(
            "memory one class may take on the worker that mixes it (12 d + 8 bytes per record: our float64 copy, an "
            "index and the runner's grouped float32 rows); default: 40 % of that machine's memory. Accepts K, M, G "
            "suffixes"
        ),
    )
    mixing_path: Literal["auto", "memory", "join"] = Field(
        "auto",
        description=(
            "memory: each class (DPMix: the dataset) mixed on one worker, refused above max_class_bytes; join: the "
            "plan-and-join path, no class on one worker (docs/operations.md); auto: join only where a class is above "
            "max_class_bytes"
        ),
    )
    join_block_rows: int = Field(
        0, ge=0, le=1 << 26, description="join path: records per join block (0: 128 MiB of float64 rows)"
    )
    output_shards: int = Field(0, ge=0, le=1000, description="Parquet part files, at most 1000 (0: the runner decides)")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where the mixing runs (auto: CUDA if present)")
    noise_threads: Optional[int] = Field(
        None, ge=1, le=4096, description="host threads drawing noise (default: the cores the process may use)"
    )
    seed: Optional[int] = Field(None, ge=0, lt=1 << 63, description="TEST ONLY: fixed noise key; marks the manifest")
    overwrite: bool = Field(False, description="replace an existing release of ours at the output")

    eval_input: Optional[str] = Field(
        None,
        description=(
            "glob of real test shards: train the evaluation model on the release and test it there, as a last stage"
        ),
    )
    eval_input_public: bool = Field(
        False, description="the evaluation's real test set is public: its figures may be published with the release"
    )
    eval_runs: int = Field(1, ge=1, le=EVAL_RUNS_MAX, description=f"evaluation training seeds (1 to {EVAL_RUNS_MAX})")
    eval_epochs: int = Field(
        5, ge=1, le=EVAL_EPOCHS_MAX, description=f"evaluation epochs, 1 to {EVAL_EPOCHS_MAX} (5: as good as 10 here)"
    )
    audit: bool = Field(False, description="add an empirical privacy audit section (a canary game on the mechanism)")
    membership_audit: bool = Field(
        False,
        description=(
            "with --eval-input: add a release-level membership audit to the audit section (distance from training "
            "and held-out real rows to their nearest synthetic row; outside the guarantee)"
        ),
    )

    ledger: Optional[str] = Field(
        None,
        description=(
            "privacy ledger: a local SQLite file or gs://bucket/object; the release is composed with every earlier "
            "release of --dataset-id before any data is read, and recorded once published"
        ),
    )
    dataset_id: Optional[str] = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="with --ledger: the name under which releases compose (letters, digits and . _ / : -)",
    )
    budget_cap: Optional[float] = Field(
        None,
        gt=0,
        description=(
            "with --ledger: refuse a release that would take the dataset's epsilon past this; stored for the dataset "
            "by its first release (later releases answer to it without the flag; another cap is refused: change it "
            "with dpcda ledger cap)"
        ),
    )

    table: Optional[TableSchema] = Field(
        None,
        description=(
            "config file only: the public schema of a table input (label, and each column's kind, bounds or "
            "categories); the input is then Parquet with named columns and the release has the same columns "
            "(docs/tables.md)"
        ),
    )
    domain_budget_share: float = Field(
        0.3,
        gt=0,
        lt=1,
        description="share of the zCDP budget (and of delta) for the DP domain step of the table columns nobody "
        "declared",
    )

    @field_validator("max_class_bytes", mode="before")
    @classmethod
    def _parse_bytes(cls, v):
        if isinstance(v, str):
            units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
            text = v.strip().upper().removesuffix("B").removesuffix("I")
            try:
                return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
            except (ValueError, KeyError, OverflowError):
                raise ValueError("expected bytes, e.g. 8000000000 or 8G") from None
        return v

    @model_validator(mode="before")
    @classmethod
    def _edge(cls, data):
        """Every spelling of the mechanism's parameters into its model, the mode's default (``config_keys.nest``),
        a table's flat keys into its section (``config_keys.table_fields``); K from a table's label categories."""
        if isinstance(data, dict):
            data = nest(table_fields(data))
        if isinstance(data, dict) and data.get("table") is not None and data.get("num_classes") is None:
            table = data["table"]
            cats = None
            if isinstance(table, TableSchema):
                cats = table.label.categories
            elif isinstance(table, dict) and isinstance(table.get("label"), dict):
                cats = table["label"].get("categories")  # anything else: the model reports it
            if isinstance(cats, list) and cats:
                data = {**data, "num_classes": len(cats)}
        return data

    @field_validator(
        "num_classes",
        "chunk_rows",
        "max_class_bytes",
        "output_shards",
        "eval_runs",
        "eval_epochs",
        "seed",
        "lowpass",
        mode="before",
    )
    @classmethod
    def _no_bools(cls, v):
        if isinstance(v, bool):
            raise ValueError("expected an integer, got a boolean")
        return v

    @field_validator("epsilon", "sigma_x", "delta", "clip", mode="after")
    @classmethod
    def _finite(cls, v):
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("output", mode="after")
    @classmethod
    def _output_named(cls, v):
        out = v.rstrip("/")
        name = out.rsplit("/", 1)[-1]
        if not out or name in ("", ".", "..") or ("://" in out and out.count("/") < 3):
            raise ValueError(f"{v!r} is not a release directory; name one, e.g. releases/fm-eps10")
        return v

    @field_validator("feature_bounds", mode="before")
    @classmethod
    def _parse_bounds(cls, v):
        if isinstance(v, str):
            parts = v.split(",")
            if len(parts) != 2:
                raise ValueError("expected 'lo,hi'")
            v = tuple(float(p) for p in parts)
        return v

    @field_validator("image_shape", mode="before")
    @classmethod
    def _parse_shape(cls, v):
        if isinstance(v, str):
            try:
                v = tuple(int(p) for p in v.split(","))
            except ValueError:
                raise ValueError("expected 'H,W' or 'C,H,W' (positive integers)") from None
        if v is not None and (
            not isinstance(v, (list, tuple))
            or len(v) not in (2, 3)
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in v)
            or min(v) < 1
        ):
            raise ValueError("expected 'H,W' or 'C,H,W' (positive integers)")
        return v

    @model_validator(mode="after")
    def _check(self):
        config_rules.check(self)
        return self

    @property
    def derives_label(self) -> bool:
        """A table input whose label's categories the DP domain step derives."""
        return self.table is not None and self.table.label.categories is None

    @property
    def reproducible(self) -> bool:
        return self.seed is not None

    @property
    def privacy(self) -> PrivacyParams:
        return PrivacyParams(
            mode=self.mode,
            epsilon=self.epsilon,
            delta=self.delta,
            sigma_x=self.sigma_x,
            clip=self.clip,
            normalization=self.normalization,
            normalization_budget_share=self.normalization_budget_share,
            histogram_budget_share=self.histogram_budget_share,
            pca_budget_share=self.pca_budget_share,
            min_std=self.min_std,
            reproducible=self.reproducible,
        )

    @property
    def core(self) -> CoreSettings:
        """What the Beam-free cores receive (``schemas.settings``): never the input's shards, the output, the ledger
        or the evaluation."""
        return CoreSettings(
            privacy=self.privacy,
            params=self.mechanism,
            data=DataParams(
                source=self.input,
                label_column=self.label_column,
                feature_bounds=tuple(self.feature_bounds),
                num_classes=self.num_classes,
                table=self.table,
            ),
            postprocess=PostprocessParams(
                soft_labels=self.soft_labels, lowpass=self.lowpass, image_shape=self.image_shape, denoise=self.denoise
            ),
            execution=ExecutionParams(
                chunk_rows=self.chunk_rows,
                device=self.device,
                max_class_bytes=self.max_class_bytes,
                mixing_path=self.mixing_path,
                join_block_rows=self.join_block_rows,
            ),
        )

    @property
    def writes_soft_labels(self) -> bool:
        """DPMix always releases its label scores; DP-CDA when asked."""
        return self.soft_labels or self.mechanism.soft_labels_always


def release_settings(**given) -> ReleaseConfig:
    """A ``ReleaseConfig`` of the ``given`` fields (None: the field's default; flat keys of the mechanism's parameters
    as a release takes them) and the defaults for the rest (the mechanism's among them), built without a release's
    cross-field checks (it names no input or output): the settings the audit's games plan with
    (``mechanisms.plan.plan_synthesis`` on its ``core``), so that they split the budget and calibrate as a release with
    the same settings does."""
    data = {"input": "(planning)", "output": "(planning)", **{k: v for k, v in given.items() if v is not None}}
    return ReleaseConfig.model_construct(**nest(data))


def _flatten_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in _BOUND_ERRORS and str(e.get("input")).strip().lower() in ("nan", "+nan", "-nan"):
            msg = "not a number (nan)"  # NaN fails every bound: say what it is
        parts.append(msg if msg.split(":")[0] in loc or loc == "config" else f"{loc}: {msg}")
    return "; ".join(parts)


_BOUND_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number")


def load_config(path: Optional[str], overrides: dict) -> ReleaseConfig:
    """Config file (YAML or JSON) overlaid with non-None ``overrides``; errors name the field."""
    data: dict = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config: {path}: {'is not a file' if p.exists() else 'no such file'}")
        if p.stat().st_size > CONFIG_MAX_BYTES:  # before reading: a huge YAML takes minutes and gigabytes to parse
            raise ConfigError(f"--config: {path}: {p.stat().st_size:,} bytes, over {CONFIG_MAX_BYTES:,}")
        try:
            loaded = strict_yaml.load(p.read_text()) or {}
        except UnicodeDecodeError:
            raise ConfigError(f"--config: {path}: not a text file") from None
        except strict_yaml.DuplicateKey as err:
            raise ConfigError(f"--config: {path}: {err}") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise ConfigError(f"--config: {path}: not valid YAML{where}") from None
        if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
            raise ConfigError(f"--config: {path} must hold a mapping of field names to values")
        data.update(flatten_sections(loaded, f"--config: {path}"))
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ReleaseConfig(**data)
    except ValidationError as err:
        raise ConfigError(_flatten_error(err)) from None
