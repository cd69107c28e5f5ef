"""NumPy rules for JAX's elementwise arithmetic: unary and binary math, comparisons, bitwise operations and shifts,
``select_n`` and ``clamp``, with float16 and bfloat16 rounded after every step as XLA:CPU rounds them. The conventions every rule keeps are :mod:`._elementwise`'s.
"""
from __future__ import annotations

import numpy as np

from spmdsim.jax.numerics import _libm, _xla_cpu_isa, _xla_cpu_math, _xla_cpu_math64, _xla_cpu_probe, _xla_cpu_scalar
from spmdsim.jax.evaluation._registry import PER_DEVICE, specialize
from spmdsim.jax.rules._elementwise import LOW_FLOATS, _operand_dtype, elementwise, is_float, via_f32
from spmdsim.jax.rules._scipy import special, special_function


# -- elementwise -----------------------------------------------------------------------------------------

def _rsqrt(x):
    """float64 as XLA:CPU computes it (:func:`._xla_cpu_math64.rsqrt64`); complex as ``1 / sqrt(x)``."""
    if x.dtype == np.float64:
        return _xla_cpu_math64.rsqrt64(x)
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


_ONE_BY_ONE = 16  # up to this many values, a port's one-value form value by value (~3 us each; the port ~50-110)


def _xla_float32(port, other):
    """float32 (and float16/bfloat16 through it) by XLA:CPU's own algorithm (:mod:`._xla_cpu_math`; one value
    by its Python-float form where there is one, :mod:`._xla_cpu_scalar`: the same bits); other dtypes (float64,
    complex) by ``other``."""
    one = _xla_cpu_scalar.SCALAR.get(port.__name__)

    def fn(x):
        if x.dtype != np.float32:
            return other(x)
        if one is not None and x.size <= _ONE_BY_ONE:
            values = [one(v) for v in x.ravel().tolist()]
            if None not in values:
                return np.array(values, np.float32).reshape(x.shape)
        return port(x)
    fn.__name__ = port.__name__
    return fn


def _c_library(symbol, other):
    """float32 and float64 as XLA:CPU computes them, by calling the C library's ``symbol`` (``symbolf``) as it
    does (:func:`._libm.call`); other dtypes (complex) by ``other``."""
    def fn(*xs):
        if xs[0].dtype in (np.float32, np.float64):
            return _libm.call(symbol, *xs, fallback=other)
        return other(*xs)
    fn.__name__ = symbol
    return fn


_atan_c_library = _c_library("atan", np.arctan)


def _log(x):
    """float64: the C library's ``log``, as XLA:CPU calls it (:func:`._libm.log64`); complex: NumPy's."""
    return _libm.log64(x) if x.dtype == np.float64 else np.log(x)


def _atan(x):
    """jaxlib 0.10 and 0.11 (or none): the C library's ``atan`` (:mod:`._libm`), which XLA:CPU calls on arrays of
    50 elements or more (jaxlib 0.10: smaller arrays and the last ``n % 4`` elements by its own code, within an
    ulp); jaxlib 0.12: XLA's own code (:func:`._xla_cpu_math64.atan`); complex: NumPy's."""
    minor = _xla_cpu_isa.jaxlib_minor()
    if minor is not None and minor >= (0, 12) and x.dtype in (np.float32, np.float64):
        return _xla_cpu_math64.atan(x)
    return _atan_c_library(x)


def _float64_port(port, other, jaxlibs=None):
    """float64 by XLA:CPU's own algorithm ``port`` (:mod:`._xla_cpu_math64`) where the installed jaxlib computes it
    so (``jaxlibs``: a predicate of its ``(major, minor)``; None: every one measured), other dtypes and jaxlibs
    by ``other``."""
    def fn(x):
        minor = _xla_cpu_isa.jaxlib_minor()
        if x.dtype == np.float64 and (jaxlibs is None or minor is None or jaxlibs(minor)):
            return port(x)
        return other(x)
    fn.__name__ = f"{port.__name__}_or_{getattr(other, '__name__', 'other')}"
    return fn


