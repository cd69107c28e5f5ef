"""Special functions (``jax.lax`` and ``jax.scipy.special``'s primitives) by ``scipy.special``, in both tables.

Every rule is elementwise (its vectorized twin is the same rule on the stacked operands). float32, float16 and
bfloat16 are computed in float64 by SciPy and rounded (through float32, as XLA:CPU computes these dtypes in
float32); float64 by SciPy directly. XLA:CPU evaluates its own float32 approximations (Lanczos for lgamma,
series and continued fractions for igamma, ...), so results agree within the ulps recorded in the
conformance report, not bit for bit. The domains and boundaries follow XLA: NaN outside (igamma with a < 0, polygamma
of a non-integer order, ...), XLA's own values at its special cases (igamma(0, x >= 1) = 1, betainc with a = 0
or b = 0, ...).
"""
from __future__ import annotations

import numpy as np
import scipy.special as sp

from spmdsim.jax._numpy_rules import LOW_FLOATS, elementwise


def _in_float64(fn):
    """``fn`` on float64 values, rounded to the operands' dtype (through float32 for float16/bfloat16)."""
    def rule(*xs, **params):
        dtype = xs[0].dtype
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*(np.asarray(x, np.float64) for x in xs)), np.float64)
        if dtype in LOW_FLOATS:
            return out.astype(np.float32).astype(dtype)
        return out.astype(dtype)
    rule.__name__ = fn.__name__
    return rule


def _digamma(x):
    return np.where((x <= 0) & (x == np.floor(x)), np.nan, sp.psi(x))


def _polygamma(m, x):
    """polygamma(m, x) = psi^(m)(x): digamma for m = 0, (-1)^(m+1) m! zeta(m + 1, x) otherwise; NaN unless m
    is a non-negative integer."""
    integral = (m >= 0) & (m == np.floor(m))
    order = np.where(integral, m, 0)
    higher = np.where(np.mod(order, 2) == 1, 1.0, -1.0) * sp.gamma(order + 1) * sp.zeta(order + 1, x)
    out = np.where(order == 0, _digamma(x), higher)
    return np.where(integral, out, np.nan)


def _zeta(x, q):
    return np.where(x == 1, np.inf, sp.zeta(x, q))


def _igamma_domain(a, x):
    """Where XLA's igamma and igammac are NaN: x < 0, a < 0, a = x = 0, or a NaN."""
    return (x < 0) | (a < 0) | ((a == 0) & (x == 0)) | np.isnan(a) | np.isnan(x)


def _igamma(a, x):
    """XLA's boundaries (JAX's igamma_impl): 0 at x = 0, 1 at x = inf; at a = 0 (x > 0) 1 where XLA takes the
    continued fraction (x >= 1) and NaN where its series divides 0 by a = 0 (x < 1); at a = inf NaN for finite
    x >= 1 (inf * log(x) - lgamma(inf) is NaN there)."""
    out = np.where(a == 0, np.where(x >= 1, 1.0, np.nan), sp.gammainc(a, x))
    out = np.where(np.isinf(a) & (x >= 1) & ~np.isinf(x), np.nan, out)
    out = np.where(x == 0, 0.0, np.where(np.isinf(x), 1.0, out))
    return np.where(_igamma_domain(a, x), np.nan, out)


def _igammac(a, x):
    """XLA's boundaries (JAX's igammac_impl): 0 at x = inf and at a = 0 (x > 0); at a = inf NaN for finite
    x >= 1."""
    out = np.where(np.isinf(a) & (x >= 1) & ~np.isinf(x), np.nan, sp.gammaincc(a, x))
    out = np.where(np.isinf(x) | (a == 0), 0.0, out)
    return np.where(_igamma_domain(a, x), np.nan, out)


def _igamma_grad_a(a, x):
    """d/da of the regularized lower incomplete gamma function. SciPy has no derivative: central differences
    of gammainc with one Richardson extrapolation step (relative error about 1e-9, below float32's ulp)."""
    h = 1e-3 * np.maximum(np.abs(a), 1e-2)
    h = np.minimum(h, 0.5 * a)

    def central(step):
        return (sp.gammainc(a + step, x) - sp.gammainc(a - step, x)) / (2 * step)
    out = (4 * central(h / 2) - central(h)) / 3
    out = np.where(np.isinf(x), np.nan, np.where(x == 0, 0.0, out))  # XLA: inf - inf in its a*log(x) - x
    return np.where((a <= 0) | (x < 0) | np.isnan(a) | np.isnan(x), np.nan, out)


def _betainc(a, b, x):
    """XLA's boundaries (JAX's regularized_incomplete_beta_impl): a = 0 or b = inf counts as "a is zero", b = 0
    or a = inf as "b is zero"; the result is 0 where b is zero and x < 1 or a is zero and x = 0, 1 where a is
    zero and x > 0 or b is zero and x = 1, NaN where both are zero or outside the domain (a, b or x
    negative, x > 1, a NaN)."""
    a_zero, b_zero = (a == 0) | (b == np.inf), (b == 0) | (a == np.inf)
    x0, x1 = x == 0, x == 1
    out = np.where((b_zero & ~x1) | (a_zero & x0), 0.0, sp.betainc(a, b, x))
    out = np.where((a_zero & ~x0) | (b_zero & x1), 1.0, out)
    nan = (a < 0) | (b < 0) | (x < 0) | (x > 1) | (a_zero & b_zero) | np.isnan(a) | np.isnan(b) | np.isnan(x)
    return np.where(nan, np.nan, out)


_FUNCTIONS = {
    "digamma": _digamma, "polygamma": _polygamma, "zeta": _zeta, "igamma": _igamma, "igammac": _igammac,
    "igamma_grad_a": _igamma_grad_a,
    "regularized_incomplete_beta": _betainc, "bessel_i0e": sp.i0e, "bessel_i1e": sp.i1e,
}

for _name, _fn in _FUNCTIONS.items():
    elementwise(_name)(_in_float64(_fn))
