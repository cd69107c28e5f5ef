"""XLA:CPU's float32 ``exp``, ``log``, ``log1p``, ``logistic`` and fused multiply-add of one value, in Python floats.

A sampler's loop (NUTS's tree, an acceptance test) calls these functions on 0-d arrays tens of thousands of
times; each port of :mod:`._xla_cpu_math` is 40-110 NumPy calls, ~50-130 us on one value. Here the same
sequence of float32 operations runs on Python floats (IEEE float64): a float32 product, sum or quotient is the
float64 one rounded to float32 (exact for products; for sums and quotients float64 carries more than twice
float32's precision, so rounding twice gives the once-rounded value), and a fused multiply-add is
``float32(float64(a) * float64(b) + float64(c))``, as :func:`._xla_cpu_math.fma` computes it. ~3-8 us a value.

Each function takes a float32 value as a Python float and returns the result as a Python float, or None where
the value is outside the range it handles (zero, subnormals, infinities, NaN, and values near the ports'
clamps, where flushing and clamping decide the result): the caller then runs the array port. The ports are the
definition; ``tests/test_scalar_ports.py`` checks these against them value by value. Only where the ISA has
FMA (:data:`SCALAR` is empty otherwise).
"""
from __future__ import annotations

import math
import struct

import numpy as np

from spmdsim.jax.numerics import _xla_cpu_math as _math

__all__ = ["SCALAR", "exp", "fma", "log", "log1p", "logistic"]

_F32 = struct.Struct("<f")
_pack, _unpack = _F32.pack, _F32.unpack
_TINY = float(np.finfo(np.float32).tiny)
_MAX = float(np.finfo(np.float32).max)


def _r32(v: float) -> float:
    """``v`` rounded to float32 (to nearest, ties to even), as a Python float."""
    return _unpack(_pack(v))[0]


def _f32s(values) -> tuple:
    return tuple(float(np.float32(v)) for v in values)


_EXP_P = _f32s(_math._EXP_P)
_LOG2E, _LN2_HI, _LN2_LO = _f32s((1.44269504088896341, -0.693359375, 2.12194440e-4))
_LOG_P = _f32s(_math._LOG_P)
_LOG_E_LO, _LOG_E_HI, _SQRT_HALF = _f32s((-2.12194440e-4, 0.693359375, 0.707106781186547524))
_LOG1P_NUMERATOR = _f32s(_math._LOG1P_NUMERATOR)
_LOG1P_DENOMINATOR = _f32s(_math._LOG1P_DENOMINATOR)
_LOG1P_SMALL = _r32(0.41421356237309504880)


def _horner(x: float, coefficients: tuple, p: float) -> float:
    """:func:`._xla_cpu_math._horner_fma` from ``p``: each step ``float32(p * x + c)``."""
    for c in coefficients:
        p = _r32(p * x + c)
    return p


def fma(a: float, b: float, c: float, negate_product: bool = False, negate_addend: bool = False) -> float | None:
    """``±a * b ± c`` of float32 values as :func:`._xla_cpu_math.rounded_once` computes it (the float64 product and
    sum, rounded to float32); None where the sum is beyond float32's range or NaN."""
    product = -(a * b) if negate_product else a * b
    wide = product - c if negate_addend else product + c
    return _r32(wide) if -_MAX <= wide <= _MAX else None


def exp(x: float) -> float | None:
    """:func:`._xla_cpu_math.exp` for normal ``x`` in (-80, 80) (no clamp, no flush: 2^n is a normal float32)."""
    if not (-80.0 < x < 80.0) or abs(x) < _TINY:
        return None
    n = float(math.floor(_r32(x * _LOG2E + 0.5)))
    a = _r32(_LN2_HI * n + x)
    a = _r32(_LN2_LO * n + a)
    p = _horner(a, _EXP_P[1:], _EXP_P[0])
    z = _r32(p * _r32(a * a) + a)
    z = _r32(1.0 + z)
    return _r32(z * 2.0 ** n)


def log(x: float) -> float | None:
    """:func:`._xla_cpu_math.log` for positive normal finite ``x``: Cephes' mantissa in [0.5, 1) is frexp's."""
    if not (_TINY <= x < math.inf):
        return None
    m, e = math.frexp(x)
    e = float(e)
    if m < _SQRT_HALF:
        e -= 1.0
        m = _r32((m - 1.0) + m)
    else:
        m = m - 1.0  # exact (Sterbenz)
    m2 = _r32(m * m)
    m3 = _r32(m2 * m)
    p = _LOG_P
    y = _r32(m * p[0] + p[1])
    y1 = _r32(m * p[3] + p[4])
    y2 = _r32(m * p[6] + p[7])
    y = _r32(y * m + p[2])
    y1 = _r32(y1 * m + p[5])
    y2 = _r32(y2 * m + p[8])
    y = _r32(y * m3 + y1)
    y = _r32(y * m3 + y2)
    y = _r32(y * m3 + _r32(_LOG_E_LO * e))
    out = _r32(-0.5 * m2 + m)
    out = _r32(out + y)
    return _r32(_LOG_E_HI * e + out)


def log1p(x: float) -> float | None:
    """:func:`._xla_cpu_math.log1p` for ``x`` in (-1, 2**100) with |x| >= 2**-20 (no float32 product of the small
    branch underflows): the branch the port selects, alone."""
    if not (-1.0 < x < 1.2676506002282294e30) or abs(x) < 9.5367431640625e-07:
        return None
    if abs(x) < _LOG1P_SMALL:
        x2 = _r32(x * x)
        ratio = _r32(_horner(x, _LOG1P_NUMERATOR, 0.0) / _horner(x, _LOG1P_DENOMINATOR, 0.0))
        small = _r32(-0.5 * x2 + _r32(_r32(x * x2) * ratio))
        return _r32(x + small)
    return log(_r32(x + 1.0))


def logistic(x: float) -> float | None:
    """:func:`._xla_cpu_math.logistic`: ``1 / (1 + exp(-x))``."""
    e = exp(-x)
    if e is None:
        return None
    return _r32(1.0 / _r32(1.0 + e))


#: the port's name -> its one-value form, where the ISA fuses multiply-adds as these functions do
SCALAR = {"exp": exp, "log": log, "log1p": log1p, "logistic": logistic} if _math.fma is _math._fused else {}
