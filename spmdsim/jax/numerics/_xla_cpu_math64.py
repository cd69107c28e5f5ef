"""XLA:CPU's own float64 functions, ported (``exp``, ``tanh``, ``log1p``, ``expm1``, ``erf_inv``, ``erfc``,
``atanh``, ``rsqrt``), and the functions of both widths built on them or on the C library (``lgamma``,
``digamma``, ``atan``).

Each port follows the LLVM IR XLA:CPU emits for the function (``XLA_FLAGS=--xla_dump_to``), step for step, with
a multiply feeding an add fused where the ISA has FMA (LLVM's ``AllowFPOpFusion``), subnormal operands as zeros
(DAZ), and is checked bit for bit against ``jax.jit`` in ``conformance/test_float64_functions.py``. Which jaxlib
computes which function so is said per function and decided by the rules (``spmdsim/jax/rules/_arithmetic.py``).
The float32 ports and the fused multiply-adds they share are in :mod:`._xla_cpu_math`.
"""
from __future__ import annotations

import numpy as np

from spmdsim.jax.numerics import _cpu_estimate, _libm, _xla_cpu_isa, _xla_cpu_probe
from spmdsim.jax.numerics._xla_cpu_math import (_blockwise, _sin_cos, f32, f64, flush_subnormals, fma, fma64,
                                                from_hex, log, log1p)

__all__ = ["exp64", "tanh64", "log1p64", "expm1_64", "erf_inv64", "erfc64", "atanh64", "rsqrt64", "atan", "lgamma",
           "digamma"]


# XLA:CPU's float64 exp (jaxlib 0.10.2-0.12.0.1; its LLVM IR, ``XLA_FLAGS=--xla_dump_to``): Cephes' exp, the
# operand clamped to [_EXP64_LO, _EXP64_HI], x = n log(2) + g with n = floor(x log2(e) + 1/2) and log(2) in two
# pieces, e^g = 1 + 2 g P(g^2) / (Q(g^2) - g P(g^2)), then times 2^n as three factors 2^(n>>2) and one
# 2^(n - 3 (n>>2)) (n clamped to +-2099); 0 below the range, +inf above it. Every multiply feeding an add is
# fused where the ISA has FMA (LLVM's AllowFPOpFusion): bit for bit with every jaxlib measured.
_EXP64_LO, _EXP64_HI = -708.3964185322641, 709.782712893384
_EXP64_P = (0.00012617719307481058, 0.030299440770744195)
_EXP64_Q = (3.0019850513866446e-06, 0.002524483403496841, 0.22726554820815503)
_ONE_BITS = 0x3FF0000000000000


@_blockwise
def exp64(x: np.ndarray) -> np.ndarray:
    """float64 ``exp`` as XLA:CPU computes it (see the comment above ``_EXP64_LO``); NaN stays NaN."""
    x = np.asarray(x, f64)
    madd = (lambda a, b, c: fma64(a, b, c)) if _xla_cpu_isa.current().fma else (lambda a, b, c: a * b + c)
    with np.errstate(invalid="ignore"):
        clamped = np.maximum(np.minimum(x, _EXP64_HI), _EXP64_LO)
        n = np.floor(madd(clamped, f64(1.4426950408889634), f64(0.5)))
        g = madd(n, f64(-0.693145751953125), clamped)
        g = madd(n, f64(-1.4286068203094173e-06), g)
        g2 = g * g
        p = madd(madd(g2, f64(_EXP64_P[0]), f64(_EXP64_P[1])), g2, f64(1)) * g
        q = madd(madd(madd(g2, f64(_EXP64_Q[0]), f64(_EXP64_Q[1])), g2, f64(_EXP64_Q[2])), g2, f64(2))
        e = madd(p / (q - p), f64(2), f64(1))
        k = np.clip(np.where(np.isnan(n), 0, n), -2099, 2099).astype(np.int64)
    quarter = k >> 2
    scale = ((quarter << 52) + _ONE_BITS).view(f64)
    rest = (((k - 3 * quarter) << 52) + _ONE_BITS).view(f64)
    with np.errstate(over="ignore", under="ignore"):
        out = flush_subnormals(e * scale * scale * scale * rest)
    return np.where(x > _EXP64_HI, np.inf, np.where(x < _EXP64_LO, 0.0, out))


