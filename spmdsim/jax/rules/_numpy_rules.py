"""NumPy rules for JAX's array primitives (``jax.lax``), following XLA:CPU's semantics, in both rule tables.

Each primitive has a per-device rule (one device's arrays) and, beside it, its vectorized twin (every operand
and result with a leading device axis; see :mod:`spmdsim.jax.evaluation._registry`). The twins compute the same thing
the same way, so that ``VECTORIZED[p](*xs)[d]`` equals ``PER_DEVICE[p](*(x[d] for x in xs))`` bit for bit:

- elementwise rules run unchanged on the stacked operands (a per-device scalar becomes ``(n, 1, ..., 1)``);
- rules with axis parameters get the axes shifted by one;
- gather, scatter and the dynamic slices treat the device axis as a batching dimension of the operation;
- matrix products (``dot_general`` here, convolutions in :mod:`._windows`) are batched ``np.matmul`` calls
  whose every slice is the same ``(M, K) @ (K, N)`` product for both twins (BLAS results depend on the
  shape of the call, so the device axis is only ever an outer batch axis, never folded into M or N).

Conventions: results keep the dtypes the jaxpr expects (checked by the interpreter); float16 and bfloat16
are computed in float32 and rounded once, as XLA:CPU does; integer arithmetic wraps; integer division by
zero gives -1 (all bits set) and remainder by zero the dividend, as on XLA:CPU; nothing is modified in place
(inputs may be read-only views shared between devices).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import ml_dtypes
import numpy as np
import scipy.special

from spmdsim.runtime import _blas, _buffers, _threads
from spmdsim.primitives._primitives import Batch
from spmdsim.runtime._values import broadcast_view
from spmdsim.jax.evaluation import _dtypes
from spmdsim.jax.numerics import _libm, _xla_cpu_isa, _xla_cpu_math, _xla_cpu_probe
from spmdsim.jax.evaluation._interpreter import Vectorized
from spmdsim.jax.evaluation._registry import IN_PLACE, PER_DEVICE, VECTORIZED, per_device, specialize, vectorized

LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
_LOW_FLOATS = LOW_FLOATS  # the name other modules used


def is_float(dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) in LOW_FLOATS


def _operand_dtype(eqn, i: int = 0) -> np.dtype | None:
    aval = getattr(eqn.invars[i], "aval", None)
    try:
        return np.dtype(aval.dtype)
    except TypeError:  # key types
        return None


def via_f32(fn):
    """``fn`` in float32 for float16/bfloat16 inputs, rounded back once to the input dtype. Accepts the
    elementwise parameters of JAX 0.10: ``accuracy`` (a hint XLA:CPU ignores) and ``out_dtype`` (``mul``:
    both operands converted to it first, as the lowering does; the parameter keeps the dtype asked for, the
    jaxpr's result has it canonicalised: float32 for float64 while x64 is off, and so does the lowering)."""
    def rule(x, *rest, accuracy=None, out_dtype=None, input_dtype=None):
        if out_dtype is not None:
            out_dtype = _canonical_dtype(out_dtype)
        if out_dtype is not None and out_dtype != x.dtype:
            x, rest = _convert_element_type(x, new_dtype=out_dtype), tuple(
                _convert_element_type(r, new_dtype=out_dtype) for r in rest)
        if x.dtype in LOW_FLOATS:
            out = np.asarray(fn(x.astype(np.float32), *(r.astype(np.float32) for r in rest)))
            return out if out.dtype == np.bool_ else out.astype(x.dtype)
        return fn(x, *rest)

    @specialize
    def direct(eqn):  # the jaxpr says the dtype: no float32 detour needed, call the NumPy function itself
        dtype = _operand_dtype(eqn)
        trivial = all(v is None for v in eqn.params.values())
        if eqn.params.get("out_dtype") is not None and set(eqn.params) <= {"out_dtype", "accuracy"}:
            target = np.dtype(eqn.outvars[0].aval.dtype)  # the jaxpr's, whatever the x64 setting here

            def converted(*xs):
                return rule(*(_convert_element_type(v, new_dtype=target) for v in xs))
            return converted
        if dtype is None or dtype in LOW_FLOATS or not trivial:
            return None
        for_dtype = getattr(fn, "for_dtype", None)  # a NumPy function of its own for some dtypes
        return fn if for_dtype is None else for_dtype(dtype)
    return direct(rule)


_via_f32 = via_f32


def _canonical_dtype(dtype) -> np.dtype:
    """``dtype`` as JAX canonicalises it under the current x64 setting (float64 -> float32 while it is off)."""
    import jax  # here: a rule's parameter only
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def expand_to(x: np.ndarray, ndim: int) -> np.ndarray:
    """A per-device scalar (shape ``(n,)``) as ``(n, 1, ..., 1)``, so it broadcasts against rank-``ndim``
    stacked blocks."""
    return x.reshape(x.shape + (1,) * (ndim - x.ndim)) if x.ndim < ndim else x


def elementwise_vectorized(rule):
    """The vectorized twin of an elementwise rule: the same rule on the stacked operands."""
    def stacked(*xs, **params):
        ndim = max(x.ndim for x in xs)
        return rule(*(expand_to(x, ndim) for x in xs), **params)
    stacked.__name__ = f"vectorized_{getattr(rule, '__name__', 'rule')}"
    return stacked


def elementwise(*names: str):
    """Register ``rule`` per device, and its stacked form as the vectorized rule, for ``names``."""
    def register(rule):
        per_device(*names)(rule)
        vectorized(*names)(elementwise_vectorized(rule))
        return rule
    return register


def both(*names: str, vectorized_rule: Callable):
    """Register ``rule`` per device and ``vectorized_rule`` as its twin."""
    def register(rule):
        per_device(*names)(rule)
        vectorized(*names)(vectorized_rule)
        return rule
    return register


def shift(axes) -> tuple:
    return tuple(int(a) + 1 for a in axes)


# -- elementwise -----------------------------------------------------------------------------------------

def _rsqrt(x):
    return np.asarray(1, x.dtype) / np.sqrt(x)


def _sign(x):
    if x.dtype.kind in "fc":
        return np.where(x == 0, x, np.sign(x)).astype(x.dtype)  # XLA: sign(-0.0) is -0.0
    return np.sign(x)


def _log1p(x):
    """float64 by NumPy; complex as ``0.5 log1p(x (2 + x) + y^2) + i atan2(y, 1 + x)`` in float64 (complex128:
    in long double, so that less cancels where |1 + z| is near 1; NumPy's
    complex log1p is ``log(1 + z)``: it loses every digit for small z, e.g. log1p(1e-5 + 0j) = 1.0014e-05),
    complex64 rounded once: within an ulp of XLA's (its own compensated algorithm, not ported)."""
    if x.dtype.kind != "c":
        return np.log1p(x)
    wide = np.float64 if x.dtype == np.complex64 else np.longdouble  # the squares of float32 are exact in float64
    re, im = np.real(x).astype(wide), np.imag(x).astype(wide)
    with np.errstate(all="ignore"):
        out = 0.5 * np.log1p(re * (2 + re) + im * im).astype(np.float64) + 1j * np.arctan2(im, 1 + re).astype(
            np.float64)
        big = np.maximum(np.abs(re), np.abs(im)) > 1e150  # x (2 + x) + y^2 would overflow: log(1 + z) is exact
        out = np.where(big, np.log(1 + x.astype(np.complex128)), out)
    return out.astype(x.dtype)


def _xla_float32(port, other):
    """float32 (and float16/bfloat16 through it) by XLA:CPU's own algorithm (:mod:`._xla_cpu_math`); other
    dtypes (float64, complex) by ``other``."""
    def fn(x):
        return port(x) if x.dtype == np.float32 else other(x)
    fn.__name__ = port.__name__
    return fn


_UNARY_XLA = {
    "exp": (_xla_cpu_math.exp, np.exp), "log": (_xla_cpu_math.log, np.log),
    "log1p": (_xla_cpu_math.log1p, _log1p), "tanh": (_xla_cpu_math.tanh, np.tanh),
    "erf": (_xla_cpu_math.erf, scipy.special.erf), "expm1": (_xla_cpu_math.expm1, np.expm1),
    "rsqrt": (_xla_cpu_math.rsqrt, _rsqrt),
}


def _abs(x):
    """complex64 as the jaxlib's XLA:CPU computes it (:func:`._xla_cpu_probe.complex64_abs`): NumPy's hypot, or
    ``sqrt(fma(a, a, b*b))`` where that neither overflows nor underflows (hypot's value elsewhere)."""
    if x.dtype != np.complex64 or _xla_cpu_probe.complex64_abs() == "hypot":
        return np.abs(x)
    a, b = np.real(x), np.imag(x)
    with np.errstate(all="ignore"):
        wide = a.astype(np.float64) * a + (b * b).astype(np.float64)
        fused = np.sqrt(_xla_cpu_math.fma(a, a, b * b))
    safe = np.isfinite(fused) & (wide >= np.finfo(np.float32).tiny) & (wide <= np.finfo(np.float32).max)
    return np.where(safe, fused, np.abs(x)).astype(np.float32)


_UNARY = {
    "neg": np.negative, "floor": np.floor, "ceil": np.ceil, "is_finite": np.isfinite,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "sqrt": np.sqrt, "cbrt": np.cbrt, "abs": _abs, "real": np.real, "imag": np.imag,
    "conj": lambda x: np.conj(x) if x.dtype.kind == "c" else np.asarray(x, np.result_type(x, np.complex64)),
    "square": np.square, "sign": _sign, "erfc": scipy.special.erfc,
    **{name: _xla_float32(port, other) for name, (port, other) in _UNARY_XLA.items()},
}


def _multiply(x, y):
    """complex64, and complex128 where the ISA has FMA, as XLA:CPU multiplies: (ac - bd) + (bc + ad)i with one
    product of each part fused; which one of the imaginary part's depends on the jaxlib
    (:func:`._xla_cpu_probe.complex64_multiply`; complex128 was measured to follow complex64)."""
    dtype = np.result_type(x, y)
    if x.dtype == dtype and y.dtype == dtype and (dtype == np.complex64 or (
            dtype == np.complex128 and _xla_cpu_isa.current().fma)):
        a, b, c, d = np.real(x), np.imag(x), np.real(y), np.imag(y)
        fma = _xla_cpu_math.fma if dtype == np.complex64 else _xla_cpu_math.fma64
        imag = fma(b, c, a * d) if _xla_cpu_probe.complex64_multiply() == "bc" else fma(a, d, b * c)
        return _complex(fma(a, c, -(b * d)), imag)
    return np.multiply(x, y)



# (operands: one dtype)
_multiply.for_dtype = lambda dtype: _multiply if dtype in (np.complex64, np.complex128) else np.multiply


_BINARY = {
    "add": np.add, "add_any": np.add, "sub": np.subtract, "mul": _multiply, "atan2": np.arctan2,
}
_COMPARISONS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
                "ge": np.greater_equal}
_BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}

for _name, _fn in {**_UNARY, **_BINARY}.items():
    elementwise(_name)(via_f32(_fn))
for _name, _fn in {**_COMPARISONS, **_BITWISE}.items():
    elementwise(_name)(specialize(lambda eqn, fn=_fn: fn)((lambda fn: lambda x, y: fn(x, y))(_fn)))


# Primitives that JAX or XLA expand into other operations before XLA:CPU compiles them: computed as those
# operations, each by its own rule, so that float16 and bfloat16 are rounded after every step as XLA:CPU rounds
# them (it computes each operation of a low-precision program in float32 and rounds its result; measured bit
# for bit on every float16 and bfloat16 value tried, where one rounding at the end differs in 30-50% of them).

