"""What the finite-precision samplers add to delta (``sampler_delta``; the argument is the package's docstring's).

Each draw of the implementation is within total variation ``TV_PER_GAUSSIAN`` or ``TV_PER_BINOMIAL`` of its ideal, so
an (eps, delta)-DP ideal mechanism is (eps, delta + (1 + e^eps) tau)-DP as implemented, tau the sum over its draws.
"""

from __future__ import annotations

import math

from dpcda.privacy.noise.constants import TV_PER_BINOMIAL, TV_PER_GAUSSIAN


def sampler_delta(epsilon: float, *, gaussian_draws: int, binomial_draws: int = 0) -> float:
    """(1 + e^eps) * sum of per-draw total variation: what the finite-precision sampler adds to delta."""
    tau = gaussian_draws * TV_PER_GAUSSIAN + binomial_draws * TV_PER_BINOMIAL
    if tau == 0:
        return 0.0
    if not math.isfinite(epsilon) or epsilon > 700:
        return math.inf
    return (1.0 + math.exp(epsilon)) * tau * (1 + 1e-12)  # round up
