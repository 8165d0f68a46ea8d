"""The host's Gaussian sampler as one compiled loop: ``gaussian.rounded_gaussian``'s arithmetic, element by element.

Relation-agnostic, like ``privacy.noise`` (whose docstring states the mechanism and the exactness argument). The
numpy sampler makes about 60 passes over each block of ``BLOCK`` elements, with the GIL held between them;
this module compiles the same per-element arithmetic in C (the system's C compiler, at the first large draw of a
process, into a private temporary directory) and calls it through ``ctypes``, which releases the GIL, so a second
noise thread runs beside the first.

Why the output is the same, bit for bit. The kernel evaluates, per element, the IEEE operations the numpy code
evaluates, in the same order: p from the two top words (int64 -> float64 conversions, products by powers of two, one
sum), AS 241's Horner recurrences with the same coefficients (passed from ``native_sampler``), the division, the
products by sigma/g and the division by g, round half to even, (k + 0.0) * g. It is built with ``-ffp-contract=off`` (no
fused multiply-adds) and without ``-ffast-math``, and the command ends with value-safety flags (``SAFE_FLAGS``: signed
zeros, no unsafe math, reassociation, reciprocals or contraction) that override anything before them, so vector and
scalar code round every operation as numpy does. The one call that may differ is ``log`` in the tail branch (glibc's,
where numpy may use its own SIMD log): both are within an ulp or two, far inside the error bound ``Z_ERROR`` the exact
decision assumes (2^-40 (1 + |z|), observed below 2^-50), so every element the float value decides lies in the exact
cell at u, which is the numpy sampler's output too. Everything else is decided where numpy decides it: the kernel
returns each block's largest t, largest |c|, whether every value is finite and the largest distance to a cell boundary,
and ``native_sampler`` applies the same error bound, the same refusals and the same exact decimal decision to the same
elements (a block holding one of p's rare low-precision cases, w0 < 2^11, goes through the numpy sampler whole).

At load the kernel is checked against the numpy sampler, bit for bit, on fixed uniforms
(``native_sampler.check_native``): random blocks, a block in the far tail (r > 5, both signs), p beside the tail's edge
and beside 1/2, zeros reached from below (rint's -0.0 must leave as +0.0) and cells beside a boundary that are decided
exactly, several blocks per call in the draws' layout; a block with w0 < 2^11 must be handed back. It samples the
arithmetic, it does not prove it: what it cannot catch, the value-safety flags and the shared error bound are there for.
A machine without a C compiler, a failed build, a failed check or a check that raises leaves ``kernel()`` None for the
process (one warning) and the numpy sampler runs: the same output, slower. ``DPCDA_NOISE_NATIVE=0`` turns the kernel
off.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import tempfile
import threading

_ENV = "DPCDA_NOISE_NATIVE"  # "0": the numpy sampler only
STATS = 5  # per block: max t, max |c|, all finite (1.0 / 0.0), max |scaled - k|, count of w0 < 2^11

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline int64_t bits(double x) {
    int64_t b;
    memcpy(&b, &x, 8);
    return b;
}

static inline double from_bits(int64_t b) {
    double x;
    memcpy(&x, &b, 8);
    return x;
}

/* Horner's rule as inverse_normal._poly evaluates it: acc = x c7; acc += c6; then acc *= x; acc += c_i down to c0. */
static inline double poly(const double *c, double x) {
    double acc = x * c[7];
    acc = acc + c[6];
    for (int j = 5; j >= 0; j--) {
        acc = acc * x;
        acc = acc + c[j];
    }
    return acc;
}

/* nblocks blocks of n elements. Block b reads its n top words at words + b * stride and its n middle words right
   after them, its centres at center + b n; it writes (k + 0.0) g to out + b n, |scaled - k| to dist + b n and
   STATS values to stats + 5 b. coef: AS 241's A, B, C, D, E, F, 8 each, constant term first. */
void dpcda_rounded_gaussian(int64_t nblocks, int64_t n, const uint64_t *words, int64_t stride,
                            const double *center, double *out, double *dist, const double *coef,
                            double sigma_over_g, double g, double *stats) {
    const uint64_t low63 = 0x7fffffffffffffffULL;
    for (int64_t b = 0; b < nblocks; b++) {
        const uint64_t *u0 = words + b * stride, *u1 = u0 + n;
        const double *c = center + b * n;
        double *o = out + b * n, *d = dist + b * n;
        int64_t small = 0;
        for (int64_t i = 0; i < n; i++) { /* gaussian.tail_p, and upper_quantile's central branch for all */
            uint64_t mask = (uint64_t)0 - (u0[i] >> 63);
            int64_t w0 = (int64_t)((u0[i] ^ mask) & low63);
            int64_t w1 = (int64_t)((u1[i] ^ mask) >> 11);
            small += w0 < 2048;
            double p = (double)w0 * 0x1p-64;
            p = p + (double)w1 * 0x1p-117;
            double q = p - 0.5;
            double r = q * q;
            r = 0.180625 - r;
            double t = poly(coef, r) / poly(coef + 8, r);
            t = t * q;
            o[i] = p;
            d[i] = -t;
        }
        for (int64_t i = 0; i < n; i++) { /* the tail branch, p < 0.075 (about 15 %) */
            double p = o[i];
            if (p < 0.075) {
                double r = sqrt(-log(p));
                int far = r > 5.0;
                r = r - 1.6;
                if (far) {
                    double rf = r - 3.4;
                    d[i] = poly(coef + 32, rf) / poly(coef + 40, rf);
                } else {
                    d[i] = poly(coef + 16, r) / poly(coef + 24, r);
                }
            }
        }
        /* maxima of non-negative doubles as maxima of their bit patterns (integers order them alike, and the
           loop vectorises); a non-finite scaled value has |s| bits >= those of infinity */
        int64_t tmax = 0, cmax = 0, dmax = 0, nonfinite = 0;
        for (int64_t i = 0; i < n; i++) { /* gaussian.rounded_gaussian after upper_quantile */
            double t = d[i], s;
            int64_t tb = bits(t);
            s = from_bits(tb ^ (int64_t)(((u0[i] >> 63) ^ 1) << 63)); /* z = t where U >= 2^191, else -t */
            s = s * sigma_over_g;
            s = s + c[i] / g;
            double k = rint(s);
            double e = fabs(s - k);
            int64_t sb = bits(s) & 0x7fffffffffffffffLL, cb = bits(c[i]) & 0x7fffffffffffffffLL, eb = bits(e);
            nonfinite |= sb >= 0x7ff0000000000000LL;
            tmax = tb > tmax ? tb : tmax;
            cmax = cb > cmax ? cb : cmax;
            dmax = eb > dmax ? eb : dmax;
            d[i] = e;
            o[i] = (k + 0.0) * g;
        }
        stats[5 * b] = from_bits(tmax);
        stats[5 * b + 1] = from_bits(cmax);
        stats[5 * b + 2] = nonfinite ? 0.0 : 1.0;
        stats[5 * b + 3] = from_bits(dmax);
        stats[5 * b + 4] = (double)small;
    }
}
"""

