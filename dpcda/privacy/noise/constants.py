"""The noise package's shared constants: the layout of the words (host and device read the same), the samplers'
precision and the texts the manifest states.

Every module of ``privacy.noise`` (host and device) reads them from here, and this module imports nothing, so no
module needs another one's constants (the device's sampler reads the host's block layout from here, not from the
host's stream).
"""

from __future__ import annotations

KEY_BYTES = 32
GRID_BITS = 12  # g = 2^(floor(log2 sigma) - GRID_BITS)
TV_PER_GAUSSIAN = 2.0**-174
TV_PER_BINOMIAL = 2.0**-171
UNIFORM_WORDS = 3  # 192-bit uniforms
MAX_BINOMIAL_TABLE = 1 << 20
# Assumed bound on AS 241's float64 error, |z_float - z| <= Z_ERROR * (1 + |z|); observed: below 2^-50.
Z_ERROR = 2.0**-40
GENERATOR = (
    "ChaCha20 keystream (RFC 8439, OpenSSL via the cryptography package), one stream per (purpose, class, "
    "chunk) under the subkey BLAKE2b-256(run key, path); 256-bit run key from the secrets module, never "
    "written"
)
SAMPLER = (
    "exact inversion of 192-bit uniforms: Gaussian noise rounded to the grid g = 2^(floor(log2 sigma) - "
    f"{GRID_BITS}) (AS 241 in float64, cells near a boundary decided in 170-digit decimal arithmetic; total "
    "variation from the exact rounded Gaussian < 2^-174 per draw); indices by rejection (exact); poisson row "
    "sizes by inversion of a 192-bit Binomial table (< 2^-171 per draw)"
)
# Released in every manifest (privacy.noise.words) and kept word for word, the old module name included: the
# manifests of earlier releases say the same.
WORDS = (
    "mixing noise, indices and row sizes on a CUDA worker: ChaCha20 and the samplers in torch on the card "
    "(privacy.noise_device: the same words and outputs as the OpenSSL stream, bit for bit, identity-tested), "
    "near-boundary cells decided on the host; everything else: OpenSSL on the host and the sampler as a compiled "
    "loop where a C compiler is present and the loop passes its check against numpy at load, else in numpy (the "
    "same output), on all its cores"
)
# Elements per block of a Gaussian draw (keeps the numpy sampler's temporaries in cache). The layout of a draw's
# words is fixed by it, on the host and on a device: block j of BLOCK elements (the last one shorter) reads its n
# top, n middle and n low words, 3 n in all, from word 3 j BLOCK of the draw on.
BLOCK = 8192
# Words of room a uint64 buffer needs beyond the words OpenSSL writes into it (``update_into`` wants them).
SLACK_WORDS = 8
STATS_PER_BLOCK = 5  # what the compiled sampler returns per block (privacy.noise.native.STATS)
MAX_STREAM_WORDS = 8 << 32  # 2^32 ChaCha20 blocks: OpenSSL refuses to wrap the 32-bit block counter
OVERFLOW = (
    "Exceeded the maximum number of bytes that can be encrypted with ChaCha20 for this nonce. The 32-bit counter "
    "portion of the nonce would overflow."
)
