"""Each mechanism's parameters: one frozen pydantic model per mechanism, the config's ``mechanism`` (chosen by
``name``).

A model holds the mechanism's own parameters under their own names (``P3gmParams.epochs``) with their defaults, bounds
and help text, and says, in class attributes and ``check``, what the mechanism offers (modes, mixing, DP-PCA, tables)
and the rules the rest of the release config must follow with it, in the config's one-line error words. It is the one
place a mechanism's parameters are declared:

- ``schemas.config.ReleaseConfig.mechanism`` is the release's model (``{name: p3gm, epochs: 3}``), which is what the
  mechanisms' Beam-free cores receive, beside ``schemas.settings``' privacy parameters, instead of the whole config;
- the flat keys of older config files and of the flags (the name with the mechanism's prefix, ``p3gm_epochs``;
  ``mixing_order``) are this model's fields too: ``schemas.config_keys`` translates them, in one place;
- ``PARAMS`` holds the models by name (``register`` adds one); ``mechanisms.registry`` has the same names
  (tests/test_registry.py).

Every model has the mixing parameters (``mixing_order``, ``samples``, ``projection``); a mechanism that does not mix
has mixing order 1 and refuses another (``check``). Nothing here compares a mechanism's name: the config looks its
model up in ``PARAMS``.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal, Mapping, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

MAX_MIXING_ORDER = 1 << 14  # keeps a row's summed records below privacy.events.MAX_ROW_RECORDS
MAX_SAMPLES_PER_INPUT_ROW = 100  # T may be at most this many times the input rows (checked once they are counted)
# T of a release that plans no public row count (marginals: its rows are the fitted model's DP total), and of a
# sample drawn from a saved model later (pipeline.sample): drawn in blocks, memory flat, time linear in T
MAX_MODEL_SAMPLES = 100_000_000
DEFAULT_LABEL_NOISE_RATIO = 1.0  # dpmix sigma_y / sigma_x; benchmarks/studies/dpmix_ratio.py measures the choice


def _no_bool(v):
    if isinstance(v, bool):
        raise ValueError("expected an integer, got a boolean")
    return v


def _finite(v):
    if v is not None and not math.isfinite(v):
        raise ValueError("must be a finite number")
    return v


Int = Annotated[int, BeforeValidator(_no_bool)]  # an integer, not a boolean (YAML's yes/no are not counts)
Finite = Annotated[float, AfterValidator(_finite)]


class MechanismParams(BaseModel):
    """A mechanism's parameters and config rules. Subclasses narrow ``name``, add their fields and extend ``check``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: ClassVar[str] = ""  # what the mechanism does, in a few words (the --mechanism help)
    prefix: ClassVar[str] = ""  # an own field's prefix in a flat config (p3gm_), left out in the mechanism section
    modes: ClassVar[tuple[str, ...]] = ("fixed", "poisson")  # the first is the default
    mode_reason: ClassVar[str] = ""  # why only ``modes`` are offered (where not both)
    mixes: ClassVar[bool] = True  # mixes l records per row (mixing_order, samples, the join path)
    dp_pca: ClassVar[bool] = False  # offers ``projection: dp-pca:K``
    soft_labels_always: ClassVar[bool] = False  # always releases the K label scores
    needs_num_classes: ClassVar[str] = ""  # why num_classes is required ('' when it is not)
    no_table: ClassVar[str] = ""  # why a table input is refused ('' when it is allowed)
    needs_table: ClassVar[str] = ""  # why only a table input is taken ('' when any input is)
    derives_domain: ClassVar[bool] = False  # takes a table whose undeclared columns the DP domain step derives
    no_image_postprocessing: ClassVar[str] = ""  # why lowpass/denoise are refused ('' when allowed)

    name: str
    mixing_order: Int = Field(
        4,
        ge=1,
        le=MAX_MIXING_ORDER,
        description="l: records mixed into each synthetic row (default 4; a mechanism that does not mix: 1, no other)",
    )
    samples: Optional[Int] = Field(
        None,
        ge=1,
        description=(
            f"T: synthetic rows in total (default: input rows; at most {MAX_SAMPLES_PER_INPUT_ROW} x input rows; "
            f"marginals: the fitted model's total, at most {MAX_MODEL_SAMPLES:,})"
        ),
    )
    projection: Optional[str] = Field(
        None,
        pattern=r"^dp-pca:[1-9][0-9]*$",
        description=(
            "dp-pca:K (dpcda, dpmix): mix in the K-dimensional basis of a DP-PCA of the clipped rows (its own share "
            "of the budget, pca_budget_share); noise only in K dimensions, rows mapped back (docs/privacy.md)"
        ),
    )

    # ---------------------------------------------------------------- the fields

    @classmethod
    def own(cls) -> tuple[str, ...]:
        """This mechanism's own parameters (beyond every mechanism's name and mixing parameters), unprefixed."""
        return tuple(n for n in cls.model_fields if n not in MechanismParams.model_fields)

    @classmethod
    def flat_name(cls, field: str) -> str:
        """The flat config field of an own parameter (``epochs`` -> ``p3gm_epochs``)."""
        return cls.prefix + field

    @classmethod
    def own_flat(cls) -> tuple[str, ...]:
        return tuple(cls.flat_name(n) for n in cls.own())

    @classmethod
    def flat_names(cls) -> tuple[str, ...]:
        """Every parameter of this model as a flat config key (the mixing parameters and its own)."""
        return (*(n for n in MechanismParams.model_fields if n != "name"), *cls.own_flat())

    # ---------------------------------------------------------------- the modes

    @classmethod
    def default_mode(cls) -> str:
        """The mode a release of this mechanism takes when none is given: its first."""
        return cls.modes[0]

    @classmethod
    def check_mode(cls, mode: str) -> None:
        """ValueError (one line) where this mechanism does not offer ``mode``."""
        if mode not in cls.modes:
            name = cls.model_fields["name"].default
            raise ValueError(f"mode: {name} offers mode {' or '.join(cls.modes)} only ({cls.mode_reason})")

    @classmethod
    def section_field(cls, key: str) -> str:
        """The config field a key of the ``mechanism:`` section names (``epochs`` -> ``p3gm_epochs``)."""
        return cls.flat_name(key) if key in cls.own() else key

    # ---------------------------------------------------------------- the rules

    @classmethod
    def defaults(cls, params: dict, config: Mapping) -> dict:
        """The raw parameters ``params`` with this mechanism's defaults that depend on the rest of the raw ``config``
        (or on the mechanism itself: a mechanism that does not mix has mixing order 1) filled in where none is given."""
        if not cls.mixes and params.get("mixing_order") is None:
            params = {**params, "mixing_order": 1}
        return params

    def check(self, cfg) -> None:
        """ValueError (the config's one-line message) where ``cfg``, the whole release config, breaks this
        mechanism's rules."""
        name = self.name
        self.check_mode(cfg.mode)
        if not self.mixes:
            if self.samples is not None:
                raise ValueError(f"samples: {name} releases exactly one row per record")
            if self.mixing_order != 1:
                raise ValueError(f"mixing_order: {name} does not mix records (leave it out)")
            if cfg.mixing_path == "join":
                raise ValueError(f"mixing_path: {name} does not mix (each record is its own row)")
        if self.no_image_postprocessing and (cfg.lowpass or cfg.denoise):
            raise ValueError(f"lowpass/denoise: {self.no_image_postprocessing}")
        if self.needs_num_classes and cfg.num_classes is None:
            raise ValueError(f"num_classes: required with {name} ({self.needs_num_classes})")
        if self.projection is not None and not self.dp_pca:
            raise ValueError(f"projection: a DP-PCA basis is for the mixing mechanisms, not {name}")
        if cfg.table is not None and self.no_table:
            raise ValueError(f"table: {self.no_table}")

    @property
    def pca_components(self) -> Optional[int]:
        """K of a DP-PCA basis: ``projection: dp-pca:K`` (None without one)."""
        return int(self.projection.split(":", 1)[1]) if self.projection else None

    def statistics_shares(self, pca_budget_share: float) -> float:
        """The shares of epsilon this mechanism takes beside the normalisation and the histogram (DP-PCA, DP-EM)."""
        return pca_budget_share if self.projection else 0.0