def _madd64():
    """float64 ``a * b + c`` as XLA:CPU's LLVM code computes a multiply feeding an add: fused with FMA."""
    return fma64 if _xla_cpu_isa.current().fma else (lambda a, b, c: a * b + c)


def _hex64(*words: str) -> tuple:
    return from_hex(f64, *words)


# XLA:CPU's float64 tanh (jaxlib 0.10.2-0.12.0.1, its LLVM IR): x clamped to +-17.71, x P(x^2) / Q(x^2) with P of
# degree 9 and Q of degree 9 (Horner, multiply-adds fused), +-1 from |x| >= 20.
_TANH64_CLAMP = _hex64("4031B6D58F246197")[0]
_TANH64_P = _hex64("3B3F9F82E5D782DF", "3C2C3C836C04B4C8", "3CEC3379F905E662", "3D929AFF6C8EDD96", "3E2525A389DCE7C2",
                   "3EA708819BE51CD9", "3F18996F4026A7FA", "3F787F80B957ED00", "3FC36FBA9B450E5A", "3FF0000000000000")
_TANH64_Q = _hex64("3BBE8630CF903250", "3C90AABCA9A5FEA0", "3D4232981AA2BBA8", "3DDEE2F015EA8065", "3E681F1947C52304",
                   "3EE26C82AB46D140", "3F4B2E7C4D488C04", "3FA1998830265B50", "3FDF0D32A2F7DC79", "3FF0000000000000")


@_blockwise
def tanh64(x: np.ndarray) -> np.ndarray:
    """float64 ``tanh`` as XLA:CPU computes it (see ``_TANH64_P``; subnormals count as zeros): bit for bit with
    every jaxlib measured."""
    x = flush_subnormals(np.asarray(x, f64))
    madd = _madd64()
    c = np.clip(x, -_TANH64_CLAMP, _TANH64_CLAMP)
    c2 = c * c
    p = madd(c2, f64(_TANH64_P[0]), f64(_TANH64_P[1]))
    for coefficient in _TANH64_P[2:]:
        p = madd(c2, p, f64(coefficient))
    q = madd(c2, f64(_TANH64_Q[0]), f64(_TANH64_Q[1]))
    for coefficient in _TANH64_Q[2:]:
        q = madd(c2, q, f64(coefficient))
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x) >= 20, np.copysign(f64(1), x), (c * p) / q)


# XLA:CPU's float64 log1p (jaxlib 0.10's LLVM IR; 0.11's and 0.12's object code): on a small range, x - x^2/2 +
# x^3 N(x)/D(x) (Cephes' rational function, Horner with fused multiply-adds, D's first step ``x * 0 + 1`` as
# emitted), else log(1 + x) by the C library's log. The range: |x| < sqrt(2) - 1 with jaxlib 0.10, and
# 1 - sqrt(1/2) <= -x, x <= sqrt(2) - 1 from 0.11 (1 + x in [sqrt(1/2), sqrt(2)]).
_LOG1P64_D = _hex64("402E20359E903E37", "4054C30B52213498", "406BB86590FCFB56", "407351945DC908A5", "406B0DB13E48E066",
                    "404E0F304466448E")
_LOG1P64_N = _hex64("3F07BC0962B395CA", "3FDFE818A0FE1A83", "401A509F46F4FA53", "403DE9738B8CB9C9", "404E798EB86C3351",
                    "404C8E7597479A10", "40340A202D99830A")
_LOG1P64_SMALL = _hex64("3FDA827999FCEF32")[0]
_LOG1P64_BELOW = _hex64("BFD2BEC333018867")[0]  # -(1 - sqrt(1/2)): jaxlib 0.11's lower end


