"""Functions that XLA:CPU leaves to the C library, computed by the same library.

Measured with jaxlib 0.10.2, 0.11.2 and 0.12.0.1 on glibc 2.36 (every result bit for bit against the C library
called directly, random operands of every array length 1-69 and 100-4096): float32 and float64 ``pow``,
``tan``, ``atan2`` and ``cbrt`` (XLA's emitter writes ``cbrt`` as a call of ``cbrt``/``cbrtf``), float64 ``erf``
and ``log``, and ``atan`` wherever XLA calls ``atan``/``atanf`` (it writes ``atan(x)`` as ``atan2(x, 1)``, which
LLVM turns into ``atan``; on arrays of 3 to about 70 elements it inlines other vector code instead, within an
ulp of ``atan``: not modelled). float32 ``sin``/``cos`` are in :mod:`._xla_cpu_math` (screened by the float64
value, as :func:`powf` is). :func:`call` is any of them, element by element.

XLA:CPU emits some elementwise functions as calls to the C math library that the process links (glibc's
``libm`` on Linux): measured with jax 0.10.2 on glibc 2.36, ``lax.pow`` of float32 (and of float16/bfloat16,
upcast to float32) is ``powf`` and of float64 ``pow``, on every value tried (10⁶). NumPy's ``np.power`` is
not: its SIMD loops give other roundings (20% of float32 values differ from XLA's by an ulp), and which loop
runs depends on the arrays' lengths and layout (``np.power(3f, .5f)`` is ``1.7320508`` alone and
``1.7320509`` in a vector of 16), so the thread and vectorized executors could disagree.

:func:`powf` is ``powf`` of every element, fast: the float64 power rounded to float32 is ``powf``'s result
wherever the float64 value lies more than :data:`WINDOW` of an ulp from a float32 rounding midpoint (the
float64 value is within a few float64 ulps of the exact one, and ``powf``'s own error before its final
rounding was below 0.0015 ulp on 10⁶ random operands: a margin of 20×); the few elements nearer a midpoint
(about 6%), and every special case (zero, subnormal, infinite or NaN results, non-positive or non-finite
operands), are ``powf`` itself, called through :mod:`ctypes`. :func:`pow64` calls ``pow`` on every element
(there is no wider type to screen with). Each element's result depends on its operands only, never on the
array's length or layout. Where no C library can be loaded, NumPy's power is used and the difference is
NumPy's.

:func:`power` is the rule for real floats: XLA:CPU runs with denormals flushed (FTZ/DAZ), so subnormal
results are zeros of their sign and subnormal operands count as zeros. (Under DAZ the C library's own
handling of a subnormal base goes astray in XLA: ``pow(1e-40f, 0.5f)`` is ``2.6e-23`` there, not ``1e-20``
or 0; spmdsim gives 0, its one documented difference here.)
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from spmdsim.jax.numerics._xla_cpu_math import flush_subnormals

__all__ = ["power", "powf", "pow64", "call", "log64", "WINDOW", "available"]

# Distance from a float32 rounding midpoint, in float32 ulps, under which powf itself is called.
WINDOW = 1 / 32


@functools.lru_cache(maxsize=None)
def _libm():
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def _ufunc(symbol: str, ctype, nargs: int = 2):
    """``symbol`` of the C library as a NumPy object ufunc of ``nargs`` arguments, or None without a C library."""
    lib = _libm()
    fn = getattr(lib, symbol, None) if lib is not None else None
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctype, [ctype] * nargs
    return np.frompyfunc(fn, nargs, 1)


def available() -> bool:
    """Whether the C library's ``powf`` and ``pow`` were found (else NumPy's power stands in)."""
    return _ufunc("powf", ctypes.c_float) is not None and _ufunc("pow", ctypes.c_double) is not None


def _call(symbol: str, ctype, dtype, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    fn = _ufunc(symbol, ctype)
    if fn is None:
        return np.power(x, y)
    return np.asarray(fn(x, y), dtype=object).astype(dtype).reshape(np.broadcast_shapes(x.shape, y.shape))


_CTYPES = {np.dtype(np.float32): (ctypes.c_float, "f"), np.dtype(np.float64): (ctypes.c_double, "")}


# Functions that return a tiny operand itself (tan(x) = atan(x) = x): no arithmetic, so XLA's FTZ/DAZ never
# touch it, and a subnormal operand is its own result in XLA too.
_OPERAND_RETURNED = frozenset({"tan", "atan"})


def call(symbol: str, *xs: np.ndarray, fallback=None) -> np.ndarray:
    """The C library's float64 function ``symbol`` (``tan``, ``atan``, ``atan2``, ``cbrt``, ``erf``, ``log``), or
    its float32 twin (``tanf``, ...) where the first operand is float32, of every element of the operands
    (broadcast; converted to the first one's dtype), as XLA:CPU computes it: for ``atan2``, ``cbrt``, ``erf`` and
    ``log`` subnormal operands count as zeros of their sign and subnormal results are flushed (XLA's FTZ/DAZ);
    ``tan`` and ``atan`` return a subnormal operand itself, as in XLA. Not modelled: what glibc's code computes
    under DAZ from a subnormal operand where it is not treated as zero (float32 ``cbrt`` of any subnormal is
    -5.6e-16 in XLA, ±0 here; ``atan2`` of two subnormals). About 0.3-0.5 µs per element (one call each).
    ``fallback(*xs)``, NumPy's function, where no C library can be loaded. Raises KeyError for other dtypes."""
    dtype = np.asarray(xs[0]).dtype
    ctype, suffix = _CTYPES[dtype]
    flush = (lambda v: v) if symbol in _OPERAND_RETURNED else flush_subnormals
    xs = [flush(np.asarray(x, dtype)) for x in xs]
    fn = _ufunc(symbol + suffix, ctype, len(xs))
    with np.errstate(all="ignore"):
        if fn is None:
            return fallback(*xs)
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        out = np.asarray(fn(*xs), dtype=object).astype(dtype).reshape(shape)
    return flush(out)


# Distance from a float64 rounding midpoint, in float64 ulps, under which log64 calls ``log`` itself: glibc's
# ``log`` (ARM's optimized-routines algorithm, 0.52 ulp) was within 0.016 ulp of the long double value at every
# element where the two rounded differently (393,216 operands over 1e-35 to 1e35).
LOG_WINDOW = 1 / 8


def log64(x: np.ndarray) -> np.ndarray:
    """float64 ``log`` as XLA:CPU computes it, the C library's ``log`` (see :func:`call`), without a call per
    element where NumPy's long double has 64 significant bits: the long double logarithm rounded to float64
    wherever it lies at least :data:`LOG_WINDOW` of an ulp from a float64 rounding midpoint, ``log`` itself
    elsewhere (about one element in six) and at zero, negative, subnormal, infinite or NaN operands."""
    x = flush_subnormals(np.asarray(x, np.float64))
    if np.finfo(np.longdouble).nmant < 63:
        return np.where(x < 0, np.nan, call("log", x, fallback=np.log))
    with np.errstate(all="ignore"):
        wide = np.log(x.astype(np.longdouble))
        out = wide.astype(np.float64)
        narrow = out.astype(np.longdouble)
        other = np.nextafter(out, np.where(wide >= narrow, np.inf, -np.inf)).astype(np.longdouble)
        distance = np.abs(wide - (narrow + other) / 2) / np.abs(other - narrow)
    exact = (distance >= LOG_WINDOW) & (x > 0) & np.isfinite(x)
    if exact.all():
        return out
    out = np.array(out, copy=True)
    rest = ~exact
    out[rest] = call("log", x[rest], fallback=np.log)
    return np.where(x < 0, np.nan, out)  # glibc's NaN of a negative operand is -NaN; XLA's is NaN


def pow64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The C library's ``pow`` of float64 ``x`` and ``y`` (broadcast), element by element."""
    return _call("pow", ctypes.c_double, np.float64, np.asarray(x, np.float64), np.asarray(y, np.float64))


def powf(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The C library's ``powf`` of float32 ``x`` and ``y`` (broadcast): float32, bit for bit what XLA:CPU's
    ``lax.pow`` gives for float32 operands."""
    x, y = np.broadcast_arrays(np.asarray(x, np.float32), np.asarray(y, np.float32))
    with np.errstate(all="ignore"):
        wide = np.power(x.astype(np.float64), y.astype(np.float64))
        out = wide.astype(np.float32)
        up = np.nextafter(out, np.float32(np.inf)).astype(np.float64)
        down = np.nextafter(out, np.float32(-np.inf)).astype(np.float64)
        narrow = out.astype(np.float64)
        midpoint = np.where(wide >= narrow, (narrow + up) / 2, (narrow + down) / 2)
        distance = np.abs(wide - midpoint) / (up - narrow)
    tiny = np.finfo(np.float32).tiny
    exact = (np.isfinite(distance) & (distance >= WINDOW) & (np.abs(out) >= tiny) & np.isfinite(out)
             & (x > 0) & np.isfinite(x) & np.isfinite(y))
    if exact.all():
        return out
    rest = ~exact
    out = np.array(out, copy=True)
    out[rest] = _call("powf", ctypes.c_float, np.float32, x[rest], y[rest])
    return out


def power(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``lax.pow`` of float32 or float64 ``x`` by ``y`` (converted to x's dtype) as XLA:CPU computes it: the C
    library's ``powf``/``pow`` with subnormal operands as zeros and subnormal results flushed to zero."""
    x = np.asarray(x)
    y = np.asarray(y).astype(x.dtype, copy=False)
    with np.errstate(all="ignore"):
        fn = powf if x.dtype == np.float32 else pow64
        return flush_subnormals(fn(flush_subnormals(x), flush_subnormals(y)))