class DpcdaParams(MechanismParams):
    name: Literal["dpcda"] = "dpcda"
    summary: ClassVar[str] = "class-centric mixing: each row the mean of l records of one class, plus noise"
    dp_pca: ClassVar[bool] = True

    sigma_y: Finite = Field(0.0, ge=0, le=1e12, description="dpcda: label noise std (free within a class)")
    class_rows: Literal["equal", "proportional"] = Field(
        "equal",
        description=(
            "dpcda: rows per class. equal: T_k = floor(T/K), DP-CDA's own; proportional: T_k in proportion to the "
            "class sizes (public N_k in fixed mode, the DP histogram's in poisson mode), largest-remainder rounding, "
            "at least one row per non-empty class. Default: proportional with a table schema, else equal"
        ),
    )

    @classmethod
    def defaults(cls, params: dict, config: Mapping) -> dict:
        params = super().defaults(params, config)
        if params.get("class_rows") is None:  # a table keeps its label's base rate; images T/K per class
            params = {**params, "class_rows": "proportional" if config.get("table") is not None else "equal"}
        return params


class DpmixParams(MechanismParams):
    name: Literal["dpmix"] = "dpmix"
    summary: ClassVar[str] = "DPMix: mixing of l records of the whole dataset, features and labels, both noised"
    dp_pca: ClassVar[bool] = True
    soft_labels_always: ClassVar[bool] = True
    needs_num_classes: ClassVar[str] = "the width of the released label scores"

    label_noise_ratio: float = Field(
        DEFAULT_LABEL_NOISE_RATIO,
        gt=0,
        description=("dpmix: sigma_y / sigma_x (the label noise is calibrated with the features')"),
    )


