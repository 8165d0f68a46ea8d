"""The release manifest: what was released and exactly what is guaranteed.

Written last, so its presence means the release is complete. Holds only public or DP quantities:
no seed or key, no per-record data, and in ``poisson`` mode no exact private counts.
``python -m dpcda.pipeline.manifest`` regenerates ``dpcda/schemas/manifest.schema.json`` (this module does no I/O).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_serializer, model_validator

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Software(_Frozen):
    name: str = "dpcda"
    version: str
    python: str
    apache_beam: Optional[str] = None
    torch: str
    dp_accounting: str


class InputInfo(_Frozen):
    """What was read: the pattern, format and columns the user gave (public). The number of input files is not
    stated: a writer that splits shards by size makes it follow the number of records, a private count."""

    pattern: str
    format: str
    features_column: str
    label_column: str
    feature_dim: int
    table: Optional[dict] = Field(
        None,
        description="a table release: the public table schema (label, columns) the rows were encoded and decoded by; "
        "feature_dim is the encoded width",
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_older_file_count(cls, data):
        """A manifest written before the file count was dropped states ``files``: read and left out, so that such a
        release is still recognised as ours (``--overwrite`` replaces it) and validates."""
        if isinstance(data, dict) and "files" in data:
            files = data["files"]
            if isinstance(files, bool) or not isinstance(files, int) or files < 0:
                raise ValueError("files: an older manifest's file count is a non-negative integer")
            data = {k: v for k, v in data.items() if k != "files"}
        return data


class PostProcessing(_Frozen):
    lowpass: Optional[int] = Field(None, description="K: each released row keeps its 2-D DCT frequencies u + v < K")
    denoise: Optional[float] = Field(None, description="std (pixels) of the Gaussian blur of each released row")
    image_shape: list[int] = Field(description="(H, W) or (C, H, W) grid the DCT runs on, channels-first")
    kept_coefficients: Optional[int] = None
    privacy: str = (
        "post-processing of the DP output by public, data-independent linear maps: the guarantee is unchanged"
    )


class _RowsSection(_Frozen):
    """A mechanism section whose rows carry Gaussian noise of std ``sigma_x``."""

    def headline(self) -> dict:
        """The release's headline noise (``dpcda release`` prints it; the audit plays at it)."""
        return {"sigma_x": self.sigma_x}


class DpcdaMechanism(_RowsSection):
    """DP-CDA (seed 000): class-centric mixing."""

    name: Literal["dpcda"] = "dpcda"
    mode: Literal["fixed", "poisson"]
    sampling: str
    mixing_order: int
    clip: float
    sigma_x: float
    sigma_y: float
    noise_multiplier: float
    num_classes: int
    samples_total: int
    class_rows: Literal["equal", "proportional"] = Field(
        "equal",
        description="how T was split into rows per class: equal, T_k = floor(T/K) (seed 000); proportional, T_k in "
        "proportion to the class sizes (class_sizes in fixed mode, class_sizes_dp in poisson mode, so public or "
        "DP), largest-remainder rounding, at least one row per non-empty class",
    )
    samples_per_class: Optional[int] = Field(None, description="T_k where every class has the same (else null)")
    rows_per_class: Optional[list[int]] = Field(
        None, description="T_k of each class: the rows each class's mixing event composes over (privacy.events)"
    )
    class_sizes: Optional[list[int]] = Field(None, description="exact N_k; fixed mode only (public there)")
    class_sizes_dp: Optional[list[int]] = Field(None, description="DP estimates N_k_hat; poisson mode only")
    sampling_rates: list[float] = Field(description="l/N_k (fixed) or q_k = l/N_k_hat (poisson), per class")
    chunk_rows: int
    postprocessing: Optional[PostProcessing] = None
    projection: Optional[dict] = Field(
        None,
        description="with --projection dp-pca:K: the DP-PCA basis the records were mixed in (components K, the "
        "covariance's noise std in units of (clip / 2^16)^2, its epsilon share); the covariance is the "
        "pca_covariance component of privacy",
    )
    mixing_paths: Optional[list[str]] = Field(
        None,
        description="which path mixed each class: 'memory' (one worker) or 'join' (plan-and-join, "
        "mechanisms.joinmix); the privacy numbers do not depend on it",
    )


