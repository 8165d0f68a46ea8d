"""The noise package: every random draw that touches private data comes from here.

Relation-agnostic: it draws indices and noise; the mechanisms say which relation their accounting assumes.

Generator. A fresh 256-bit run key (``secrets``) is never written anywhere. Each (purpose, class, chunk) path gets
its own ChaCha20 keystream (RFC 8439 block function, OpenSSL through the ``cryptography`` package) under the subkey
BLAKE2b-256(key = run key, message = path). Streams are deterministic in (key, path), so a retried Beam bundle
redraws exactly the rows it drew the first time; they are independent as long as ChaCha20 is a PRF. Privacy is
therefore claimed against adversaries who cannot distinguish ChaCha20 from random bits; below, the bits are treated
as ideal.

Uniform indices (``uniform_int``, ``distinct``) are exact: rejection sampling on 64-bit words (no modulo bias), and
distinct sets either by rejecting rows with a repeated index or, where repeats would be common, as the l smallest
of n random 64-bit keys with rows redrawn on a tie at the cut (no tie-breaking bias).

Gaussian noise (``gaussian``). The ideal mechanism is ``g * round((f + sigma * Z) / g)`` for an exact standard
normal Z: post-processing of the Gaussian mechanism on the query f, so its privacy is exactly the Gaussian
mechanism's (dp_accounting's events). The grid is public and data-independent: g = 2^(floor(log2 sigma) - 12), so
rounding adds at most sigma/8192 to any value. It is what keeps float artefacts out of the output: an unrounded
float sum would carry the low bits of f (Mironov's attack on floating-point Laplace noise).
We sample it by inversion. A 192-bit uniform integer U gives u = (U + 1/2) / 2^192, and Z = Phi^-1(u), so the output is
a function of U alone. Phi^-1 is evaluated in float64 with Wichura's AS 241 (relative error about 1e-16; we assume 2^-40
(1 + |z|), and the tests check it against mpmath over the whole range). Any output whose float value lies within (twice)
the error bound of a cell boundary is decided exactly instead: u is compared with Phi(boundary) computed in 170-digit
decimal arithmetic. On the host the float part runs as one compiled loop (``privacy.noise.native``: the same IEEE
operations in the same order, its ``log`` within the same error bound; checked against numpy at load) or, where no C
compiler is present or the check fails, in numpy; the decisions above are taken from its values the same way. So given
U, the output is exactly the ideal mechanism's output at u (a zero always as +0.0, whichever path decided it). The only
gap left is u's resolution: every output cell receives a number of U values within one of 2^192 times its ideal
probability, the implementation's support is |Z| <= Phi^-1(1 - 2^-193) < 16.5 (ideal mass outside it: below 2^-191), and
fewer than 33 * 2^13 + 2 < 2^18.1 cells lie inside. The total variation distance from the ideal mechanism is therefore
below tau = 2^-174 per draw.

Binomial draws (``binomial``, poisson-mode row sizes) use the inverse CDF of Binomial(n, q), q rational, tabulated
to 192 bits in decimal arithmetic up to the point M where the upper tail is below 2^-193 (every threshold below
2^192); their distance is below (M + 1) 2^-192 + 2^-193 <= 2^-171 per draw (M < 2^20 is enforced).

What it adds to delta (``sampler_delta``). If the ideal mechanism is (eps, delta)-DP and every draw of the
implementation is within total variation tau_i of its ideal, then for any event S and neighbours D, D',
P[impl(D) in S] <= P[ideal(D) in S] + tau <= e^eps P[ideal(D') in S] + delta + tau
<= e^eps P[impl(D') in S] + delta + (1 + e^eps) tau, with tau = sum of tau_i. The release's delta budget is split
so that the accountant's delta plus this term is at most the target; the manifest states both.

Modules, each of one concern (imports run one way: none imports the package itself or a module above it):
- ``constants``: the words' layout, the samplers' precision, the manifest's texts (host and device read them);
- ``keys``: run, test and public keys, and the per-path subkey;
- ``pool``: the noise threads and the fork guard;
- ``keystream``: OpenSSL's ChaCha20 at any word position;
- ``inverse_normal``: AS 241 in float64; ``exact``: the exact decisions in decimal arithmetic;
- ``gaussian``: the grid and the numpy sampler (the reference); ``native``: its compiled loop (C source, build);
  ``native_sampler``: the loop's calls, finishing and load check; ``host_draw``: a span of blocks on the host;
- ``binomial``: the 192-bit Binomial table; ``indices``: exact uniform indices; ``delta``: ``sampler_delta``;
- ``stream``: ``NoiseStream``; ``paths``: the first draw of each of many streams at once (the domain step's values);
  ``numpy_global``: numpy's global generator seeded from a stream (for mbi);
- ``device``: the same words and samplers in torch (loaded only for a draw on a device).
"""

from __future__ import annotations

from dpcda.privacy.noise.constants import (
    BLOCK,
    GENERATOR,
    GRID_BITS,
    KEY_BYTES,
    MAX_BINOMIAL_TABLE,
    MAX_STREAM_WORDS,
    SAMPLER,
    SLACK_WORDS,
    STATS_PER_BLOCK,
    TV_PER_BINOMIAL,
    TV_PER_GAUSSIAN,
    UNIFORM_WORDS,
    WORDS,
    Z_ERROR,
)
from dpcda.privacy.noise.delta import sampler_delta
from dpcda.privacy.noise.exact import normal_cdf_decimal
from dpcda.privacy.noise.gaussian import grid_for
from dpcda.privacy.noise.indices import sparse_distinct
from dpcda.privacy.noise.inverse_normal import upper_quantile
from dpcda.privacy.noise.keys import fresh_key, key_from_test_seed, public_key, subkey
from dpcda.privacy.noise.native_sampler import native_kernel
from dpcda.privacy.noise.numpy_global import NumpyGlobalState
from dpcda.privacy.noise.pool import available_cores, check_not_forked, forks, set_threads, threads
from dpcda.privacy.noise.stream import NoiseStream

__all__ = [
    "BLOCK",
    "GENERATOR",
    "GRID_BITS",
    "KEY_BYTES",
    "MAX_BINOMIAL_TABLE",
    "MAX_STREAM_WORDS",
    "SAMPLER",
    "SLACK_WORDS",
    "STATS_PER_BLOCK",
    "TV_PER_BINOMIAL",
    "TV_PER_GAUSSIAN",
    "UNIFORM_WORDS",
    "WORDS",
    "Z_ERROR",
    "NoiseStream",
    "NumpyGlobalState",
    "available_cores",
    "check_not_forked",
    "forks",
    "fresh_key",
    "grid_for",
    "key_from_test_seed",
    "native_kernel",
    "normal_cdf_decimal",
    "public_key",
    "sampler_delta",
    "set_threads",
    "sparse_distinct",
    "subkey",
    "threads",
    "upper_quantile",
]
