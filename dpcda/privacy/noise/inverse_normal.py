"""The inverse normal in float64: Wichura's AS 241 (PPND16), the upper quantile the Gaussian sampler inverts.

Its relative error is about 1e-16; the samplers assume 2^-40 (1 + |z|) (``Z_ERROR``), and the tests check it against
mpmath over the whole range. The host's numpy sampler, its compiled loop (``privacy.noise.native``, which takes
the coefficients from here) and the device's torch sampler (``privacy.noise.device.gaussian``) all evaluate these
recurrences, in this order.
"""

from __future__ import annotations

import numpy as np

# AS 241's coefficients: the central rational approximation (A / B), the near tail (C / D), the far tail (E / F)
A = (
    3.3871328727963666080,
    1.3314166789178437745e2,
    1.9715909503065514427e3,
    1.3731693765509461125e4,
    4.5921953931549871457e4,
    6.7265770927008700853e4,
    3.3430575583588128105e4,
    2.5090809287301226727e3,
)
B = (
    1.0,
    4.2313330701600911252e1,
    6.8718700749205790830e2,
    5.3941960214247511077e3,
    2.1213794301586595867e4,
    3.9307895800092710610e4,
    2.8729085735721942674e4,
    5.2264952788528545610e3,
)
C = (
    1.42343711074968357734,
    4.63033784615654529590,
    5.76949722146069140550,
    3.64784832476320460504,
    1.27045825245236838258,
    2.41780725177450611770e-1,
    2.27238449892691845833e-2,
    7.74545014278341407640e-4,
)
D = (
    1.0,
    2.05319162663775882187,
    1.67638483018380384940,
    6.89767334985100004550e-1,
    1.48103976427480074590e-1,
    1.51986665636164571966e-2,
    5.47593808499534494600e-4,
    1.05075007164441684324e-9,
)
E = (
    6.65790464350110377720,
    5.46378491116411436990,
    1.78482653991729133580,
    2.96560571828504891230e-1,
    2.65321895265761230930e-2,
    1.24266094738807843860e-3,
    2.71155556874348757815e-5,
    2.01033439929228813265e-7,
)
F = (
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
    t = _poly(A, r)
    t /= _poly(B, r)
    t *= q
    np.negative(t, out=t)
    tail = np.flatnonzero(p < 0.075)  # |q| > 0.425: about 15 % of uniform p
    if tail.size:
        r = np.sqrt(-np.log(p[tail]))
        far = r > 5.0  # p < 1.4e-11: rare
        r -= 1.6
        near = _poly(C, r)
        near /= _poly(D, r)
        if far.any():
            rf = r[far] - 3.4  # r - 5
            near[far] = _poly(E, rf) / _poly(F, rf)
        t[tail] = near
    return t
