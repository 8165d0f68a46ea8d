"""The one noise module: every random draw that touches private data comes from here.

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
We sample it by inversion. A 192-bit uniform integer U gives u = (U + 1/2) / 2^192, and Z = Phi^-1(u), so the
output is a function of U alone. Phi^-1 is evaluated in float64 with Wichura's AS 241 (relative error about
1e-16; we assume 2^-40 (1 + |z|), and the tests check it against mpmath over the whole range). Any output whose
float value lies within (twice) the error bound of a cell boundary is decided exactly instead: u is compared with
Phi(boundary) computed in 170-digit decimal arithmetic. On the host the float part runs as one compiled loop
(``privacy.noise_native``: the same IEEE operations in the same order, its ``log`` within the same error bound; checked
against numpy at load) or, where no C compiler is present or the check fails, in numpy; the decisions above are taken
from its values the same way. So given U, the output is exactly the ideal mechanism's output at u (a zero always as
+0.0, whichever path decided it). The only gap left is u's resolution: every output cell receives a number of U values
within one of 2^192 times its ideal probability, the implementation's support is |Z| <= Phi^-1(1 - 2^-193) < 16.5 (ideal
mass outside it: below 2^-191), and fewer than 33 * 2^13 + 2 < 2^18.1 cells lie inside. The total variation distance
from the ideal mechanism is therefore below tau = 2^-174 per draw.

Binomial draws (``binomial``, poisson-mode row sizes) use the inverse CDF of Binomial(n, q), q rational, tabulated
to 192 bits in decimal arithmetic up to the point M where the upper tail is below 2^-193 (every threshold below
2^192); their distance is below (M + 1) 2^-192 + 2^-193 <= 2^-171 per draw (M < 2^20 is enforced).

What it adds to delta (``sampler_delta``). If the ideal mechanism is (eps, delta)-DP and every draw of the
implementation is within total variation tau_i of its ideal, then for any event S and neighbours D, D',
P[impl(D) in S] <= P[ideal(D) in S] + tau <= e^eps P[ideal(D') in S] + delta + tau
<= e^eps P[impl(D') in S] + delta + (1 + e^eps) tau, with tau = sum of tau_i. The release's delta budget is split
so that the accountant's delta plus this term is at most the target; the manifest states both.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache
from typing import Optional

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

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
WORDS = (
    "mixing noise, indices and row sizes on a CUDA worker: ChaCha20 and the samplers in torch on the card "
    "(privacy.noise_device: the same words and outputs as the OpenSSL stream, bit for bit, identity-tested), "
    "near-boundary cells decided on the host; everything else: OpenSSL on the host and the sampler as a compiled "
    "loop where a C compiler is present and the loop passes its check against numpy at load, else in numpy (the "
    "same output), on all its cores"
)
_BLOCK = 8192  # elements per vectorised block (keeps temporaries in cache)
_DENSE_KEYS = 1 << 22  # random keys per batch in the dense distinct-index sampler
_ZEROS = memoryview(bytes(1 << 20))  # plaintext for the keystream, 1 MiB at a time (sliced without a copy)
_SLACK_WORDS = 8
_TASK_BLOCKS = 64  # Gaussian blocks per thread task (512 Ki elements: few OpenSSL streams to open)
_NATIVE_GROUP = 4  # blocks per call of the compiled sampler (noise_native)
_SKIP_LOW_WORDS = False  # True: each block opens an OpenSSL stream to skip its low words (openings serialise threads)
_NATIVE_MIN = 2 * _BLOCK  # smaller spans: the numpy sampler (no build for a few draws)
STATS_PER_BLOCK = 5  # what the compiled sampler returns per block (noise_native.STATS)
_TASK_WORDS = 1 << 20  # keystream words per thread task
MAX_STREAM_WORDS = 8 << 32  # 2^32 ChaCha20 blocks: OpenSSL refuses to wrap the 32-bit block counter
_OVERFLOW = (
    "Exceeded the maximum number of bytes that can be encrypted with ChaCha20 for this nonce. The 32-bit counter "
    "portion of the nonce would overflow."
)
_NO_COPY = "a NoiseStream cannot be copied or pickled: a copy would draw the same noise again (make one where it draws)"
_FORKED = (
    "a NoiseStream made before a fork cannot draw in the child: parent and child would draw the same noise (make the "
    "stream in the process that draws from it)"
)
_THREADS: Optional[int] = None
_POOL: Optional[ThreadPoolExecutor] = None
_POOL_PID = 0
_POOL_LOCK = threading.Lock()
_FORKS = 0  # forks this process descends from since the module was loaded: a stream draws only where it was made


def _after_fork_in_child() -> None:
    """A forked child: streams made before the fork refuse to draw (``_FORKS`` moved on; a pid could be reused), and
    the pool's lock, which another thread may have held at the fork, is new."""
    global _FORKS, _POOL, _POOL_LOCK
    _FORKS += 1
    _POOL, _POOL_LOCK = None, threading.Lock()


def check_not_forked(forks: int) -> None:
    """RuntimeError where an object made when ``_FORKS`` was ``forks`` is used in a process forked since."""
    if forks != _FORKS:
        raise RuntimeError(_FORKED)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def fresh_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_from_test_seed(seed: int) -> bytes:
    """TEST ONLY: a fixed key (the manifest then says ``reproducible_seed: true``)."""
    return hashlib.blake2b(f"dpcda-test-seed:{int(seed)}".encode(), digest_size=KEY_BYTES).digest()


def public_key(purpose: str, seed: int) -> bytes:
    """A key anyone can rebuild, for PUBLIC draws only (e.g. randproj's projection matrix from its public seed)."""
    return hashlib.blake2b(f"dpcda-public:{purpose}:{int(seed)}".encode(), digest_size=KEY_BYTES).digest()


def subkey(key: bytes, path: tuple) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"noise key must be {KEY_BYTES} bytes")
    label = "/".join(str(p) for p in path).encode()
    return hashlib.blake2b(label, key=bytes(key), digest_size=32, person=b"dpcda-stream").digest()


