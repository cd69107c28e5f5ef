"""XLA:CPU's float32 transcendental functions, operation for operation, in NumPy.

XLA:CPU (jaxlib 0.10) does not call a math library for float32 ``exp``, ``log``, ``log1p``, ``tanh``, ``erf``,
``logistic`` and ``expm1``: it emits polynomial and rational approximations (Cephes' and Eigen's) whose
multiply-adds LLVM contracts into fused multiply-adds, and it runs with denormals flushed to zero. NumPy's
own functions are more accurate but differ from XLA:CPU in the last bits of 6-37% of float32 results (up to 6
ulps), and a random sampler built on them (``jax.random.normal`` through ``erf_inv`` and ``log1p``, the
rejection loop of ``jax.random.gamma`` through ``log``) then draws different samples. These functions repeat
XLA's sequence of float32 operations, so their results equal XLA:CPU's bit for bit on every value we measured
(hundreds of thousands per function, see ``conformance/test_lax_ops.py``), on an x86-64 CPU with FMA.

- A fused multiply-add ``fma(a, b, c)`` is computed as ``float32(float64(a) * float64(b) + float64(c))``: the
  product of two float32 values is exact in float64, so only the sum is rounded twice (to float64, then to
  float32), which differs from one rounding in about one case in 2**29.
- Inputs below the smallest normal float32 count as zero and results below it are flushed to zero, as XLA:CPU
  does (FTZ/DAZ).
- float16 and bfloat16 use the float32 functions (XLA:CPU upcasts them); float64 keeps NumPy/SciPy.

XLA's results depend on its version and on the instruction set it compiles for: without FMA (a CPU before
AVX2, or ``--xla_cpu_max_isa=AVX``) LLVM does not fuse, and :func:`fma` then rounds the product first, as XLA
does (:mod:`._xla_cpu_isa` says which ISA is in effect). These ports follow jaxlib 0.10.2.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from spmdsim import _blas, _buffers, _threads
from spmdsim.jax import _xla_cpu_isa, _xla_cpu_probe

__all__ = ["exp", "log", "log1p", "tanh", "erf", "logistic", "expm1", "rsqrt", "lgamma", "digamma", "fma", "multiply_add",
           "ftz", "flush_subnormals"]

f32, f64 = np.float32, np.float64
_TINY = np.finfo(np.float32).tiny


_CHUNK = 1 << 15  # elements of a float64 temporary that stay in a core's cache
_PARALLEL = 1 << 20  # a fused multiply-add this large uses every CPU (see spmdsim._threads.in_parallel)


def rounded_once(a, b, c, dtype=f32, *, negate_product: bool = False, negate_addend: bool = False,
                 out: np.ndarray | None = None) -> np.ndarray:
    """``±a * b ± c`` computed in float64 and rounded to ``dtype`` (float32 or float16) once: a fused multiply-add
    (the product of two float32 or float16 values is exact in float64; a float32 sum is rounded to float64 first,
    which differs from one rounding in about one case in 2**29). Operands broadcast. The float64 product lives in
    a cache-sized temporary, a block at a time: 3-5x faster than float64 copies of large operands. ``out``: a
    C-contiguous array of the result's shape and ``dtype`` to write into; it may be one of the operands (each
    block of it is read before it is written)."""
    combine = np.subtract if negate_addend else np.add
    if out is None and np.size(a) <= _CHUNK and np.size(b) <= _CHUNK and np.size(c) <= _CHUNK:
        # a block of a port or of a fused run: three NumPy calls, the same operations as below
        product = np.multiply(a, b, dtype=f64)
        return np.asarray(combine(-product if negate_product else product, c, dtype=f64).astype(dtype))
    ops = [np.asarray(x) for x in (a, b, c)]
    shapes = {x.shape for x in ops if x.ndim}
    shape = next(iter(shapes)) if len(shapes) == 1 else np.broadcast_shapes(*(x.shape for x in ops))
    ops = [_unbroadcast(x) for x in ops]
    if out is None:
        out = _buffers.empty(shape, dtype, faulted=True)
    elif out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(f"rounded_once: out must be a C-contiguous {np.dtype(dtype)}{list(shape)} array, got "
                         f"{out.dtype}{list(out.shape)}")

    def product(x, y, temp) -> None:  # temp = ±x * y, exact
        np.multiply(x, y, out=temp, dtype=f64)
        if negate_product:
            np.negative(temp, out=temp)

    def compute(x, y, z, temp, target) -> None:  # target = ±x * y ± z, through the float64 temp
        product(x, y, temp)
        combine(temp, z, out=target, dtype=f64, casting="unsafe")

    if out.size <= _CHUNK:
        compute(*ops, np.empty(shape, f64), out)
        return out
    split = _flat_split(ops, shape)
    if split is not None:
        # (rows, inner) views, cut in blocks of _CHUNK along inner: a value broadcast over the rows is read again
        rows, inner = math.prod(shape[:split]), math.prod(shape[split:])
        flat = [x.reshape(()) if x.size == 1 else x.reshape(-1, 1 if x.size == rows else inner) for x in ops]
        target = out.reshape(rows, inner)
        width = min(inner, _CHUNK)
        per_row = -(-inner // width)

        def block_of(v, r: int, start: int):  # operand v's part of row r, columns start..start + width
            return v if v.ndim == 0 else v[r, 0] if v.shape[1] == 1 else \
                v[r if v.shape[0] > 1 else 0, start:start + width]

        if rows > 1 and all(v.ndim == 0 or v.shape == (1, inner) for v in flat[:2]):
            # the same product in every row (a replicated gradient times a scalar, added to each device's
            # parameters): each block of it computed once, then added to the block of every row
            def work(lo: int, hi: int) -> None:  # blocks lo..hi-1 of the columns
                temp = np.empty(width, f64)
                for block in range(lo, hi):
                    start = block * width
                    t = temp[:min(width, inner - start)]
                    product(*(block_of(v, 0, start) for v in flat[:2]), t)
                    for r in range(rows):
                        combine(t, block_of(flat[2], r, start), out=target[r, start:start + width], dtype=f64,
                                casting="unsafe")
            count = per_row
        else:
            def work(lo: int, hi: int) -> None:  # blocks lo..hi-1, row-major over (rows, per_row)
                temp = np.empty(width, f64)
                for block in range(lo, hi):
                    r, start = divmod(block, per_row)
                    start *= width
                    compute(*(block_of(v, r, start) for v in flat), temp[:min(width, inner - start)],
                            target[r, start:start + width])
            count = rows * per_row
    else:  # blocks of rows; an operand with one row (or fewer axes) broadcasts whole
        rows, inner = shape[0], out.size // shape[0]
        step = max(1, _CHUNK // inner)
        count = rows
        cut = [x.ndim == len(shape) and x.shape[0] == rows for x in ops]

        def work(lo: int, hi: int) -> None:
            temp = np.empty((min(step, hi - lo),) + shape[1:], f64)
            for start in range(lo, hi, step):
                x, y, z = (v[start:min(start + step, hi)] if k else v for v, k in zip(ops, cut))
                compute(x, y, z, temp[:min(step, hi - start)], out[start:min(start + step, hi)])
    if out.size >= _PARALLEL:
        _threads.in_parallel(work, count, cpus=_blas.cpus())
    else:
        work(0, count)
    return out


def _unbroadcast(x: np.ndarray) -> np.ndarray:
    """``x`` with each axis it repeats (stride 0: a broadcast view, as a replicated value stacked over the devices)
    cut to length 1: the same values once broadcast again, and read as the one array they are (a reshape of the
    broadcast view would copy it)."""
    if 0 in x.strides and x.size > 1:
        return x[tuple(slice(0, 1) if stride == 0 and n > 1 else slice(None) for n, stride in zip(x.shape, x.strides))]
    return x


def _flat_split(ops: list, shape: tuple) -> int | None:
    """The first axis ``k`` such that every operand is a scalar, holds ``shape[k:]`` whole (once, or once per
    index of ``shape[:k]``), or one value per index of ``shape[:k]`` (a device's scalar): then each is a
    ``(rows, inner)`` matrix, a row broadcast over the rows, or a ``(rows, 1)`` column; None if there is no such
    axis (an operand broadcast inside the trailing axes), or if the rows would be short (a per-channel operand of
    NHWC activations: blocks of rows then, see :func:`rounded_once`)."""
    for k in range(len(shape)):
        if math.prod(shape[k:]) < _CHUNK // 8:
            return None
        if all(x.size == 1 or _holds_from(x, shape, k) for x in ops):
            return k
    return None


def _holds_from(x: np.ndarray, shape: tuple, k: int) -> bool:
    padded = (1,) * (len(shape) - x.ndim) + x.shape
    if padded[:k] == shape[:k] and all(d == 1 for d in padded[k:]):
        return True
    return padded[k:] == shape[k:] and (padded[:k] == shape[:k] or all(d == 1 for d in padded[:k]))


def _fused(a, b, c) -> np.ndarray:
    """float32 fused multiply-add, through float64 (see the module docstring)."""
    return rounded_once(a, b, c, f32)


def _unfused(a, b, c) -> np.ndarray:
    """float32 multiply, rounded, then add: what XLA:CPU computes where the CPU (or the cap) has no FMA."""
    return np.asarray(np.asarray(a, f32) * np.asarray(b, f32), f32) + np.asarray(c, f32)


#: ``a * b + c`` in float32 as XLA:CPU computes a multiply feeding an add on this machine's ISA
#: (:mod:`._xla_cpu_isa`): one rounding with FMA (AVX2 on), two without.
fma = _fused if _xla_cpu_isa.current().fma else _unfused


def multiply_add(a, b, c, dtype) -> np.ndarray:
    """``a * b + c`` of ``dtype`` values as XLA:CPU computes a multiply feeding an add inside one program on
    this machine's ISA: float32 by :func:`fma`; float16 rounded once (one fused float16 multiply-add) where
    AVX512-FP16 is in effect, else the product rounded to float16 and then the sum; bfloat16 and float64 the
    product rounded, then the sum (measured, see :mod:`._xla_cpu_isa`). The float16 fused form is computed in
    float64 (the product of two float16 values is exact there) and rounded to float16."""
    dtype = np.dtype(dtype)
    if dtype == f32:
        return fma(a, b, c)
    if dtype == np.float16 and _xla_cpu_isa.current().fp16:
        return rounded_once(a, b, c, dtype)
    return np.asarray(np.asarray(a, dtype) * np.asarray(b, dtype) + np.asarray(c, dtype), dtype)


def flush_subnormals(x: np.ndarray, dtype=None) -> np.ndarray:
    """``x`` in ``dtype`` (default: its own), values below the dtype's smallest normal as zeros of their sign
    (XLA:CPU's FTZ/DAZ). ``x`` itself where it has ``dtype`` and holds no such value."""
    x = np.asarray(x)
    dtype = x.dtype if dtype is None else np.dtype(dtype)
    tiny = _TINIES.get(dtype)
    if tiny is None:
        tiny = _TINIES[dtype] = np.finfo(dtype).tiny
    small = np.abs(x) < tiny
    if not small.any() or not x[small].any():  # the common case: zeros, but no subnormal (then x itself where it
        return x if x.dtype == dtype else x.astype(dtype)  # has the dtype: nothing writes into it)
    return np.where(small, np.copysign(np.zeros((), dtype), x), x).astype(dtype)


_TINIES: dict = {}  # dtype -> its smallest normal


def _daz(x: np.ndarray) -> np.ndarray:
    return flush_subnormals(np.asarray(x, f32))


def ftz(x: np.ndarray) -> np.ndarray:
    return flush_subnormals(x, f32)


_BLOCK = 1 << 14  # elements per block of a function below: its temporaries stay in a core's cache


def _blockwise(fn):
    """``fn`` (elementwise, one operand) on a large array a block of ``_BLOCK`` elements at a time, in the calling
    thread: each of its dozen or more steps then reads and writes cache instead of memory. Every element's
    result is the same. (Not spread over the CPUs: a block's steps are NumPy calls of a few microseconds each, and
    two threads trading the GIL around each of them took 1.4-1.7x the time of one thread here; for the same reason
    one device thread at a time computes a large port, :func:`spmdsim._threads.one_at_a_time`.)"""
    @functools.wraps(fn)
    def blockwise(x):
        x = np.asarray(x)
        if x.size <= 2 * _BLOCK:
            return fn(x)
        flat = x.reshape(-1)
        with _threads.one_at_a_time():  # (in a device thread)
            first = fn(flat[:_BLOCK])
            out = _buffers.empty(x.size, first.dtype)
            out[:_BLOCK] = first
            for start in range(_BLOCK, x.size, _BLOCK):
                out[start:start + _BLOCK] = fn(flat[start:start + _BLOCK])
        return out.reshape(x.shape)
    return blockwise


def _horner_fma(x: np.ndarray, coefficients) -> np.ndarray:
    """``((c0 * x + c1) * x + c2) ...`` with fused multiply-adds, highest degree first: each step
    ``float32(float64(p) * float64(x) + c)``, as :func:`fma` computes it, with ``x`` converted once."""
    if fma is _unfused:  # no FMA on this ISA: each step rounded twice
        p = np.full(x.shape, f32(coefficients[0]), f32)
        for c in coefficients[1:]:
            p = fma(p, x, f32(c))
        return p
    wide = np.asarray(x, f64)
    temp, p = np.empty(wide.shape, f64), np.full(wide.shape, f32(coefficients[0]), f32)
    for c in coefficients[1:]:
        np.multiply(p, wide, out=temp)
        np.add(temp, f64(f32(c)), out=p, casting="unsafe")
    return p


_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


@_blockwise
def exp(x: np.ndarray) -> np.ndarray:
    """Cephes' expf: x = n log(2) + a with n = floor(x log2(e) + 1/2), e^a by a degree-7 polynomial, times 2^n."""
    x = np.clip(_daz(x), f32(-87.8), f32(88.8))
    n = np.clip(np.floor(fma(x, f32(1.44269504088896341), f32(0.5))), f32(-127), f32(127))
    n = np.where(np.isnan(n), f32(0), n)
    a = fma(f32(-0.693359375), n, x)
    a = fma(f32(2.12194440e-4), n, a)
    z = fma(_horner_fma(a, _EXP_P), a * a, a)
    z = f32(1) + z
    pow2 = ((n.astype(np.int32) + np.int32(0x7F)) << np.int32(23)).view(f32)
    with np.errstate(over="ignore", under="ignore"):
        out = z * pow2
    return ftz(np.where(np.isnan(x), x, out))


_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
          -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


@_blockwise
def log(x: np.ndarray) -> np.ndarray:
    """Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a polynomial in m - 1 evaluated in
    three interleaved parts, plus e log(2) in two pieces."""
    x = _daz(x)
    m = np.maximum(x, f32(_TINY))
    bits = m.view(np.int32)
    e = f32(1) + ((bits >> np.int32(23)) - np.int32(0x7F)).astype(f32)
    m = ((bits & np.int32(~0x7F800000)) | f32(0.5).view(np.int32)).view(f32)
    small = m < f32(0.707106781186547524)
    shifted = np.where(small, m, f32(0))
    m = m - f32(1)
    e = e - np.where(small, f32(1), f32(0))
    m = m + shifted
    m2 = m * m
    m3 = m2 * m
    p = _LOG_P
    y = fma(m, f32(p[0]), f32(p[1]))
    y1 = fma(m, f32(p[3]), f32(p[4]))
    y2 = fma(m, f32(p[6]), f32(p[7]))
    y = fma(y, m, f32(p[2]))
    y1 = fma(y1, m, f32(p[5]))
    y2 = fma(y2, m, f32(p[8]))
    y = fma(y, m3, y1)
    y = fma(y, m3, y2)
    y = fma(y, m3, f32(-2.12194440e-4) * e)
    out = fma(f32(-0.5), m2, m)
    out = out + y
    out = fma(f32(0.693359375), e, out)
    out = np.where(x == 0, f32(-np.inf), np.where(x == np.inf, f32(np.inf), np.where(x > 0, out, f32(np.nan))))
    return np.asarray(out, f32)


_LOG1P_NUMERATOR = (4.5270000862445199635215e-5, 4.9854102823193375972212e-1, 6.5787325942061044846969e0,
                    2.9911919328553073277375e1, 6.0949667980987787057556e1, 5.7112963590585538103336e1,
                    2.0039553499201281259648e1)
_LOG1P_DENOMINATOR = (1.0, 1.5062909083469192043167e1, 8.3047565967967209469434e1, 2.2176239823732856465394e2,
                      3.0909872225312059774938e2, 2.1642788614495947685003e2, 6.0118660497603843919306e1)


@_blockwise
def log1p(x: np.ndarray) -> np.ndarray:
    """For |x| < sqrt(2) - 1, Cephes' rational approximation x - x^2/2 + x^3 P(x)/Q(x); else log(1 + x)."""
    x = _daz(x)
    x2 = x * x
    ratio = _horner_fma(x, (0.0, *_LOG1P_NUMERATOR)) / _horner_fma(x, (0.0, *_LOG1P_DENOMINATOR))
    small = fma(f32(-0.5), x2, (x * x2) * ratio)
    small = x + small
    with np.errstate(invalid="ignore"):
        large = log(x + f32(1))
    return np.asarray(np.where(np.abs(x) < f32(0.41421356237309504880), small, large), f32)


_TANH_NUMERATOR = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
                   1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
_TANH_DENOMINATOR = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)


@_blockwise
def tanh(x: np.ndarray) -> np.ndarray:
    """Eigen's rational (13, 6) approximation on x clamped to +-7.9988..., x itself for |x| < 0.0004."""
    x = np.asarray(x, f32)
    flushed = _daz(x)
    clamp = f32(7.99881172180175781)
    c = np.clip(flushed, -clamp, clamp)
    c2 = c * c
    numerator = c * _horner_fma(c2, _TANH_NUMERATOR)
    with np.errstate(invalid="ignore"):
        out = ftz(numerator / _horner_fma(c2, _TANH_DENOMINATOR))
    return np.where(np.abs(x) < f32(0.0004), x, out).astype(f32)  # the small branch returns x unflushed


_ERF_NUMERATOR = (0.00022905065861350646, 0.0034082910107109506, 0.050955695062380861, 0.18520832239976145,
                  1.128379143519084)
_ERF_DENOMINATOR = (-1.1791602954361697e-7, 0.000023547966471313185, 0.0010179625278914885,
                    0.014070470171167667, 0.11098505178285362, 0.49746925110067538, 1.0)


@_blockwise
def erf(x: np.ndarray) -> np.ndarray:
    """Eigen's rational (9, 12) approximation in x^2, +-1 beyond |x| >= 3.8325..."""
    x = _daz(x)
    x2 = x * x
    with np.errstate(invalid="ignore"):
        out = (x * _horner_fma(x2, _ERF_NUMERATOR)) / _horner_fma(x2, _ERF_DENOMINATOR)
    return ftz(np.where(f32(3.832506856900711) <= np.abs(x), np.copysign(f32(1), x), out))


@_blockwise
def logistic(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), with XLA's exp (XLA:CPU expands logistic so)."""
    with np.errstate(over="ignore"):
        return ftz(f32(1) / (f32(1) + exp(-np.asarray(x, f32))))


@_blockwise
def expm1(x: np.ndarray) -> np.ndarray:
    """tanh(x/2) (exp(x) + 1) for |x| <= 1/2 (exp(x) - 1 beyond; x itself where x/2 flushes to zero)."""
    x = np.asarray(x, f32)
    half = ftz(_daz(x) * f32(0.5))
    e = exp(x)
    with np.errstate(over="ignore", invalid="ignore"):
        out = ftz(np.where(np.abs(x) > f32(0.5), e - f32(1), tanh(half) * (e + f32(1))))
    return np.where(half == 0, x, out).astype(f32)


@_blockwise
def rsqrt(x: np.ndarray) -> np.ndarray:
    """XLA:CPU refines the CPU's rsqrt estimate (rsqrt14 on AVX-512) with two Newton-Raphson steps; the
    estimate's exact bits are the hardware's, so this starts from the correctly rounded value instead: equal
    to XLA:CPU's result for about 4 values in 5, otherwise one ulp apart."""
    x = np.asarray(x, f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (1 / np.sqrt(x.astype(f64))).astype(f32)
        refined = y
        for _ in range(2):
            refined = fma(refined * f32(-0.5), fma(x * refined, refined, f32(-1)), refined)
    return np.where((x < f32(_TINY)) | (x == f32(np.inf)), y, refined).astype(f32)


# Lanczos' approximation with g = 7, n = 9, as StableHLO's CHLO decomposition (materializeLgamma) writes lgamma
_LANCZOS_G = 7.0
_LANCZOS_BASE = 0.99999999999980993227684700473478
_LANCZOS = (676.520368121885098567009190444019, -1259.13921672240287047156078755283,
            771.3234287776530788486528258894, -176.61502916214059906584551354, 12.507343278686904814458936853,
            -0.13857109526572011689554707, 9.984369578019570859563e-6, 1.50563273514931155834e-7)


def _lanczos(x: np.ndarray):
    """What lgamma and digamma share: ``reflect`` (x < 1/2), ``z`` (-x there, x - 1 elsewhere), ``a(z)``,
    ``t(z) = z + 7.5`` and ``log t(z)`` as CHLO writes them, in x's dtype (float32 with XLA:CPU's log1p)."""
    c = x.dtype.type
    reflect = x < c(0.5)
    z = np.where(reflect, -x, x + c(-1))
    a = np.full_like(z, c(_LANCZOS_BASE))
    for k, coefficient in enumerate(_LANCZOS, 1):
        a = a + c(coefficient) / (z + c(k))
    log1p_ = log1p if x.dtype == f32 else np.log1p
    log_t = log1p_(z * c(1 / (_LANCZOS_G + 0.5))) + c(np.log(_LANCZOS_G + 0.5))
    return reflect, z, a, z + c(_LANCZOS_G + 0.5), log_t


def _sin_cos(x: np.ndarray, fn) -> np.ndarray:
    """float32 sin/cos: XLA:CPU has its own approximation (not ported); the float64 one, rounded, is the closest."""
    return fn(x.astype(f64)).astype(x.dtype) if x.dtype == f32 else fn(x)


@_blockwise
def digamma(x: np.ndarray) -> np.ndarray:
    """digamma of float32 or float64 as CHLO's decomposition (materializeDigamma) writes it:
    ``log t + a'(z) / a(z) - 7 / t`` with ``a'(z) = -sum c_k / (z + k)^2`` (see :func:`_lanczos`); reflected below
    1/2 as ``digamma(1 - x) - pi cos(pi x') / sin(pi x')`` with ``x' = x + |floor(x + 1/2)|``; NaN at the poles
    (x <= 0, integral; at +-0 the jaxlib's value, :func:`._xla_cpu_probe.digamma_at_zero`). Bit for bit with XLA:CPU in float32 for x >= 1/2; below, its sin and cos (not ported)."""
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
        out = np.where(x == 0, c(_xla_cpu_probe.digamma_at_zero()), out)
    return out.astype(x.dtype)


@_blockwise
def lgamma(x: np.ndarray) -> np.ndarray:
    """lgamma of float32 or float64 as XLA computes it: CHLO's Lanczos approximation (``z = x - 1``, or ``-x``
    reflected below 1/2, ``a(z) = c0 + sum c_k / (z + k)``, ``log t(z) = log1p(z * (1/7.5)) + log(7.5)``: XLA's
    simplifier turns the division by 7.5 into a multiplication by its rounded reciprocal,
    ``lgamma = fma(z + 1/2 - t / log t, log t, log(2 pi) / 2) + log(a)``; reflection
    ``log(pi) - log(sin(pi * |frac(x)|')) - lgamma(1 - x)``; +inf at +-inf), so lgamma(1) is 4.8e-7 in float32
    and -5.8e-8 in float64 as in XLA, not 0. float32 with XLA:CPU's log, log1p and multiply-adds: equal to
    XLA:CPU's result bit for bit where x >= 1/2; below, its float32 sin (an approximation of its own, not ported:
    sin here is the float64 one, rounded) makes about 1 result in 1000 differ by an ulp or two. float64 with
    NumPy's log, log1p and sin and unfused multiply-adds (XLA:CPU's differ in the last bits)."""
    x = np.asarray(x)
    dtype = x.dtype
    c = dtype.type
    log_ = log if dtype == f32 else np.log
    with np.errstate(all="ignore"):
        reflect, z, a, t, log_t = _lanczos(x)
        s = (z + c(0.5)) - t / log_t
        half_log_2pi = c((np.log(2) + np.log(np.pi)) / 2)
        head = fma(s, log_t, half_log_2pi) if dtype == f32 else s * log_t + half_log_2pi
        out = head + log_(a)
        frac = np.abs(x) - np.floor(np.abs(x))
        frac = np.where(c(0.5) < frac, c(1) - frac, frac)
        denominator = log_(_sin_cos(c(np.pi) * frac, np.sin))
        reflected = np.where(np.isfinite(denominator), (c(np.log(np.pi)) - denominator) - out, -denominator)
        out = np.where(reflect, reflected, out)
    return np.where(np.isinf(x), c(np.inf), out).astype(dtype)