class DpmixMechanism(_RowsSection):
    """DPMix (seed 001): mixing across the whole dataset, features and one-hot labels, noise on both."""

    name: Literal["dpmix"]
    mode: Literal["fixed", "poisson"]
    sampling: str
    mixing_order: int
    clip: float
    sigma_x: float
    sigma_y: float
    label_noise_ratio: float
    noise_multiplier: float = Field(description="of the combined feature-and-label Gaussian (privacy.events)")
    num_classes: int
    samples_total: int
    dataset_size: Optional[int] = Field(None, description="N; fixed mode only (public there)")
    dataset_size_dp: Optional[int] = Field(None, description="DP estimate of N; poisson mode only")
    sampling_rate: float
    chunk_rows: int
    postprocessing: Optional[PostProcessing] = None
    projection: Optional[dict] = Field(
        None,
        description="with --projection dp-pca:K: the DP-PCA basis the records were mixed in (components K, the "
        "covariance's noise std in units of (clip / 2^16)^2, its epsilon share); the covariance is the "
        "pca_covariance component of privacy",
    )
    mixing_paths: Optional[list[str]] = Field(
        None,
        description="which path mixed each group (one: the dataset): 'memory' (one worker) or 'join' (plan-and-join, "
        "mechanisms.joinmix); the privacy numbers do not depend on it",
    )


class LocalMechanism(_RowsSection):
    """Local perturbation: every record plus Gaussian noise, once, with its label."""

    name: Literal["local"]
    mode: Literal["fixed"]
    clip: float
    sigma_x: float
    noise_multiplier: float
    num_classes: int
    samples_total: int
    class_sizes: list[int]
    postprocessing: Optional[PostProcessing] = None


class RandprojMechanism(_RowsSection):
    """Random projection: every record projected by a public random matrix, plus noise, once, with its label."""

    name: Literal["randproj"]
    mode: Literal["fixed"]
    clip: float
    sigma_x: float
    noise_multiplier: float
    projection_dim: int
    projection_seed: int = Field(description="public seed of R (mechanisms.randproj.projection_matrix)")
    projection_norm: float = Field(
        description="an upper bound on ||R||_2 (privacy.events.projection_gain): the sensitivity is 2 c times it"
    )
    num_classes: int
    samples_total: int
    class_sizes: list[int]


class P3gmMechanism(_Frozen):
    """P3GM (seed 004): DP-PCA encoder mean, DP-EM mixture prior, VAE trained with DP-SGD; rows sampled from it."""

    name: Literal["p3gm"]
    mode: Literal["poisson"]
    clip: float = Field(description="c: the L2 clip of the z-scored rows (the model sees rows / c, norm <= 1)")
    num_classes: int
    samples_total: int
    dataset_size_dp: Optional[int] = Field(None, description="DP estimate of N (sets q)")
    latent_dim: int = Field(description="d': the DP-PCA dimension, the encoder's fixed mean")
    pca_covariance_noise_std: Optional[float] = Field(
        None, description="std of the covariance's noise, in units of (clip / 2^16)^2 (pca_covariance component)"
    )
    pca_epsilon_share: float
    em: dict = Field(
        description="DP-EM of the mixture prior: components, iterations, the noise std on every coordinate of the "
        "sufficient statistics, their L2 sensitivity, its epsilon share (dp_em component)"
    )
    dp_sgd: dict = Field(
        description="DP-SGD of the VAE: Poisson sampling rate q, steps, noise multiplier z (noise std z C on the sum "
        "of clipped gradients), clip C, learning rate, epochs, expected batch, hidden widths of the decoder and the "
        "encoder, the label cross-entropy's weight (dp_sgd component), and the per-record position check the fit "
        "passed (per_record_check)"
    )
    sampling: str = Field(description="how the released rows are drawn from the fitted model (post-processing)")

    def headline(self) -> dict:
        """The release's headline noise: DP-SGD's noise multiplier."""
        return {"noise_multiplier": self.dp_sgd["noise_multiplier"]}