def grid_for(sigma: float) -> float:
    """The public output grid of Gaussian noise of std ``sigma``: 2^(floor(log2 sigma) - GRID_BITS)."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be positive and finite, got {sigma}")
    _, e = math.frexp(sigma)  # sigma = m 2^e, m in [0.5, 1)
    return math.ldexp(1.0, e - 1 - GRID_BITS)


def sampler_delta(epsilon: float, *, gaussian_draws: int, binomial_draws: int = 0) -> float:
    """(1 + e^eps) * sum of per-draw total variation: what the finite-precision sampler adds to delta."""
    tau = gaussian_draws * TV_PER_GAUSSIAN + binomial_draws * TV_PER_BINOMIAL
    if tau == 0:
        return 0.0
    if not math.isfinite(epsilon) or epsilon > 700:
        return math.inf
    return (1.0 + math.exp(epsilon)) * tau * (1 + 1e-12)  # round up


# ---------------------------------------------------------------- threads


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def set_threads(n: Optional[int]) -> None:
    """Host threads that draw noise (None: ``available_cores()``). No output depends on it: a draw's words sit at
    fixed stream positions, and each thread reads its own span of them."""
    global _THREADS
    if n is not None and int(n) < 1:
        raise ValueError(f"noise threads must be at least 1, got {n}")
    _THREADS = None if n is None else int(n)


def threads() -> int:
    return _THREADS or available_cores()


def _pool(n: int) -> ThreadPoolExecutor:
    """The noise threads of this process (a forked worker starts its own: threads do not survive a fork)."""
    global _POOL, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL._max_workers != n or _POOL_PID != os.getpid():
            _POOL, _POOL_PID = ThreadPoolExecutor(max_workers=n, thread_name_prefix="dpcda-noise"), os.getpid()
        return _POOL


def _encryptor(key: bytes, word: int):
    """The OpenSSL ChaCha20 stream of subkey ``key`` positioned at 64-bit word ``word`` (block counter word // 8)."""
    block, skip = divmod(int(word), 8)
    if not 0 <= block < 1 << 32:
        raise ValueError(_OVERFLOW)
    enc = Cipher(algorithms.ChaCha20(key, block.to_bytes(4, "little") + bytes(12)), mode=None).encryptor()
    if skip:
        enc.update(bytes(8 * skip))
    return enc


def _fill_from(enc, out: np.ndarray, first: int, n: int) -> None:
    """Words first..first+n-1 of ``out`` (a uint64 buffer with room beyond them) from ``enc``, in order."""
    view = memoryview(out).cast("B")[8 * first :]
    for start in range(0, 8 * n, len(_ZEROS)):
        size = min(len(_ZEROS), 8 * n - start)
        enc.update_into(_ZEROS[:size], view[start:])


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a tensor can only exist if torch is loaded
    return torch is not None and isinstance(x, torch.Tensor)


# ---------------------------------------------------------------- the stream


class NoiseStream:
    """ChaCha20 keystream for one (purpose, class, chunk) path; every draw reads the next bytes.

    ``device`` (a torch device, optional): ``gaussian`` runs there (``privacy.noise_device``), with the same output
    bit for bit; so does ``gaussian`` on a tensor. Words read on the host are drawn by ``threads()`` threads.
    Each draw reserves its range of words before reading any (so threads sharing a stream read disjoint words, and
    a failed draw's words are never used again), and a stream cannot be copied or pickled, nor draw in a process
    forked after it was made: a copy would draw the same noise again.
    """

    def __init__(self, key: bytes, *path, device=None):
        if not path:
            raise ValueError("a noise stream needs a path, e.g. ('mix', k, chunk)")
        self.path = path
        self.device = device
        self._subkey = subkey(key, path)
        self._lock = threading.Lock()  # guards _pos and _enc: a stream may be shared by threads
        self._pos = 0  # 64-bit words reserved so far (read, or being read by a draw under way)
        self._enc = None  # an OpenSSL stream positioned at _pos that no draw holds, if one is ready
        self._forks = _FORKS  # a forked child holds a copy of _pos: it must not draw (_reserve)

    @property
    def position(self) -> int:
        """64-bit words of the stream reserved so far: every draw's words lie below it, and none is drawn twice."""
        return self._pos

    def _seek(self, word: int) -> None:
        """Tests only: the next draw starts at ``word`` (seeking back would draw words again)."""
        if word > MAX_STREAM_WORDS:
            raise ValueError(_OVERFLOW)
        with self._lock:
            self._enc = None  # made at the next sequential read
            self._pos = word

    def _reserve(self, n: int):
        """Words [first, first + n) for one draw, and the OpenSSL stream at ``first`` if one is ready (else None).

        The range is taken before any word of it is drawn, under the stream's lock, so two threads drawing from one
        stream read disjoint words, and a draw that fails part-way leaves its words unused for good (never read
        again by a later draw, which may run from its own position on other threads)."""
        n = int(n)
        check_not_forked(self._forks)
        with self._lock:
            first = self._pos
            if first + n > MAX_STREAM_WORDS:
                raise ValueError(_OVERFLOW)
            if n == 0:
                return first, None
            enc, self._enc = self._enc, None
            self._pos = first + n
        return first, enc

    def _keep(self, enc, end: int) -> None:
        """After a draw that read ``enc`` up to word ``end``: keep it for the next draw if that one starts there."""
        with self._lock:
            if self._pos == end and self._enc is None:
                self._enc = enc

    def __reduce_ex__(self, protocol):
        raise TypeError(_NO_COPY)

    def __reduce__(self):
        raise TypeError(_NO_COPY)

    def __getstate__(self):
        raise TypeError(_NO_COPY)

    def __copy__(self):
        raise TypeError(_NO_COPY)

    def __deepcopy__(self, memo):
        raise TypeError(_NO_COPY)

    def words(self, n: int) -> np.ndarray:
        """``n`` uniform uint64 words: the next 8n keystream bytes (little-endian)."""
        n = max(int(n), 0)
        out = np.empty(n + _SLACK_WORDS, np.uint64)  # update_into wants room beyond the data
        self._fill(out, n)
        return out[:n]

    def _fill(self, out: np.ndarray, n: int) -> None:
        """The next ``n`` words into ``out`` (room beyond them), reserved first."""
        first, enc = self._reserve(n)
        self._fill_reserved(out, first, n, enc)

    def _fill_reserved(self, out: np.ndarray, first: int, n: int, enc) -> None:
        """Reserved words [first, first + n) into ``out``; ``enc``: the OpenSSL stream at ``first``, or None."""
        if n == 0:
            return
        workers = threads()
        if workers > 1 and n >= 2 * _TASK_WORDS:  # spans of the stream in parallel, each from its own position

            def span(off: int) -> None:
                _fill_from(_encryptor(self._subkey, first + off), out, off, min(_TASK_WORDS, n - off))

            list(_pool(workers).map(span, range(0, n, _TASK_WORDS)))
            return
        enc = enc if enc is not None else _encryptor(self._subkey, first)
        _fill_from(enc, out, 0, n)
        self._keep(enc, first + n)

    def uniform_int(self, bound: int, size) -> np.ndarray:
        """int64 array of shape ``size``, uniform on range(bound), exactly (rejection, no modulo bias)."""
        bound = int(bound)
        if not 1 <= bound <= 1 << 62:
            raise ValueError(f"bound must be in [1, 2^62], got {bound}")
        shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"uniform_int: negative size {size}")
        total = int(np.prod(shape))
        excess = (1 << 64) % bound  # accept w < 2^64 - excess: each residue then occurs equally often
        w = self.words(total)
        out = _residues(w, bound)  # every position; a rejected word's residue is overwritten below
        if excess:
            limit = np.uint64((1 << 64) - excess)
            todo = np.flatnonzero(w >= limit)  # redrawn in position order, one word each, until accepted
            while todo.size:
                w = self.words(todo.size)
                ok = w < limit
                out[todo[ok]] = _residues(w[ok], bound)
                todo = todo[~ok]
        return out.reshape(shape)

    def uniform(self, size) -> np.ndarray:
        """float64 array of shape ``size``: k / 2^53 for k uniform on range(2^53) (``uniform_int``), in [0, 1)."""
        return self.uniform_int(1 << 53, size).astype(np.float64) / float(1 << 53)

    def distinct(self, n: int, l: int, rows: int, *, tensor: bool = False) -> np.ndarray:
        """(rows, l) int64: each row ``l`` distinct indices of range(n), a uniform l-subset in uniform order.

        With a ``device``, the words and the sampler run there (``privacy.noise_device.distinct``): the same words,
        the same decisions, so the same indices and the same stream position, element for element; ``tensor``
        then returns the torch tensor where it was drawn (no copy to the host)."""
        if not 0 <= l <= n:
            raise ValueError(f"cannot draw {l} distinct records from {n}")
        if self.device is not None:
            from dpcda.privacy import noise_device

            out = noise_device.distinct(self._device_words, n, l, rows, self.device)
            return out if tensor else out.cpu().numpy()
        if rows == 0 or l == 0:
            return np.zeros((rows, l), np.int64)
        if sparse_distinct(n, l):  # a row repeats an index with probability < 0.4: reject such rows
            out = self.uniform_int(n, (rows, l))
            bad = _has_repeat(out)
            while bad.any():
                out[bad] = self.uniform_int(n, (int(bad.sum()), l))
                bad = _has_repeat(out)
            return out
        out = np.empty((rows, l), np.int64)
        step = max(1, _DENSE_KEYS // n)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            out[start:stop] = self._smallest_keys(n, l, stop - start)
        return out

    def _device_words(self, n: int):
        """The next ``n`` words as an int64 tensor (64-bit patterns) on ``self.device``, reserved first: made there by
        the torch ChaCha20 (``noise_device.stream_words``), or on a CPU device read from OpenSSL (faster there)."""
        from dpcda.privacy import noise_device

        torch = sys.modules["torch"]
        device = torch.device(self.device)
        if device.type == "cpu":
            return torch.from_numpy(self.words(n).view(np.int64))
        first, _ = self._reserve(n)
        return noise_device.stream_words(self._subkey, first, int(n), device)

    def _smallest_keys(self, n: int, l: int, rows: int) -> np.ndarray:
        """The l smallest of n random keys per row, ordered by key; rows with a tie at the cut are redrawn."""
        out = np.empty((rows, l), np.int64)
        todo = np.arange(rows)
        while todo.size:
            keys = self.words(todo.size * n).reshape(todo.size, n)
            if l < n:
                part = np.argpartition(keys, l, axis=1)[:, : l + 1]
                pk = np.take_along_axis(keys, part, axis=1)
                order = np.argsort(pk, axis=1, kind="stable")
                part, pk = np.take_along_axis(part, order, axis=1), np.take_along_axis(pk, order, axis=1)
                tied = pk[:, l - 1] == pk[:, l] if l > 0 else np.zeros(todo.size, bool)
                chosen = part[:, :l]
            else:
                order = np.argsort(keys, axis=1, kind="stable")
                chosen, tied = order, np.zeros(todo.size, bool)
            sel = np.take_along_axis(keys, chosen, axis=1)
            tied |= (np.diff(sel, axis=1) == 0).any(axis=1)  # order inside the row must be random too
            out[todo[~tied]] = chosen[~tied]
            todo = todo[tied]
        return out

    def binomial(self, n: int, q: Fraction, size: int, *, tensor: bool = False) -> np.ndarray:
        """int64 draws of Binomial(n, q) for rational q, by inversion of a 192-bit table; ``tensor`` (a stream with
        a ``device``): the draws as a torch tensor on that device (made there on a card, copied there otherwise)."""
        m = self._binomial(n, q, size)
        if tensor and self.device is not None:
            torch = sys.modules["torch"]
            return torch.as_tensor(m, device=self.device)
        return m.cpu().numpy() if _is_tensor(m) else m

    def _binomial(self, n: int, q: Fraction, size: int):
        """``binomial``'s draws: a tensor where a card drew them, else a numpy array."""
        q = Fraction(q)
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if q == 0 or n == 0:
            return np.zeros(size, np.int64)
        if q == 1:
            return np.full(size, int(n), np.int64)
        th = _binomial_thresholds(int(n), q.numerator, q.denominator)
        if self.device is not None and str(self.device) != "cpu":  # words and comparison on the card: same draws
            from dpcda.privacy import noise_device

            first, _ = self._reserve(UNIFORM_WORDS * size)
            return noise_device.binomial(self._subkey, first, n, q.numerator, q.denominator, size, self.device)
        u = self._uniform_words(size)
        # m = number of thresholds C_j <= U (C_j = 2^192 F(j), increasing), compared word by word.
        t0, t1, t2 = (th[None, :, i] for i in range(UNIFORM_WORDS))
        u0, u1, u2 = (u[i, :, None] for i in range(UNIFORM_WORDS))
        below = (t0 < u0) | ((t0 == u0) & ((t1 < u1) | ((t1 == u1) & (t2 <= u2))))
        return below.sum(axis=1).astype(np.int64)

    def _uniform_words(self, n: int) -> np.ndarray:
        """(3, n) uint64: n 192-bit uniform integers, row 0 the most significant words (each row read in turn)."""
        out = np.empty(UNIFORM_WORDS * n + _SLACK_WORDS, np.uint64)
        self._fill(out, UNIFORM_WORDS * n)
        return out[: UNIFORM_WORDS * n].reshape(UNIFORM_WORDS, n)

    def gaussian(self, center, sigma: float) -> np.ndarray:
        """float64 ``g * round((center + sigma * Z) / g)``, Z exact standard normal per element, g = grid_for(sigma).

        ``center`` is an array (float64 values taken as exact); ``sigma`` = 0 returns ``center`` unchanged (no
        noise, no privacy).
        """
        if self.device is not None or _is_tensor(center):
            return self._gaussian_on_device(center, sigma)
        c = np.asarray(center, dtype=np.float64)
        if sigma == 0:
            return c.copy()
        g = grid_for(sigma)
        flat = c.reshape(-1)
        out = np.empty(flat.size, np.float64)
        first, enc = self._reserve(3 * flat.size)  # spent whatever happens below (a refusal included)
        if flat.size == 0:
            return out.reshape(c.shape)
        task = _TASK_BLOCKS * _BLOCK
        workers = threads()
        if workers > 1 and flat.size > task:  # spans of blocks in parallel, each reading its own stream span

            def span(s: int) -> None:
                _gaussian_span(self._subkey, first, None, flat, out, s, min(flat.size, s + task), sigma, g)

            list(_pool(workers).map(span, range(0, flat.size, task)))
        else:
            enc = _gaussian_span(self._subkey, first, enc, flat, out, 0, flat.size, sigma, g)
            if enc is not None:
                self._keep(enc, first + 3 * flat.size)
        return out.reshape(c.shape)

    def _gaussian_on_device(self, center, sigma: float):
        """``gaussian`` with the sampler in torch on ``self.device`` (or the tensor's device); same output.

        On a CPU device the words come from OpenSSL on the host (faster there than any torch kernel); elsewhere
        the torch block function makes them on the device.
        """
        from dpcda.privacy import noise_device

        torch = sys.modules["torch"]
        as_numpy = not _is_tensor(center)
        device = torch.device(self.device) if self.device is not None else center.device
        c = torch.as_tensor(np.asarray(center, np.float64) if as_numpy else center).to(device, torch.float64)
        if sigma == 0:
            out = c.clone()
        else:
            total = c.numel()
            first, enc = self._reserve(3 * total)  # spent whatever happens below
            host_words = None
            if device.type == "cpu":
                host_words = np.empty(3 * total + _SLACK_WORDS, np.uint64)
                self._fill_reserved(host_words, first, 3 * total, enc)
            out, _ = noise_device.rounded_gaussian(
                c, float(sigma), subkey=self._subkey, start=first, host_words=host_words
            )
        return out.cpu().numpy() if as_numpy else out


def _gaussian_span(subkey, first, enc, flat, out, start, stop, sigma: float, g: float):
    """out[start:stop] (``start`` a multiple of _BLOCK) for the draw whose words start at stream word ``first``.

    The layout is fixed: block j of _BLOCK elements (the last one shorter) reads words first + 3 j _BLOCK on: n top,
    n middle and n low words of its n 192-bit uniforms. The compiled kernel (``noise_native``) reads only the top and
    middle words of each block (the low words where an exact decision needs them); without it the numpy sampler
    reads all three, from ``enc`` if given (an OpenSSL stream at the span's first word). Returns the OpenSSL stream
    at word first + 3 stop if one ended there, else None."""
    fn = native_kernel() if stop - start >= _NATIVE_MIN else None
    if fn is not None:
        return _native_span(fn, subkey, first, enc, flat, out, start, stop, sigma, g)
    enc = enc if enc is not None else _encryptor(subkey, first + 3 * start)
    buf = np.empty(3 * _BLOCK + _SLACK_WORDS, np.uint64)
    for s in range(start, stop, _BLOCK):
        e = min(stop, s + _BLOCK)
        n = e - s
        _fill_from(enc, buf, 0, 3 * n)
        out[s:e] = _rounded_gaussian(flat[s:e], float(sigma), g, buf[: 3 * n].reshape(UNIFORM_WORDS, n))
    return enc


def _native_span(fn, subkey, first, enc, flat, out, start, stop, sigma: float, g: float):
    """``_gaussian_span`` with the compiled kernel: _NATIVE_GROUP blocks per call (the GIL released inside), then
    per block, in order, the numpy sampler's error bound, refusals and exact decisions (``_finish_block``).

    With _SKIP_LOW_WORDS each block reads its top and middle words from an OpenSSL stream opened at them, and a low
    word only where an exact decision needs it; else one stream reads every word in order (``enc``, if given, is
    at the span's first word), and is returned at word first + 3 stop."""
    sigma = float(sigma)  # a numpy float32 sigma: the numpy sampler's float64 value (and Fraction takes it)
    skip = _SKIP_LOW_WORDS
    group = _NATIVE_GROUP * _BLOCK
    stride = (2 if skip else 3) * _BLOCK  # words per block in the buffer
    words = np.empty(stride * _NATIVE_GROUP + _SLACK_WORDS, np.uint64)
    dist = np.empty(group, np.float64)
    stats = np.empty((_NATIVE_GROUP, STATS_PER_BLOCK), np.float64)
    if not skip and enc is None:
        enc = _encryptor(subkey, first + 3 * start)
    for s in range(start, stop, group):
        e = min(stop, s + group)
        full, rest = divmod(e - s, _BLOCK)
        if skip:
            for j in range(full + (1 if rest else 0)):  # top and middle words of each block
                n = min(_BLOCK, e - s - j * _BLOCK)
                _fill_from(_encryptor(subkey, first + 3 * (s + j * _BLOCK)), words, stride * j, 2 * n)
        else:
            _fill_from(enc, words, 0, 3 * (e - s))
        if full:
            _call_kernel(
                fn, full, _BLOCK, words, 0, stride, flat[s : s + full * _BLOCK], out[s:], dist, stats, sigma, g
            )
        if rest:
            at = full * _BLOCK
            _call_kernel(
                fn,
                1,
                rest,
                words,
                stride * full,
                stride,
                flat[s + at : e],
                out[s + at :],
                dist[at:],
                stats[full:],
                sigma,
                g,
            )
        for j in range(full + (1 if rest else 0)):
            b0 = s + j * _BLOCK
            n = min(_BLOCK, e - b0)
            top = words[stride * j : stride * j + 3 * n]  # n top, n middle (and n low) words

            def low(i: int, base=first + 3 * b0 + 2 * n, top=top, n=n) -> int:  # element i's low word
                if not skip:
                    return int(top[2 * n + i])
                w = np.empty(1 + _SLACK_WORDS, np.uint64)
                _fill_from(_encryptor(subkey, base + i), w, 0, 1)
                return int(w[0])

            if not _finish_block(
                stats[j], dist[j * _BLOCK : j * _BLOCK + n], flat[b0 : b0 + n], out[b0 : b0 + n], top, low, sigma, g
            ):
                u = np.empty(3 * n + _SLACK_WORDS, np.uint64)  # p's rare low-precision case: numpy, all words
                _fill_from(_encryptor(subkey, first + 3 * b0), u, 0, 3 * n)
                out[b0 : b0 + n] = _rounded_gaussian(flat[b0 : b0 + n], float(sigma), g, u[: 3 * n].reshape(3, n))
    return None if skip else enc  # skipping, ``enc`` (if any) was never read: it is not at the span's end


def _call_kernel(fn, nblocks, n, words, offset, stride, center, out, dist, stats, sigma: float, g: float) -> None:
    """The kernel on ``nblocks`` blocks of ``n`` elements (n top then n middle words of block j at
    words[offset + stride j:])."""
    c = np.ascontiguousarray(center, np.float64)
    if not (out.flags.c_contiguous and out.dtype == np.float64 and out.size >= nblocks * n and c.size == nblocks * n):
        raise ValueError("noise sampler: kernel buffers of the wrong shape")  # never expected: memory safety first
    fn(
        nblocks,
        n,
        words.ctypes.data + 8 * offset,
        stride,
        c.ctypes.data,
        out.ctypes.data,
        dist.ctypes.data,
        _coefficients().ctypes.data,
        sigma / g,
        g,
        stats.ctypes.data,
    )


def _finish_block(st, dist, center, out, top, low, sigma: float, g: float) -> bool:
    """After the kernel, one block as ``_rounded_gaussian`` finishes it: its error bound from its largest t and |c|,
    the same refusals, and the exact decision for every element within (twice) the bound of a cell boundary.
    ``top``: the block's n top then n middle words; ``low(i)``: element i's low word. False (nothing done) where an
    element has w0 < 2^11: the caller runs the numpy sampler on the block."""
    tmax, cmax, finite, dmax, small = (float(x) for x in st)
    if small:
        return False
    err = _error_bound(sigma, g, tmax, cmax)
    if not (finite and math.isfinite(err)):
        raise ArithmeticError(f"noise sampler: values overflow at sigma={sigma:g} (too large for the grid)")
    if err > 0.125:
        raise ArithmeticError(f"noise sampler: sigma={sigma:g} is too small for the values' size")
    if dmax >= 0.5 - 2.0 * err:
        n = center.size
        for i in np.flatnonzero(dist >= 0.5 - 2.0 * err):
            u_int = (int(top[i]) << 128) | (int(top[n + i]) << 64) | low(int(i))
            k = _exact_cell(float(center[i]), sigma, g, u_int, int(out[i] / g))
            out[i] = (k + 0.0) * g
    return True


def native_kernel():
    """The compiled sampler (``privacy.noise_native``), built and checked against numpy once per process, or None
    (no C compiler, a failed build or check, ``DPCDA_NOISE_NATIVE=0``): then numpy runs the sampler."""
    from dpcda.privacy import noise_native

    return noise_native.kernel(_check_native)


@lru_cache(maxsize=1)
def _coefficients() -> np.ndarray:
    return np.array([_A, _B, _C, _D, _E, _F], np.float64).reshape(-1)


def _check_words() -> tuple:
    """The load check's fixed uniforms, in the draws' layout (per block of n: n top, n middle, n low words), and for
    each block its elements: three full blocks and a short one. Block 0 holds random uniforms; block 1 the far tail
    (p < 1.4e-11, r > 5: top words from 2^11 to 2^28, both signs), p beside the tail's edge 0.075 and r = 5, U beside
    1/2; block 2 random uniforms again; the short block 3 the extremes with w0 < 2^11 (U = 0, 2^192 - 1, ...)."""
    rng = np.random.default_rng(20261126)
    mask = (1 << 64) - 1
    words = NoiseStream(public_key("native-check", 0), "words").words(3 * 3 * _BLOCK).reshape(3, 3, _BLOCK).copy()
    far = np.exp2(rng.uniform(11.0, 28.0, _BLOCK)).astype(np.uint64)  # w0 (and so p 2^-64 w0) in the far tail
    far[:8] = [1 << 11, (1 << 11) + 1, (1 << 11) + 2, 3 << 10, 1 << 20, (1 << 27) + 12345, 1 << 27, (1 << 28) - 1]
    for j, p_edge in enumerate((0.075, math.exp(-25.0))):  # p on either side of the tail's edge and of r = 5
        at = 16 + 64 * j
        far[at : at + 64] = int(p_edge * 2.0**64) + rng.integers(-(1 << 30), 1 << 30, 64)
    far[200:264] = ((1 << 63) - 1) - rng.integers(0, 1 << 20, 64).astype(np.uint64)  # p beside 1/2
    flip = rng.integers(0, 2, _BLOCK).astype(bool)  # U >= 2^191 (w0 = ~u0): the other tail
    words[1, 0] = np.where(flip, ~far, far)
    extremes = [0, 1, 5 << 64, (1 << 192) - 1, (1 << 192) - 2, 12345 << 140, (1 << 191) - 1, 1 << 191]
    ext = np.array([[(u >> s) & mask for s in (128, 64, 0)] for u in extremes], np.uint64).T
    flat = np.concatenate([words.reshape(-1), ext.reshape(-1), np.zeros(_SLACK_WORDS, np.uint64)])
    return flat, [_BLOCK, _BLOCK, _BLOCK, len(extremes)]


def _check_native(fn) -> str:
    """'' if the kernel gives the numpy sampler's output, bit for bit, on fixed uniforms (``_check_words``: random
    ones, the far tail and the tail's edges, U beside 1/2 and the extremes), called on several blocks at once in the
    draws' layout as a draw calls it; else what differs. At each sigma the centres put some elements right beside a
    cell boundary (so the check makes exact decisions, and fails if it made none) and some at scaled values in
    (-1/2, 0), where rint gives -0.0 and the output must be +0.0 (a build that ignores signed zeros fails here).
    The block with w0 < 2^11 must be handed back to the numpy sampler, with the right count."""
    words, sizes = _check_words()
    starts = [3 * sum(sizes[:j]) for j in range(len(sizes))]
    rng = np.random.default_rng(7)
    for sigma in (0.7, 1e-3, 2.5):
        g = grid_for(sigma)
        z = np.zeros(sum(sizes))
        blocks = []
        for j, n in enumerate(sizes):
            u = words[starts[j] : starts[j] + 3 * n].reshape(3, n)
            flip, p = _tail_p(u)
            t = upper_quantile(p)
            z[j * _BLOCK : j * _BLOCK + n] = np.where(flip, t, -t)
            blocks.append(u)
        center = rng.normal(size=z.size) * 3.0
        idx = rng.permutation(z.size)
        near, negzero = idx[:24], idx[24 : z.size // 4]
        center[near] = (rng.integers(-40, 40, near.size) + 0.5) * g - sigma * z[near]  # beside a boundary
        center[negzero] = -sigma * z[negzero] - rng.uniform(0.05, 0.45, negzero.size) * g  # rint(scaled) = -0.0
        out, dist = np.empty(z.size), np.empty(z.size)
        st = np.empty((len(sizes), STATS_PER_BLOCK))
        full = len(sizes) - 1
        _call_kernel(fn, full, _BLOCK, words, 0, 3 * _BLOCK, center[: full * _BLOCK], out, dist, st, sigma, g)
        at = full * _BLOCK
        _call_kernel(
            fn, 1, sizes[-1], words, starts[-1], 3 * _BLOCK, center[at:], out[at:], dist[at:], st[full:], sigma, g
        )
        decided = []
        for j, (n, u) in enumerate(zip(sizes, blocks)):
            sl = slice(j * _BLOCK, j * _BLOCK + n)
            top = np.ascontiguousarray(u[:2]).reshape(-1)
            small = int(((u[0] ^ (np.uint64(0) - (u[0] >> np.uint64(63)))) & _LOW63 < np.uint64(1 << 11)).sum())
            if int(st[j, 4]) != small:
                return f"sigma {sigma}, block {j}: {int(st[j, 4])} elements with w0 < 2^11, not {small}"

            def low(i: int, u=u) -> int:
                decided.append(i)
                return int(u[2, i])

            if not _finish_block(st[j], dist[sl], center[sl], out[sl], top, low, sigma, g):
                if small:
                    continue  # the numpy sampler decides that block
                return f"sigma {sigma}, block {j}: not finished"
            want = _rounded_gaussian(center[sl], sigma, g, u)
            differ = int((out[sl].view(np.uint64) != want.view(np.uint64)).sum())
            if differ:
                return f"sigma {sigma}, block {j}: {differ} of {n} values"
            if small:
                return f"sigma {sigma}, block {j}: finished with w0 < 2^11"
        if not decided:
            return f"sigma {sigma}: no exact decision made"
    return ""


def _error_bound(sigma: float, g: float, tmax: float, cmax: float) -> float:
    """Float error of a block's scaled values, in grid units: AS 241 and p's rounding (Z_ERROR (1 + |z|)) and three
    roundings, from the block's largest t and |c|."""
    return (sigma * Z_ERROR * (1.0 + tmax) + 2.0**-50 * (cmax + sigma * tmax)) / g


def sparse_distinct(n: int, l: int) -> bool:
    """``distinct``'s choice of sampler (the host's and the device's): rows of independent uniform indices, rejected
    on a repeat, where a repeat has probability below 0.4; else the l smallest of n random keys."""
    return l * (l - 1) / (2.0 * n) <= 0.5


def _residues(w: np.ndarray, bound: int) -> np.ndarray:
    """int64 ``w mod bound`` of uint64 words (``bound`` <= 2^62, so every residue fits): a mask for a power of two."""
    if bound & (bound - 1) == 0:
        return (w & np.uint64(bound - 1)).view(np.int64)
    return (w % np.uint64(bound)).view(np.int64)


def _has_repeat(idx: np.ndarray) -> np.ndarray:
    if idx.shape[1] < 2:
        return np.zeros(idx.shape[0], bool)
    s = np.sort(idx, axis=1)
    return (s[:, 1:] == s[:, :-1]).any(axis=1)


# ---------------------------------------------------------------- numpy's global generator, for a library


_NUMPY_GLOBAL = threading.Lock()


class NumpyGlobalState:
    """numpy's global generator, seeded from ``stream`` (its first 8 words), for a library that draws only from it
    (mbi's ``synthetic_data``): ``with state:`` swaps it in under a process-wide lock (threads never interleave their
    draws), then keeps where it got to and restores the caller's state, so successive uses continue one sequence."""

    def __init__(self, stream: NoiseStream):
        self._seed = stream.words(8).view(np.uint32)
        self._state = None  # the sequence's state after the last use (None: not yet seeded)

    def __enter__(self):
        _NUMPY_GLOBAL.acquire()
        self._caller = np.random.get_state()
        if self._state is None:
            np.random.seed(self._seed)
        else:
            np.random.set_state(self._state)
        return self

    def __exit__(self, *exc):
        try:
            self._state = np.random.get_state()
            np.random.set_state(self._caller)
        finally:
            _NUMPY_GLOBAL.release()
        return False


# ---------------------------------------------------------------- Gaussian by inversion

_A = (
    3.3871328727963666080,
    1.3314166789178437745e2,
    1.9715909503065514427e3,
    1.3731693765509461125e4,
    4.5921953931549871457e4,
    6.7265770927008700853e4,
    3.3430575583588128105e4,
    2.5090809287301226727e3,
)
_B = (
    1.0,
    4.2313330701600911252e1,
    6.8718700749205790830e2,
    5.3941960214247511077e3,
    2.1213794301586595867e4,
    3.9307895800092710610e4,
    2.8729085735721942674e4,
    5.2264952788528545610e3,
)
_C = (
    1.42343711074968357734,
    4.63033784615654529590,
    5.76949722146069140550,
    3.64784832476320460504,
    1.27045825245236838258,
    2.41780725177450611770e-1,
    2.27238449892691845833e-2,
    7.74545014278341407640e-4,
)
_D = (
    1.0,
    2.05319162663775882187,
    1.67638483018380384940,
    6.89767334985100004550e-1,
    1.48103976427480074590e-1,
    1.51986665636164571966e-2,
    5.47593808499534494600e-4,
    1.05075007164441684324e-9,
)
_E = (
    6.65790464350110377720,
    5.46378491116411436990,
    1.78482653991729133580,
    2.96560571828504891230e-1,
    2.65321895265761230930e-2,
    1.24266094738807843860e-3,
    2.71155556874348757815e-5,
    2.01033439929228813265e-7,
)
_F = (
    1.0,
    5.99832206555887937690e-1,
    1.36929880922735805310e-1,
    1.48753612908506148525e-2,
    7.86869131145613259100e-4,
    1.84631831751005468180e-5,
    1.42151175831644588870e-7,
    2.04426310338993978564e-15,
)


def _poly(coef, x):
    """Horner's rule, in place on one temporary."""
    acc = x * coef[-1]
    acc += coef[-2]
    for a in coef[-3::-1]:
        acc *= x
        acc += a
    return acc


def upper_quantile(p: np.ndarray) -> np.ndarray:
    """t >= 0 with P(Z > t) = p, for float64 p in (0, 1/2] (Wichura's AS 241, PPND16)."""
    p = np.asarray(p, np.float64)
    q = p - 0.5
    r = q * q
    np.subtract(0.180625, r, out=r)
    t = _poly(_A, r)
    t /= _poly(_B, r)
    t *= q
    np.negative(t, out=t)
    tail = np.flatnonzero(p < 0.075)  # |q| > 0.425: about 15 % of uniform p
    if tail.size:
        r = np.sqrt(-np.log(p[tail]))
        far = r > 5.0  # p < 1.4e-11: rare
        r -= 1.6
        near = _poly(_C, r)
        near /= _poly(_D, r)
        if far.any():
            rf = r[far] - 3.4  # r - 5
            near[far] = _poly(_E, rf) / _poly(_F, rf)
        t[tail] = near
    return t


_LOW63 = np.uint64((1 << 63) - 1)
_SHIFT11 = np.uint64(11)


def _tail_p(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the 192-bit uniforms ``u`` (3, n): which are above 1/2 (z = +t, else z = -t), and the float64 tail
    probability p = min(u, 1 - u) whose upper quantile is t = |z|."""
    flip = u[0] >> np.uint64(63)  # 1 where U >= 2^191: u > 1/2 and z = +t; else z = -t
    mask = np.uint64(0) - flip  # all ones where flipped: U' = 2^192 - 1 - U, so p = 1 - u
    w0 = (u[0] ^ mask) & _LOW63
    w1 = ((u[1] ^ mask) >> _SHIFT11).view(np.int64)
    # p = (U' + 1/2) / 2^192 from its top 116 bits; exact to a relative 2^-51 when w0 >= 2^11 (int64 -> float64
    # conversions are fast; the unsigned ones are not). Where w0 < 2^11 (probability 2^-52) p is recomputed.
    p = w0.view(np.int64).astype(np.float64)
    p *= 2.0**-64
    p += w1.astype(np.float64) * 2.0**-117
    small = np.flatnonzero(w0 < np.uint64(1 << 11))
    for i in small:
        exact = (int(w0[i]) << 128) | (int(u[1, i] ^ mask[i]) << 64) | int(u[2, i] ^ mask[i])
        p[i] = float(Fraction(2 * exact + 1, 2**193))
    return flip.astype(bool), p


def _rounded_gaussian(center: np.ndarray, sigma: float, g: float, u: np.ndarray) -> np.ndarray:
    """The ideal rounded Gaussian at the 192-bit uniforms ``u`` (3, n); see the module docstring."""
    flip, p = _tail_p(u)
    t = upper_quantile(p)
    scaled = np.where(flip, t, -t)
    scaled *= sigma / g
    scaled += center / g  # (center + sigma z) / g: g is a power of two, so the divisions are exact
    k = np.rint(scaled)
    tmax = float(t.max()) if t.size else 0.0
    cmax = float(np.abs(center).max()) if center.size else 0.0
    err = _error_bound(sigma, g, tmax, cmax)
    if not (np.isfinite(scaled).all() and math.isfinite(err)):
        raise ArithmeticError(f"noise sampler: values overflow at sigma={sigma:g} (too large for the grid)")
    if err > 0.125:
        raise ArithmeticError(f"noise sampler: sigma={sigma:g} is too small for the values' size")
    ambiguous = np.flatnonzero(np.abs(scaled - k) >= 0.5 - 2.0 * err)
    for i in ambiguous:
        u_int = (int(u[0, i]) << 128) | (int(u[1, i]) << 64) | int(u[2, i])
        k[i] = _exact_cell(float(center[i]), sigma, g, u_int, int(k[i]))
    k += 0.0  # every zero +0.0: rint gives -0.0 for scaled in (-1/2, 0), the exact path +0.0 (x + 0.0 is x otherwise)
    k *= g
    return k


# ---------------------------------------------------------------- exact decisions (rare), in decimal arithmetic

_DIGITS = 110  # decisions need |Phi(w) - u| resolved far below u's resolution 2^-192 (1.6e-58)


@lru_cache(maxsize=4)
def _decimal_pi(prec: int) -> Decimal:
    """pi to ``prec`` digits (the recipe of the decimal module's documentation)."""
    with localcontext() as ctx:
        ctx.prec = prec + 2
        three = Decimal(3)
        lasts, t, s, n, na, d, da = 0, three, 3, 1, 0, 0, 24
        while s != lasts:
            lasts = s
            n, na = n + na, na + 8
            d, da = d + da, da + 32
            t = (t * n) / d
            s += t
        ctx.prec = prec
        return +s


def normal_cdf_decimal(w: Fraction) -> Decimal:
    """Phi(w) with absolute error below 1e-100, for |w| < 17 (cancellation costs at most 63 of the 180 digits)."""
    with localcontext() as ctx:
        ctx.prec = _DIGITS + 70
        x = abs(Decimal(w.numerator) / Decimal(w.denominator)) / Decimal(2).sqrt()
        x2 = x * x
        # erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2x^2)^n x / (1 3 5 ... (2n+1)): positive terms only.
        term = x
        total = x
        n = 0
        eps = Decimal(10) ** -(ctx.prec + 5)
        while term > eps * total:
            n += 1
            term = term * 2 * x2 / (2 * n + 1)
            total += term
        erf = 2 / _decimal_pi(ctx.prec).sqrt() * (-x2).exp() * total
        half_tail = (1 - erf) / 2  # Phi(-|w|)
        return +(half_tail if w < 0 else 1 - half_tail)


def _u_below_cdf(u_int: int, w: Fraction) -> bool:
    """Exactly: is u = (U + 1/2) / 2^192 below Phi(w)?"""
    if w <= -17:  # Phi(-17) < 1e-64 < 2^-193 <= u
        return False
    if w >= 17:  # Phi(17) > 1 - 1e-64 > 1 - 2^-193 >= u
        return True
    phi = normal_cdf_decimal(w)
    with localcontext() as ctx:
        ctx.prec = _DIGITS + 70
        u = Decimal(2 * u_int + 1) / Decimal(2**193)
        gap = phi - u
    if abs(gap) < Decimal(10) ** -(_DIGITS - 10):
        raise ArithmeticError("noise sampler: u within 1e-100 of a cell boundary; cannot decide")  # probability ~0
    return gap > 0


def _exact_cell(center: float, sigma: float, g: float, u_int: int, k: int) -> float:
    """The k with Phi(((k - 1/2) g - c) / s) <= u < Phi(((k + 1/2) g - c) / s), starting the walk at ``k``."""
    c, s, gg = Fraction(center), Fraction(sigma), Fraction(g)
    k = int(k)
    while _u_below_cdf(u_int, ((k - Fraction(1, 2)) * gg - c) / s):
        k -= 1
    while not _u_below_cdf(u_int, ((k + Fraction(1, 2)) * gg - c) / s):
        k += 1
    return float(k)


@lru_cache(maxsize=256)
def _binomial_thresholds(n: int, num: int, den: int) -> np.ndarray:
    """(M, 3) uint64 words of C_j = round(2^192 F(j)) < 2^192, j < M, F the Binomial(n, num/den) CDF.

    The table stops where the upper tail is below 2^-194 or where C_j would round to 2^192 (no U reaches it); draws
    above the last threshold are m = M, which then carries pmf(M) and a tail below 2^-193.
    """
    with localcontext() as ctx:
        ctx.prec = 100
        q = Decimal(num) / Decimal(den)
        ratio = q / (1 - q)
        pmf = (1 - q) ** n
        cdf = Decimal(0)
        tail_limit = Decimal(2) ** -194
        scale = Decimal(2) ** 192
        thresholds = []
        j = 0
        mean = Decimal(n) * q
        top = 1 << 192
        while True:
            cdf += pmf
            if (1 - cdf) < tail_limit and j >= mean or j == n:
                break
            threshold = int((cdf * scale).to_integral_value())
            if threshold >= top:  # no 192-bit U reaches it: draws above the last threshold are m = j
                break
            if thresholds and threshold < thresholds[-1]:
                raise ArithmeticError(f"Binomial({n}, {num}/{den}): table not monotone")  # never expected
            thresholds.append(threshold)
            if len(thresholds) >= MAX_BINOMIAL_TABLE:
                raise ValueError(f"Binomial({n}, {num}/{den}): table longer than {MAX_BINOMIAL_TABLE}")
            pmf = pmf * (n - j) / (j + 1) * ratio
            j += 1
    mask = (1 << 64) - 1
    return np.array([[(v >> 128) & mask, (v >> 64) & mask, v & mask] for v in thresholds], dtype=np.uint64).reshape(
        -1, UNIFORM_WORDS
    )