class LocalParams(MechanismParams):
    name: Literal["local"] = "local"
    summary: ClassVar[str] = "local perturbation: every record once, plus noise"
    modes: ClassVar[tuple[str, ...]] = ("fixed",)
    mode_reason: ClassVar[str] = (
        "it releases one row per record, which publishes the count: only replace one record within its class"
    )
    mixes: ClassVar[bool] = False


class RandprojParams(MechanismParams):
    name: Literal["randproj"] = "randproj"
    summary: ClassVar[str] = "random projection: every record times a public random matrix, plus noise"
    modes: ClassVar[tuple[str, ...]] = ("fixed",)
    mode_reason: ClassVar[str] = LocalParams.mode_reason
    mixes: ClassVar[bool] = False
    no_image_postprocessing: ClassVar[str] = "randproj rows are projections, not images"
    no_table: ClassVar[str] = "randproj releases projections, which cannot be read back as the table's columns"

    projection_dim: Int = Field(100, ge=1, description="randproj: p, the projected dimension")
    projection_seed: Int = Field(0, ge=0, lt=1 << 63, description="randproj: public seed of the projection matrix")


class P3gmParams(MechanismParams):
    name: Literal["p3gm"] = "p3gm"
    summary: ClassVar[str] = (
        "P3GM: a generative model (DP-PCA, a DP-EM mixture prior, a VAE trained with DP-SGD), rows sampled from it"
    )
    prefix: ClassVar[str] = "p3gm_"
    modes: ClassVar[tuple[str, ...]] = ("poisson",)
    mode_reason: ClassVar[str] = "it trains with Poisson-sampled DP-SGD, accounted under add/remove only"
    mixes: ClassVar[bool] = False

    latent_dim: int = Field(10, ge=1, le=1000, description="p3gm: d', the DP-PCA dimension of the latent space")
    components: int = Field(3, ge=1, le=100, description="p3gm: Gaussians in the DP-EM mixture prior")
    em_iterations: int = Field(20, ge=1, le=1000, description="p3gm: DP-EM iterations (each one accounted)")
    em_budget_share: float = Field(0.1, gt=0, lt=0.5, description="p3gm: share of epsilon for DP-EM alone")
    # The batch and epochs default to 1500 and 20, not seed 004's Table IV (300 and 4): the same ~800 steps with a
    # third less noise on the mean gradient scored higher at eps 1 (benchmarks/results/p3gm_fashion_mnist.md)
    epochs: float = Field(20.0, gt=0, le=1000, description="p3gm: DP-SGD epochs (steps = epochs / q)")
    batch: int = Field(
        1500,
        ge=1,
        le=1 << 14,
        description="p3gm: expected DP-SGD batch, q N_hat (Poisson; at most 2^14, so the float64 batch sum keeps "
        "inside the clip margin)",
    )
    lr: float = Field(1e-3, gt=0, le=10, description="p3gm: Adam learning rate of the VAE")
    grad_clip: float = Field(1.0, gt=0, le=1e6, description="p3gm: C, the per-example gradient clip norm")
    hidden: int = Field(
        1000,
        ge=1,
        le=100000,
        description="p3gm: hidden width of the decoder (and of the encoder unless p3gm_encoder_hidden)",
    )
    encoder_hidden: Optional[int] = Field(
        None,
        ge=1,
        le=100000,
        description="p3gm: hidden width of the encoder, which outputs only the latent variance (default: p3gm_hidden)",
    )
    label_weight: Optional[float] = Field(
        None,
        gt=0,
        le=1e6,
        description="p3gm: weight of the label cross-entropy in the VAE loss (default: sqrt(d), mechanisms.p3gm)",
    )

    def check(self, cfg) -> None:
        """(samples is offered: the rows are sampled from the fitted model.)"""
        self.check_mode(cfg.mode)
        if cfg.epsilon is None and cfg.sigma_x != 0:
            raise ValueError("epsilon: p3gm calibrates its noise to a target epsilon (sigma_x 0: no noise, no privacy)")
        if self.mixing_order != 1:
            raise ValueError("mixing_order: p3gm does not mix records (leave it out)")
        if self.projection is not None:
            raise ValueError("projection: not available with p3gm")
        for name in ("lowpass", "denoise", "image_shape", "table"):
            if getattr(cfg, name) is not None:
                raise ValueError(f"{name}: not available with p3gm")
        if cfg.soft_labels:
            raise ValueError("soft_labels: p3gm generates one label per row (the argmax of its label scores)")
        if cfg.mixing_path == "join":
            raise ValueError("mixing_path: p3gm fits its model on one worker (the in-memory path)")
        if self.hidden < 2 * self.latent_dim:
            raise ValueError(
                f"p3gm_hidden: at least 2 x p3gm_latent_dim = {2 * self.latent_dim} (the decoder starts as the "
                "DP-PCA reconstruction through its hidden layer)"
            )

    @property
    def pca_components(self) -> Optional[int]:
        return self.latent_dim  # the DP-PCA of the latent space

    def statistics_shares(self, pca_budget_share: float) -> float:
        return pca_budget_share + self.em_budget_share