class MarginalsMechanism(_Frozen):
    """Marginals (MST): noisy one- and two-way counts on public bins, a graphical model (mbi) fitted and sampled."""

    name: Literal["marginals"]
    mode: Literal["poisson"]
    selection: str = Field(
        description="how the pairs were picked (mst: exponential-mechanism rounds, a spanning tree; aim: AIM's "
        "adaptive rounds, a zCDP filter)"
    )
    num_classes: int
    samples_total: int
    dataset_size_dp: Optional[int] = Field(None, description="DP estimate of N (the class histogram's sum)")
    row_count: Optional[str] = Field(
        None,
        description="where samples_total comes from: model_total (the fitted model's total, rounded: DP, "
        "post-processing of the noisy counts, no budget of its own) or samples (the configured rows, public)",
    )
    bins: int = Field(description="equal bins of each numeric column's declared [lower, upper]")
    columns: dict[str, int] = Field(description="codes per column (a nullable column's null is one), the label last")
    rho: float = Field(description="zCDP of the measurements and the selection together")
    rho_split: dict[str, float] = Field(description="zCDP of the one-way counts, the selection, the two-way counts")
    one_way_noise_std: float = Field(description="Gaussian noise std on every one-way count (sensitivity 1 each)")
    two_way_noise_std: float = Field(
        description="Gaussian noise std on every two-way count of a picked pair (aim: the first round's; each round's "
        "in aim.rounds)"
    )
    selection_rounds: int
    round_epsilon: float = Field(
        description="epsilon of each exponential-mechanism round (epsilon^2/8 zCDP; aim: the first round's, each "
        "round's in aim.rounds)"
    )
    cliques: list[list[str]] = Field(
        description="the pairs of columns measured: the picked ones in order (DP: the selection's output), then with "
        "selection mst-label the label's pair with every column (chosen in advance)"
    )
    fit: dict = Field(description="the graphical model's estimator, iterations and total (DP)")
    absent_codes: Optional[dict[str, list[str]]] = Field(
        None,
        description="residual codes the release does not draw (column -> null and/or other): a nullable column's null "
        "or a categorical column's other bucket whose noisy one-way count is below 3 stds (post-processing; the "
        "model is conditioned on their absence, so a column's few real nulls or other values can be lost)",
    )
    sampling: str = Field(description="how the released rows are drawn from the fitted model (post-processing)")
    aim: Optional[dict] = Field(
        None,
        description="selection aim: the workload, the model size cap (cells), the rounds as run (each one's clique, "
        "selection epsilon, noise std, zCDP and whether it annealed), the annealing steps and the zCDP spent against "
        "the cap rho (privacy.aim: a zCDP filter; the release is accounted at the cap)",
    )

    def headline(self) -> dict:
        """The release's headline noise: the zCDP rho of its measurements."""
        return {"rho": self.rho}


def _mechanism_name(value) -> str:
    """The union's tag; manifests written before the mechanism family have none and are DP-CDA."""
    if isinstance(value, dict):
        return value.get("name", "dpcda")
    return getattr(value, "name", "dpcda")


Mechanism = Annotated[
    Annotated[DpcdaMechanism, Tag("dpcda")]
    | Annotated[DpmixMechanism, Tag("dpmix")]
    | Annotated[LocalMechanism, Tag("local")]
    | Annotated[RandprojMechanism, Tag("randproj")]
    | Annotated[P3gmMechanism, Tag("p3gm")]
    | Annotated[MarginalsMechanism, Tag("marginals")],
    Discriminator(_mechanism_name),
]


class Normalization(_Frozen):
    method: Literal["dp", "public", "exact", "none"] = Field(
        description="the z-score statistics: dp, public, exact, or none (rows not z-scored: marginals' counts)"
    )
    feature_bounds: tuple[float, float]
    out_of_bounds: Literal["clip", "refuse"]
    min_std: float
    noise_std: Optional[float] = None
    epsilon_share: Optional[float] = None
    statistics_file: Optional[str] = Field(
        "normalization.json",
        description="the z-score statistics and clip the rows were normalised with, relative to OUTPUT (null: the "
        "rows were not z-scored, method none)",
    )


class Noise(_Frozen):
    generator: str = Field(description="where the random bits come from")
    sampler: str = Field(description="how indices and Gaussian noise are drawn from them")
    words: Optional[str] = Field(None, description="where the keystream words and the Gaussian noise were computed")
    grids: dict[str, float] = Field(
        description="output grid of each Gaussian release, by name: every noisy value is a multiple of it"
    )