def _logistic_wide(x):
    if x.dtype == np.float32:
        return _xla_cpu_math.logistic(x)
    if x.dtype.kind == "f":
        return np.asarray(scipy.special.expit(x), x.dtype)
    return np.asarray(1, x.dtype) / (np.asarray(1, x.dtype) + np.exp(-x))


@elementwise("logistic")
@specialize(lambda eqn: _logistic_wide if _operand_dtype(eqn) not in (None, *LOW_FLOATS) else None)
def _logistic(x, *, accuracy=None):
    """float32 by XLA:CPU's own algorithm; float16/bfloat16 as XLA's LogisticExpander writes it,
    ``1 / (1 + exp(-x))``, rounded after each step."""
    if x.dtype not in LOW_FLOATS:
        return _logistic_wide(x)
    one = np.asarray(1, x.dtype)
    return PER_DEVICE["div"](one, PER_DEVICE["add"](one, PER_DEVICE["exp"](np.negative(x))))


@elementwise("exp2")
def _exp2(x, *, accuracy=None):
    """As JAX lowers ``exp2`` (``jax/_src/lax/lax.py``: ``_exp2_lower``): ``exp(log(2) * x)``, log(2) and
    the product in x's dtype."""
    return PER_DEVICE["exp"](PER_DEVICE["mul"](np.asarray(np.log(2), x.dtype), x))


@elementwise("log2")
def _log2(x, *, accuracy=None):
    """A primitive from JAX 0.11 (``jnp.log2`` divided two logs before). As JAX lowers it (``_log2_lower``):
    ``log(x) * 1.4426950408889634`` with the constant in x's dtype; a complex x's real and imaginary parts of
    ``log(x)`` each times the constant in the real dtype."""
    log = PER_DEVICE["log"](x)
    if x.dtype.kind != "c":
        return PER_DEVICE["mul"](log, np.asarray(1.4426950408889634, x.dtype))
    scale = np.asarray(1.4426950408889634, np.real(log).dtype)
    return _complex(PER_DEVICE["mul"](np.real(log), scale), PER_DEVICE["mul"](np.imag(log), scale))


@elementwise("one_minus_square")
def _one_minus_square(x):
    """``1 - x**2``, a primitive from JAX 0.11, as JAX lowers it: ``(1 + x) * (1 - x)``, each step in x's dtype."""
    one = np.asarray(1, x.dtype)
    return PER_DEVICE["mul"](PER_DEVICE["add"](one, x), PER_DEVICE["sub"](one, x))


@elementwise("polynomial")
def _polynomial(x, *coeffs, unroll=None):
    """``coeffs[0] + x * (coeffs[1] + x * (...))``, a primitive from JAX 0.12, as JAX lowers it (Horner's steps
    ``acc * x + c`` from the highest coefficient, or, beyond ``unroll`` (8) coefficients, a scan of those steps
    from zero): each step a multiply feeding an add, which XLA:CPU computes as one multiply-add
    (:func:`._xla_cpu_math.multiply_add`; float64's is not modelled, as elsewhere)."""
    dtype = np.result_type(x, *coeffs)
    if len(coeffs) <= (8 if unroll is None else unroll):  # unrolled: from the highest coefficient
        acc, steps = np.asarray(coeffs[-1], dtype), coeffs[-2::-1]
    else:  # a scan of the steps from zero (0 * x: NaN at an infinite x)
        acc, steps = np.zeros((), dtype), coeffs[::-1]
    for c in steps:
        if dtype.kind == "f" or dtype in LOW_FLOATS:
            acc = np.asarray(_xla_cpu_math.multiply_add(acc, np.asarray(x, dtype), np.asarray(c, dtype), dtype))
        else:
            acc = PER_DEVICE["add"](PER_DEVICE["mul"](acc, x), c)
    return np.broadcast_to(acc, np.broadcast_shapes(np.shape(x), *(np.shape(c) for c in coeffs))).copy()


def _complex_pick(x, y, greater: bool):
    """XLA's complex max/min: lexicographic on (real, imaginary), the second operand where not greater."""
    xr, xi, yr, yi = np.real(x), np.imag(x), np.real(y), np.imag(y)
    first = (xr > yr) | ((xr == yr) & (xi > yi)) if greater else (xr < yr) | ((xr == yr) & (xi < yi))
    return np.where(first, x, y)


_SIGN_BIT = {np.dtype(np.float32): np.int32(-2**31), np.dtype(np.float64): np.int64(-2**63)}


def _may_hold_negative_zero(x) -> bool:
    """Whether ``x`` holds a -0.0 (one pass over its bits; True for dtypes not checked)."""
    x = np.asarray(x)
    sign = _SIGN_BIT.get(x.dtype)
    return sign is None or bool((x.view(sign.dtype) == sign).any())


def _float_max(x, y):
    if np.result_type(x, y).kind == "c":
        return _complex_pick(x, y, True)
    out = np.maximum(x, y)
    # XLA orders -0.0 below +0.0; NumPy keeps either zero: only a -0.0 can make them differ (ReLU's inputs rarely)
    if is_float(out.dtype) and (_may_hold_negative_zero(x) or _may_hold_negative_zero(y)):
        out = np.where((x == 0) & (y == 0), x + y, out)
    return out


def _float_min(x, y):
    if np.result_type(x, y).kind == "c":
        return _complex_pick(x, y, False)
    out = np.minimum(x, y)
    if is_float(out.dtype) and (_may_hold_negative_zero(x) or _may_hold_negative_zero(y)):
        out = np.where((x == 0) & (y == 0), -((-x) + (-y)), out)
    return out


elementwise("max")(via_f32(_float_max))
elementwise("min")(via_f32(_float_min))


@elementwise("not")
def _not(x):
    """Bitwise not; NumPy inverts the sub-byte integers of ml_dtypes (int4, uint2, ...) as int8: wrapped back."""
    out = np.invert(x)
    return out if out.dtype == x.dtype else out.astype(x.dtype)


def _division_guard(x, y):
    """The divisor with the cases C leaves undefined replaced by 1: zero, and INT_MIN / -1."""
    bad = y == 0
    overflow = np.zeros_like(bad)
    if x.dtype.kind == "i":
        overflow = (x == np.iinfo(x.dtype).min) & (y == -1)
    return np.where(bad | overflow, np.ones((), y.dtype), y), bad, overflow


def _all_ones(dtype) -> np.ndarray:
    return np.asarray(np.iinfo(dtype).max if np.dtype(dtype).kind == "u" else -1, dtype=dtype)


def _float_divide(eqn):
    dtype = _operand_dtype(eqn)
    return np.true_divide if dtype is not None and dtype.kind in "fc" and dtype not in LOW_FLOATS else None


@elementwise("div")
@specialize(_float_divide)
def _div(x, y):
    if x.dtype.kind in "iu":  # C semantics: round toward zero; x / 0 is -1 (all bits set), INT_MIN / -1 INT_MIN
        safe, zero, overflow = _division_guard(x, y)
        q = np.floor_divide(x, safe)
        fix = (np.remainder(x, safe) != 0) & ((x < 0) != (safe < 0))
        q = (q + fix.astype(x.dtype)).astype(x.dtype)
        return np.where(zero, _all_ones(x.dtype), np.where(overflow, x, q)).astype(x.dtype)
    return via_f32(np.true_divide)(x, y)


@elementwise("rem")
def _rem(x, y):
    if x.dtype.kind in "iu":  # C remainder; x % 0 is x, INT_MIN % -1 is 0
        safe, zero, overflow = _division_guard(x, y)
        return np.where(zero, x, np.fmod(x, safe)).astype(x.dtype)
    return via_f32(np.fmod)(x, y)


@elementwise("pow")
def _pow(x, y):
    """Real floats: the C library's powf/pow, as XLA:CPU calls it (:mod:`._libm`); complex: NumPy's power."""
    if x.dtype.kind == "c":
        return np.power(x, y.astype(x.dtype)).astype(x.dtype)
    return via_f32(_libm.power)(x, y).astype(x.dtype)


@elementwise("nextafter")
def _nextafter(x, y):
    """The next representable value of x's own format towards y (bf16 and f16 step by their own ulp)."""
    if x.dtype not in LOW_FLOATS:
        return np.nextafter(x, y)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    xb = np.asarray(x, order="C").view(bits)
    sign = np.asarray(1 << (8 * x.dtype.itemsize - 1), bits)
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    away = (x32 < y32) == (x32 > 0)          # moving away from zero: the magnitude grows
    stepped = np.where(away, xb + np.asarray(1, bits), xb - np.asarray(1, bits)).astype(bits)
    smallest = np.where(y32 > 0, np.asarray(1, bits), sign | np.asarray(1, bits)).astype(bits)
    out = np.where(x32 == 0, smallest, stepped).view(x.dtype)
    out = np.where(x32 == y32, y, out)
    return np.where(np.isnan(x32) | np.isnan(y32), np.asarray(np.nan, x.dtype), out).astype(x.dtype)


def _specialize_integer_pow(eqn):
    y, dtype = eqn.params["y"], _operand_dtype(eqn)
    if y == 2 and dtype is not None and dtype not in LOW_FLOATS:
        return lambda x: x * x  # what the expansion below does for y=2, without the loop
    return None


@elementwise("integer_pow")
@specialize(_specialize_integer_pow)
def _integer_pow(x, *, y):
    """Binary exponentiation with multiplications in x's dtype, as XLA expands it (complex64 products fused
    as XLA:CPU fuses them)."""
    def power(a):
        acc, base, n = None, a, abs(y)
        while n:
            if n & 1:
                acc = base if acc is None else _multiply(acc, base)
            n >>= 1
            if n:
                base = _multiply(base, base)
        acc = np.ones_like(a) if acc is None else acc
        return np.asarray(1, a.dtype) / acc if y < 0 else acc
    return np.asarray(power(x), x.dtype)  # float16/bfloat16: rounded after every multiplication, as on XLA:CPU


@elementwise("round")
def _round(x, *, rounding_method):
    if int(rounding_method) == 1:  # TO_NEAREST_EVEN
        return np.round(x)
    def away(a):
        t = np.trunc(a)
        return np.where(np.abs(a - t) >= np.asarray(0.5, a.dtype), t + np.copysign(np.ones((), a.dtype), a), t)
    return via_f32(away)(x).astype(x.dtype)


@elementwise("erf_inv")
def _erf_inv(x):
    """float32 (and float16/bfloat16 through it): Giles' single-precision polynomial with XLA's log1p, as
    XLA:CPU computes it; float64: scipy.special.erfinv."""
    if x.dtype == np.float64:
        return scipy.special.erfinv(x)
    fma = _xla_cpu_math.fma
    a = x.astype(np.float32)
    w = -_xla_cpu_math.log1p(-a * a)
    small = w < np.float32(5.0)
    ws = w - np.float32(2.5)
    wl = np.sqrt(w) - np.float32(3.0)
    p_small = np.float32(2.81022636e-08)
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
              -0.00417768164, 0.246640727, 1.50140941):
        p_small = fma(p_small, ws, np.float32(c))
    p_large = np.float32(-0.000200214257)
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
              0.00943887047, 1.00167406, 2.83297682):
        p_large = fma(p_large, wl, np.float32(c))
    out = np.where(small, p_small, p_large) * a
    out = np.where(np.abs(a) == 1, a * np.float32(np.inf), _xla_cpu_math.ftz(out))
    return np.where(np.abs(a) > 1, np.float32(np.nan), out).astype(np.float32).astype(x.dtype)


@elementwise("population_count")
def _popcount(x):
    bits = np.unpackbits(np.asarray(x, order="C").reshape(-1).view(np.uint8).reshape((*x.shape, x.dtype.itemsize)),
                         axis=-1)
    return bits.sum(axis=-1).astype(x.dtype)