class MarginalsParams(MechanismParams):
    name: Literal["marginals"] = "marginals"
    summary: ClassVar[str] = (
        "tables only: a graphical model fitted to noisy one- and two-way counts (MST or AIM), rows sampled from it"
    )
    prefix: ClassVar[str] = "marginals_"
    modes: ClassVar[tuple[str, ...]] = ("poisson",)
    mode_reason: ClassVar[str] = "its counts are accounted under add/remove only: the row count stays private"
    mixes: ClassVar[bool] = False
    needs_table: ClassVar[str] = (
        "marginals counts a table's columns on its public schema; give --label (the DP domain step derives the rest) "
        "or a table: section (docs/tables.md); image and vector inputs are not offered"
    )
    derives_domain: ClassVar[bool] = True

    selection: Literal["mst", "mst-label", "aim"] = Field(
        "mst-label",
        description="marginals: which pairs of columns are measured: mst (a spanning tree picked by the exponential "
        "mechanism, MST), mst-label (the default: that tree and the label's pair with every column, from the same "
        "share) or aim (AIM's adaptive rounds over every pair)",
    )
    max_model_size: Optional[Int] = Field(
        None,
        ge=1,
        le=1 << 34,
        description="marginals, selection aim only: the fitted model's size cap in cells (AIM's max_model_size; "
        "default 65536 cells; the paper's 80 MB of float64 is 10485760)",
    )
    bins: Int = Field(20, ge=2, le=1024, description="marginals: equal bins of each numeric column's declared bounds")
    iters: Int = Field(
        1000, ge=1, le=100_000, description="marginals: mirror-descent iterations of the graphical model's fit (mbi)"
    )

    def check(self, cfg) -> None:
        """(samples is offered: the rows are sampled from the fitted model.)"""
        self.check_mode(cfg.mode)
        if cfg.epsilon is None:
            raise ValueError("epsilon: marginals calibrates its counts' noise to a target epsilon (no --sigma-x)")
        if self.mixing_order != 1:
            raise ValueError("mixing_order: marginals does not mix records (leave it out)")
        if self.samples is not None and self.samples > MAX_MODEL_SAMPLES:  # no public row count to scale a bound by
            raise ValueError(
                f"samples: T={self.samples:,} is more than marginals' {MAX_MODEL_SAMPLES:,}; lower --samples"
            )
        if cfg.normalization != "dp" or cfg.normalization_file is not None:
            raise ValueError("normalization: marginals counts codes on public bins and z-scores nothing (leave it out)")
        if cfg.mixing_path != "auto":
            raise ValueError(
                "mixing_path: marginals does not mix records (its counts take the same memory for any rows)"
            )
        if self.projection is not None:
            raise ValueError("projection: not available with marginals")
        if self.max_model_size is not None and self.selection != "aim":
            raise ValueError("marginals_max_model_size: selection aim only (MST's tree has no size cap)")
        if cfg.audit or cfg.membership_audit:
            raise ValueError(
                f"{'audit' if cfg.audit else 'membership_audit'}: no audit game is offered for marginals yet"
            )

    def statistics_shares(self, pca_budget_share: float) -> float:
        return 0.0  # no z-score statistics: the normalisation's share is not spent


