"""Marginals (MST, McKenna, Miklau and Sheldon 2021; or AIM, McKenna, Mullins, Sheldon and Miklau 2022): noisy one- and
two-way counts, a graphical model fitted to them with ``mbi`` (private-pgm), and rows sampled from the model. Tables
only. AIM's adaptive rounds (``measure_aim``) spend a zCDP filter's budget (``privacy.aim``).

Neighbouring relation: add or remove one record (all its columns, the label included); the row count is private.

Codes. Every column of the table (the label last) becomes integer codes on PUBLIC bins, read off the encoded rows that
``storage.tables.encode_batch`` makes from the public ``table:`` schema: a categorical column its category's index, a
boolean 0/1, a numeric column one of ``bins`` equal bins of its declared [lower, upper] (``encoded_edges``: a value on
an edge in the bin above it, as ``evaluation.table_metrics`` bins it), a nullable column one more code for null, the
label its class index. Nothing about the bins depends on the data.

Measuring (``MarginalCounter``: count arrays merged by addition, memory independent of the rows, the core of a Beam
combiner). MST's three thirds of a zCDP budget (``privacy.marginals``): every column's one-way counts plus Gaussian
noise; the pairs of columns picked one by one by the exponential mechanism (``privacy.exponential``, exact), each
round among the pairs that join two trees of the forest picked so far, scoring a pair by the L1 distance between its
exact two-way counts and what the noisy one-way counts predict for it (independence: sensitivity 1, as a record moves
one cell by one); the picked pairs' two-way counts plus Gaussian noise (``mst-label``: and the label's pair with every
other column, chosen in advance, so not selected: measured from the same third). Only noisy counts leave ``measure``;
the exact two-way counts feed the scores only. Scores and two-way counts are taken on compressed codes
(``compression``: a column's cells whose noisy one-way count is below 3 stds merged into one, post-processing; mapped
back by ``decompress``). Noise comes from ``privacy.noise`` (``NoiseStream.gaussian``, the
rounded Gaussian whose privacy is the Gaussian mechanism's).

Fitting and sampling are post-processing of the noisy counts: ``mbi``'s mirror descent fits a graphical model on the
measured cliques (its total is the minimum-variance estimate of the uncompressed noisy counts: mbi leaves the
compressed one-way counts, weighted queries, out of it), ``synthetic_data`` draws rows in blocks of
``SAMPLE_ROWS`` as the writer takes them, so no step holds the release's N rows (mbi draws from numpy's global
generator: it is seeded from the noise stream and restored around each call), and a numeric code becomes a value
drawn uniformly inside its bin (uniforms of the noise stream); before that, a merged code (MST's compression) becomes
one of the codes merged into it, in proportion to their noisy one-way counts clamped at zero (the noise stream's
uniforms; ``estimation.code_weights``). A residual code (a nullable column's null, a categorical column's other
bucket) whose noisy one-way count is below 3 stds is absent from the release (``residual``).

Modules: ``domain`` (codes), ``counting`` (the combiner's core, compression), ``plan`` (the plan and the
measurements), ``selection`` (MST), ``aim`` (AIM's rounds), ``estimation`` (fit and sample), ``synthesis`` (counts to
rows), ``limits`` (the size bounds checked before work), ``noisy`` (the measurements a quality report reads),
``mechanism`` (the registry entry).
"""

from __future__ import annotations

from dpcda.mechanisms.base import PlanError  # noqa: F401
from dpcda.mechanisms.marginals.aim import (  # noqa: F401
    AIM_ROUND_ITERS,
    AIM_ROUND_TOL,
    _exact_sum,
    aim_candidates,
    aim_scores,
    measure_aim,
)
from dpcda.mechanisms.marginals.counting import (  # noqa: F401
    COMPRESS_SIGMAS,
    CompressedCounter,
    MarginalCounter,
    compressed_domain,
    compression,
)
from dpcda.mechanisms.marginals.domain import (  # noqa: F401
    MAX_INTEGER_VALUES,
    Domain,
    _values,
    codes_of,
    domain_of,
    encoded,
    encoded_edges,
    inside_bins,
    integer_bins,
    rows_of,
)
from dpcda.mechanisms.marginals.estimation import (  # noqa: F401
    SAMPLE_ROWS,
    _mbi,
    decompress,
    fit,
    merged,
    sample_codes,
    warm_start,
)
from dpcda.mechanisms.marginals.limits import (  # noqa: F401
    MAX_CELLS,
    MAX_COLUMNS,
    MAX_FIT_BYTES,
    MAX_MODEL_CELLS,
    Footprint,
    footprint,
    refusal,
)
from dpcda.mechanisms.marginals.mechanism import Marginals  # noqa: F401
from dpcda.mechanisms.marginals.noisy import noisy_summary  # noqa: F401
from dpcda.mechanisms.marginals.plan import (  # noqa: F401
    AIM,
    AIM_MAX_MODEL_SIZE,
    SCORE_BITS,
    SELECTIONS,
    MarginalsPlan,
    Measurements,
    label_pairs,
)
from dpcda.mechanisms.marginals.selection import (  # noqa: F401
    _DisjointSet,
    independence_scores,
    measure,
    select_mst,
)
from dpcda.mechanisms.marginals.synthesis import (  # noqa: F401
    fit_and_sample,
    integer_columns,
    rows_of_total,
)
