"""``NoiseStream``: one ChaCha20 keystream per (purpose, class, chunk) path, and every draw made from it.

Each draw reserves its range of words before reading any, under the stream's lock, so threads sharing a stream read
disjoint words and a failed draw's words are never used again; a stream cannot be copied or pickled, nor draw in a
process forked after it was made (``pool.check_not_forked``). Words read on the host come from OpenSSL
(``keystream``) on ``pool.threads()`` threads; with a torch ``device`` the draws run there
(``privacy.noise.device``, loaded only then), with the host's output, element for element.
"""

from __future__ import annotations

import sys
import threading
from fractions import Fraction

import numpy as np

import dpcda.privacy.noise.keystream as keystream
import dpcda.privacy.noise.pool as pool
from dpcda.privacy.noise.binomial import binomial_thresholds, count_below
from dpcda.privacy.noise.constants import BLOCK, MAX_STREAM_WORDS, OVERFLOW, SLACK_WORDS, UNIFORM_WORDS
from dpcda.privacy.noise.gaussian import grid_for
from dpcda.privacy.noise.host_draw import gaussian_span
from dpcda.privacy.noise.indices import DENSE_KEYS, has_repeat, residues, sparse_distinct
from dpcda.privacy.noise.keys import subkey

_TASK_BLOCKS = 64  # Gaussian blocks per thread task (512 Ki elements: few OpenSSL streams to open)
_TASK_WORDS = 1 << 20  # keystream words per thread task
_NO_COPY = "a NoiseStream cannot be copied or pickled: a copy would draw the same noise again (make one where it draws)"


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")  # never imported here: a tensor can only exist if torch is loaded
    return torch is not None and isinstance(x, torch.Tensor)


# ---------------------------------------------------------------- the stream