@elementwise("clz")
def _clz(x):
    bits = x.dtype.itemsize * 8
    u = np.asarray(x, order="C").view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    out = np.full(x.shape, bits, dtype=np.int64)
    for b in range(bits):
        hit = (u >> np.uint64(bits - 1 - b)) & np.uint64(1)
        out = np.where((out == bits) & (hit == 1), b, out)
    return out.astype(x.dtype)


def _shift_amount_ok(y, bits):
    return (y >= 0) & (y < bits)


@elementwise("shift_left")
def _shift_left(x, y):
    bits = x.dtype.itemsize * 8
    ok = _shift_amount_ok(y, bits)
    return np.where(ok, np.left_shift(x, np.where(ok, y, 0).astype(x.dtype)), 0).astype(x.dtype)


@elementwise("shift_right_logical")
def _shift_right_logical(x, y):
    bits = x.dtype.itemsize * 8
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    ok = _shift_amount_ok(y, bits)
    shifted = np.right_shift(np.asarray(x, order="C").view(unsigned), np.where(ok, y, 0).astype(unsigned))
    return np.where(ok, shifted, 0).astype(unsigned).view(x.dtype)


@elementwise("shift_right_arithmetic")
def _shift_right_arithmetic(x, y):
    bits = x.dtype.itemsize * 8
    signed = np.dtype(f"i{x.dtype.itemsize}")
    xs = np.asarray(x, order="C").view(signed)
    amount = np.where(_shift_amount_ok(y, bits), y, bits - 1).astype(signed)
    return np.right_shift(xs, amount).astype(signed).view(x.dtype)


@elementwise("mulhi")
def _mulhi(x, y):
    """The high half of the double-width product."""
    bits = 8 * x.dtype.itemsize
    if bits < 64:
        wide = np.dtype(f"{x.dtype.kind}{2 * x.dtype.itemsize}")
        return (x.astype(wide) * y.astype(wide) >> np.asarray(bits, wide)).astype(x.dtype)
    # 64 bits: schoolbook on 32-bit halves, in uint64, then the signed correction
    u = np.dtype(np.uint64)
    xu, yu = x.astype(u), y.astype(u)
    lo32, m32 = np.uint64(32), np.uint64(0xFFFFFFFF)
    x0, x1, y0, y1 = xu & m32, xu >> lo32, yu & m32, yu >> lo32
    p00, p01, p10, p11 = x0 * y0, x0 * y1, x1 * y0, x1 * y1
    middle = (p00 >> lo32) + (p01 & m32) + (p10 & m32)
    high = p11 + (p01 >> lo32) + (p10 >> lo32) + (middle >> lo32)
    if x.dtype.kind == "i":
        high = high - np.where(x < 0, yu, np.uint64(0)) - np.where(y < 0, xu, np.uint64(0))
    return high.astype(x.dtype)


def _ordered_key(x: np.ndarray) -> np.ndarray:
    """An unsigned integer key per element, ordered as XLA's total order compares x: -NaN < -inf < ... <
    -0.0 < +0.0 < ... < +inf < +NaN for floats; the values themselves for integers and bools."""
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    if x.dtype.kind == "u":
        return x
    size = x.dtype.itemsize
    unsigned = np.dtype(f"u{size}")
    top = np.asarray(1 << (8 * size - 1), unsigned)
    if x.dtype.kind == "i":
        return (np.asarray(x, order="C").view(unsigned) ^ top).astype(unsigned)
    bits = np.asarray(x, order="C").view(unsigned)
    negative = (bits & top) != 0
    return np.where(negative, ~bits, bits | top).astype(unsigned)


@elementwise("eq_to")
def _eq_to(x, y):
    return _ordered_key(x) == _ordered_key(y)


@elementwise("lt_to")
def _lt_to(x, y):
    return _ordered_key(x) < _ordered_key(y)


@elementwise("le_to")
def _le_to(x, y):
    return _ordered_key(x) <= _ordered_key(y)


@elementwise("complex")
def _complex(x, y):
    dtype = np.complex64 if x.dtype == np.float32 else np.complex128
    out = np.empty(np.broadcast_shapes(x.shape, y.shape), dtype=dtype)
    out.real, out.imag = x, y
    return out


@elementwise("select_n")
def _select_n(which, *cases):
    if len(cases) == 1:
        return cases[0]
    if len(cases) == 2:  # np.where broadcasts the three itself; a boolean predicate is read as it is
        return np.where(which.astype(bool, copy=False), cases[1], cases[0])
    shape = np.broadcast_shapes(which.shape, *(c.shape for c in cases))
    return np.choose(np.broadcast_to(which, shape).astype(np.intp), [np.broadcast_to(c, shape) for c in cases])


@elementwise("clamp")
def _clamp(lo, x, hi):
    return np.asarray(_float_min(_float_max(x, lo), hi), dtype=x.dtype)


def _float_to_int(x: np.ndarray, new_dtype: np.dtype) -> np.ndarray:
    """XLA's float-to-integer conversion: truncate toward zero, saturate, NaN to 0."""
    info = np.iinfo(new_dtype)
    y = np.trunc(x.astype(np.float64))
    out = np.where(np.isnan(y), 0, np.clip(y, info.min, info.max))
    big = y >= float(info.max)          # float(2**63 - 1) rounds up to 2**63: no cast of such values
    small = y <= float(info.min)
    out = np.where(big | small, 0, out).astype(new_dtype)
    out = np.where(big, np.asarray(info.max, new_dtype), out)
    return np.where(small, np.asarray(info.min, new_dtype), out).astype(new_dtype)


@elementwise("convert_element_type")
def _convert_element_type(x, *, new_dtype, weak_type=False, sharding=None):
    new_dtype = np.dtype(new_dtype)
    if x.dtype == new_dtype:
        return x
    if x.dtype.kind == "c" and new_dtype.kind != "c":
        x = np.real(x)  # XLA drops the imaginary part, also for bool
    if new_dtype == np.bool_:
        return x != 0
    if is_float(x.dtype) and new_dtype.kind in "iu":
        return _float_to_int(x.astype(np.float32) if x.dtype in LOW_FLOATS else x, new_dtype)
    if new_dtype in LOW_FLOATS and x.dtype != np.float32 and not (
            new_dtype == np.float16 and x.dtype == np.float64 and _xla_cpu_isa.current().fp16):
        # XLA:CPU converts integers, the other 16-bit format, and float64 (except to float16 where AVX512-FP16
        # converts it directly: vcvtsd2sh, rounded once) through float32
        x = x.astype(np.float32)
    return x.astype(new_dtype)


# Sub-byte dtypes: one per byte in NumPy (ml_dtypes keeps the value in the byte's low bits), packed in XLA.
SUB_BYTE = {np.dtype(getattr(ml_dtypes, name)): bits for name, bits in (
    ("int2", 2), ("uint2", 2), ("int4", 4), ("uint4", 4), ("float4_e2m1fn", 4)) if hasattr(ml_dtypes, name)}


def bit_width(dtype) -> int:
    """The width of ``dtype`` in XLA, in bits (4 for int4, where NumPy's itemsize says 1 byte)."""
    dtype = np.dtype(dtype)
    return SUB_BYTE.get(dtype, 8 * dtype.itemsize)


def _to_bits(x: np.ndarray) -> np.ndarray:
    """Each element's bit pattern as a uint64."""
    if x.dtype in SUB_BYTE:
        return (x.view(np.uint8) & np.uint8((1 << SUB_BYTE[x.dtype]) - 1)).astype(np.uint64)
    return x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)


def _from_bits(bits: np.ndarray, dtype: np.dtype) -> np.ndarray:
    storage = np.dtype(np.uint8) if dtype in SUB_BYTE else np.dtype(f"u{dtype.itemsize}")
    return bits.astype(storage).view(dtype)