# no contraction into fused multiply-adds, no -ffast-math; errno (which changes no value) is dropped
_FLAGS = ["-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno"]
# appended after every other flag (the last of two contrary flags wins), so nothing before them can turn on a
# value-changing optimisation (-ffast-math, -fno-signed-zeros, contraction, reassociation, reciprocals)
SAFE_FLAGS = [
    "-fno-fast-math",
    "-fsigned-zeros",
    "-ftrapping-math",
    "-fno-unsafe-math-optimizations",
    "-fno-associative-math",
    "-fno-reciprocal-math",
    "-fno-finite-math-only",
    "-ffp-contract=off",
]
_LOCK = threading.Lock()
_LIB = None  # the loaded function, or False once a build failed or was turned off
_REASON = "not built yet"


def _compile(cc: str, flags: list) -> ctypes.CDLL:
    tmp = tempfile.mkdtemp(prefix="dpcda-noise-")  # private (0700): nobody else can swap the library we load
    try:
        src, lib = os.path.join(tmp, "sampler.c"), os.path.join(tmp, "sampler.so")
        with open(src, "w") as f:
            f.write(SOURCE)
        subprocess.run([cc, *flags, "-o", lib, src, "-lm"], check=True, capture_output=True, timeout=120)
        return ctypes.CDLL(lib)  # mapped now: the file can go
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build():
    global _REASON
    if os.environ.get(_ENV, "1") == "0":
        _REASON = f"turned off ({_ENV}=0)"
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        _REASON = "no C compiler"
        return None
    errors = []
    for flags in (_FLAGS + ["-march=native"], _FLAGS):  # the host's vector units where the compiler knows them
        try:
            fn = _compile(cc, flags + SAFE_FLAGS).dpcda_rounded_gaussian
        except (OSError, AttributeError, subprocess.SubprocessError) as err:
            errors.append(f"{type(err).__name__}: {getattr(err, 'stderr', b'')[-300:] or err}")
            continue
        fn.restype = None
        fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        fn.argtypes += [ctypes.c_void_p] * 4 + [ctypes.c_double, ctypes.c_double, ctypes.c_void_p]
        return fn
    _REASON = "build failed: " + "; ".join(errors)
    return None


def kernel(check):
    """The compiled sampler (built and checked once per process), or None: then the numpy sampler runs.

    ``check(fn)``: '' where ``fn`` gives the numpy sampler's output on fixed words, else what differs
    (``native_sampler`` passes its own check: this module imports nothing else of ``privacy.noise``). A check that
    raises has failed: the kernel is off for the process (one warning), never built again per draw."""
    global _LIB, _REASON
    if _LIB is None:
        with _LOCK:
            if _LIB is None:
                fn = None
                try:
                    fn = _build()
                    if fn is not None:
                        problem = check(fn)
                        if problem:
                            _REASON, fn = f"disagrees with the numpy sampler ({problem})", None
                except Exception as err:  # whatever went wrong (an overflow included), numpy runs the sampler
                    _REASON, fn = f"the load check raised {type(err).__name__}: {err}", None
                if fn is not None:
                    _REASON = "compiled"
                elif os.environ.get(_ENV, "1") != "0":
                    logging.getLogger(__name__).warning(
                        "noise sampler: the compiled kernel is not used (%s); numpy runs it, the same output", _REASON
                    )
                _LIB = fn if fn is not None else False
    return _LIB or None


def status() -> str:
    """'compiled', or why the numpy sampler runs."""
    return _REASON


def _reset() -> None:
    """Tests: build again at the next call (after changing the environment)."""
    global _LIB, _REASON
    with _LOCK:
        _LIB, _REASON = None, "not built yet"


def _after_fork_in_child() -> None:
    """A fork while another thread held ``_LOCK`` (building) leaves the child's copy held by no thread of the child:
    the child gets a fresh lock, and builds (or not) for itself where the parent had not finished."""
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
