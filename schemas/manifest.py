"""The release manifest: what was released and exactly what is guaranteed.

Written last, so its presence means the release is complete. Holds only public or DP quantities:
no seed or key, no per-record data, and in ``poisson`` mode no exact private counts.
``python -m schemas.manifest`` regenerates ``schemas/manifest.schema.json``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

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
    pattern: str
    format: str
    files: int
    features_column: str
    label_column: str
    feature_dim: int


class PostProcessing(_Frozen):
    lowpass: int = Field(description="K: each released row keeps its 2-D DCT frequencies u + v < K")
    image_shape: list[int] = Field(description="(H, W) or (C, H, W) grid the DCT runs on, channels-first")
    kept_coefficients: int
    privacy: str = ("post-processing of the DP output by a public, data-independent linear projection: "
                    "the guarantee is unchanged")


class Mechanism(_Frozen):
    mode: Literal["fixed", "poisson"]
    sampling: str
    mixing_order: int
    clip: float
    sigma_x: float
    sigma_y: float
    noise_multiplier: float
    num_classes: int
    samples_total: int
    samples_per_class: int
    class_sizes: Optional[list[int]] = Field(None, description="exact N_k; fixed mode only (public there)")
    class_sizes_dp: Optional[list[int]] = Field(None, description="DP estimates N_k_hat; poisson mode only")
    sampling_rates: list[float] = Field(description="l/N_k (fixed) or q_k = l/N_k_hat (poisson), per class")
    chunk_rows: int
    postprocessing: Optional[PostProcessing] = None


class Normalization(_Frozen):
    method: Literal["dp", "public", "exact"]
    feature_bounds: tuple[float, float]
    out_of_bounds: Literal["clip", "refuse"]
    min_std: float
    noise_std: Optional[float] = None
    epsilon_share: Optional[float] = None
    statistics_file: str = "normalization.json"


class Noise(_Frozen):
    generator: str = Field(description="where the random bits come from")
    sampler: str = Field(description="how indices and Gaussian noise are drawn from them")
    grids: dict[str, float] = Field(description="output grid of each Gaussian release, by name: every noisy value "
                                                "is a multiple of it")


class Privacy(_Frozen):
    epsilon: Optional[float] = Field(description="the guarantee; null means infinite (no noise)")
    delta: float
    target_epsilon: Optional[float]
    epsilon_this_histogram: Optional[float] = Field(None, description=(
        "poisson mode: what the accountant gives for the parameters this run's DP histogram chose; informational, "
        "the guarantee is epsilon (the budget fixed before the histogram was drawn)"))
    accountant: str
    neighbouring_relation: str
    composition: str
    components: dict[str, Optional[float]] = Field(description="epsilon of each component alone at delta (null: infinite)")
    cross_check: dict[str, Optional[float]] = Field(default_factory=dict)
    delta_breakdown: dict[str, float] = Field(description=(
        "where delta goes: the accountant's share, adaptive stages accounted alone (poisson: class_histogram) and "
        "the noise sampler's finite-precision bound; the sum is at most delta"))
    noise: Noise
    end_to_end_dp: bool
    reproducible_seed: bool
    paper_theorem1_epsilon: Optional[float] = Field(
        None, description="seed 000 Theorem 1 as written (p = l/N, T compositions, label term): "
                          "informational only, NOT the guarantee; null means infinite (sigma_y = 0 or sigma_x = 0)")
    caveats: list[str]


class OutputFile(_Frozen):
    path: str = Field(description="relative to the release directory (OUTPUT)")
    rows: int
    sha256: str = Field(description="of the stored object, read back after writing")
    bytes: Optional[int] = None


class Output(_Frozen):
    rows: int
    prefix: str = Field("", description="where this release's files live under OUTPUT ('' locally; on gs:// the "
                                        "run's own prefix runs/<run>/, never rewritten)")
    files: list[OutputFile]
    format: str = "parquet: features fixed_size_list<float32>[d], label int64"


class RunInfo(_Frozen):
    runner: str
    job_id: Optional[str] = None
    console_url: Optional[str] = None


class Manifest(_Frozen):
    manifest_version: int = 1
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

    def write_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"


def export_schema(path: Path = SCHEMA_PATH) -> None:
    path.write_text(json.dumps(Manifest.model_json_schema(), indent=2) + "\n")


if __name__ == "__main__":
    export_schema()
    print(f"wrote {SCHEMA_PATH}")
