"""Each mechanism's section of the release config: its own parameters and the rules the rest must follow.

``schemas.config.ReleaseConfig`` stays one flat model in memory (its readers ask ``cfg.p3gm_epochs``), but a
mechanism's parameters are a section of their own. ``PARAMS`` maps each mechanism to its class here (the config's
discriminated union on ``mechanism``); the class says

- which fields are the mechanism's own (``own``): written in the ``mechanism:`` section of a config file, where
  ``p3gm_epochs`` may be written ``epochs``; a field of another mechanism given a value is refused;
- the defaults it sets (``defaults``: mode, mixing order) and what it offers (modes, mixing, DP-PCA, tables);
- the rules the rest of the config must follow with it (``check``), in the config's one-line error words.

Nothing here compares a mechanism's name: the config looks its class up. ``mechanisms.registry`` has the same names
(tests/test_registry.py).
"""

from __future__ import annotations

from typing import ClassVar, Optional


class MechanismParams:
    """A mechanism's config rules. Subclasses set the class attributes and extend ``check``."""

    name: ClassVar[str] = ""
    own: ClassVar[tuple[str, ...]] = ()  # ReleaseConfig fields that are this mechanism's parameters
    prefix: ClassVar[str] = ""  # an own field's prefix, left out in the mechanism section of a config file
    modes: ClassVar[tuple[str, ...]] = ("fixed", "poisson")
    default_mode: ClassVar[Optional[str]] = None  # None: the config's default
    mixes: ClassVar[bool] = True  # mixes l records per row (mixing_order, samples, the join path)
    dp_pca: ClassVar[bool] = False  # offers ``projection: dp-pca:K``
    soft_labels_always: ClassVar[bool] = False  # always releases the K label scores
    needs_num_classes: ClassVar[str] = ""  # why num_classes is required ('' when it is not)
    no_table: ClassVar[str] = ""  # why a table input is refused ('' when it is allowed)
    needs_table: ClassVar[str] = ""  # why only a table input is taken ('' when any input is)
    no_image_postprocessing: ClassVar[str] = ""  # why lowpass/denoise are refused ('' when allowed)

    @classmethod
    def defaults(cls, data: dict) -> dict:
        """The raw config with this mechanism's defaults filled in where the user gave none."""
        if cls.default_mode is not None and data.get("mode") is None:
            data = {**data, "mode": cls.default_mode}
        if not cls.mixes and data.get("mixing_order") is None:
            data = {**data, "mixing_order": 1}
        return data

    @classmethod
    def section_field(cls, key: str) -> str:
        """The config field a key of the ``mechanism:`` section names (``epochs`` -> ``p3gm_epochs``)."""
        return cls.prefix + key if cls.prefix and cls.prefix + key in cls.own else key

    @classmethod
    def check(cls, cfg) -> None:
        """ValueError (the config's one-line message) where ``cfg`` breaks this mechanism's rules."""
        if cfg.mode not in cls.modes:
            raise ValueError(
                f"mode: {cls.name} releases one row per record, which publishes the count; only mode fixed "
                f"(replace one record within its class) is offered"
            )
        if not cls.mixes:
            if cfg.samples is not None:
                raise ValueError(f"samples: {cls.name} releases exactly one row per record")
            if cfg.mixing_order != 1:
                raise ValueError(f"mixing_order: {cls.name} does not mix records (leave it out)")
            if cfg.mixing_path == "join":
                raise ValueError(f"mixing_path: {cls.name} does not mix (each record is its own row)")
        if cls.no_image_postprocessing and (cfg.lowpass or cfg.denoise):
            raise ValueError(f"lowpass/denoise: {cls.no_image_postprocessing}")
        if cls.needs_num_classes and cfg.num_classes is None:
            raise ValueError(f"num_classes: required with {cls.name} ({cls.needs_num_classes})")
        if "sigma_y" not in cls.own and cfg.sigma_y:
            raise ValueError("sigma_y: dpcda only (dpmix sets it from --label-noise-ratio)")
        if cfg.projection is not None and not cls.dp_pca:
            raise ValueError(f"projection: a DP-PCA basis is for the mixing mechanisms, not {cls.name}")
        if cfg.table is not None and cls.no_table:
            raise ValueError(f"table: {cls.no_table}")

    @classmethod
    def pca_components(cls, cfg) -> Optional[int]:
        """K of ``projection: dp-pca:K`` (None without one)."""
        return int(cfg.projection.split(":", 1)[1]) if cfg.projection else None

    @classmethod
    def statistics_shares(cls, cfg) -> float:
        """The shares of epsilon this mechanism takes beside the normalisation and the histogram (DP-PCA, DP-EM)."""
        return cfg.pca_budget_share if cfg.projection else 0.0


class DpcdaParams(MechanismParams):
    name = "dpcda"
    own = ("sigma_y", "class_rows")
    dp_pca = True

    @classmethod
    def defaults(cls, data: dict) -> dict:
        data = super().defaults(data)
        if data.get("class_rows") is None:  # a table keeps its label's base rate; images seed 000's T/K per class
            data = {**data, "class_rows": "proportional" if data.get("table") is not None else "equal"}
        return data