@elementwise("bitcast_convert_type")
def _bitcast_convert_type(x, *, new_dtype):
    """XLA's BitcastConvert: the same bits; to a narrower type a new trailing axis of the width ratio (the first
    element is the least significant part, as on a little-endian machine), from a narrower type the trailing
    axis (of that ratio) merged. Sub-byte types are packed, their first element in the low bits."""
    new_dtype = np.dtype(new_dtype)
    x = np.asarray(x, order="C")
    old_bits, new_bits = bit_width(x.dtype), bit_width(new_dtype)
    if x.dtype not in SUB_BYTE and new_dtype not in SUB_BYTE:  # NumPy views: bytes in memory order
        if new_bits == old_bits:
            return x.view(new_dtype)
        if new_bits < old_bits:
            return x.reshape((*x.shape, 1)).view(new_dtype)
        return x.view(new_dtype).reshape(x.shape[:-1])
    bits = _to_bits(x)
    if new_bits == old_bits:
        return _from_bits(bits, new_dtype)
    if new_bits < old_bits:
        shifts = (np.arange(old_bits // new_bits) * new_bits).astype(np.uint64)
        return _from_bits((bits[..., None] >> shifts) & np.uint64((1 << new_bits) - 1), new_dtype)
    shifts = (np.arange(new_bits // old_bits) * old_bits).astype(np.uint64)
    return _from_bits(np.bitwise_or.reduce(bits << shifts, axis=-1), new_dtype)


_FORMATS = {np.dtype(np.float16): (5, 10), np.dtype(ml_dtypes.bfloat16): (8, 7), np.dtype(np.float32): (8, 23),
            np.dtype(np.float64): (11, 52)}


@elementwise("reduce_precision")
def _reduce_precision(x, *, exponent_bits, mantissa_bits):
    """XLA's ReducePrecision on x's own bits: round the mantissa to nearest even, then flush exponents out
    of range to zero or infinity (NaN stays NaN while mantissa bits remain)."""
    src_exponent, src_mantissa = _FORMATS[x.dtype]
    nbits = 8 * x.dtype.itemsize
    u = np.dtype(f"u{x.dtype.itemsize}")
    c = lambda v: np.asarray(v, u)  # noqa: E731
    bits = np.asarray(x, order="C").view(u)
    if mantissa_bits < src_mantissa:
        drop = src_mantissa - mantissa_bits
        last = c(1 << drop)
        rounding = ((bits & last) >> c(drop)) + c((1 << (drop - 1)) - 1)
        bits = ((bits + rounding) & ~c((1 << drop) - 1)).astype(u)
    if exponent_bits < src_exponent:
        sign_mask = c(1 << (nbits - 1))
        exponent_mask = c(((1 << src_exponent) - 1) << src_mantissa)
        bias, reduced_bias = (1 << (src_exponent - 1)) - 1, (1 << (exponent_bits - 1)) - 1
        exponent = bits & exponent_mask
        overflows = exponent > c((bias + reduced_bias) << src_mantissa)
        underflows = exponent <= c((bias - reduced_bias) << src_mantissa)
        signed_zero = bits & sign_mask
        bits = np.where(overflows, signed_zero | exponent_mask, np.where(underflows, signed_zero, bits)).astype(u)
    out = bits.view(x.dtype)
    return np.asarray(np.where(np.isnan(x), x, out), dtype=x.dtype)  # NaN stays NaN (measured on XLA:CPU)


@elementwise("copy", "copy_p", "pvary", "sharding_constraint", "pcast", "stop_gradient", "stage", "random_clone")
def _identity(x, **_):
    return x


@elementwise("optimization_barrier", "device_put")
def _identities(*xs, **_):
    return list(xs)


@elementwise("dce_sink")
def _dce_sink(*xs, **_):
    return []


@per_device("platform_index")
def _platform_index(*, platforms):
    """spmdsim computes as XLA:CPU does: the branch listing ``cpu``, else the default (None) branch."""
    default = None
    for i, names in enumerate(platforms):
        if names is None:
            default = i
        elif "cpu" in names:
            return np.int32(i)
    if default is None:
        raise NotImplementedError(f"MLIR translation rule for primitive 'platform_index(platforms={platforms})' not "
                                  f"found for platform cpu")  # JAX's message, raised when it lowers for CPU
    return np.int32(default)


# Primitives without operands: their vectorized rules return the value with a leading axis of size 1, which
# the executor broadcasts to every device (as it broadcasts literals).
vectorized("platform_index")(lambda *, platforms: np.asarray(_platform_index(platforms=platforms)).reshape(1))


@per_device("empty")
def _empty(*, shape, dtype, out_sharding=None):
    """lax.empty: XLA:CPU fills it with zeros."""
    return np.zeros(tuple(shape), np.dtype(dtype))


@per_device("empty2")
def _empty2(*, dtype, memory_space=None):
    return np.zeros((), np.dtype(dtype))


vectorized("empty")(lambda *, shape, dtype, out_sharding=None: _empty(shape=shape, dtype=dtype)[np.newaxis])
vectorized("empty2")(lambda *, dtype, memory_space=None: _empty2(dtype=dtype)[np.newaxis])


@elementwise("tie")
def _tie(x, y):
    return y


# -- shapes ----------------------------------------------------------------------------------------------

def _expanded_shape(operand_shape, shape, broadcast_dimensions) -> tuple:
    """The operand's shape with size-1 axes inserted, so that it broadcasts to ``shape``."""
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = operand_shape[src]
    return tuple(expanded)


def _reshape_to(shape: tuple, vectorized: bool = False) -> Callable:
    """``x.reshape(shape)``; vectorized, the leading device axis kept in front of ``shape``."""
    if vectorized:
        return lambda x: x.reshape((x.shape[0], *shape))
    return lambda x: x.reshape(shape)


def _static_broadcast(eqn):
    """broadcast_in_dim with a static shape: the operand's shape is known, so is the reshape before it."""
    if len(eqn.invars) != 1:
        return None
    shape = tuple(eqn.params["shape"])
    expanded = _expanded_shape(eqn.invars[0].aval.shape, shape, eqn.params["broadcast_dimensions"])
    if expanded == shape:  # only unit axes added (pmap's expanded output): a reshape
        return _reshape_to(shape)
    if math.prod(shape) <= _SMALL_BROADCAST and not _dtypes.is_extended(eqn.outvars[0].aval.dtype):
        def small(x):  # a copy: cheaper than a view of a few elements (~0.4 against ~1.3 µs)
            out = np.empty(shape, x.dtype)
            out[...] = x.reshape(expanded)
            return out
        return small
    return lambda x: broadcast_view(x.reshape(expanded), shape)


_SMALL_BROADCAST = 1024  # elements: up to this many, a broadcast result is made as a new array


@per_device("broadcast_in_dim")
@specialize(_static_broadcast)
def _broadcast_in_dim(x, *dyn_shape, shape, broadcast_dimensions, sharding=None):
    expanded = _expanded_shape(x.shape, shape, broadcast_dimensions)
    return x.reshape(expanded) if expanded == tuple(shape) else broadcast_view(x.reshape(expanded), tuple(shape))


def _static_broadcast_v(eqn):
    """The vectorized broadcast_in_dim that only adds unit axes (pmap's expanded output): a reshape that keeps
    the device axis."""
    shape = tuple(eqn.params["shape"])
    if len(eqn.invars) != 1 or _dtypes.is_extended(eqn.outvars[0].aval.dtype) or \
            _expanded_shape(eqn.invars[0].aval.shape, shape, eqn.params["broadcast_dimensions"]) != shape:
        return None
    return _reshape_to(shape, vectorized=True)


@vectorized("broadcast_in_dim")
@specialize(_static_broadcast_v)
def _broadcast_in_dim_v(x, *dyn_shape, shape, broadcast_dimensions, sharding=None):
    return _broadcast_in_dim(x, shape=(x.shape[0], *shape), broadcast_dimensions=(0, *shift(broadcast_dimensions)))


@per_device("reshape")
def _reshape(x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dimensions is not None:
        x = np.transpose(x, dimensions)
    return np.reshape(x, new_sizes)


@vectorized("reshape")
def _reshape_v(x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dimensions is not None:
        x = np.transpose(x, (0, *shift(dimensions)))
    return x.reshape((x.shape[0], *new_sizes))


def _static_squeeze(eqn, vectorized: bool = False):
    """squeeze, its result's shape known from the jaxpr: a reshape (not for extended dtypes such as PRNG keys,
    whose NumPy form has trailing axes more)."""
    aval = eqn.outvars[0].aval
    if _dtypes.is_extended(aval.dtype):
        return None
    return _reshape_to(tuple(aval.shape), vectorized)


@both("squeeze", vectorized_rule=specialize(functools.partial(_static_squeeze, vectorized=True))(
    lambda x, *, dimensions: np.squeeze(x, axis=shift(dimensions))))
@specialize(_static_squeeze)
def _squeeze(x, *, dimensions):
    return np.squeeze(x, axis=tuple(dimensions))


@both("expand_dims", vectorized_rule=lambda x, *, dimensions: np.expand_dims(x, shift(dimensions)))
def _expand_dims(x, *, dimensions):
    return np.expand_dims(x, tuple(dimensions))


@both("transpose", vectorized_rule=lambda x, *, permutation: np.transpose(x, (0, *shift(permutation))))
def _transpose(x, *, permutation):
    return np.transpose(x, permutation)


@both("rev", vectorized_rule=lambda x, *, dimensions: np.flip(x, shift(dimensions)) if dimensions else x)
def _rev(x, *, dimensions):
    return np.flip(x, tuple(dimensions)) if dimensions else x


def pad_array(x: np.ndarray, padding_value, padding_config) -> np.ndarray:
    """lax.pad: per axis (low, high, interior); negative low/high crop. ``padding_value`` broadcasts."""
    out = x
    for axis, (lo, hi, interior) in enumerate(padding_config):
        if interior:
            n = out.shape[axis]
            shape = list(out.shape)
            shape[axis] = n + (n - 1) * interior if n else 0
            spaced = np.empty(shape, dtype=x.dtype)
            spaced[...] = padding_value
            index = [slice(None)] * out.ndim
            index[axis] = slice(None, None, interior + 1)
            spaced[tuple(index)] = out
            out = spaced
        if lo > 0 or hi > 0:
            shape = list(out.shape)
            shape[axis] += max(lo, 0) + max(hi, 0)
            grown = np.empty(shape, dtype=x.dtype)
            grown[...] = padding_value
            index = [slice(None)] * out.ndim
            index[axis] = slice(max(lo, 0), max(lo, 0) + out.shape[axis])
            grown[tuple(index)] = out
            out = grown
        if lo < 0 or hi < 0:
            index = [slice(None)] * out.ndim
            index[axis] = slice(max(-lo, 0), out.shape[axis] - max(-hi, 0))
            out = out[tuple(index)]
    return out


@per_device("pad")
def _pad(x, padding_value, *, padding_config):
    return pad_array(x, padding_value, padding_config)


@vectorized("pad")
def _pad_v(x, padding_value, *, padding_config):
    return pad_array(x, expand_to(padding_value, x.ndim), ((0, 0, 0), *padding_config))


@both("concatenate", vectorized_rule=lambda *xs, dimension: np.concatenate(xs, axis=dimension + 1))
def _concatenate(*xs, dimension):
    return np.concatenate(xs, axis=dimension)


@both("stack", vectorized_rule=lambda *xs, axis: np.stack(xs, axis=axis + 1))
def _stack(*xs, axis):
    return np.stack(xs, axis=axis)


@both("unstack", vectorized_rule=lambda x, *, axis: [np.take(x, i, axis=axis + 1) for i in range(x.shape[axis + 1])])
def _unstack(x, *, axis):
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


@both("split", vectorized_rule=lambda x, *, sizes, axis: np.split(x, np.cumsum(sizes)[:-1], axis=axis + 1))
def _split(x, *, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


@per_device("tile")
def _tile(x, *, reps):
    return np.tile(x, tuple(reps))


@vectorized("tile")
def _tile_v(x, *, reps):
    return np.tile(x, (1, *reps))


@per_device("slice")
def _slice(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * x.ndim
    return x[tuple(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides, strict=True))]


@vectorized("slice")
def _slice_v(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * (x.ndim - 1)
    return x[(slice(None), *(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides,
                                                                  strict=True)))]


def _clamped_starts(shape, starts, sizes) -> np.ndarray:
    """Start indices clamped so the slice fits, per device: shape ``(n, rank)`` (XLA's dynamic-slice rule)."""
    starts = np.stack([np.asarray(s).astype(np.int64).reshape(-1) for s in starts], axis=-1) if starts else \
        np.zeros((1, 0), np.int64)
    return np.clip(starts, 0, np.maximum(np.asarray(shape, np.int64) - np.asarray(sizes, np.int64), 0))


def _window_indices(starts: np.ndarray, sizes) -> tuple:
    """Fancy indices of a ``sizes`` window at per-device ``starts`` (shape (n, rank)): device axis first."""
    n, rank = starts.shape
    index = [np.arange(n).reshape((n,) + (1,) * rank)]
    for d, size in enumerate(sizes):
        shape = [n] + [1] * rank
        shape[d + 1] = size
        index.append((starts[:, d].reshape((n,) + (1,) * rank) + np.arange(size).reshape(shape[1:]).reshape(
            [1] + shape[1:])))
    return tuple(index)


@per_device("dynamic_slice")
def _dynamic_slice(x, *starts_and_dyn, slice_sizes):
    starts = _clamped_starts(x.shape, starts_and_dyn[:x.ndim], slice_sizes)[0]
    return x[tuple(slice(int(s), int(s) + n) for s, n in zip(starts, slice_sizes, strict=True))]


@vectorized("dynamic_slice")
def _dynamic_slice_v(x, *starts_and_dyn, slice_sizes):
    starts = _clamped_starts(x.shape[1:], starts_and_dyn[:x.ndim - 1], slice_sizes)
    starts = np.broadcast_to(starts, (x.shape[0], x.ndim - 1))
    return x[_window_indices(starts, slice_sizes)]


@per_device("dynamic_update_slice")
def _dynamic_update_slice(x, update, *starts, in_place: bool = False):
    """``in_place``: ``x`` itself updated (an operand nothing else holds, see ``_registry.IN_PLACE``)."""
    starts = _clamped_starts(x.shape, starts, update.shape)[0]
    out = x if in_place else x.copy()
    out[tuple(slice(int(s), int(s) + n) for s, n in zip(starts, update.shape, strict=True))] = update
    return out


@vectorized("dynamic_update_slice")
def _dynamic_update_slice_v(x, update, *starts, in_place: bool = False):
    starts = np.broadcast_to(_clamped_starts(x.shape[1:], starts, update.shape[1:]), (x.shape[0], x.ndim - 1))
    out = x if in_place else x.copy()
    out[_window_indices(starts, update.shape[1:])] = update
    return out


@per_device("iota")
def _iota(*dyn, dtype, shape, dimension, sharding=None):
    ramp = np.arange(shape[dimension], dtype=dtype)
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    return np.broadcast_to(ramp.reshape(expanded), shape)


@vectorized("iota")
def _iota_v(*dyn, dtype, shape, dimension, sharding=None):
    """Without operands: a leading axis of size 1, broadcast to the devices by the executor."""
    return _iota(dtype=dtype, shape=shape, dimension=dimension)[np.newaxis]


# -- gather and scatter (XLA semantics, vectorised with advanced indexing) --------------------------------

def _mode_name(mode) -> str:
    return getattr(mode, "name", str(mode)).upper()


def _window_index(operand_shape, indices, slice_sizes, *, start_index_map, collapsed, operand_batching,
                  indices_batching):
    """For every batch position and window offset, the operand coordinate, as arrays for fancy indexing.

    Returns (index tuple, batch shape, window dims kept, in-bounds mask before clamping)."""
    batch_shape = indices.shape[:-1]
    nb = len(batch_shape)
    starts = [np.zeros(batch_shape, dtype=np.int64) for _ in operand_shape]
    for k, d in enumerate(start_index_map):
        starts[d] = indices[..., k].astype(np.int64)
    for od, idim in zip(operand_batching, indices_batching, strict=True):
        ramp = np.arange(batch_shape[idim]).reshape([-1 if a == idim else 1 for a in range(nb)])
        starts[od] = np.broadcast_to(ramp, batch_shape).astype(np.int64)
    in_bounds = np.ones(batch_shape, dtype=bool)
    for d, size in enumerate(slice_sizes):
        in_bounds &= (starts[d] >= 0) & (starts[d] <= operand_shape[d] - size)
        starts[d] = np.clip(starts[d], 0, max(operand_shape[d] - size, 0))
    window_dims = [d for d in range(len(operand_shape)) if d not in collapsed and d not in operand_batching]
    index = []
    for d, size in enumerate(slice_sizes):
        offset = np.arange(size)
        if d in window_dims:
            w = window_dims.index(d)
            offset = offset.reshape([1] * nb + [-1 if a == w else 1 for a in range(len(window_dims))])
            start = starts[d].reshape(batch_shape + (1,) * len(window_dims))
            index.append(start + offset)
        else:
            index.append(starts[d].reshape(batch_shape + (1,) * len(window_dims)))
    return tuple(index), batch_shape, window_dims, in_bounds


def _default_fill(dtype):
    if is_float(dtype) or np.dtype(dtype).kind == "c":
        return np.nan
    if np.dtype(dtype).kind == "i":
        return np.iinfo(dtype).min
    if np.dtype(dtype).kind == "u":
        return np.iinfo(dtype).max
    return True


@per_device("gather")
def _gather(operand, indices, *, dimension_numbers, slice_sizes, mode, fill_value=None, indices_are_sorted=False,
            unique_indices=False):
    dn = dimension_numbers
    index, batch_shape, window_dims, in_bounds = _window_index(
        operand.shape, indices, slice_sizes, start_index_map=dn.start_index_map,
        collapsed=dn.collapsed_slice_dims, operand_batching=dn.operand_batching_dims,
        indices_batching=dn.start_indices_batching_dims)
    if operand.size == 0:
        out = np.zeros(tuple(np.broadcast_shapes(*(i.shape for i in index))), operand.dtype)
    else:
        out = operand[index]  # shape: batch_shape + window dims (in operand order)
    if _mode_name(mode).endswith("FILL_OR_DROP"):
        fill = _default_fill(operand.dtype) if fill_value is None else fill_value
        mask = in_bounds.reshape(batch_shape + (1,) * len(window_dims))
        out = np.where(mask, out, np.asarray(fill).astype(operand.dtype))
    # move window dims to offset_dims positions in the output
    nb = len(batch_shape)
    rank = nb + len(window_dims)
    offset_dims = list(dn.offset_dims)
    batch_positions = [p for p in range(rank) if p not in offset_dims]
    perm = [0] * rank
    for i, p in enumerate(batch_positions):
        perm[p] = i
    for i, p in enumerate(offset_dims):
        perm[p] = nb + i
    return np.transpose(out, perm)


def _device_batched_gather_dnums(dn):
    return type(dn)(offset_dims=shift(dn.offset_dims), collapsed_slice_dims=shift(dn.collapsed_slice_dims),
                    start_index_map=shift(dn.start_index_map),
                    operand_batching_dims=(0, *shift(dn.operand_batching_dims)),
                    start_indices_batching_dims=(0, *shift(dn.start_indices_batching_dims)))


@vectorized("gather")
def _gather_v(operand, indices, *, dimension_numbers, slice_sizes, **params):
    """The device axis as a batching dimension of the operand and of the indices."""
    indices = np.broadcast_to(indices, (operand.shape[0], *indices.shape[1:]))
    return _gather(operand, indices, dimension_numbers=_device_batched_gather_dnums(dimension_numbers),
                   slice_sizes=(1, *slice_sizes), **params)


def _scatter(combine):
    def rule(operand, indices, updates, *, dimension_numbers, mode, update_jaxpr=None, update_consts=(),
             indices_are_sorted=False, unique_indices=False, in_place: bool = False):
        """``in_place``: ``operand`` itself updated (one nothing else holds, C-contiguous: see
        ``_registry.IN_PLACE``)."""
        if operand.size == 0:  # nothing to update (XLA: every index out of bounds, also when clamped)
            return operand if in_place else operand.copy()
        dn = dimension_numbers
        uw = list(dn.update_window_dims)
        update_window_shape = [updates.shape[d] for d in uw]
        it = iter(update_window_shape)
        window_sizes = [1 if d in dn.inserted_window_dims or d in dn.operand_batching_dims else next(it)
                        for d in range(operand.ndim)]
        index, batch_shape, window_dims, in_bounds = _window_index(
            operand.shape, indices, window_sizes, start_index_map=dn.scatter_dims_to_operand_dims,
            collapsed=dn.inserted_window_dims, operand_batching=dn.operand_batching_dims,
            indices_batching=dn.scatter_indices_batching_dims)
        # updates: scatter (batch) dims first, window dims after, like the gathered layout
        batch_axes = [d for d in range(updates.ndim) if d not in uw]
        upd = np.transpose(updates, batch_axes + uw)
        if _mode_name(mode).endswith("CLIP"):
            in_bounds = np.ones_like(in_bounds)
        keep = np.broadcast_to(in_bounds.reshape(batch_shape + (1,) * len(window_dims)), upd.shape)
        out = operand if in_place else operand.copy()
        full_index = tuple(np.broadcast_to(i, upd.shape)[keep] for i in index)
        apply = combine if update_jaxpr is None or combine is not _assign else _update_computation(update_jaxpr,
                                                                                                   update_consts)
        apply(out, full_index, upd[keep])  # float16/bfloat16: rounded after every update, as XLA:CPU does
        return out

    def stacked(operand, indices, updates, *, dimension_numbers, **params):
        """The device axis as a batching dimension of the operand and of the indices."""
        dn = dimension_numbers
        n = operand.shape[0]
        dnums = type(dn)(update_window_dims=shift(dn.update_window_dims),
                         inserted_window_dims=shift(dn.inserted_window_dims),
                         scatter_dims_to_operand_dims=shift(dn.scatter_dims_to_operand_dims),
                         operand_batching_dims=(0, *shift(dn.operand_batching_dims)),
                         scatter_indices_batching_dims=(0, *shift(dn.scatter_indices_batching_dims)))
        return rule(operand, np.broadcast_to(indices, (n, *indices.shape[1:])),
                    np.broadcast_to(updates, (n, *updates.shape[1:])), dimension_numbers=dnums, **params)
    return rule, stacked


def _assign(out, index, values):
    out[index] = values


def _update_computation(update_jaxpr, update_consts):
    """A ``scatter`` with an update computation (``lax.scatter_apply``, ``x.at[i].apply(f)``): XLA:CPU applies it
    to each update in turn, ``out[i] = update(out[i], u)``, in the updates' row-major order. ``combine(out,
    index, values)`` does the same in rounds: round ``r`` applies every target's ``r``-th update at once (the
    targets of a round are distinct, and each target sees its updates in order), the update jaxpr evaluated
    on the round's elements stacked on one axis (the vectorized rules, elementwise, so that the result of an
    element does not depend on how many are evaluated together)."""
    jaxpr, consts = (update_jaxpr.jaxpr, update_jaxpr.consts) if hasattr(update_jaxpr, "consts") else \
        (update_jaxpr, update_consts)
    if not jaxpr.eqns and not consts and jaxpr.outvars == jaxpr.invars[1:]:  # (x, y) -> y: lax.scatter's own
        return _assign

    def combine(out, index, values):
        if values.size == 0:
            return
        flat = np.ravel_multi_index(index, out.shape) if out.ndim else np.zeros(values.size, np.intp)
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        first = np.r_[True, ordered[1:] != ordered[:-1]]
        positions = np.arange(len(flat))
        rank = np.empty(len(flat), np.intp)
        rank[order] = positions - np.maximum.accumulate(np.where(first, positions, 0))
        target = out.reshape(-1)  # a view: out is C-contiguous (a fresh copy, or an operand updated in place)
        for r in range(int(rank.max()) + 1):
            now = rank == r
            where = flat[now]
            evaluator = Vectorized(Batch((("scatter update", int(where.size)),)))
            evaluator.compiled = False  # one program per element count otherwise
            target[where] = evaluator.eval_jaxpr(jaxpr, consts, [target[where], values[now]])[0]
    return combine


for _names, _combine in ((("scatter",), _assign),
                         (("scatter-add", "scatter_add"), lambda o, i, v: np.add.at(o, i, v)),
                         (("scatter-sub", "scatter_sub"), lambda o, i, v: np.subtract.at(o, i, v)),
                         (("scatter-mul", "scatter_mul"), lambda o, i, v: np.multiply.at(o, i, v)),
                         (("scatter-min", "scatter_min"), lambda o, i, v: np.minimum.at(o, i, v)),
                         (("scatter-max", "scatter_max"), lambda o, i, v: np.maximum.at(o, i, v))):
    _rule, _stacked = _scatter(_combine)
    per_device(*_names)(_rule)
    vectorized(*_names)(_stacked)
    IN_PLACE.update(_names)
IN_PLACE.add("dynamic_update_slice")


# -- PRNG keys in the shape rules ---------------------------------------------------------------------------
# A typed key array's NumPy form is its key data: its shape followed by its impl's key shape (uint32; see
# ._dtypes). As JAX lowers these primitives on keys, their rules apply to the key data with their parameters
# extended over the trailing key-data axes (never moved, split or broadcast); eq/ne compare every word of a
# key. The extension is worked out from the equation: once per equation through ``specialize`` (what both
# executors' compiled form calls), or from the equation being evaluated (the reference loop).

def _trailing(start: int, key_shape: tuple) -> tuple:
    return tuple(range(start, start + len(key_shape)))


def _rank(var) -> int:
    return len(var.aval.shape)


def _zero_starts(starts, count: int) -> list:
    return [np.zeros_like(starts[0] if starts else np.int32(0))] * count


def _key_params(eqn, ks, vect):
    """``(operands -> operands or None, physical params, result -> result or None)`` of ``eqn`` on key data."""
    p, kn, name = eqn.params, len(ks), eqn.primitive.name
    if name == "broadcast_in_dim":
        shape = tuple(p["shape"])
        return None, {**p, "shape": (*shape, *ks),
                      "broadcast_dimensions": (*p["broadcast_dimensions"], *_trailing(len(shape), ks))}, None
    if name == "reshape":
        dims = p.get("dimensions")
        return None, {**p, "new_sizes": (*p["new_sizes"], *ks), "dimensions": None if dims is None else
                      (*dims, *_trailing(_rank(eqn.invars[0]), ks))}, None
    if name == "transpose":
        return None, {**p, "permutation": (*p["permutation"], *_trailing(len(p["permutation"]), ks))}, None
    if name == "tile":
        return None, {**p, "reps": (*p["reps"], *(1,) * kn)}, None
    if name == "slice":
        return None, {**p, "start_indices": (*p["start_indices"], *(0,) * kn), "limit_indices": (
            *p["limit_indices"], *ks), "strides": None if p["strides"] is None else (*p["strides"], *(1,) * kn)}, None
    if name in ("dynamic_slice", "dynamic_update_slice"):
        first, r = (1 if name == "dynamic_slice" else 2), _rank(eqn.invars[0])

        def operands(xs):
            starts = list(xs[first:first + r])
            return (*xs[:first + r], *_zero_starts(starts, kn), *xs[first + r:])
        params = {**p, "slice_sizes": (*p["slice_sizes"], *ks)} if name == "dynamic_slice" else p
        return operands, params, None
    if name == "gather":
        dn = p["dimension_numbers"]
        return None, {**p, "dimension_numbers": dn._replace(offset_dims=(
            *dn.offset_dims, *_trailing(_rank(eqn.outvars[0]), ks))), "slice_sizes": (*p["slice_sizes"], *ks)}, None
    if name == "scatter":
        dn = p["dimension_numbers"]
        return None, {**p, "dimension_numbers": dn._replace(update_window_dims=(
            *dn.update_window_dims, *_trailing(_rank(eqn.invars[2]), ks)))}, None
    if name == "select_n":
        def operands(xs):
            which = xs[0]
            return (which.reshape(which.shape + (1,) * kn) if vect or which.ndim else which, *xs[1:])
        return operands, p, None
    if name in ("eq", "ne"):
        axes, lead, rank = tuple(range(-kn, 0)), int(vect), max(_rank(v) for v in eqn.invars)

        def operands(xs):  # a rank-0 operand against an array (lax broadcasts it): unit axes before its key data
            return tuple(x.reshape((*x.shape[:lead], *(1,) * (rank + kn + lead - x.ndim), *x.shape[lead:]))
                         for x in xs)
        return operands, p, (lambda out: out.all(axis=axes)) if name == "eq" else (lambda out: out.any(axis=axes))
    raise AssertionError(name)


def _on_key_data(rule, name: str, vect: bool):
    """``rule`` (of primitive ``name``), also computing equations on PRNG keys (see above)."""
    inner = getattr(rule, "specialize", None)

    def on_keys(eqn):
        ks = _dtypes.key_data_shape_of(eqn)
        if ks is None:
            return None
        operands, params, finish = _key_params(eqn, ks, vect)

        def call(*xs):
            out = rule(*(operands(xs) if operands is not None else xs), **params)
            return finish(out) if finish is not None else out
        return call

    def specialized(eqn):
        call = on_keys(eqn)
        if call is None and inner is not None:
            call = inner(eqn)
        if call is None:
            call = functools.partial(rule, **eqn.params) if eqn.params else rule
        return call

    def key_aware(*xs, **params):
        if any(getattr(x, "dtype", None) == np.uint32 for x in xs):  # key data is uint32
            eqn = _dtypes.equation_being_evaluated(name)
            call = on_keys(eqn) if eqn is not None else None
            if call is not None:
                return call(*xs)
        return rule(*xs, **params)
    key_aware.specialize = specialized
    key_aware.__wrapped__ = rule
    return key_aware


for _name in ("broadcast_in_dim", "reshape", "transpose", "tile", "slice", "dynamic_slice", "dynamic_update_slice",
              "gather", "scatter", "select_n", "eq", "ne"):
    PER_DEVICE[_name] = _on_key_data(PER_DEVICE[_name], _name, False)
    VECTORIZED[_name] = _on_key_data(VECTORIZED[_name], _name, True)


# -- reductions ------------------------------------------------------------------------------------------

def _canonical(x: np.ndarray, axes) -> np.ndarray:
    """x with the reduced axes moved last and merged: ``(kept..., R)``, contiguous. Reducing its last axis
    sums every output element in the same order whatever the leading (device) axes are."""
    axes = tuple(sorted(int(a) for a in axes))
    first = x.ndim - len(axes)
    if axes == tuple(range(first, x.ndim)) and x.flags.c_contiguous:  # already so: a reshape, no copy
        return x.reshape((*x.shape[:first], math.prod(x.shape[first:])))
    kept = [d for d in range(x.ndim) if d not in axes]
    shape = (*(x.shape[d] for d in kept), math.prod(x.shape[d] for d in axes))
    consecutive = axes and axes == tuple(range(axes[0], axes[0] + len(axes)))
    if consecutive and x.flags.c_contiguous and x.size >= _TILED_ELEMENTS:
        # consecutive axes (a sum over a batch's leading axes): (before, R, after) -> (before, after, R) by tiles
        before, after = math.prod(x.shape[:axes[0]]), math.prod(x.shape[axes[-1] + 1:])
        if after >= _TILE:
            return _transposed(x.reshape(before, shape[-1], after)).reshape(shape)
    moved = np.transpose(x, kept + list(axes))
    return np.asarray(moved, order="C").reshape(shape)


_TILED_ELEMENTS, _TILE = 1 << 16, 64


def _transposed(x: np.ndarray) -> np.ndarray:
    """``x.transpose(0, 2, 1)`` copied tile by tile (64 x 64 elements of each matrix, some matrices at a time):
    NumPy's own copy reads one of the two across pages, 3-6x slower on large matrices. The same values."""
    batch, rows, columns = x.shape
    out = np.empty((batch, columns, rows), x.dtype)
    group = max(1, (1 << 18) // (_TILE * _TILE * x.itemsize))
    for b in range(0, batch, group):
        for r in range(0, rows, _TILE):
            for c in range(0, columns, _TILE):
                out[b:b + group, c:c + _TILE, r:r + _TILE] = x[b:b + group, r:r + _TILE, c:c + _TILE].transpose(0, 2, 1)
    return out


_TREE_WINDOW = 32  # XLA:CPU's TreeReductionRewriter window
SPLIT_ELEMENTS = 1 << 20  # a vectorized rule over this many elements runs on every CPU (by_devices, _compiled._split)


def splits(shape: tuple) -> bool:
    """Whether a vectorized result of ``shape`` (the device axis first) is cut into one part of the devices per
    CPU: at least ``SPLIT_ELEMENTS`` elements, over two devices or more."""
    return len(shape) >= 2 and shape[0] >= 2 and math.prod(shape) >= SPLIT_ELEMENTS


def by_devices(fn: Callable, *stacked: np.ndarray) -> np.ndarray:
    """``fn(*stacked)`` for operands stacked on a device axis of one length, where each device's result depends
    on its own blocks alone (a reduction, a window's pooling or its gradient): from ``SPLIT_ELEMENTS`` elements
    on, one part of the devices per CPU (:func:`spmdsim.runtime._threads.in_parallel`: NumPy releases the GIL in its
    loops), the parts' results joined along the device axis. The same values."""
    n = stacked[0].shape[0] if stacked[0].ndim else 0
    if n < 2 or sum(x.size for x in stacked) < SPLIT_ELEMENTS or any(x.ndim == 0 or x.shape[0] != n
                                                                      for x in stacked):
        return fn(*stacked)
    parts: dict = {}

    def part(lo: int, hi: int) -> None:
        parts[lo] = fn(*(x[lo:hi] for x in stacked))
    _threads.in_parallel(part, n, cpus=_blas.cpus())
    return np.concatenate([parts[lo] for lo in sorted(parts)])


def _low_precision_fold(x: np.ndarray, axes, ufunc) -> np.ndarray:
    """A float16/bfloat16 sum or product as XLA:CPU computes the ``reduce`` (measured bit for bit on every
    single-axis shape tried): in the operand's dtype, rounded after every step, from the identity, in XLA's
    tree order. Where every reduced dimension has at least 32 elements, XLA's TreeReductionRewriter first
    reduces windows of 32 along each of them (SAME padding with the identity, so the windows at the ends are
    shorter), then reduces the windows' results the same way; otherwise the reduced elements are folded in
    row-major order."""
    dtype, axes = x.dtype, sorted(int(a) for a in axes)
    if not axes:  # nothing reduced: XLA's reduce is the operand
        return x
    kept = [d for d in range(x.ndim) if d not in axes]
    k, kept_shape = len(axes), tuple(x.shape[d] for d in kept)
    columns = math.prod(kept_shape)
    v = np.transpose(x, axes + kept).astype(np.float32).reshape(*(x.shape[a] for a in axes), columns)
    identity = np.float32(1 if ufunc is np.multiply else 0)

    def fold(rows: np.ndarray) -> np.ndarray:  # (groups, R, columns) -> (groups, columns)
        acc = np.full((rows.shape[0], columns), identity, np.float32)
        for j in range(rows.shape[1]):
            acc = ufunc(acc, rows[:, j]).astype(dtype).astype(np.float32)
        return acc

    while not any(n < _TREE_WINDOW for n in v.shape[:k]):
        counts = [-(-n // _TREE_WINDOW) for n in v.shape[:k]]
        pads = [((c * _TREE_WINDOW - n) // 2, c * _TREE_WINDOW - n - (c * _TREE_WINDOW - n) // 2)
                for c, n in zip(counts, v.shape[:k])]
        v = np.pad(v, pads + [(0, 0)], constant_values=identity)
        v = v.reshape(*(d for c in counts for d in (c, _TREE_WINDOW)), columns)
        v = v.transpose(*range(0, 2 * k, 2), *range(1, 2 * k, 2), 2 * k)
        v = fold(v.reshape(math.prod(counts), _TREE_WINDOW ** k, columns)).reshape(*counts, columns)
    return fold(v.reshape(1, -1, columns) if columns else v.reshape(1, 0, 0)).astype(dtype).reshape(kept_shape)


def _reduction(ufunc, name):
    accumulate = ufunc in (np.add, np.multiply)

    def rule(x, *, axes, out_sharding=None):
        if x.dtype in LOW_FLOATS and accumulate:
            return _low_precision_fold(x, axes, ufunc)
        if x.dtype.kind == "f" and ufunc is np.maximum:
            return _reduce_float_extremum(_canonical(x, axes), _float_max)
        if x.dtype.kind == "f" and ufunc is np.minimum:
            return _reduce_float_extremum(_canonical(x, axes), _float_min)
        if x.dtype in LOW_FLOATS and ufunc in (np.maximum, np.minimum):
            return rule(x.astype(np.float32), axes=axes).astype(x.dtype)
        flat = _canonical(x, axes)
        if flat.shape[-1] == 0 and not accumulate:
            return np.full(flat.shape[:-1], _reduction_identity(ufunc, x.dtype), x.dtype)
        return ufunc.reduce(flat, axis=-1, dtype=x.dtype if accumulate else None)

    def specialized(eqn):
        """The rule's last case for this equation, its reduced axes known: when they are the trailing ones, a
        contiguous operand is reshaped to ``(kept..., R)`` without :func:`_canonical`'s steps (the same array)."""
        aval, axes = eqn.invars[0].aval, tuple(sorted(eqn.params["axes"]))
        if _dtypes.is_extended(aval.dtype):
            return None
        dtype, ndim = np.dtype(aval.dtype), len(aval.shape)
        first = ndim - len(axes)
        if dtype in LOW_FLOATS or dtype.kind == "f" and ufunc in (np.maximum, np.minimum) \
                or axes != tuple(range(first, ndim)):
            return None
        flat_shape = (*aval.shape[:first], math.prod(aval.shape[first:]))
        if flat_shape[-1] == 0 and not accumulate:
            return None
        reduce_dtype = dtype if accumulate else None

        def reduce(x):
            return ufunc.reduce(x.reshape(flat_shape) if x.flags.c_contiguous else _canonical(x, axes), axis=-1,
                                dtype=reduce_dtype)
        return reduce

    rule.specialize = specialized
    per_device(name)(rule)

    vectorized(name)(lambda x, *, axes, out_sharding=None: by_devices(functools.partial(rule, axes=shift(axes)), x))


def _reduction_identity(ufunc, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return ufunc in (np.minimum, np.bitwise_and)
    if ufunc is np.bitwise_and:
        return np.asarray(-1).astype(dtype) if dtype.kind == "i" else np.iinfo(dtype).max
    if ufunc in (np.bitwise_or, np.bitwise_xor):
        return 0
    info = np.iinfo(dtype)
    return info.min if ufunc is np.maximum else info.max


def _reduce_float_extremum(x: np.ndarray, pick) -> np.ndarray:
    """The max (``pick`` = :func:`_float_max`) or min of ``x``'s last axis as XLA computes it: NaN if any
    element is NaN, -0.0 ordered below +0.0. NumPy's reduction where it is the same (not complex; rows whose
    result is NaN are folded again one element at a time, for the NaN's bits); a zero result takes its sign
    from the row's zeros."""
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf if pick is _float_max else np.inf, x.dtype)
    largest = pick is _float_max
    if x.dtype.kind == "c" or x.ndim == 0:
        return _fold_float_extremum(x, pick)
    out = np.asarray((np.maximum if largest else np.minimum).reduce(x, axis=-1))
    nan = np.isnan(out)
    if nan.any():
        out[nan] = _fold_float_extremum(x[nan], pick)
    zero = out == 0
    if zero.any():  # max: +0.0 if the row holds one, else -0.0; min: -0.0 if the row holds one, else +0.0
        rows = x[zero]
        wanted = ((rows == 0) & (np.signbit(rows) != largest)).any(axis=-1)
        out[zero] = np.where(wanted == largest, np.zeros((), x.dtype), -np.zeros((), x.dtype))
    return out


def _fold_float_extremum(x: np.ndarray, pick) -> np.ndarray:
    out = x[..., 0]
    for k in range(1, x.shape[-1]):
        out = pick(out, x[..., k])
    return np.asarray(out, x.dtype)


for _name, _ufunc in (("reduce_sum", np.add), ("reduce_prod", np.multiply), ("reduce_max", np.maximum),
                      ("reduce_min", np.minimum), ("reduce_and", np.bitwise_and), ("reduce_or", np.bitwise_or),
                      ("reduce_xor", np.bitwise_xor)):
    _reduction(_ufunc, _name)


def _argextremum(x, axis, index_dtype, largest: bool):
    if x.dtype.kind == "c":
        raise NotImplementedError("argmax/argmin of complex")
    if is_float(x.dtype):  # NaN wins (the first one); -0.0 and +0.0 tie (the first one)
        x32 = x.astype(np.float32) if x.dtype in LOW_FLOATS else x
        nan = np.isnan(x32)
        best = np.argmax(x32, axis=axis) if largest else np.argmin(x32, axis=axis)
        return np.where(nan.any(axis=axis), np.argmax(nan, axis=axis), best).astype(index_dtype)
    return (np.argmax(x, axis=axis) if largest else np.argmin(x, axis=axis)).astype(index_dtype)


both("argmax", vectorized_rule=lambda x, *, axes, index_dtype: _argextremum(x, axes[0] + 1, index_dtype, True))(
    lambda x, *, axes, index_dtype: _argextremum(x, axes[0], index_dtype, True))
both("argmin", vectorized_rule=lambda x, *, axes, index_dtype: _argextremum(x, axes[0] + 1, index_dtype, False))(
    lambda x, *, axes, index_dtype: _argextremum(x, axes[0], index_dtype, False))


def _cumulative(fn, name):
    def rule(x, *, axis, reverse):
        if x.dtype in LOW_FLOATS:
            return rule(x.astype(np.float32), axis=axis, reverse=reverse).astype(x.dtype)
        y = np.flip(x, axis) if reverse else x
        y = fn(y, axis)
        return (np.flip(y, axis) if reverse else y).astype(x.dtype)

    per_device(name)(rule)
    vectorized(name)(lambda x, *, axis, reverse: rule(x, axis=axis + 1, reverse=reverse))


def _accumulate_extremum(pick):
    def fn(x, axis):
        if x.dtype.kind != "f":
            return (np.maximum if pick is _float_max else np.minimum).accumulate(x, axis=axis)
        out = np.array(x, copy=True)
        moved = np.moveaxis(out, axis, 0)
        for k in range(1, moved.shape[0]):
            moved[k] = pick(moved[k - 1], moved[k])
        return out
    return fn


_cumulative(lambda x, a: np.cumsum(x, axis=a, dtype=x.dtype), "cumsum")
_cumulative(lambda x, a: np.cumprod(x, axis=a, dtype=x.dtype), "cumprod")
_cumulative(_accumulate_extremum(_float_max), "cummax")
_cumulative(_accumulate_extremum(_float_min), "cummin")
_cumulative(lambda x, a: np.logaddexp.accumulate(x, axis=a), "cumlogsumexp")


# -- the generic reduce: a reducer jaxpr, evaluated on whole arrays ---------------------------------------------

def eval_elementwise_jaxpr(jaxpr, consts, *args) -> list[np.ndarray]:
    """Evaluate a scalar jaxpr (a reducer, a selector) on arrays of any shape with the per-device rules: its
    equations are elementwise, so the same rules compute every element at once."""
    env = {}
    for v, a in zip(jaxpr.constvars, consts, strict=True):
        env[v] = np.asarray(a)
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a

    def read(v):
        return np.asarray(v.val, dtype=np.dtype(v.aval.dtype)) if not hasattr(v, "count") and hasattr(v, "val") \
            else env[v]

    for eqn in jaxpr.eqns:
        rule = PER_DEVICE.get(eqn.primitive.name)
        if rule is None:
            raise NotImplementedError(f"spmdsim has no NumPy rule for primitive {eqn.primitive.name!r} inside a "
                                      f"reducer (params {dict(eqn.params)})")
        invals = [read(v) for v in eqn.invars]
        ndim = max((x.ndim for x in invals), default=0)
        out = rule(*(expand_to(x, ndim) if x.ndim else x for x in invals), **eqn.params)
        outs = out if eqn.primitive.multiple_results else [out]
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = np.asarray(o)
    return [read(v) for v in jaxpr.outvars]


def _reduce_generic(*operands_and_inits, computation=None, jaxpr, dimensions):
    """lax.reduce with any reducer: a sequential fold over the reduced axes in row-major order."""
    n = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:n], operands_and_inits[n:]
    inner, consts = (jaxpr.jaxpr, jaxpr.consts) if hasattr(jaxpr, "consts") else (jaxpr, ())
    flat = [_canonical(x, dimensions) for x in operands]
    acc = [np.broadcast_to(np.asarray(i, x.dtype), f.shape[:-1]) for i, x, f in zip(inits, operands, flat,
                                                                                    strict=True)]
    for k in range(flat[0].shape[-1]):
        acc = eval_elementwise_jaxpr(inner, consts, *acc, *(f[..., k] for f in flat))
        acc = [np.asarray(a, x.dtype) for a, x in zip(acc, operands, strict=True)]
    return [np.array(np.broadcast_to(a, f.shape[:-1])) for a, f in zip(acc, flat, strict=True)]


per_device("reduce")(_reduce_generic)


@vectorized("reduce")
def _reduce_generic_v(*operands_and_inits, computation=None, jaxpr, dimensions):
    n = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:n], [np.asarray(i) for i in operands_and_inits[n:]]
    if all(i.size == 0 or (i == i.reshape(-1)[0]).all() for i in inits):  # the usual case: literal inits
        firsts = [i.reshape(-1)[0] for i in inits]
        return _reduce_generic(*operands, *firsts, jaxpr=jaxpr, dimensions=shift(dimensions))
    per_device = [_reduce_generic(*(x[d] for x in operands), *(i[d] for i in inits), jaxpr=jaxpr,
                                  dimensions=dimensions) for d in range(operands[0].shape[0])]
    return [np.stack(outs) for outs in zip(*per_device, strict=True)]


# -- dot_general: one canonical batched matmul for both twins ------------------------------------------------

def _dot_general_plan(lhs_shape, rhs_shape, dimension_numbers):
    """Transpositions and shapes that turn dot_general into a batched matmul: lhs to (batch, free,
    contracting), rhs to (batch, contracting, free), then the result to (batch, lhs free, rhs free)."""
    (lc, rc), (lb, rb) = dimension_numbers
    lf = [i for i in range(len(lhs_shape)) if i not in lb and i not in lc]
    rf = [i for i in range(len(rhs_shape)) if i not in rb and i not in rc]
    batch = [lhs_shape[i] for i in lb]
    size = lambda dims, shape: math.prod(shape[i] for i in dims)  # noqa: E731
    return ((*lb, *lf, *lc), (*batch, size(lf, lhs_shape), size(lc, lhs_shape)),
            (*rb, *rc, *rf), (*batch, size(rc, rhs_shape), size(rf, rhs_shape)),
            (*batch, *(lhs_shape[i] for i in lf), *(rhs_shape[i] for i in rf)))


def _precision(dtype) -> tuple:
    """XLA's order of types for a product of two (HigherPrecisionType, as JAX's dot_general dtype rule follows
    it): complex first, then exponent range, mantissa, width, signed before unsigned."""
    dtype = np.dtype(dtype)
    real = np.dtype(np.float32 if dtype == np.complex64 else np.float64) if dtype.kind == "c" else dtype
    floating = is_float(real) or real.name.startswith("float")
    info = ml_dtypes.finfo(real) if floating else None
    return (dtype.kind == "c", info.maxexp if floating else -1, info.nmant if floating else -1,
            1 if real == np.bool_ else bit_width(real), not (real.kind == "u" or real.name.startswith("uint")))


def product_dtypes(lhs_dtype, rhs_dtype, preferred_element_type) -> tuple[np.dtype, np.dtype]:
    """(compute dtype, result dtype) of a dot_general or convolution: float16/bfloat16 computed in float32 and
    bool in int32, as XLA:CPU does; the result in ``preferred_element_type`` or, for operands of two types,
    the one of higher precision in XLA's order (:func:`_precision`; NumPy has no common type for bfloat16 and
    an integer, and JAX's is another)."""
    lhs_dtype, rhs_dtype = np.dtype(lhs_dtype), np.dtype(rhs_dtype)
    out = np.dtype(preferred_element_type) if preferred_element_type is not None else lhs_dtype \
        if lhs_dtype == rhs_dtype else max(lhs_dtype, rhs_dtype, key=_precision)
    if out in LOW_FLOATS:
        return np.dtype(np.float32), out
    if out == np.bool_:
        return np.dtype(np.int32), out
    return out, out


def c_slices(x: np.ndarray, leading: int = 0) -> np.ndarray:
    """``x`` with its axes after the ``leading`` ones C-contiguous: ``x`` itself where they are, else a copy; a
    broadcast leading axis (stride 0: a value replicated over the devices) stays broadcast. A product's operands
    pass through here before they are transposed, so that the layout of each matrix slice, and with it BLAS's
    kernel and result, depends on shapes only: never on how the value was made or how many slices are batched."""
    expected = x.itemsize
    contiguous = True
    for size, stride in zip(reversed(x.shape[leading:]), reversed(x.strides[leading:])):
        contiguous &= size == 1 or stride == expected
        expected *= size
    if contiguous:
        return x
    index = tuple(slice(0, 1) if stride == 0 else slice(None) for stride in x.strides[:leading])
    return np.broadcast_to(np.ascontiguousarray(x[index]), x.shape)


def _blas_readable(x: np.ndarray) -> np.ndarray:
    """``x``, or a C-order copy where BLAS cannot read its matrix slices in place (NumPy's rule: unit stride
    along one of the two axes, the other stride at least the row length)."""
    if x.ndim < 2:
        return x
    (rows, cols), (row_stride, col_stride), size = x.shape[-2:], x.strides[-2:], x.itemsize
    readable = (col_stride == size and row_stride % size == 0 and row_stride // size >= cols) or \
        (row_stride == size and col_stride % size == 0 and col_stride // size >= rows)
    return x if readable else np.ascontiguousarray(x)


SPREAD_FLOPS = 1 << 22  # a product this large runs on every CPU (see matmul_slices): about a millisecond


def matmul_slices(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(..., M, K) @ (..., K, N)`` as one BLAS call per ``(M, K) @ (K, N)`` slice, read in place where BLAS can
    (a transposed view, a broadcast batch axis) and from a C-order copy where it cannot. The kernel BLAS picks
    for a slice depends on the slice's layout (small products' results differ in the last bits between a
    transposed and a copied operand), so callers hand in views of :func:`c_slices` operands: a slice's result
    then never depends on how many slices there are or on which executor made the operands.

    A large product (``SPREAD_FLOPS``) uses every CPU (:func:`spmdsim.runtime._threads.in_parallel`): in a device thread,
    that thread leaves the lanes' one CPU while BLAS runs; elsewhere (the vectorized executor), the slices are
    split over the CPUs, each part one thread's BLAS calls (BLAS itself runs one thread per device there, see
    :mod:`spmdsim.runtime._blas`: its own pools spin and stall when a CPU is busy)."""
    a, b = _blas_readable(np.asarray(a)), _blas_readable(np.asarray(b))
    if a.shape[-1] == 0:
        return np.zeros((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]),
                        np.result_type(a, b))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if 2 * math.prod(batch) * a.shape[-2] * a.shape[-1] * b.shape[-1] < SPREAD_FLOPS:
        return np.matmul(a, b)
    out = _buffers.empty((*batch, a.shape[-2], b.shape[-1]), np.result_type(a, b), faulted=True)
    cut = [x.ndim == len(batch) + 2 and x.shape[0] > 1 for x in (a, b)]

    def part(lo: int, hi: int) -> None:
        if batch:
            np.matmul(*(x[lo:hi] if c else x for x, c in zip((a, b), cut)), out=out[lo:hi])
        else:
            np.matmul(a, b, out=out)
    _threads.in_parallel(part, batch[0] if batch else 1, cpus=_blas.cpus())
    return out


def _same_type(lhs: np.ndarray, rhs: np.ndarray, out_dtype) -> tuple[np.ndarray, np.ndarray]:
    """Operands of two types both converted to the result type first, as JAX lowers dot_general for XLA:CPU
    (bfloat16 x int16 is a bfloat16 product, with a preferred int32 an int32 one: the floats truncated)."""
    if lhs.dtype == rhs.dtype:
        return lhs, rhs
    return _convert_element_type(lhs, new_dtype=out_dtype), _convert_element_type(rhs, new_dtype=out_dtype)


def _dot_general_with(plan, compute, out_dtype, leading: int = 0):
    lhs_perm, lhs_shape, rhs_perm, rhs_shape, out_shape = plan
    lead = tuple(range(leading))
    lhs_perm = lead + tuple(p + leading for p in lhs_perm)
    rhs_perm = lead + tuple(p + leading for p in rhs_perm)

    def dot(lhs, rhs):
        lhs, rhs = _same_type(lhs, rhs, out_dtype)
        n = lhs.shape[:leading]
        lhs, rhs = c_slices(lhs, leading), c_slices(rhs, leading)
        a = np.transpose(lhs, lhs_perm).astype(compute, copy=False).reshape((*n, *lhs_shape))
        b = np.transpose(rhs, rhs_perm).astype(compute, copy=False).reshape((*n, *rhs_shape))
        return matmul_slices(a, b).reshape((*n, *out_shape)).astype(out_dtype, copy=False)
    return dot


def _specialize_dot_general(eqn):
    """The per-device product of this equation, with the steps that do nothing for its operands' shapes and
    dtypes (an identity transposition, a cast to the same dtype, a reshape to the same shape) left out: the same
    operations on the same values as :func:`_dot_general_with`."""
    lhs, rhs = (v.aval for v in eqn.invars)
    compute, out_dtype = product_dtypes(np.dtype(lhs.dtype), np.dtype(rhs.dtype),
                                        eqn.params.get("preferred_element_type"))
    if np.dtype(lhs.dtype) != np.dtype(rhs.dtype):  # operands converted first: the general rule
        return None
    lhs_perm, lhs_shape, rhs_perm, rhs_shape, out_shape = _dot_general_plan(lhs.shape, rhs.shape,
                                                                             eqn.params["dimension_numbers"])

    def prepare(aval, perm, shape):
        transposed = tuple(aval.shape[p] for p in perm)
        return (None if perm == tuple(range(len(perm))) else perm, None if np.dtype(aval.dtype) == compute else compute,
                None if transposed == shape else shape)
    (lt, lc, ls), (rt, rc, rs) = prepare(lhs, lhs_perm, lhs_shape), prepare(rhs, rhs_perm, rhs_shape)
    product_shape = (*lhs_shape[:-1], rhs_shape[-1])
    reshape_out = None if product_shape == out_shape else out_shape
    cast_out = None if compute == out_dtype else out_dtype

    def dot(a, b):
        out = matmul_slices(_shaped(c_slices(a), lt, lc, ls), _shaped(c_slices(b), rt, rc, rs))
        if reshape_out is not None:
            out = out.reshape(reshape_out)
        return out if cast_out is None else out.astype(cast_out)
    return dot


def _shaped(x: np.ndarray, perm: tuple | None, dtype: np.dtype | None, shape: tuple | None) -> np.ndarray:
    """``x`` transposed by ``perm``, cast to ``dtype`` and reshaped to ``shape``, each step only if given."""
    if perm is not None:
        x = x.transpose(perm)
    if dtype is not None:
        x = x.astype(dtype)
    return x if shape is None else x.reshape(shape)


@per_device("dot_general")
@specialize(_specialize_dot_general)
def _dot_general(lhs, rhs, *, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None,
                 **_):
    """As a batched matmul: lhs to (batch, free, contracting), rhs to (batch, contracting, free)."""
    plan = _dot_general_plan(lhs.shape, rhs.shape, dimension_numbers)
    return _dot_general_with(plan, *product_dtypes(lhs.dtype, rhs.dtype, preferred_element_type))(lhs, rhs)


@vectorized("dot_general")
def _dot_general_v(lhs, rhs, *, dimension_numbers, precision=None, preferred_element_type=None,
                   out_sharding=None, **_):
    """The per-device product with the device axis as an outer batch axis of the same matmul slices."""
    plan = _dot_general_plan(lhs.shape[1:], rhs.shape[1:], dimension_numbers)
    dot = _dot_general_with(plan, *product_dtypes(lhs.dtype, rhs.dtype, preferred_element_type), leading=1)
    n = max(lhs.shape[0], rhs.shape[0])
    return dot(np.broadcast_to(lhs, (n, *lhs.shape[1:])), np.broadcast_to(rhs, (n, *rhs.shape[1:])))


# -- sorting ---------------------------------------------------------------------------------------------------

def _sort_keys(x: np.ndarray) -> list[np.ndarray]:
    """JAX's sort comparator on one operand, as lexicographic unsigned keys: floats with -0.0 = +0.0 and every
    NaN equal and last; complex numbers by (real, imaginary)."""
    if x.dtype.kind == "c":
        return _sort_keys(np.real(x)) + _sort_keys(np.imag(x))
    if is_float(x.dtype):
        canonical = np.where(x == 0, np.zeros((), x.dtype), x)
        canonical = np.where(np.isnan(canonical), np.asarray(np.nan, x.dtype), canonical).astype(x.dtype)
        return [_ordered_key(canonical)]
    return [_ordered_key(x)]


def sort_order(keys: list[np.ndarray], axis: int) -> np.ndarray:
    """The stable ascending order along ``axis`` of lexicographic keys (first key most significant)."""
    moved = [np.moveaxis(k, axis, -1) for k in keys]
    if len(moved) == 1:
        order = np.argsort(moved[0], axis=-1, kind="stable")
    else:
        order = np.lexsort(tuple(reversed(moved)), axis=-1)
    return np.moveaxis(order, -1, axis)


@per_device("sort")
def _sort(*operands, dimension, is_stable, num_keys):
    keys = [k for x in operands[:num_keys] for k in _sort_keys(x)]
    order = sort_order(keys, dimension)
    return [np.take_along_axis(o, order, axis=dimension) for o in operands]


vectorized("sort")(lambda *operands, dimension, is_stable, num_keys: _sort(
    *operands, dimension=dimension + 1, is_stable=is_stable, num_keys=num_keys))


def _top(x, k, axis, largest: bool):
    """The first k along ``axis`` in XLA's order (total order, descending for top_k; ties: lower index)."""
    key = _ordered_key(x)
    key = ~key if largest else key
    order = np.take(np.argsort(np.moveaxis(key, axis, -1), axis=-1, kind="stable"), np.arange(k), axis=-1)
    order = np.moveaxis(order, -1, axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int32)]


@per_device("top_k")
def _top_k(x, *, k, axis=-1, **_):
    return _top(x, int(k), axis % x.ndim, True)


vectorized("top_k")(lambda x, *, k, axis=-1, **_: _top(x, int(k), axis % (x.ndim - 1) + 1, True))


def _approx_top_k_size(x_shape, k, reduction_dimension, recall_target, aggregate_to_topk,
                       reduction_input_size_override) -> int:
    if aggregate_to_topk:
        return int(k)
    from spmdsim.jax._internals import jaxlib_ext as _jax

    size = x_shape[reduction_dimension]
    return int(_jax.approx_top_k_reduction_output_size(size, len(x_shape), int(k), recall_target, aggregate_to_topk,
                                                       reduction_input_size_override)[0])


@per_device("approx_top_k")
def _approx_top_k(x, *, k, reduction_dimension, recall_target, is_max_k, reduction_input_size_override,
                  aggregate_to_topk):
    """XLA:CPU's fallback: an exact sort along the reduction dimension, the first entries kept."""
    axis = reduction_dimension % x.ndim
    size = _approx_top_k_size(x.shape, k, axis, recall_target, aggregate_to_topk, reduction_input_size_override)
    return _top(x, size, axis, bool(is_max_k))


@vectorized("approx_top_k")
def _approx_top_k_v(x, *, k, reduction_dimension, recall_target, is_max_k, reduction_input_size_override,
                    aggregate_to_topk):
    axis = reduction_dimension % (x.ndim - 1)
    size = _approx_top_k_size(x.shape[1:], k, axis, recall_target, aggregate_to_topk,
                              reduction_input_size_override)
    return _top(x, size, axis + 1, bool(is_max_k))


# -- jax.debug.print and jax.debug.callback: run per device on concrete values -------------------------------
# What they print goes through spmdsim's ordered output: labelled with the device and released in device
# order at each rendezvous. They have no vectorized rule on purpose: a callback is a per-device side effect (a
# print per device, a user function called once per device with that device's values, in device order), which
# a stacked evaluation cannot reproduce; the vectorized executor reports them as unsupported.

@per_device("debug_print")
def _debug_print(*args, fmt, in_tree, static_args=(), np_printoptions=(), **_):
    import jax

    positional, keywords = jax.tree_util.tree_unflatten(in_tree, list(args))
    positional = list(positional)
    for index, value in static_args:
        positional.insert(index, value)
    with np.printoptions(**dict(np_printoptions)):
        print(fmt.format(*positional, **keywords))
    return []
