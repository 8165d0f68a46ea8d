"""Empirical privacy audit: a distinguishing game against the real mixing mechanism.

Neighbouring relations (DESIGN.md, "Privacy model"), one game per mode:
- ``fixed``: replace one record's features within its class. D holds a canary ``+c u`` and
  ``N_k - 1`` background records; D' replaces the canary by ``-c u`` (the largest replace-one move,
  ``2c``). Class size and label are unchanged.
- ``poisson``: add or remove one record. D holds the canary ``+c u`` and the background; D' is the
  background alone. The sampling rate ``q = l / N_k`` is the same on both (it comes from the DP
  class count, which the mixing event treats as given).

Background records are clipped to norm ``c`` and orthogonal to ``u``, so the projection of a released
row on ``u`` is exactly (canary's share) + Gaussian noise: the canary is as easy to detect as the
relation allows. Each trial runs ``mechanisms.dpcda.mix_chunk`` (the product's mechanism) for one
class of ``samples_per_class`` rows; trials are stacked as rows of one call, batched, on CUDA when
present. The test statistic is the Neyman-Pearson log-likelihood ratio of the released projections
(monotone in the projection when a trial releases one row; the largest projection when noise is off).

Half the trials of each dataset choose a threshold; the other half measure the false-positive rate
FP (guess D on D') and false-negative rate FN (guess D' on D). With one-sided Clopper-Pearson upper
bounds at 97.5 % each (so both hold together with probability >= 95 %), any (epsilon, delta)-DP
mechanism satisfies (Kairouz et al. 2015; seed 003 eq. 2-6)::

    epsilon >= max(ln((1 - delta - FP_hi) / FN_hi), ln((1 - delta - FN_hi) / FP_hi))

so the figure is a 95 %-confidence lower bound on the true epsilon of this small configuration. It
can only ever expose accounting that is too optimistic; it never certifies privacy. Seed 003's
Theorem 1 ("noiseless privacy", Grining & Klonowski 2017) is reported beside it as an informational
figure only: it treats the data's own variance as the noise, which is not a guarantee.

Modules: ``statistics`` (the threshold, the error rates and the bound), ``games`` (one canary game per way a
mechanism releases a record; a mechanism names its game), ``play`` (a configuration, a release's manifest, a broken
claim), ``command`` (``dpcda audit``).
"""

from __future__ import annotations

from dpcda.evaluation.audit.command import audit_mode, format_table, run_audit_cli  # noqa: F401
from dpcda.evaluation.audit.games import (  # noqa: F401
    BATCH_ROWS,
    NOISELESS_NOTE,
    canary_datasets,
    noiseless_privacy,
)
from dpcda.evaluation.audit.play import (  # noqa: F401
    AUDIT_NOTE,
    DEFAULT_DIM,
    audit_section,
    json_safe,
    run_audit,
    run_paper_rate_audit,
)
from dpcda.evaluation.audit.statistics import (  # noqa: F401
    CONFIDENCE,
    MAX_CANDIDATES,
    AuditError,
    _error_counts,
    choose_threshold,
    clopper_pearson_upper,
    epsilon_lower_bound,
    log_likelihood_ratio,
    max_detectable_epsilon,
    score_game,
)
