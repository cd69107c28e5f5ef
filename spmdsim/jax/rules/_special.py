"""Special functions (``jax.lax`` and ``jax.scipy.special``'s primitives), in both tables.

``igamma``, ``igammac``, ``igamma_grad_a``, ``regularized_incomplete_beta`` and ``bessel_i0e`` are lowered by
JAX itself (``mlir.lower_fun`` of its ``*_impl`` in ``jax/_src/lax/special.py``: series and continued fractions
in ``while`` loops): XLA:CPU runs that program, so spmdsim evaluates the same program, traced once per operand
shapes and dtypes, with its own rules (:func:`_as_jax_lowers`). ``digamma`` (and ``lgamma``, in
``_arithmetic``) is CHLO's Lanczos approximation as XLA computes it (:mod:`._xla_cpu_math64`). The others, by
``scipy.special``:

Every rule is elementwise (its vectorized twin is the same rule on the stacked operands). float32, float16 and
bfloat16 are computed in float64 by SciPy and rounded (through float32, as XLA:CPU computes these dtypes in
float32); float64 by SciPy directly. XLA:CPU evaluates its own approximations of these (``polygamma``,
``zeta``, ``bessel_i1e``), so results agree within the ulps recorded in the conformance report, not bit for
bit. The domains and boundaries follow XLA: NaN outside (polygamma of a non-integer order), XLA's own values at
its special cases (zeta(1, q) = inf).
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from spmdsim.jax._internals import jax_special, lgamma_float32_program

from spmdsim.jax.evaluation._interpreter import PER_DEVICE as per_device_executor
from spmdsim.jax.numerics import _xla_cpu_math64
from spmdsim.jax.rules._elementwise import LOW_FLOATS, both, elementwise, expand_to, via_f32
from spmdsim.jax.rules._scipy import special as sp, special_function


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


_FUNCTIONS = {"polygamma": _polygamma, "zeta": _zeta, "bessel_i1e": special_function("i1e")}

for _name, _fn in _FUNCTIONS.items():
    elementwise(_name)(_in_float64(_fn))

# CHLO's Lanczos approximation, as XLA computes it (float16/bfloat16 through float32, rounded once)
elementwise("digamma")(via_f32(_xla_cpu_math64.digamma))

# -- the primitives JAX lowers with its own implementation ---------------------------------------------------------

_LOWERED_BY_JAX = {
    "igamma": jax_special._up_and_broadcast(jax_special.igamma_impl),
    "igammac": jax_special._up_and_broadcast(jax_special.igammac_impl),
    "igamma_grad_a": jax_special._up_and_broadcast(jax_special.igamma_grad_a_impl),
    "regularized_incomplete_beta": jax_special._up_and_broadcast(jax_special.regularized_incomplete_beta_impl),
    "bessel_i0e": jax_special.bessel_i0e_impl,
}


@functools.lru_cache(maxsize=256)
def _lowered(name: str, avals: tuple):
    """The jaxpr of JAX's lowering of ``name`` on operands of ``avals`` ((shape, dtype) pairs)."""
    with jax.enable_x64(any(np.dtype(d).itemsize == 8 for _, d in avals)):
        return jax.make_jaxpr(_LOWERED_BY_JAX[name])(*(jax.ShapeDtypeStruct(s, d) for s, d in avals))


def _as_jax_lowers(name: str):
    """The rule of ``name``: the program JAX lowers it to (``mlir.lower_fun`` of its implementation), evaluated by
    spmdsim's per-device rules; so its algorithm, iteration counts and boundary values are XLA's."""
    def rule(*xs, **params):
        xs = [np.asarray(x) for x in xs]
        closed = _lowered(name, tuple((x.shape, x.dtype) for x in xs))
        return per_device_executor.eval_jaxpr(closed.jaxpr, closed.consts, xs)[0]
    rule.__name__ = f"{name}_as_jax_lowers"
    return rule


def _device_by_device(rule):
    """The vectorized twin: ``rule`` on each device's operands in turn (not on the stacked ones: the ``while``
    loops run until every element they hold has converged, and XLA runs them on one device's array)."""
    def stacked(*xs, **params):
        ndim = max(np.ndim(x) for x in xs)
        xs = [expand_to(np.asarray(x), ndim) for x in xs]
        n = max(x.shape[0] for x in xs)
        return np.stack([np.asarray(rule(*(x[min(d, x.shape[0] - 1)] for x in xs), **params)) for d in range(n)])
    stacked.__name__ = f"vectorized_{rule.__name__}"
    return stacked


for _name in _LOWERED_BY_JAX:
    _rule = _as_jax_lowers(_name)
    both(_name, vectorized_rule=_device_by_device(_rule))(_rule)


# lgamma: CHLO's Lanczos approximation as XLA computes it, except float32 where the installed JAX lowers it with
# its own program (JAX 0.12's ``lgamma_impl``, ``jax/_src/lax/lgamma.py``); float16/bfloat16 through float32.
if lgamma_float32_program is not None:
    _LOWERED_BY_JAX["lgamma_float32"] = lgamma_float32_program
    _lgamma_float32 = _as_jax_lowers("lgamma_float32")
else:
    _lgamma_float32 = _xla_cpu_math64.lgamma


def _lgamma(x):
    return _xla_cpu_math64.lgamma(x) if x.dtype == np.float64 else _lgamma_float32(x)


elementwise("lgamma")(via_f32(_lgamma))
