"""What the Beam-free cores of a release receive instead of the whole ``ReleaseConfig``.

The mechanisms' plan, calibration and synthesis (``dpcda.mechanisms``) read the privacy parameters and the
mechanism's own (``schemas.mechanism_params``), plus the few public facts and execution settings they cannot do
without, each in its own small frozen object; the input glob's shards, the output, the ledger and the evaluation stay
with the launcher. ``ReleaseConfig.core`` builds them from a validated config (tests/test_registry.py checks that
no core reads anything else).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class PrivacyParams:
    """The privacy section as the cores use it: the target, the relation, the clip and the statistics' shares."""

    mode: str  # fixed (replace-one) or poisson (add/remove)
    epsilon: Optional[float]  # the target (None: sigma_x given)
    delta: float
    sigma_x: Optional[float]  # an explicit feature noise std instead of a target
    clip: float
    normalization: str  # dp, public or exact
    normalization_budget_share: float
    histogram_budget_share: float
    pca_budget_share: float
    min_std: float  # the std floor, as a fraction of the feature range
    reproducible: bool  # the noise key comes from a TEST seed (the plan says so in its caveats)


@dataclasses.dataclass(frozen=True)
class DataParams:
    """Public facts of the input the plan needs: its declared bounds, classes and table schema, and its names for
    messages."""

    source: str  # the input glob: named in messages; marginals reads the first shard's Parquet footer (public types)
    label_column: str  # named in messages
    feature_bounds: tuple[float, float]
    num_classes: Optional[int]
    table: Any = None  # schemas.table.TableSchema


@dataclasses.dataclass(frozen=True)
class PostprocessParams:
    """Public, data-independent post-processing the plan resolves against the feature dimension."""

    soft_labels: bool
    lowpass: Optional[int]
    image_shape: Optional[tuple[int, ...]]
    denoise: Optional[float]


@dataclasses.dataclass(frozen=True)
class ExecutionParams:
    """Where and in what pieces the work runs: no output depends on these, except which groups take the join path
    (a public choice; the rows are the same either way)."""

    chunk_rows: int
    device: str
    max_class_bytes: Optional[int]
    mixing_path: str
    join_block_rows: int


@dataclasses.dataclass(frozen=True)
class CoreSettings:
    """Everything a core receives: privacy and mechanism parameters, public input facts, post-processing and
    execution."""

    privacy: PrivacyParams
    params: Any  # schemas.mechanism_params.MechanismParams, the release's mechanism's model
    data: DataParams
    postprocess: PostprocessParams
    execution: ExecutionParams