PARAMS: dict[str, type[MechanismParams]] = {}  # the models by mechanism name, in the order ``--help`` lists them


def register(cls: type[MechanismParams]) -> type[MechanismParams]:
    """Adds a mechanism's parameter model (its name is its ``name`` field's default); its flat keys must be new."""
    name = cls.model_fields["name"].default
    taken = {key for other in PARAMS.values() for key in other.own_flat()}
    if name in PARAMS or set(cls.own_flat()) & taken:
        raise ValueError(f"mechanism {name!r}: its name or a flat key ({cls.own_flat()}) is taken")
    PARAMS[name] = cls
    return cls


for _cls in (DpcdaParams, DpmixParams, LocalParams, RandprojParams, P3gmParams, MarginalsParams):
    register(_cls)


def names() -> tuple[str, ...]:
    return tuple(PARAMS)


def parse(data: Mapping) -> MechanismParams:
    """The model ``data["name"]`` names, validated from ``data`` (pydantic's ValidationError for a bad field);
    ValueError (one line) for a name no model has."""
    name = data.get("name")
    if not isinstance(name, str) or name not in PARAMS:
        choices = ", ".join(repr(n) for n in PARAMS)
        raise ValueError(f"mechanism: Input should be {choices} (got {name!r})")
    return PARAMS[name].model_validate(dict(data))


def owner_of(flat: str) -> Optional[tuple[type[MechanismParams], str]]:
    """(the model, its field) of a flat config key (``p3gm_epochs`` -> (P3gmParams, "epochs"); ``mixing_order`` ->
    (MechanismParams, "mixing_order")), or None where the key is no mechanism's."""
    if flat in MechanismParams.model_fields and flat != "name":
        return MechanismParams, flat
    for cls in PARAMS.values():
        for field in cls.own():
            if cls.flat_name(field) == flat:
                return cls, field
    return None
