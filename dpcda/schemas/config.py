"""Release job configuration: one frozen pydantic model, validated before anything runs.

Loaded from a YAML/JSON ``--config`` file and overridden by command-line flags. Runner flags stay in
Beam's ``PipelineOptions`` and never appear here. The config is in sections (``SECTIONS``); the mechanism's is one
model per mechanism (``schemas.mechanism_params``, a discriminated union on the mechanism's name), whose fields the
config also takes flat (``p3gm_epochs``). The Beam-free cores receive ``ReleaseConfig.core`` (``schemas.settings``:
the privacy and mechanism parameters and the few public facts they need), never the config itself.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, Optional, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from dpcda.privacy.errors import DpcdaError
from dpcda.schemas import strict_yaml
from dpcda.schemas.mechanism_params import OWNER, PARAMS, MechanismParams, flat_fields
from dpcda.schemas.settings import CoreSettings, DataParams, ExecutionParams, PostprocessParams, PrivacyParams
from dpcda.schemas.table import TableSchema, table_fields

MAX_CLASSES = 1 << 16


class ConfigError(DpcdaError, ValueError):
    """A configuration problem, with a message that names the field."""


# The config's sections, in the order ``dpcda release --help`` shows them: every field is in exactly one
# (tests/test_config.py checks). A config file may name the fields at its top level or group them by section
# (``flatten_sections``). The mechanism section's fields are the mechanisms' models' (``schemas.mechanism_params``);
# in memory the config takes them flat, and ``ReleaseConfig.mechanism_params`` is the release's mechanism's model.
SECTIONS: dict[str, tuple[str, ...]] = {
    "input": (
        "input", "input_format", "features_column", "label_column", "num_classes", "feature_bounds", "out_of_bounds",
        "table", "label", "drop_columns",
    ),
    "privacy": (
        "epsilon", "delta", "sigma_x", "mode", "clip", "normalization", "normalization_file",
        "allow_exact_normalization", "normalization_budget_share", "histogram_budget_share", "pca_budget_share",
        "domain_budget_share", "min_std", "seed",
    ),
    "mechanism": ("mechanism", *flat_fields()),
    "postprocess": ("soft_labels", "lowpass", "image_shape", "denoise"),
    "scale": ("chunk_rows", "max_class_bytes", "mixing_path", "join_block_rows", "device", "noise_threads"),
    "evaluation": ("eval_input", "eval_input_public", "eval_runs", "eval_epochs", "audit", "membership_audit"),
    "ledger": ("ledger", "dataset_id", "budget_cap"),
    "output": ("output", "output_shards", "overwrite"),
}  # fmt: skip


# The names of mechanisms.registry (schemas sit below mechanisms; tests/test_registry.py checks the two agree).
MechanismName = Literal["dpcda", "dpmix", "local", "randproj", "p3gm", "marginals"]
MECHANISM_NAMES: tuple[str, ...] = get_args(MechanismName)


class _ReleaseConfig(BaseModel):
    """The release config without the mechanisms' parameters (``ReleaseConfig`` adds them, flat)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(description="glob of input shards, local or gs://")
    output: str = Field(description="release directory, local or gs://")
    input_format: Literal["auto", "parquet", "tfrecord"] = Field("auto", description="format of the input shards")
    features_column: str = Field("features", description="name of the features column")
    label_column: str = Field("label", description="name of the label column")

    mechanism: MechanismName = Field(
        "dpcda",
        description=(
            "dpcda: class-centric mixing (seed 000); dpmix: mixing across the whole dataset, labels included "
            "(seed 001); local: each record plus noise; randproj: each record randomly projected, plus noise; "
            "p3gm: a generative model (seed 004: DP-PCA, DP-EM prior, VAE trained with DP-SGD), rows sampled from it; "
            "marginals: tables only, a graphical model fitted to noisy one- and two-way counts (MST), rows sampled"
        ),
    )
    mode: Literal["fixed", "poisson"] = Field(
        "fixed",
        description=(
            "fixed: exactly l records per row, replace-one relation; poisson: each record with probability q, "
            "add/remove relation (docs/privacy.md)"
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
            "post-processing (seed 001): Gaussian blur of each released image row with this std in pixels; public and "
            "data-independent, so privacy is unchanged"
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
    output_shards: int = Field(0, ge=0, le=100_000, description="Parquet part files (0: the runner decides)")
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
    eval_runs: int = Field(1, ge=1, description="evaluation training seeds")
    eval_epochs: int = Field(5, ge=1, description="evaluation epochs (5: as good as 10 in our measurements)")
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
        None, gt=0, description="with --ledger: refuse a release that would take the dataset's epsilon past this"
    )

    table: Optional[TableSchema] = Field(
        None,
        description=(
            "config file only: the public schema of a table input (label, and each column's kind, bounds or "
            "categories); the input is then Parquet with named columns and the release has the same columns "
            "(docs/tables.md)"
        ),
    )
    label: Optional[str] = Field(
        None,
        description="the label column of a table input: with it and no table: section, every column's domain is "
        "derived by the DP domain step and the mechanism is marginals (docs/tables.md)",
    )
    drop_columns: Optional[list[str]] = Field(
        None, description="a table's input columns left out of the release (comma-separated; they are not read)"
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
    def _defaults_for_mechanism(cls, data):
        if isinstance(data, dict):
            data = table_fields(data)
        if isinstance(data, dict):
            name = data.get("mechanism", cls.model_fields["mechanism"].get_default())
            if isinstance(name, str) and name in PARAMS:  # anything else: the field reports it
                data = PARAMS[name].defaults(data)
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
        lo, hi = self.feature_bounds
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"feature_bounds: need finite lo < hi, got {lo},{hi}")
        if not (math.isfinite(hi - lo) and hi - lo <= 1e30 and max(abs(lo), abs(hi)) <= 1e30):
            raise ValueError(
                f"feature_bounds: {lo:g},{hi:g} is too wide (|bounds| and hi - lo must be at most 1e30; "
                f"the z-score would overflow)"
            )
        params = self.mechanism_params
        if params.needs_table and self.table is None:
            raise ValueError(f"table: {params.needs_table}")
        if self.epsilon is None and self.sigma_x is None:
            raise ValueError("epsilon: give a target epsilon (or an explicit sigma_x)")
        if self.epsilon is not None and self.sigma_x is not None:
            raise ValueError("epsilon and sigma_x: give one, not both")
        if self.mode == "poisson" and self.epsilon is not None:
            from dpcda.privacy.accounting import PLD_MIN_DELTA, SAMPLER_DELTA_SHARE, accountant_delta, round_up

            share = self.histogram_budget_share
            if not accountant_delta(self.delta, [share * self.delta]) >= PLD_MIN_DELTA:  # the plan's own arithmetic
                least = round_up(PLD_MIN_DELTA / (1.0 - SAMPLER_DELTA_SHARE - share))
                raise ValueError(
                    f"delta: {self.delta:g} is below {least:.3g}, the least a poisson release can state (its PLD "
                    f"accountant composes in float64 and does not resolve less than {PLD_MIN_DELTA:g} after the "
                    f"class counts' share); raise delta"
                    + (", or use --mode fixed (RDP)" if "fixed" in params.modes else "")
                )
        if self.mode == "fixed" and self.epsilon is not None and (self.normalization == "dp" or self.projection):
            from dpcda.privacy.accounting import SAMPLER_DELTA_SHARE, accountant_delta, round_up
            from dpcda.privacy.calibration import ALONE_MIN_DELTA

            if not accountant_delta(self.delta) >= ALONE_MIN_DELTA:  # the statistics' share: the plan's arithmetic
                raise ValueError(
                    f"delta: {self.delta:g} is below {round_up(ALONE_MIN_DELTA / (1.0 - SAMPLER_DELTA_SHARE)):g}, the "
                    f"least the DP statistics can be calibrated at (one Gaussian's PLD is exact down to "
                    f"{ALONE_MIN_DELTA:g}); raise delta"
                )
        if self.mode == "poisson" and self.sigma_x:
            raise ValueError(
                "sigma_x: poisson mode chooses q_k and T_k from the DP class histogram, so its epsilon "
                "holds only for a budget fixed in advance: give --epsilon (sigma_x 0 is allowed: no "
                "privacy)"
            )
        if self.mode == "poisson" and self.num_classes is None and not self.derives_label:
            raise ValueError("num_classes: required in poisson mode (which labels occur is private)")
        if self.normalization == "public" and not self.normalization_file:
            raise ValueError("normalization_file: required with normalization=public")
        if self.normalization == "exact" and not self.allow_exact_normalization:
            raise ValueError(
                "normalization: 'exact' uses private statistics without noise; pass "
                "--i-understand-exact-normalization-is-not-dp to allow it"
            )
        if self.soft_labels and self.num_classes is None:
            raise ValueError("num_classes: required with soft_labels (the width of the soft-label column)")
        if self.image_shape is not None and self.lowpass is None and self.denoise is None:
            raise ValueError("image_shape: only used with --lowpass or --denoise; give it with one of them")
        self._check_own_fields(params)
        params.check(self)
        if self.table is not None:
            self._check_table()
        if self.ledger is not None and self.dataset_id is None:
            raise ValueError("dataset_id: required with --ledger (the name under which releases compose)")
        if self.ledger is None and (self.dataset_id is not None or self.budget_cap is not None):
            raise ValueError(
                f"{'dataset_id' if self.dataset_id is not None else 'budget_cap'}: only used with --ledger"
            )
        if self.ledger is not None and self.epsilon is None:
            raise ValueError(
                "ledger: give --epsilon (the ledger composes the release's budget before any data is read; with "
                "--sigma-x the epsilon is known only after the data)"
            )
        if self.ledger is not None and self.seed is not None:
            raise ValueError(
                "seed: a TEST seed makes the release reproducible and NOT private; a ledger records "
                "private releases only"
            )
        if self.ledger is not None and self.normalization == "exact":
            raise ValueError(
                "ledger: a release with exact normalization is not end-to-end DP; the ledger cannot compose it"
            )
        if self.membership_audit and not self.eval_input:
            raise ValueError("membership_audit: needs --eval-input (the held-out real rows)")
        statistics = params.statistics_shares(self.pca_budget_share)
        if self.normalization_budget_share + self.histogram_budget_share + statistics >= 0.5:
            raise ValueError(
                "normalization_budget_share: the statistics (with pca_budget_share"
                + (" and p3gm_em_budget_share" if "p3gm_em_budget_share" in params.own_flat() else "")
                + ") may take under half the budget"
            )
        if self.projection is not None:
            if self.mixing_path == "join":
                raise ValueError("projection: not available on the join mixing path yet; use --mixing-path memory")
            if self.table is not None:
                raise ValueError("projection: for image and vector rows; a table's encoded columns are not projected")
        return self

    def _check_own_fields(self, params: MechanismParams) -> None:
        """A parameter of another mechanism, given a value, is refused (it would be ignored)."""
        for name in sorted(self.model_fields_set):
            owner = OWNER.get(name)
            if (
                owner is not None
                and name not in params.own_flat()
                and getattr(self, name) != self.model_fields[name].default
            ):
                raise ValueError(f"{name}: a {owner} parameter; this release's mechanism is {self.mechanism}")

    def _check_table(self) -> None:
        if self.input_format == "tfrecord":
            raise ValueError("table: a table input is Parquet (named, typed columns); input_format tfrecord is not")
        for name in ("lowpass", "denoise", "image_shape"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name}: image post-processing; a table has no image")
        if self.soft_labels:
            raise ValueError("soft_labels: a table release has the input's columns only")
        if self.out_of_bounds != "clip":
            raise ValueError("out_of_bounds: a table's numeric columns are clipped to their declared bounds")
        if tuple(self.feature_bounds) != (0.0, 1.0):
            raise ValueError("feature_bounds: set per column in the table schema (encoded values lie in [0, 1])")
        if not self.table.complete and not self.mechanism_params.derives_domain:
            raise ValueError(
                f"table: the label's categories and every column's domain must be declared for {self.mechanism} (the "
                "DP domain step feeds --mechanism marginals)"
            )
        if self.derives_label:
            if self.num_classes is not None:
                raise ValueError("num_classes: the label's categories are derived by the DP domain step")
            return
        if self.num_classes != self.table.num_classes:
            raise ValueError(
                f"num_classes: {self.num_classes}, but the table's label declares {self.table.num_classes} categories"
            )

    @property
    def derives_label(self) -> bool:
        """A table input whose label's categories the DP domain step derives."""
        return self.table is not None and self.table.label.categories is None

    @property
    def reproducible(self) -> bool:
        return self.seed is not None

    @property
    def mechanism_params(self) -> MechanismParams:
        """The release's mechanism's parameters and rules: its model in ``schemas.mechanism_params`` (the union's
        member named by ``mechanism``), built from the flat fields."""
        return PARAMS[self.mechanism].from_flat(self)

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
            params=self.mechanism_params,
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
    def pca_components(self) -> Optional[int]:
        """K of ``projection: dp-pca:K``, or p3gm's latent dimension (None otherwise)."""
        return self.mechanism_params.pca_components

    @property
    def writes_soft_labels(self) -> bool:
        """DPMix always releases its label scores; DP-CDA when asked."""
        return self.soft_labels or self.mechanism_params.soft_labels_always


ReleaseConfig = create_model(
    "ReleaseConfig",
    __base__=_ReleaseConfig,
    __module__=__name__,
    __doc__="The release config: ``_ReleaseConfig``'s fields and the mechanisms' parameters, flat (``flat_fields``).",
    **flat_fields(),
)


def release_settings(**given) -> ReleaseConfig:
    """A ``ReleaseConfig`` of the ``given`` fields (None: the field's default) and the defaults for the rest, built
    without a release's checks (it names no input or output): the settings ``dpcda account`` and ``dpcda audit`` plan
    a budget with (``mechanisms.plan.release_budget`` on its ``privacy`` and ``mechanism_params``), so that they split
    it as a release with the same settings does."""
    return ReleaseConfig.model_construct(**{k: v for k, v in given.items() if v is not None})


def _flatten_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(msg if msg.split(":")[0] in loc or loc == "config" else f"{loc}: {msg}")
    return "; ".join(parts)


# In a section of a config file, the field that shares the section's name may be written with this key.
SECTION_KEY = {"input": "path", "output": "path", "ledger": "path", "mechanism": "name"}


def flatten_sections(data: dict, where: str) -> dict:
    """A config file's mapping as the model's flat fields. A top-level key that names a section (``SECTIONS``) and
    holds a mapping is that section: its keys are the section's fields (``path`` or ``name`` for the field that
    shares the section's name; in ``mechanism:``, the mechanism's own parameters without their prefix, e.g.
    ``epochs`` for ``p3gm_epochs``). Any other key is a field, as in a flat file. ConfigError for a key outside its
    section or a field given twice."""
    out: dict = {}
    origin: dict = {}

    def put(field: str, value, key: str) -> None:
        if field in out:
            raise ConfigError(f"{where}: {field} is given twice ({origin[field]} and {key})")
        out[field], origin[field] = value, key

    for key, value in data.items():
        key = key.replace("-", "_")
        if key not in SECTIONS or not isinstance(value, dict):
            put(key, value, key)
            continue
        name = value.get("name", value.get("mechanism")) if key == "mechanism" else None
        params = PARAMS.get(name) if isinstance(name, str) else None
        for inner, v in value.items():
            if not isinstance(inner, str):
                raise ConfigError(f"{where}: section {key} must map field names to values")
            inner = inner.replace("-", "_")
            field = key if inner == SECTION_KEY.get(key) else inner
            if params is not None:
                field = params.section_field(field)
            if field not in SECTIONS[key]:
                home = next((s for s, names in SECTIONS.items() if field in names), None)
                owner = OWNER.get(field) or next(
                    (OWNER[p.prefix + field] for p in PARAMS.values() if p.prefix and p.prefix + field in OWNER), None
                )
                why = (
                    f"a {owner} parameter; this section's mechanism is {name}"
                    if owner and key == "mechanism"
                    else f"belongs in section {home}"
                    if home
                    else "no such field"
                )
                raise ConfigError(f"{where}: {key}.{inner}: {why}")
            put(field, v, f"{key}.{inner}")
    return out


def load_config(path: Optional[str], overrides: dict) -> ReleaseConfig:
    """Config file (YAML or JSON) overlaid with non-None ``overrides``; errors name the field."""
    data: dict = {}
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"--config: {path}: {'is not a file' if p.exists() else 'no such file'}")
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