def _log1p64_small(x: np.ndarray) -> np.ndarray:
    """Where the installed jaxlib's float64 log1p takes its rational function (see ``_LOG1P64_D``)."""
    minor = _xla_cpu_isa.jaxlib_minor()
    if minor is None or minor <= (0, 10):
        return np.abs(x) < _LOG1P64_SMALL
    return (x >= _LOG1P64_BELOW) & (x <= _LOG1P64_SMALL)


def _log1p64_ratio(x: np.ndarray) -> np.ndarray:
    """``N(x) / D(x)`` of the rational function (see ``_LOG1P64_D``), their steps as emitted."""
    madd = _madd64()
    d = madd(x, f64(0), f64(1))
    for coefficient in _LOG1P64_D:
        d = madd(d, x, f64(coefficient))
    n = x * f64(0) + f64(_LOG1P64_N[0])
    for coefficient in _LOG1P64_N[1:]:
        n = madd(n, x, f64(coefficient))
    return n / d


@_blockwise
def log1p64(x: np.ndarray) -> np.ndarray:
    """float64 ``log1p`` as XLA:CPU computes it (see ``_LOG1P64_D``; subnormals count as zeros)."""
    x = flush_subnormals(np.asarray(x, f64))
    with np.errstate(all="ignore"):
        x2 = x * x
        small = x + _madd64()(x2, f64(-0.5), (x * x2) * _log1p64_ratio(x))
        return np.where(_log1p64_small(x), small, _libm.log64(x + f64(1)))


@_blockwise
def expm1_64(x: np.ndarray) -> np.ndarray:
    """float64 ``expm1`` as XLA:CPU's emitter writes it (as float32's, :func:`expm1`): ``tanh(x/2) (exp(x) + 1)``
    for |x| <= 1/2, ``exp(x) - 1`` beyond, x itself where x/2 is zero, with its float64 exp and tanh."""
    x = np.asarray(x, f64)
    half = flush_subnormals(x * f64(0.5))
    e = exp64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(np.abs(x) > f64(0.5), e - f64(1), tanh64(half) * (e + f64(1)))
    return np.where(half == 0, x, out)