class NoiseStream:
    """ChaCha20 keystream for one (purpose, class, chunk) path; every draw reads the next bytes.

    ``device`` (a torch device, optional): ``gaussian`` runs there (``privacy.noise.device``), with the same output
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
        self._forks = pool.forks()  # a forked child holds a copy of _pos: it must not draw (_reserve)

    @property
    def position(self) -> int:
        """64-bit words of the stream reserved so far: every draw's words lie below it, and none is drawn twice."""
        return self._pos

    def _seek(self, word: int) -> None:
        """Tests only: the next draw starts at ``word`` (seeking back would draw words again)."""
        if word > MAX_STREAM_WORDS:
            raise ValueError(OVERFLOW)
        with self._lock:
            self._enc = None  # made at the next sequential read
            self._pos = word

    def _reserve(self, n: int):
        """Words [first, first + n) for one draw, and the OpenSSL stream at ``first`` if one is ready (else None).

        The range is taken before any word of it is drawn, under the stream's lock, so two threads drawing from one
        stream read disjoint words, and a draw that fails part-way leaves its words unused for good (never read
        again by a later draw, which may run from its own position on other threads)."""
        n = int(n)
        if n < 0:  # a negative count would move the position back: words already released drawn again
            raise ValueError(f"a draw of {n} words: the count must be 0 or more")
        pool.check_not_forked(self._forks)
        with self._lock:
            first = self._pos
            if first + n > MAX_STREAM_WORDS:
                raise ValueError(OVERFLOW)
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
        out = np.empty(n + SLACK_WORDS, np.uint64)  # update_into wants room beyond the data
        self.fill(out, n)
        return out[:n]

    def fill(self, out: np.ndarray, n: int) -> None:
        """The next ``n`` words into ``out[:n]``, reserved first: ``words`` without a new array (``out``: uint64, C
        order, at least ``n + SLACK_WORDS`` long, since OpenSSL writes room beyond the words). Checked before any word
        is reserved: a refused call leaves the stream where it was."""
        n = int(n)
        if not (isinstance(out, np.ndarray) and out.dtype == np.uint64 and out.ndim == 1 and out.flags.c_contiguous):
            raise ValueError("fill: out must be a one-dimensional C-ordered uint64 array")
        if n < 0 or len(out) < n + SLACK_WORDS:
            raise ValueError(f"fill: {n} words need 0 <= n and an out of at least n + {SLACK_WORDS} words")
        first, enc = self._reserve(n)
        self._fill_reserved(out, first, n, enc)

    def _fill_reserved(self, out: np.ndarray, first: int, n: int, enc) -> None:
        """Reserved words [first, first + n) into ``out``; ``enc``: the OpenSSL stream at ``first``, or None."""
        if n == 0:
            return
        workers = pool.threads()
        if workers > 1 and n >= 2 * _TASK_WORDS:  # spans of the stream in parallel, each from its own position

            def span(off: int) -> None:
                keystream.fill_from(keystream.encryptor(self._subkey, first + off), out, off, min(_TASK_WORDS, n - off))

            list(pool.executor(workers).map(span, range(0, n, _TASK_WORDS)))
            return
        enc = enc if enc is not None else keystream.encryptor(self._subkey, first)
        keystream.fill_from(enc, out, 0, n)
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
        out = residues(w, bound)  # every position; a rejected word's residue is overwritten below
        if excess:
            limit = np.uint64((1 << 64) - excess)
            todo = np.flatnonzero(w >= limit)  # redrawn in position order, one word each, until accepted
            while todo.size:
                w = self.words(todo.size)
                ok = w < limit
                out[todo[ok]] = residues(w[ok], bound)
                todo = todo[~ok]
        return out.reshape(shape)

    def uniform(self, size) -> np.ndarray:
        """float64 array of shape ``size``: k / 2^53 for k uniform on range(2^53) (``uniform_int``), in [0, 1)."""
        return self.uniform_int(1 << 53, size).astype(np.float64) / float(1 << 53)

    def distinct(self, n: int, l: int, rows: int, *, tensor: bool = False) -> np.ndarray:
        """(rows, l) int64: each row ``l`` distinct indices of range(n), a uniform l-subset in uniform order.

        With a ``device``, the words and the sampler run there (``privacy.noise.device.distinct``): the same words,
        the same decisions, so the same indices and the same stream position, element for element; ``tensor``
        then returns the torch tensor where it was drawn (no copy to the host)."""
        if not 0 <= l <= n:
            raise ValueError(f"cannot draw {l} distinct records from {n}")
        if self.device is not None:
            import dpcda.privacy.noise.device as noise_device

            out = noise_device.distinct(self._device_words, n, l, rows, self.device)
            return out if tensor else out.cpu().numpy()
        if rows == 0 or l == 0:
            return np.zeros((rows, l), np.int64)
        if sparse_distinct(n, l):  # a row repeats an index with probability < 0.4: reject such rows
            out = self.uniform_int(n, (rows, l))
            bad = has_repeat(out)
            while bad.any():
                out[bad] = self.uniform_int(n, (int(bad.sum()), l))
                bad = has_repeat(out)
            return out
        out = np.empty((rows, l), np.int64)
        step = max(1, DENSE_KEYS // n)
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            out[start:stop] = self._smallest_keys(n, l, stop - start)
        return out

    def _device_words(self, n: int):
        """The next ``n`` words as an int64 tensor (64-bit patterns) on ``self.device``, reserved first: made there by
        the torch ChaCha20 (``privacy.noise.device.stream_words``), or on a CPU device read from OpenSSL (faster
        there)."""
        import dpcda.privacy.noise.device as noise_device

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
        th = binomial_thresholds(int(n), q.numerator, q.denominator)
        if self.device is not None and str(self.device) != "cpu":  # words and comparison on the card: same draws
            import dpcda.privacy.noise.device as noise_device

            first, _ = self._reserve(UNIFORM_WORDS * size)
            return noise_device.binomial(self._subkey, first, n, q.numerator, q.denominator, size, self.device)
        return count_below(self._uniform_words(size), th)

    def _uniform_words(self, n: int) -> np.ndarray:
        """(3, n) uint64: n 192-bit uniform integers, row 0 the most significant words (each row read in turn)."""
        out = np.empty(UNIFORM_WORDS * n + SLACK_WORDS, np.uint64)
        self.fill(out, UNIFORM_WORDS * n)
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
        task = _TASK_BLOCKS * BLOCK
        workers = pool.threads()
        if workers > 1 and flat.size > task:  # spans of blocks in parallel, each reading its own stream span

            def span(s: int) -> None:
                gaussian_span(self._subkey, first, None, flat, out, s, min(flat.size, s + task), sigma, g)

            list(pool.executor(workers).map(span, range(0, flat.size, task)))
        else:
            enc = gaussian_span(self._subkey, first, enc, flat, out, 0, flat.size, sigma, g)
            if enc is not None:
                self._keep(enc, first + 3 * flat.size)
        return out.reshape(c.shape)

    def _gaussian_on_device(self, center, sigma: float):
        """``gaussian`` with the sampler in torch on ``self.device`` (or the tensor's device); same output.

        On a CPU device the words come from OpenSSL on the host (faster there than any torch kernel); elsewhere
        the torch block function makes them on the device.
        """
        import dpcda.privacy.noise.device as noise_device

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
                host_words = np.empty(3 * total + SLACK_WORDS, np.uint64)
                self._fill_reserved(host_words, first, 3 * total, enc)
            out, _ = noise_device.rounded_gaussian(
                c, float(sigma), subkey=self._subkey, start=first, host_words=host_words
            )
        return out.cpu().numpy() if as_numpy else out
