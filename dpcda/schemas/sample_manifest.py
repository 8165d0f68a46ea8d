"""The manifest of a sample drawn from a release's model (``dpcda sample``, ``dpcda.load(DIR).sample``).

A sample is post-processing of one release: its rows are drawn from the model the release kept (``model/``), which
holds DP measurements and what was fitted to them, never a row. So it spends no budget and has no guarantee of its
own: the manifest names the release it came from (its path and the SHA-256 of its manifest) and states that
release's epsilon and delta as inherited. No ledger is read or written. Written last, like a release's manifest.
"""

from __future__ import annotations

import json
from typing import Literal, Optional

from pydantic import Field

from dpcda.schemas.manifest import ModelFile, Output, Software, _Frozen

SAMPLE_MANIFEST_VERSION = 1


class SampleSource(_Frozen):
    path: str = Field(description="the release the rows were drawn from, as it was read (a local path made absolute)")
    manifest_sha256: str = Field(description="SHA-256 of that release's manifest.json, as read")
    created_at: str = Field(description="when that release was made (its manifest's created_at)")
    mechanism: str
    model: list[ModelFile] = Field(description="the release's model files read, with the digests they were checked to")


class SamplePrivacy(_Frozen):
    inherited: Literal[True] = True
    epsilon: Optional[float] = Field(description="the source release's epsilon, inherited (null: infinite)")
    delta: float = Field(description="the source release's delta, inherited")
    epsilon_spent: float = Field(0.0, description="budget this sample spent: none (post-processing)")
    neighbouring_relation: str
    end_to_end_dp: bool = Field(description="the source release's (false there, false here)")
    statement: str
    ledger: str = "no ledger entry: a sample spends nothing, so no ledger is read or written"


class SampleDraw(_Frozen):
    rows: int
    reproducible_seed: bool = Field(
        description="true: the draws came from a key built from --seed (the same seed gives the same rows); the "
        "model is DP, so a known seed reveals nothing more about the records"
    )
    generator: str
    how: str


class SampleManifest(_Frozen):
    kind: Literal["sample"] = "sample"
    sample_manifest_version: int = SAMPLE_MANIFEST_VERSION
    created_at: str
    software: Software
    source: SampleSource
    privacy: SamplePrivacy
    sampling: SampleDraw
    output: Output

    def write_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, allow_nan=False) + "\n"