def rsqrt64(x: np.ndarray) -> np.ndarray:
    """float64 ``rsqrt`` as XLA:CPU computes it (jaxlib 0.10-0.12, where AVX-512F is in effect): the CPU's
    estimate ``vrsqrt14pd`` (:func:`._cpu_estimate.rsqrt14`, the instruction itself) refined by two Newton-Raphson
    steps ``h = fma(x y, y, -1)``, ``y = fma(-y/2, h, y)``; below the smallest normal (zero, negatives, flushed
    subnormals) and at +inf the estimate itself, as XLA selects it. Elsewhere (no AVX-512F in effect, a later
    jaxlib, or the instruction cannot be run here) the correctly rounded ``1 / sqrt(x)``, which is XLA's
    fallback, or within an ulp of its result."""
    x = flush_subnormals(np.asarray(x, f64))
    minor = _xla_cpu_isa.jaxlib_minor()
    estimate = None
    if _xla_cpu_isa.current().avx512 and (minor is None or minor <= (0, 12)):
        estimate = _cpu_estimate.rsqrt14(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        if estimate is None:
            return f64(1) / np.sqrt(x)
        y = estimate
        for _ in range(2):
            y = fma64(y * f64(-0.5), fma64(x * y, y, f64(-1)), y)
    return np.where((x < np.finfo(f64).tiny) | (x == np.inf), estimate, y)


# Lanczos' approximation with g = 7, n = 9, as StableHLO's CHLO decomposition (materializeLgamma) writes lgamma
_LANCZOS_G = 7.0
_LANCZOS_BASE = 0.99999999999980993227684700473478
_LANCZOS = (676.520368121885098567009190444019, -1259.13921672240287047156078755283,
            771.3234287776530788486528258894, -176.61502916214059906584551354, 12.507343278686904814458936853,
            -0.13857109526572011689554707, 9.984369578019570859563e-6, 1.50563273514931155834e-7)


def _log1p_of(x: np.ndarray) -> np.ndarray:
    """log1p as XLA:CPU computes it (:func:`._xla_cpu_math.log1p`, :func:`log1p64`)."""
    return log1p(x) if x.dtype == f32 else log1p64(x)


def _lanczos(x: np.ndarray):
    """What lgamma and digamma share: ``reflect`` (x < 1/2), ``z`` (-x there, x - 1 elsewhere), ``a(z)``,
    ``t(z) = z + 7.5`` and ``log t(z)`` as CHLO writes them, in x's dtype (float32 with XLA:CPU's log1p)."""
    c = x.dtype.type
    reflect = x < c(0.5)
    z = np.where(reflect, -x, x + c(-1))
    a = np.full_like(z, c(_LANCZOS_BASE))
    for k, coefficient in enumerate(_LANCZOS, 1):
        a = a + c(coefficient) / (z + c(k))
    log_t = _log1p_of(z * c(1 / (_LANCZOS_G + 0.5))) + c(np.log(_LANCZOS_G + 0.5))
    return reflect, z, a, z + c(_LANCZOS_G + 0.5), log_t


# XLA:CPU's own arctangent (jaxlib 0.12; jaxlib 0.10 on arrays of fewer than 50 elements): Eigen's rational
# approximation ``x p(x^2) / q(x^2)`` on [0, 1], ``pi/2 - atan(1/x)`` above 1, as ``xla/codegen/intrinsic/cpp/
# eigen_unary.cc`` writes its scalar ``atan_f32``/``atan_f64`` and Eigen its vector one (float64: the operand
# itself below 1e-9, as both do; float32: the vector loop's, without the scalar code's bypass below 1e-3); the
# polynomials' steps are multiply-adds (``llvm.fmuladd``: fused where the ISA has FMA). Coefficients, highest
# power first.
_ATAN = {
    f32: (1e-3, (1.12026982009410858154296875e-01, 7.296695709228515625e-01, 8.109951019287109375e-01),
          (1.00917108356952667236328125e-02, 2.8318560123443603515625e-01, 1.0, 8.109951019287109375e-01)),
    f64: (1e-9, (2.6667153866462208e-05, 3.0917513112462781e-03, 5.2574296781008604e-02, 3.0409318473444424e-01,
                 7.5365702534987022e-01, 8.2704055405494614e-01, 3.3004361289279920e-01),
          (2.7311202462436667e-04, 1.0899150928962708e-02, 1.1548932646420353e-01, 4.9716458728465573e-01, 1.0,
           9.3705509168587852e-01, 3.3004361289279920e-01)),
}


@_blockwise
def atan(x: np.ndarray) -> np.ndarray:
    """float32 or float64 ``atan`` by XLA:CPU's own code (see ``_ATAN``), as jaxlib 0.12 computes it: bit for bit
    on arrays of 50 elements or more but a few elements in a hundred (float32: and on smaller arrays but below
    1e-3, where its scalar code returns the operand). NaN stays NaN, +-inf gives +-pi/2, subnormals count as
    zeros."""
    x = flush_subnormals(np.asarray(x))  # XLA's own code: DAZ
    c = x.dtype.type
    tiny, alpha, beta = _ATAN[c]
    step = fma if c == f32 else (fma64 if _xla_cpu_isa.current().fma else lambda a, b, d: a * b + d)
    magnitude = np.abs(x)
    large = magnitude > c(1)
    with np.errstate(all="ignore"):
        t = np.where(large, c(1) / magnitude, magnitude).astype(c)
        t2 = t * t
        p, q = np.full_like(t2, c(alpha[0])), np.full_like(t2, c(beta[0]))
        for a in alpha[1:]:
            p = step(p, t2, c(a))
        for b in beta[1:]:
            q = step(q, t2, c(b))
        r = t * (p / q)
        out = np.copysign(np.where(large, c(np.pi / 2) - r, r), x)
    return (out if c == f32 else np.where(magnitude < c(tiny), x, out)).astype(c)


@_blockwise
def digamma(x: np.ndarray) -> np.ndarray:
    """digamma of float32 or float64 as CHLO's decomposition (materializeDigamma) writes it:
    ``log t + a'(z) / a(z) - 7 / t`` with ``a'(z) = -sum c_k / (z + k)^2`` (see :func:`_lanczos`); reflected below
    1/2 as ``digamma(1 - x) - pi cos(pi x') / sin(pi x')`` with ``x' = x + |floor(x + 1/2)|``; NaN at the poles
    (x <= 0, integral; at +-0 and subnormals the jaxlib's value, :func:`._xla_cpu_probe.digamma_at_zero`). Bit
    for bit with XLA:CPU in float32 (with :func:`sin` and :func:`cos` below 1/2: 200,000 values in [-20, 1/2)
measured equal)."""
    x = np.asarray(x)
    c = x.dtype.type
    with np.errstate(all="ignore"):
        reflect, z, a, t, log_t = _lanczos(x)
        a_prime = np.zeros_like(z)
        for k, coefficient in enumerate(_LANCZOS, 1):
            term = z + c(k)
            a_prime = a_prime - c(coefficient) / (term * term)
        out = (log_t + a_prime / a) - c(_LANCZOS_G) / t
        reduced = (x + np.abs(np.floor(x + c(0.5)))) * c(np.pi)
        reflected = out - (_sin_cos(reduced, np.cos) * c(np.pi)) / _sin_cos(reduced, np.sin)
        out = np.where(reflect, reflected, out)
        out = np.where((x <= 0) & (x == np.floor(x)), c(np.nan), out)
        # zero, and subnormals (flushed to zero by DAZ): the jaxlib's value at zero
        out = np.where(np.abs(x) < np.finfo(x.dtype).tiny, c(_xla_cpu_probe.digamma_at_zero()), out)
    return out.astype(x.dtype)


@_blockwise
def lgamma(x: np.ndarray) -> np.ndarray:
    """lgamma of float32 or float64 as XLA computes it: CHLO's Lanczos approximation (``z = x - 1``, or ``-x``
    reflected below 1/2, ``a(z) = c0 + sum c_k / (z + k)``, ``log t(z) = log1p(z * (1/7.5)) + log(7.5)``: XLA's
    simplifier turns the division by 7.5 into a multiplication by its rounded reciprocal,
    ``lgamma = fma(z + 1/2 - t / log t, log t, log(2 pi) / 2) + log(a)``; reflection
    ``log(pi) - log(sin(pi * |frac(x)|')) - lgamma(1 - x)``; +inf at +-inf), so lgamma(1) is 4.8e-7 in float32
    and -5.8e-8 in float64 as in XLA, not 0. float32 with XLA:CPU's log, log1p and multiply-adds: equal to
    XLA:CPU's result bit for bit, below 1/2 with its sinf (:func:`sin`; 200,000 values in [-20, 1/2) measured
    equal). float64 with
    NumPy's log, log1p and sin and unfused multiply-adds (XLA:CPU's differ in the last bits)."""
    x = np.asarray(x)
    x = flush_subnormals(x) if x.dtype == f64 else x
    dtype = x.dtype
    c = dtype.type
    log_ = log if dtype == f32 else _libm.log64
    with np.errstate(all="ignore"):
        reflect, z, a, t, log_t = _lanczos(x)
        s = (z + c(0.5)) - t / log_t
        half_log_2pi = c((np.log(2) + np.log(np.pi)) / 2)
        head = fma(s, log_t, half_log_2pi) if dtype == f32 else _madd64()(s, log_t, half_log_2pi)
        out = head + log_(a)
        frac = np.abs(x) - np.floor(np.abs(x))
        frac = np.where(c(0.5) < frac, c(1) - frac, frac)
        denominator = log_(_sin_cos(c(np.pi) * frac, np.sin))
        reflected = np.where(np.isfinite(denominator), (c(np.log(np.pi)) - denominator) - out, -denominator)
        out = np.where(reflect, reflected, out)
    return np.where(np.isinf(x), c(np.inf), out).astype(dtype)


# XLA:CPU's float64 erf_inv (CHLO's decomposition as it compiles it, read from jaxlib 0.10's LLVM IR; the same
# results with 0.11 and 0.12): Giles' double-precision approximation, w = -log1p(-x^2) (XLA's float64 log1p,
# :func:`log1p64`), a polynomial in
# w - 3.125 below 6.25, in sqrt(w) - 3.25 below 16, in sqrt(w) - 5 beyond (Horner, fused multiply-adds), times x;
# +-inf at +-1. Coefficients, highest degree first.
_ERF_INV64 = (
    (-3.64441206401782e-21, -1.6850591381820166e-19, 1.28584807152564e-18, 1.1157877678025181e-17,
     -1.333171662854621e-16, 2.0972767875968562e-17, 6.637638134358324e-15, -4.054566272975207e-14,
     -8.151934197605472e-14, 2.6335093153082323e-12, -1.2975133253453532e-11, -5.415412054294628e-11,
     1.0512122733215323e-09, -4.112633980346984e-09, -2.9070369957882005e-08, 4.2347877827932404e-07,
     -1.3654692000834679e-06, -1.3882523362786469e-05, 0.00018673420803405714, -0.000740702534166267,
     -0.006033670871430149, 0.24015818242558962, 1.6536545626831027),
    (2.2137376921775787e-09, 9.075656193888539e-08, -2.7517406297064545e-07, 1.8239629214389228e-08,
     1.5027403968909828e-06, -4.013867526981546e-06, 2.9234449089955446e-06, 1.2475304481671779e-05,
     -4.7318229009055734e-05, 6.828485145957318e-05, 2.4031110387097894e-05, -0.0003550375203628475,
     0.0009532893797373805, -0.0016882755560235047, 0.002491442096107851, -0.003751208507569241,
     0.005370914553590064, 1.0052589676941592, 3.0838856104922208),
    (-2.7109920616438573e-11, -2.555641816996525e-10, 1.5076572693500548e-09, -3.789465440126737e-09,
     7.61570120807834e-09, -1.496002662714924e-08, 2.914795345090108e-08, -6.771199775845234e-08,
     2.2900482228026655e-07, -9.9298272942317e-07, 4.526062597223154e-06, -1.968177810553167e-05,
     7.599527703001776e-05, -0.00021503011930044477, -0.00013871931833623122, 1.0103004648645344,
     4.849906401408584),
)


@_blockwise
def erf_inv64(x: np.ndarray) -> np.ndarray:
    """float64 ``erf_inv`` as XLA:CPU computes it (see ``_ERF_INV64``); NaN outside [-1, 1]."""
    x = flush_subnormals(np.asarray(x, f64))
    madd = _madd64()
    with np.errstate(all="ignore"):
        log_term = log1p64(x * -x)  # -w
        central, middle = log_term > f64(-6.25), log_term > f64(-16)
        root = np.sqrt(-log_term)
        t = np.where(central, f64(-3.125) - log_term, root - np.where(middle, f64(3.25), f64(5)))
        out = np.empty_like(t)
        for mask, coefficients in zip((central, middle & ~central, ~middle), _ERF_INV64):
            p = np.full_like(t, coefficients[0])
            for c in coefficients[1:]:
                p = madd(p, t, f64(c))
            out = np.where(mask, p, out)
        return x * np.where(np.abs(x) == 1, np.inf, out)


# float64 erfc as CHLO decomposes it and XLA:CPU compiles it (jaxlib 0.10.2's LLVM IR, the same results with 0.11.2
# and 0.12.0.1; Cephes' erfc): below |x| = 1,
# 1 - x T(x^2) / U(x^2); else exp(-x^2) P(|x|) / Q(|x|) below |x| = 8 and exp(-x^2) R(|x|) / S(|x|) beyond, 0 where
# x^2 exceeds exp's range, 2 - that for x < 0. Q, S and U are monic (their first step an add). Horner, highest
# degree first, fused multiply-adds.
_ERFC64_P = _hex64("3DF0EB24A24F6479", "3FE20DD746363488", "401DDA53DEC56DC4", "4048518FACADBA66", "406890AAA9E020F7",
                   "4080738FC264CF58", "408D343A6C7434D8", "40900E3521D6972A", "40816C485DE8FFB3")
_ERFC64_Q = _hex64("402A74D5FD7C23CC", "4055AD42FEE17365", "40762F01246F610D", "408E7DAB02F641D0", "409C7FA2FCA47151",
                   "40A18CACDAFAF4FF", "4099E2A70192EDE2", "40816C4860C442D6")
_ERFC64_R = _hex64("3FE20DD750429B62", "3FF467E6EBB8C5A6", "40141381F436A71A", "4018A40E58DD0C0C", "401DA3939718960E",
                   "4007D4B80A470367")
_ERFC64_S = _hex64("400215900917CE21", "4022CAC521D84CFD", "402819107F052C4D", "403114D9959C7FF5", "402337CAAA6326C1",
                   "400AF3DE5AB62D90")
_ERFC64_T = _hex64("402335BF1E375D88", "405681AA4E9E067F", "40A17002BCB435B7", "40BB5B533C72EF90", "40EB2509A44213DC")
_ERFC64_U = _hex64("4040C7E63FEFA6BA", "40804ADD14C63AEE", "40B1F252E680FD12", "40D6194001017C0A", "40E80E6C9DC8F567")


def _horner64(x: np.ndarray, coefficients, *, monic: bool = False) -> np.ndarray:
    """``((c0 x + c1) x + c2) ...`` (``monic``: ``((x + c0) x + c1) ...``), each step a multiply-add as XLA:CPU's
    LLVM code computes it."""
    madd = _madd64()
    p = x + f64(coefficients[0]) if monic else madd(x, f64(coefficients[0]), f64(coefficients[1]))
    for c in coefficients[1 if monic else 2:]:
        p = madd(x, p, f64(c))
    return p


@_blockwise
def erfc64(x: np.ndarray) -> np.ndarray:
    """float64 ``erfc`` as XLA:CPU computes it (see ``_ERFC64_P``; jaxlib 0.10.2, 0.11.2 and 0.12.0.1 alike)."""
    x = flush_subnormals(np.asarray(x, f64))
    with np.errstate(all="ignore"):
        magnitude, square = np.abs(x), x * x
        e = exp64(-square)
        near = flush_subnormals(flush_subnormals(e * _horner64(magnitude, _ERFC64_P))
                                / _horner64(magnitude, _ERFC64_Q, monic=True))  # FTZ after each step
        far = flush_subnormals(flush_subnormals(e * _horner64(magnitude, _ERFC64_R))
                               / _horner64(magnitude, _ERFC64_S, monic=True))
        y = np.where(square > _EXP64_HI, f64(0), np.where(magnitude < 8, near, far))
        y = np.where(x < 0, f64(2) - y, y)
        small = f64(1) - (x * _horner64(square, _ERFC64_T)) / _horner64(square, _ERFC64_U, monic=True)
        return np.where(magnitude < 1, small, y)


@_blockwise
def atanh64(x: np.ndarray) -> np.ndarray:
    """float64 ``atanh`` as XLA:CPU computes it, as float32's (:func:`._xla_cpu_math.atanh`) with
    :func:`log1p64`'s rational function: each small branch ``fma(+-x^3, N/D, round(-x^2/2))``."""
    x = flush_subnormals(np.asarray(x, f64))
    madd = _madd64()
    with np.errstate(all="ignore"):
        x2 = x * x
        half = x2 * f64(-0.5)
        up = np.where(_log1p64_small(x), x + madd(x * x2, _log1p64_ratio(x), half), _libm.log64(x + f64(1)))
        down = np.where(_log1p64_small(-x), madd(-x * x2, _log1p64_ratio(-x), half) - x,
                        _libm.log64(f64(1) - x))
        out = (up - down) * f64(0.5)
    return np.where(np.abs(x) > 1, np.nan, out)
