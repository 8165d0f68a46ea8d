"""The noise package's streams and samplers on a torch device: the same words, the same samplers, bit for bit.

Relation-agnostic, like ``privacy.noise`` (whose docstring states the mechanism): nothing here decides what is
sampled, only where the arithmetic runs. The only part of ``privacy/`` that imports torch; ``NoiseStream`` loads it
lazily, when a caller asks for a device.

- ``chacha``: the RFC 8439 block function in torch integer operations, keyed and laid out as the OpenSSL stream
  ``NoiseStream`` reads, so word w is the host's word w;
- ``gaussian``: the host's Gaussian sampler (AS 241 in float64, the grid, the error bound), near-boundary cells
  handed back to the host's exact code;
- ``indices``: Binomial row sizes and distinct indices, the host's samplers in exact integer arithmetic;
- ``kernels``: ``torch.compile`` where it works, else eager (the same arithmetic), and the work per kernel call.

The tests check the identity, in the bits, on CPU tensors and, where present, on CUDA.
"""

from __future__ import annotations

from dpcda.privacy.noise.device.chacha import (
    MAX_BLOCKS,
    MAX_WORDS,
    StreamWords,
    chacha20_blocks,
    stream_halves,
    stream_words,
)
from dpcda.privacy.noise.device.gaussian import rounded_gaussian, upper_quantile
from dpcda.privacy.noise.device.indices import binomial, binomial_from_halves, distinct
from dpcda.privacy.noise.device.kernels import backend, compile_enabled

__all__ = [
    "MAX_BLOCKS",
    "MAX_WORDS",
    "StreamWords",
    "backend",
    "binomial",
    "binomial_from_halves",
    "chacha20_blocks",
    "compile_enabled",
    "distinct",
    "rounded_gaussian",
    "stream_halves",
    "stream_words",
    "upper_quantile",
]
