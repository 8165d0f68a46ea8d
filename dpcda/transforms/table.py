"""DecodeTable: released Arrow blocks (features, label) -> tables with the input's columns (``storage.tables``)."""

from __future__ import annotations

import hashlib

import apache_beam as beam
import numpy as np
import pyarrow as pa

from dpcda.privacy.noise import NoiseStream
from dpcda.storage.build import checked
from dpcda.storage.table_rules import keep_rules, scores_of
from dpcda.storage.tables import decode_rows, decode_uniforms, label_uniforms


def _decode(table: pa.Table, plan, key, schema, arrow_schema, fc: str, lc: str) -> pa.Table:
    col = table.column(fc).combine_chunks()
    z = col.flatten().to_numpy(zero_copy_only=False).reshape(len(col), -1).astype(np.float64)
    x01 = z * plan.std + plan.mean  # back to encoded units with the release's (public or DP) statistics
    labels = table.column(lc).to_numpy()
    if lc + "_soft" in table.column_names:  # released label scores (DPMix): the label is decoded from them
        soft = table.column(lc + "_soft").combine_chunks()
        labels = soft.flatten().to_numpy(zero_copy_only=False).reshape(len(soft), -1)
    uniforms = draws = None
    if schema.decoding == "sample":
        # the stream is named by the released block itself, so every block gets its own
        tag = hashlib.blake2b(np.ascontiguousarray(z).tobytes(), digest_size=16).hexdigest()
        uniforms = decode_uniforms(key, tag, len(z), schema)
        draws = label_uniforms(key, tag, len(z)) if labels.ndim == 2 else None
    rows = decode_rows(x01, labels, schema, arrow_schema, uniforms=uniforms, label_draws=draws)
    if not schema.rules:
        return rows
    # the table's public rules: rows outside decoded again under them (marginals rows keep them already)
    rule_draws = NoiseStream(key, "table-rules", tag).uniform(len(z)) if schema.decoding == "sample" else None
    return keep_rules(rows, schema, scores_of(x01, labels, schema), rule_draws)


class DecodeTable(beam.PTransform):
    """pyarrow.Table (features, label) -> pyarrow.Table with ``arrow_schema``; post-processing only."""

    def __init__(
        self, plan, key, schema, arrow_schema, features_column: str, label_column: str, *, expected_build=None
    ):
        super().__init__()
        self.plan, self.key, self.schema, self.arrow_schema = plan, key, schema, arrow_schema
        self.fc, self.lc, self.expected_build = features_column, label_column, expected_build

    def expand(self, tables):
        return tables | "Decode" >> beam.Map(
            checked(_decode, self.expected_build),
            beam.pvalue.AsSingleton(self.plan),
            beam.pvalue.AsSingleton(self.key),
            self.schema,
            self.arrow_schema,
            self.fc,
            self.lc,
        )