_UNARY_XLA = {
    "exp": (_xla_cpu_math.exp, _float64_port(_xla_cpu_math64.exp64, np.exp)), "log": (_xla_cpu_math.log, _log),
    "log1p": (_xla_cpu_math.log1p, _float64_port(_xla_cpu_math64.log1p64, _log1p)),
    "tanh": (_xla_cpu_math.tanh, _float64_port(_xla_cpu_math64.tanh64, np.tanh)),
    "erf": (_xla_cpu_math.erf, _c_library("erf", special_function("erf"))),
    "erfc": (_xla_cpu_math.erfc, _float64_port(_xla_cpu_math64.erfc64, special_function("erfc"))),
    "expm1": (_xla_cpu_math.expm1, _float64_port(_xla_cpu_math64.expm1_64, np.expm1, lambda v: v < (0, 12))),
    "rsqrt": (_xla_cpu_math.rsqrt, _rsqrt), "sin": (_xla_cpu_math.sin, np.sin), "cos": (_xla_cpu_math.cos, np.cos),
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
    "tan": _c_library("tan", np.tan), "atan": _atan,
    "sqrt": np.sqrt, "cbrt": _c_library("cbrt", np.cbrt), "abs": _abs, "real": np.real, "imag": np.imag,
    "conj": lambda x: np.conj(x) if x.dtype.kind == "c" else np.asarray(x, np.result_type(x, np.complex64)),
    "square": np.square, "sign": _sign,
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
    "add": np.add, "add_any": np.add, "sub": np.subtract, "mul": _multiply, "atan2": _c_library("atan2", np.arctan2),
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

_logistic32 = _xla_float32(_xla_cpu_math.logistic, None)


def _logistic_wide(x):
    if x.dtype == np.float32:
        return _logistic32(x)
    if x.dtype == np.float64:  # XLA's LogisticExpander, with its float64 exp
        return _xla_cpu_math.flush_subnormals(1 / (1 + PER_DEVICE["exp"](-x)))
    if x.dtype.kind == "f":
        return np.asarray(special.expit(x), x.dtype)
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


# The inverse and hyperbolic functions as CHLO decomposes them (read from XLA:CPU's HLO before optimization, jaxlib
# 0.10.2), each step by its own rule (the C library's atan2 and log, XLA's exp, expm1, log1p): bit for bit in
# float32 and float64 where those steps are (a product feeding an add inside the fused loop is fused only where
# LLVM fuses it: a product with one use; ``x^2 + 1`` in asinh has two). float16 and bfloat16: in float32 (CHLO
# upcasts them), rounded once. Complex: NumPy's.

def _chlo(decomposition, numpy_fn):
    def fn(x):
        return decomposition(x, x.dtype.type) if x.dtype in (np.float32, np.float64) else numpy_fn(x)
    fn.__name__ = decomposition.__name__
    return fn


def _asin(x, c):
    """``2 atan2(x, 1 + sqrt((1 - x)(1 + x)))``"""
    a = PER_DEVICE["atan2"](x, np.sqrt((c(1) - x) * (x + c(1))) + c(1))
    return a + a


def _acos(x, c):
    """``atan2(sqrt((1 - x)(1 + x)), x)``"""
    return PER_DEVICE["atan2"](np.sqrt((c(1) - x) * (x + c(1))), x)


def _sinh(x, c):
    """``(e + e / (e + 1)) / 2`` with ``e = expm1(x)`` below |x| = 1, ``exp(x - log 2) - exp(-log 2 - x)`` beyond."""
    e = PER_DEVICE["expm1"](x)
    log2 = c(-0.693147182) if c is np.float32 else c(-0.69314718055994529)
    big = PER_DEVICE["exp"](x + log2) - PER_DEVICE["exp"](log2 - x)
    return np.where(np.abs(x) < c(1), (e + e / (e + c(1))) * c(0.5), big).astype(c)


def _cosh(x, c):
    """``exp(x - log 2) + exp(-log 2 - x)``"""
    log2 = c(-0.693147182) if c is np.float32 else c(-0.69314718055994529)
    return PER_DEVICE["exp"](x + log2) + PER_DEVICE["exp"](log2 - x)


def _asinh(x, c):
    """``sign(x) log1p(|x| + x^2 / (sqrt(x^2 + 1) + 1))``, ``sign(x) (log |x| + log 2)`` from sqrt(max)."""
    a = np.abs(x)
    a2 = a * a
    small = PER_DEVICE["log1p"](a + a2 / (np.sqrt(a2 + c(1)) + c(1)))
    big = PER_DEVICE["log"](a) + c(0.693147182 if c is np.float32 else 0.69314718055994529)
    return (_sign(x) * np.where(a >= np.sqrt(np.finfo(c).max), big, small)).astype(c)


def _acosh(x, c):
    """``log1p(sqrt(x - 1) (sqrt(x + 1) + sqrt(x - 1)))``, ``log x + log 2`` from max / 2."""
    root = np.sqrt(x - c(1))
    small = PER_DEVICE["log1p"](root * (np.sqrt(x + c(1)) + root))
    big = PER_DEVICE["log"](x) + c(0.693147182 if c is np.float32 else 0.69314718055994529)
    return np.where(x >= np.finfo(c).max / c(2), big, small).astype(c)


def _atanh(x, c):
    """``(log1p(x) - log1p(-x)) / 2``, NaN beyond |x| = 1, as one fused loop computes it
    (:func:`._xla_cpu_math.atanh`, :func:`._xla_cpu_math64.atanh64`)."""
    return _xla_cpu_math.atanh(x) if c is np.float32 else _xla_cpu_math64.atanh64(x)


for _name, _decomposition, _numpy_fn in (("asin", _asin, np.arcsin), ("acos", _acos, np.arccos),
                                         ("sinh", _sinh, np.sinh), ("cosh", _cosh, np.cosh),
                                         ("asinh", _asinh, np.arcsinh), ("acosh", _acosh, np.arccosh),
                                         ("atanh", _atanh, np.arctanh)):
    elementwise(_name)(via_f32(_chlo(_decomposition, _numpy_fn)))


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


#: NumPy's own integer dtypes -> the mask of their bits (two's complement: ``int(x) & mask`` is the unsigned value)
_MASK = {np.dtype(t): (1 << 8 * np.dtype(t).itemsize) - 1 for t in (np.int8, np.int16, np.int32, np.int64,
                                                                    np.uint8, np.uint16, np.uint32, np.uint64)}


def _int_scalars(*xs) -> bool:
    """Whether every operand is one value (0-d) of one of NumPy's own integer dtypes (not ml_dtypes' sub-byte
    ones): the rule then computes in Python ints, ~1 us against 5-20 us of NumPy calls on 0-d arrays (a sampler's
    loop counters and tree bookkeeping). The same values as the array form."""
    dtype = xs[0].dtype
    return dtype in _MASK and all(x.ndim == 0 and x.dtype == dtype for x in xs)


def _may_hold_negative_zero(x) -> bool:
    """Whether ``x`` holds a -0.0 (one pass over its bits; True for dtypes not checked)."""
    x = np.asarray(x)
    sign = _SIGN_BIT.get(x.dtype)
    return sign is None or bool((x.view(sign.dtype) == sign).any())


def _zeros_to_order(x, y, out) -> bool:
    """Whether ``max``/``min``'s result ``out`` may need its zeros put in XLA's order (-0.0 below +0.0; NumPy keeps
    either zero): only where both operands are zeros and one is -0.0. A few values: whether ``out`` has a zero
    (one check); more: whether an operand holds a -0.0 (ReLU's inputs rarely do, and ReLU's results are zeros)."""
    if not is_float(out.dtype):
        return False
    if out.size <= 16:
        return bool((out == 0).any())
    return _may_hold_negative_zero(x) or _may_hold_negative_zero(y)


def _float_max(x, y):
    if np.result_type(x, y).kind == "c":
        return _complex_pick(x, y, True)
    out = np.maximum(x, y)
    if _zeros_to_order(x, y, out):
        out = np.where((x == 0) & (y == 0), x + y, out)
    return out


def _float_min(x, y):
    if np.result_type(x, y).kind == "c":
        return _complex_pick(x, y, False)
    out = np.minimum(x, y)
    if _zeros_to_order(x, y, out):
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
    if _int_scalars(x, y):  # C's remainder takes the dividend's sign; x % 0 is x, INT_MIN % -1 is 0
        a, b = int(x), int(y)
        r = a if b == 0 else abs(a) % abs(b) * (-1 if a < 0 else 1)
        return np.asarray(r, x.dtype)
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
    XLA:CPU computes it; float64: Giles' double-precision one (:func:`._xla_cpu_math64.erf_inv64`)."""
    if x.dtype == np.float64:
        return _xla_cpu_math64.erf_inv64(x)
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
    if _int_scalars(x):
        return np.asarray(bin(int(x) & _MASK[x.dtype]).count("1"), x.dtype)
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
    if _int_scalars(x, y):
        amount = int(y)
        value = (int(x) & _MASK[x.dtype]) >> amount if 0 <= amount < bits else 0
        return np.asarray(value, np.dtype(f"u{x.dtype.itemsize}")).view(x.dtype)
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    ok = _shift_amount_ok(y, bits)
    shifted = np.right_shift(np.asarray(x, order="C").view(unsigned), np.where(ok, y, 0).astype(unsigned))
    return np.where(ok, shifted, 0).astype(unsigned).view(x.dtype)


@elementwise("shift_right_arithmetic")
def _shift_right_arithmetic(x, y):
    bits = x.dtype.itemsize * 8
    if _int_scalars(x, y):
        amount, value = int(y), int(x) & _MASK[x.dtype]
        signed = value - (1 << bits) if value >> (bits - 1) else value
        return np.asarray(signed >> (amount if 0 <= amount < bits else bits - 1),
                          np.dtype(f"i{x.dtype.itemsize}")).view(x.dtype)
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
    if which.ndim == 0 and all(c.shape == cases[0].shape and c.dtype == cases[0].dtype for c in cases):
        # one predicate for the whole operand: the case itself (a program writes into a result only where nothing
        # else holds it, see _compiled._donating); two cases: any nonzero predicate is the second, as np.where reads it
        k = bool(which) if len(cases) == 2 else int(which)
        if 0 <= k < len(cases):
            return cases[k]
    if len(cases) == 2:  # np.where broadcasts the three itself; a boolean predicate is read as it is
        return np.where(which.astype(bool, copy=False), cases[1], cases[0])
    shape = np.broadcast_shapes(which.shape, *(c.shape for c in cases))
    return np.choose(np.broadcast_to(which, shape).astype(np.intp), [np.broadcast_to(c, shape) for c in cases])


@elementwise("clamp")
def _clamp(lo, x, hi):
    return np.asarray(_float_min(_float_max(x, lo), hi), dtype=x.dtype)