class DpmixParams(MechanismParams):
    name = "dpmix"
    own = ("label_noise_ratio",)
    dp_pca = True
    soft_labels_always = True
    needs_num_classes = "the width of the released label scores"


class LocalParams(MechanismParams):
    name = "local"
    modes = ("fixed",)
    mixes = False


class RandprojParams(MechanismParams):
    name = "randproj"
    own = ("projection_dim", "projection_seed")
    modes = ("fixed",)
    mixes = False
    no_image_postprocessing = "randproj rows are projections, not images"
    no_table = "randproj releases projections, which cannot be read back as the table's columns"


class P3gmParams(MechanismParams):
    name = "p3gm"
    own = (
        "p3gm_latent_dim",
        "p3gm_components",
        "p3gm_em_iterations",
        "p3gm_em_budget_share",
        "p3gm_epochs",
        "p3gm_batch",
        "p3gm_lr",
        "p3gm_grad_clip",
        "p3gm_hidden",
        "p3gm_encoder_hidden",
        "p3gm_label_weight",
    )
    prefix = "p3gm_"
    modes = ("poisson",)
    default_mode = "poisson"  # the generative model is accounted under add/remove only
    mixes = False

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.mode != "poisson":
            raise ValueError(
                "mode: p3gm trains with Poisson-sampled DP-SGD, accounted under add/remove only (mode poisson, the "
                "default for p3gm)"
            )
        if cfg.epsilon is None and cfg.sigma_x != 0:
            raise ValueError("epsilon: p3gm calibrates its noise to a target epsilon (sigma_x 0: no noise, no privacy)")
        if cfg.mixing_order != 1:
            raise ValueError("mixing_order: p3gm does not mix records (leave it out)")
        for name in ("projection", "lowpass", "denoise", "image_shape", "table"):
            if getattr(cfg, name) is not None:
                raise ValueError(f"{name}: not available with p3gm")
        if cfg.soft_labels:
            raise ValueError("soft_labels: p3gm generates one label per row (the argmax of its label scores)")
        if cfg.mixing_path == "join":
            raise ValueError("mixing_path: p3gm fits its model on one worker (the in-memory path)")
        if cfg.sigma_y:
            raise ValueError("sigma_y: dpcda only")
        if cfg.p3gm_hidden < 2 * cfg.p3gm_latent_dim:
            raise ValueError(
                f"p3gm_hidden: at least 2 x p3gm_latent_dim = {2 * cfg.p3gm_latent_dim} (the decoder starts as the "
                "DP-PCA reconstruction through its hidden layer)"
            )

    @classmethod
    def pca_components(cls, cfg) -> Optional[int]:
        return cfg.p3gm_latent_dim  # the DP-PCA of the latent space

    @classmethod
    def statistics_shares(cls, cfg) -> float:
        return cfg.pca_budget_share + cfg.p3gm_em_budget_share


class MarginalsParams(MechanismParams):
    name = "marginals"
    own = ("marginals_selection", "marginals_bins", "marginals_iters", "marginals_max_model_size")
    prefix = "marginals_"
    modes = ("poisson",)
    default_mode = "poisson"  # counts under add/remove only: the row count stays private
    mixes = False
    needs_table = (
        "marginals counts a table's columns on its public schema; give a table: section (docs/tables.md); image and "
        "vector inputs are not offered"
    )

    @classmethod
    def check(cls, cfg) -> None:
        """(mixing_order is not read: a table config written for a mixing mechanism runs with --mechanism marginals.)"""
        if cfg.mode != "poisson":
            raise ValueError("mode: marginals is accounted under add/remove only (mode poisson, its default)")
        if cfg.epsilon is None:
            raise ValueError("epsilon: marginals calibrates its counts' noise to a target epsilon (no --sigma-x)")
        if cfg.normalization != "dp" or cfg.normalization_file is not None:
            raise ValueError("normalization: marginals counts codes on public bins and z-scores nothing (leave it out)")
        if cfg.mixing_path != "auto":
            raise ValueError(
                "mixing_path: marginals does not mix records (its counts take the same memory for any rows)"
            )
        if cfg.sigma_y:
            raise ValueError("sigma_y: dpcda only")
        if cfg.projection is not None:
            raise ValueError("projection: not available with marginals")
        if cfg.marginals_max_model_size is not None and cfg.marginals_selection != "aim":
            raise ValueError("marginals_max_model_size: selection aim only (MST's tree has no size cap)")
        if cfg.audit or cfg.membership_audit:
            raise ValueError(
                f"{'audit' if cfg.audit else 'membership_audit'}: no audit game is offered for marginals yet"
            )

    @classmethod
    def statistics_shares(cls, cfg) -> float:
        return 0.0  # no z-score statistics: the normalisation's share is not spent


PARAMS: dict[str, type[MechanismParams]] = {
    cls.name: cls for cls in (DpcdaParams, DpmixParams, LocalParams, RandprojParams, P3gmParams, MarginalsParams)
}
OWNER: dict[str, str] = {field: cls.name for cls in PARAMS.values() for field in cls.own}  # field -> its mechanism