class Privacy(_Frozen):
    epsilon: Optional[float] = Field(description="the guarantee; null means infinite (no noise)")
    delta: float
    target_epsilon: Optional[float]
    epsilon_this_histogram: Optional[float] = Field(
        None,
        description=(
            "poisson mode: what the accountant gives for the parameters this run's DP histogram chose; informational, "
            "the guarantee is epsilon (the budget fixed before the histogram was drawn)"
        ),
    )
    accountant: str
    neighbouring_relation: str
    composition: str
    components: dict[str, Optional[float]] = Field(
        description="epsilon of each component alone at delta (null: infinite)"
    )
    cross_check: dict[str, Optional[float]] = Field(default_factory=dict)
    delta_breakdown: dict[str, float] = Field(
        description=(
            "where delta goes: the accountant's share, adaptive stages accounted alone (poisson: class_histogram), "
            "the noise sampler's finite-precision bound and, where the PLD is the accountant, the share set aside for "
            "its float64 round-off (pld_roundoff); the sum is at most delta"
        )
    )
    noise: Noise
    risk: Optional[dict] = Field(
        None,
        description="what the claim means to a membership attacker: the smallest equal error rate and the largest "
        "advantage (TPR - FPR) any test can reach (privacy.risk; dpcda risk)",
    )
    end_to_end_dp: bool = Field(
        description="true only if everything released is DP under a secret key: false with exact normalization, an "
        "infinite epsilon, or a --seed (reproducible_seed: epsilon is then the mechanism's, not the release's)"
    )
    reproducible_seed: bool
    paper_theorem1_epsilon: Optional[float] = Field(
        None,
        description="seed 000 Theorem 1 as written (p = l/N, T compositions, label term): "
        "informational only, NOT the guarantee; null means infinite (sigma_y = 0 or sigma_x = 0)",
    )
    caveats: list[str]
    events: Optional[dict] = Field(
        None,
        description="the DP events accounted (privacy.composition's JSON of privacy.accounting.ReleaseEvents): what "
        "a privacy ledger composes with the dataset's other releases; every number in it is public or DP",
    )


class OutputFile(_Frozen):
    path: str = Field(description="relative to the release directory (OUTPUT)")
    rows: int
    sha256: str = Field(description="of the stored object, read back after writing")
    bytes: Optional[int] = None


class Output(_Frozen):
    rows: int
    prefix: str = Field(
        "",
        description="where this release's files live under OUTPUT ('' locally; on gs:// the "
        "run's own prefix runs/<run>/, never rewritten)",
    )
    files: list[OutputFile]
    format: str = "parquet: features fixed_size_list<float32>[d], label int64"


class ModelFile(_Frozen):
    path: str = Field(description="relative to the release directory (OUTPUT)")
    sha256: str = Field(description="of the stored object, read back after writing")
    bytes: int


class ReleaseModel(_Frozen):
    """The fitted model a release keeps beside its rows (``model/``), from which more rows can be drawn later."""

    format: str = Field(description="the saved model's format and version (docs/tables.md, 'The model')")
    version: int
    files: list[ModelFile]
    contents: str = Field(description="what the files hold, and why each part may be published")
    sampling: str = Field(
        "post-processing: 'dpcda sample --release OUTPUT --rows N --output OUT' (or dpcda.load(OUTPUT).sample(n)) "
        "draws more rows from it, spends no budget and writes no ledger entry; the guarantee stays this release's",
        description="how more rows are drawn, and what that costs",
    )


class RunInfo(_Frozen):
    runner: str
    job_id: Optional[str] = None
    console_url: Optional[str] = None


class Manifest(_Frozen):
    manifest_version: int = 2
    created_at: str
    software: Software
    input: InputInfo
    mechanism: Mechanism
    normalization: Normalization
    privacy: Privacy
    output: Output
    run: Optional[RunInfo] = None
    utility: Optional[dict] = None
    audit: Optional[dict] = None
    ledger: Optional[dict] = Field(
        None,
        description="with --ledger: the dataset id, the ledger's run id, and the composed budget before this release "
        "and at most after it (privacy.composition)",
    )
    model: Optional[ReleaseModel] = Field(
        None,
        description="a release that keeps its fitted model (marginals): the files of model/ and their digests; "
        "absent from the JSON of a release without one",
    )

    @model_serializer(mode="wrap")
    def _without_absent_model(self, handler):
        """A release without a model states none (its manifest reads as before the model was kept)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("model") is None:
            data.pop("model", None)
        return data

    def write_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"
