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
- float16 and bfloat16 use the float32 functions (XLA:CPU upcasts them); float64's own ports (and lgamma,
  digamma, atan) are in :mod:`._xla_cpu_math64`, the C library's functions in :mod:`._libm`.

XLA's results depend on its version and on the instruction set it compiles for: without FMA (a CPU before
AVX2, or ``--xla_cpu_max_isa=AVX``) LLVM does not fuse, and :func:`fma` then rounds the product first, as XLA
does (:mod:`._xla_cpu_isa` says which ISA is in effect). These ports follow jaxlib 0.10.2.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from spmdsim.runtime import _blas, _buffers, _threads
from spmdsim.jax.numerics import _xla_cpu_isa, _xla_cpu_probe

__all__ = ["exp", "log", "sin", "cos", "log1p", "atanh", "tanh", "erf", "erfc", "logistic", "expm1", "rsqrt", "fma",
           "fma64", "multiply_add",
           "ftz", "flush_subnormals"]

f32, f64 = np.float32, np.float64
_TINY = np.finfo(np.float32).tiny


_CHUNK = 1 << 15  # elements of a float64 temporary that stay in a core's cache
_SMALL = 1 << 10  # fewer elements: NumPy's per-call cost dominates (see rounded_once and _horner_fma)
_PARALLEL = 1 << 20  # a fused multiply-add this large uses every CPU (see spmdsim.runtime._threads.in_parallel)


_LOW = np.uint64(0x1FFFFFFF)  # a float64's bits below float32's last mantissa bit
_HALF = np.uint64(0x10000000)  # ... at a float32 rounding midpoint (of a normal float32)
_LOW28 = np.uint64(0x0FFFFFFF)  # zero at every float32 midpoint, normal or subnormal (and at float32 values)
_F32_MIN_NORMAL = 2.0 ** -126
_LITTLE = np.little_endian  # a float64's low 32 bits are the first of its two uint32 halves


def fma32_step(products: np.ndarray, acc: np.ndarray, wide: np.ndarray) -> None:
    """``acc = float32(products + acc)`` rounded once, in place: ``products`` float64 (exact products of float32
    values), ``acc`` float32, ``wide`` a float64 scratch array of ``acc``'s shape.

    The float64 sum rounded to float32 is the exactly rounded sum but where that float64 sum lies exactly on a
    float32 rounding midpoint and is itself inexact (about once in 2**29). Those few elements are found by their
    bits (the low 29 bits ``0x10000000``; a subnormal float32's midpoints have them zero) and moved one float64 ulp
    toward the exact sum (its error by TwoSum): round-to-odd, after which float32's rounding is the correct one.
    Costs 3 NumPy passes more than the plain sum (SPMDSIM_EXACT=1's chains, :mod:`._xla_cpu_dot`)."""
    np.add(products, acc, out=wide)
    bits = wide.view(np.uint64)
    # each element's low 28 bits, shifted up (on a little-endian CPU from the low uint32 half: half the bytes)
    low = np.left_shift(wide.view(np.uint32)[..., ::2], 4) if _LITTLE else np.bitwise_and(bits, _LOW28)
    if not low.all():  # some element's are zero (``low`` has ``wide``'s shape and order)
        index = np.flatnonzero(low == 0)
        s = wide.reshape(-1)[index]
        low = bits.reshape(-1)[index] & _LOW
        size = np.abs(s)
        midpoint = (low == _HALF) | ((size < _F32_MIN_NORMAL) & (size > 0))
        if midpoint.any():
            index, s = index[midpoint], s[midpoint]
            p = products.reshape(-1)[index] if products.shape == acc.shape else \
                np.broadcast_to(products, acc.shape).reshape(-1)[index]
            c = acc.reshape(-1)[index].astype(f64)
            back = s - p
            error = (p - (s - back)) + (c - back)  # TwoSum: s + error == p + c exactly
            odd = s.view(np.uint64) & np.uint64(1)
            move = (error != 0) & (odd == 0) & np.isfinite(error)
            step = np.where((error > 0) == (s > 0), np.uint64(1), np.uint64(0xFFFFFFFFFFFFFFFF))  # +1 or -1 ulp
            wide.reshape(-1)[index[move]] = (s.view(np.uint64)[move] + step[move]).view(f64)
    np.copyto(acc, wide, casting="same_kind")


def rounded_once(a, b, c, dtype=f32, *, negate_product: bool = False, negate_addend: bool = False,
                 out: np.ndarray | None = None) -> np.ndarray:
    """``±a * b ± c`` computed in float64 and rounded to ``dtype`` (float32 or float16) once: a fused multiply-add
    (the product of two float32 or float16 values is exact in float64; a float32 sum is rounded to float64 first,
    which differs from one rounding in about one case in 2**29). Operands broadcast. The float64 product lives in
    a cache-sized temporary, a block at a time: 3-5x faster than float64 copies of large operands. ``out``: a
    C-contiguous array of the result's shape and ``dtype`` to write into; it may be one of the operands (each
    block of it is read before it is written)."""
    combine = np.subtract if negate_addend else np.add
    if out is None and getattr(a, "size", 1) <= _SMALL and getattr(b, "size", 1) <= _SMALL and \
            getattr(c, "size", 1) <= _SMALL:
        # a few elements (a scalar of a sampler's loop): each operand converted to float64 first, then
        # operations of one dtype (NumPy's mixed-dtype and casting calls cost several times more); the same
        # float64 operations and rounding as below
        product = np.asarray(a, f64) * np.asarray(b, f64)
        if negate_product:
            product = -product
        wide = product - np.asarray(c, f64) if negate_addend else product + np.asarray(c, f64)
        return np.asarray(wide.astype(dtype))
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
    AVX512-FP16 is in effect, else the product rounded to float16 and then the sum; float64 rounded once by
    :func:`fma64` where FMA is in effect (as float32); bfloat16 the product rounded, then the sum (measured, see
    :mod:`._xla_cpu_isa`). The float16 fused form is computed in float64 (the product of two float16 values is
    exact there) and rounded to float16."""
    dtype = np.dtype(dtype)
    if dtype == f32:
        return fma(a, b, c)
    if dtype == f64 and _xla_cpu_isa.current().fma:
        return fma64(a, b, c)
    if dtype == np.float16 and _xla_cpu_isa.current().fp16:
        return rounded_once(a, b, c, dtype)
    return np.asarray(np.asarray(a, dtype) * np.asarray(b, dtype) + np.asarray(c, dtype), dtype)


# -- float64 fused multiply-adds, rounded once ---------------------------------------------------------------------
#
# The product of two float64 values needs 106 bits, so NumPy's float64 cannot hold it; an exactly rounded
# ``a * b + c`` is computed from error-free transformations instead (Boldo & Melquiond, "Emulation of FMA and
# correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008):
#   p + pl = a * b        exactly (Dekker's product, Veltkamp's splitting by 2**27 + 1)
#   uh + ul = c + p       exactly (Knuth's TwoSum)
#   t = RO(ul + pl)       rounded to odd: the sum rounded to nearest, then, when inexact and its last bit is even,
#                         moved one ulp towards the exact sum (TwoSum gives the error's sign)
#   result = RN(uh + t)   which is RN(a * b + c) (their theorem, without underflow or overflow).
# That holds where no step overflows or underflows (:func:`_fma64_core`'s domain: every element of ordinary
# magnitude). Elsewhere (:func:`_fma64_edges`): IEEE's rules for infinities, NaNs and zeros; otherwise a and b are
# scaled to [1/2, 1) by their exponents and c with them (c far below the product by a sticky value of its sign, c
# far above it is the result), the core applied and the result scaled back, which is exact unless the result is
# subnormal and the product below 2**-968; those few elements are computed exactly with Python's fractions.
# Checked against Python 3.13's math.fma (a correctly rounded C fma) on tens of millions of random and adversarial
# operands: random bit patterns, ties, cancellations, subnormal and overflowing products and sums, infinities,
# NaNs and signed zeros (``tests/test_fma64.py``; bit for bit, every one).

_SPLITTER = f64(2.0 ** 27 + 1)
_F64_CHUNK = 1 << 13  # elements per block of fma64's temporaries (a dozen float64 arrays stay in a core's cache)


def _two_sum(x, y):
    """``(s, e)``: ``s = RN(x + y)`` and ``e`` its error, ``x + y = s + e`` exactly (Knuth)."""
    s = x + y
    v = s - x
    return s, (x - (s - v)) + (y - v)


def _fma64_core(a, b, c):
    """``(RN(a * b + c), RN(a * b))`` by the algorithm above; exact where |a|, |b| < 2**995, 2**-966 <= |a b| <=
    2**1020, |c| <= 2**1020 and the result is at least 2**-1000 in magnitude (:func:`fma64` checks)."""
    t = _SPLITTER * a
    ah = t - (t - a)
    al = a - ah
    t = _SPLITTER * b
    bh = t - (t - b)
    bl = b - bh
    p = a * b
    pl = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    uh, ul = _two_sum(c, p)
    s, e = _two_sum(ul, pl)
    bits = s.view(np.int64)
    fix = ((bits & 1) == 0) & (e != 0)  # inexact and even: to odd, towards the exact sum
    if fix.any():
        s = (bits + np.where(fix, np.where((e > 0) == (s > 0), 1, -1), 0)).view(f64)
    return uh + s, p


def _fma64_block(a, b, c):
    """:func:`fma64` of float64 operands of one shape (or scalars)."""
    with np.errstate(all="ignore"):
        v, p = _fma64_core(a, b, c)
        magnitude = np.abs(p)
        inside = ((magnitude >= 2.0 ** -966) & (magnitude <= 2.0 ** 1020) & (np.abs(c) <= 2.0 ** 1020)
                  & (np.abs(a) < 2.0 ** 995) & (np.abs(b) < 2.0 ** 995) & (np.abs(v) >= 2.0 ** -1000))
        if inside.all():
            return v
        v = np.array(v, f64)
        edge = ~inside
        a, b, c = np.broadcast_arrays(a, b, c)
        v[edge] = _fma64_edges(a[edge], b[edge], c[edge])
        return v


def _fma64_edges(a, b, c):
    """RN(a * b + c) of 1-d float64 arrays whose elements are outside :func:`_fma64_core`'s domain."""
    out = np.empty(a.shape, f64)
    finite = np.isfinite(a) & np.isfinite(b)
    out[~finite] = a[~finite] * b[~finite] + c[~finite]  # an infinite or NaN product is exact
    infinite_c = finite & ~np.isfinite(c)
    out[infinite_c] = c[infinite_c]  # a finite product (even one past float64's range) and an infinite or NaN c
    zero_product = finite & ((a == 0) | (b == 0)) & ~infinite_c
    out[zero_product] = a[zero_product] * b[zero_product] + c[zero_product]  # an exact zero plus c
    rest = finite & ~infinite_c & ~zero_product
    zero_c = rest & (c == 0)
    out[zero_c] = a[zero_c] * b[zero_c]  # the product rounded once; its sign when it rounds to zero
    rest &= ~zero_c
    if not rest.any():
        return out
    a, b, c = a[rest], b[rest], c[rest]
    ma, ea = np.frexp(a)
    mb, eb = np.frexp(b)
    mc, ec = np.frexp(c)
    e = ea.astype(np.int64) + eb  # |a b| < 2**e, the product's scaled form ma * mb in [1/4, 1), exact to 2**-106
    shift = ec - e
    above = shift > 60  # |c| >= 2**(ec - 1) > 2**58 |a b|: RN(c + a b) = c
    below = shift < -110  # |c| < 2**-110 of the scaled product: only its sign matters (a sticky bit)
    scaled_c = np.where(below, np.copysign(f64(2.0 ** -200), c), np.ldexp(mc, np.clip(shift, -110, 60).astype(np.int32)))
    v, _ = _fma64_core(ma, mb, scaled_c)
    result = np.where(above, c, np.ldexp(v, np.clip(e, -4000, 4000).astype(np.int32)))
    # scaling back rounds a second time only where the result is subnormal; below a product of 2**-968 it can then
    # be inexact (above, the exact result is a multiple of 2**-1074 and so representable): computed exactly
    for k in np.flatnonzero(~above & (v != 0) & (np.frexp(v)[1] + e <= -1022) & (e < -968)):
        result[k] = _fma64_exact(float(a[k]), float(b[k]), float(c[k]))
    out[rest] = result
    return out


def _fma64_exact(a: float, b: float, c: float) -> float:
    """RN(a * b + c) of finite nonzero values by exact rational arithmetic (a correctly rounded int division)."""
    from fractions import Fraction
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:
        return 0.0
    r = x.numerator / x.denominator
    return r if r != 0 else (0.0 if x > 0 else -0.0)


def fma64(a, b, c, *, negate_product: bool = False, negate_addend: bool = False,
          out: np.ndarray | None = None) -> np.ndarray:
    """``±a * b ± c`` in float64 rounded once (IEEE's fusedMultiplyAdd, round to nearest even; subnormals kept),
    as XLA:CPU computes a float64 multiply feeding an add where the ISA has FMA (see the block comment above).
    Operands broadcast; computed a cache-sized block at a time. ``out``: a C-contiguous float64 array of the
    result's shape to write into; it may be one of the operands."""
    ops = [np.asarray(x, f64) for x in (a, b, c)]
    if negate_product:
        ops[0] = np.negative(ops[0])
    if negate_addend:
        ops[2] = np.negative(ops[2])
    shape = np.broadcast_shapes(*(x.shape for x in ops))
    size = math.prod(shape)
    if out is None and size <= _F64_CHUNK:
        return np.asarray(_fma64_block(*ops)).reshape(shape)
    if out is None:
        out = _buffers.empty(shape, f64, faulted=True)
    elif out.shape != shape or out.dtype != f64 or not out.flags.c_contiguous:
        raise ValueError(f"fma64: out must be a C-contiguous float64{list(shape)} array, got "
                         f"{out.dtype}{list(out.shape)}")
    # each operand flat (a broadcast one made whole first, unless it is a single value)
    flat = [x.reshape(()) if x.size == 1 else
            (x if x.shape == shape else np.broadcast_to(x, shape)).reshape(-1) for x in ops]
    target = out.reshape(-1)
    for start in range(0, size, _F64_CHUNK):
        stop = min(start + _F64_CHUNK, size)
        target[start:stop] = _fma64_block(*(x if x.ndim == 0 else x[start:stop] for x in flat))
    return out


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
    one device thread at a time computes a large port, :func:`spmdsim.runtime._threads.one_at_a_time`.)"""
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
    if wide.size <= _SMALL:  # one dtype per call (see rounded_once): the same float64 steps, rounded alike
        p = np.full(wide.shape, f32(coefficients[0]), f32)
        for c in coefficients[1:]:
            p = np.asarray((p.astype(f64) * wide + f64(f32(c))).astype(f32))
        return p
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


def _log1p_ratio(x: np.ndarray) -> np.ndarray:
    """``P(x) / Q(x)`` of Cephes' log1p, Horner with fused multiply-adds."""
    return _horner_fma(x, (0.0, *_LOG1P_NUMERATOR)) / _horner_fma(x, (0.0, *_LOG1P_DENOMINATOR))


@_blockwise
def log1p(x: np.ndarray) -> np.ndarray:
    """For |x| < sqrt(2) - 1, Cephes' rational approximation x - x^2/2 + x^3 P(x)/Q(x); else log(1 + x)."""
    x = _daz(x)
    x2 = x * x
    small = fma(f32(-0.5), x2, (x * x2) * _log1p_ratio(x))
    small = x + small
    with np.errstate(invalid="ignore"):
        large = log(x + f32(1))
    return np.asarray(np.where(np.abs(x) < f32(0.41421356237309504880), small, large), f32)


@_blockwise
def atanh(x: np.ndarray) -> np.ndarray:
    """float32 ``atanh`` as XLA:CPU computes CHLO's ``(log1p(x) - log1p(-x)) / 2`` (NaN beyond |x| = 1) fused in
    one loop: the two :func:`log1p` share ``-x^2/2``, which then has two uses, and LLVM fuses a multiply into an
    add only where it has one, so each small branch is ``fma(+-x^3, P/Q, round(-x^2/2))`` (the standalone log1p
    fuses ``-x^2/2`` instead)."""
    x = _daz(x)
    with np.errstate(all="ignore"):
        x2 = x * x
        half = x2 * f32(-0.5)
        small = np.abs(x) < f32(0.41421356237309504880)
        up = np.where(small, x + fma(x * x2, _log1p_ratio(x), half), log(x + f32(1)))
        down = np.where(small, fma(-x * x2, _log1p_ratio(-x), half) - x, log(f32(1) - x))
        out = (up - down) * f32(0.5)
    return np.where(np.abs(x) > f32(1), f32(np.nan), out).astype(f32)


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


def from_hex(dtype, *words: str) -> tuple:
    """Constants written as their IEEE bits in hex (``"3F800000"``: 1.0), as XLA's LLVM IR prints them."""
    return tuple(float(np.frombuffer(bytes.fromhex(w)[::-1], dtype)[0]) for w in words)


# float32 erfc as CHLO decomposes it and XLA:CPU compiles it (jaxlib 0.10.2's LLVM IR; Cephes' erfcf): for
# |x| < 1, 1 - x E(x^2); else exp(-x^2) / |x| R(1/x^2), R one of two polynomials (|x| < 2 or not), 0 where
# x^2 > 88.72, 2 - that for x < 0. Highest degree first; every step a fused multiply-add.
_ERFC_SMALL = from_hex(f32, "3CBE9CF4", "BE0E0868", "3EBCCBD0", "BF151CF8", "3F1EF9E3", "BEFD28C0", "3EAE5471",
                       "BE8C5880", "3F1056E6")
_ERFC_LARGE = from_hex(f32, "C127A483", "414FA29C", "C0EFDB4A", "403AF1FA", "BF81F436", "3ED7FC3E", "BE906C5D",
                       "3F106EB9")
_ERFC_ERF = from_hex(f32, "38A4B519", "BA51FB80", "3BAA02D9", "BCDBFC87", "3DE7167C", "BEC0939F", "3F906EBA")
_ERFC_UNDERFLOW = from_hex(f32, "42B17218")[0]


@_blockwise
def erfc(x: np.ndarray) -> np.ndarray:
    """float32 ``erfc`` as XLA:CPU computes CHLO's decomposition (see ``_ERFC_SMALL``), with its own ``exp``."""
    x = _daz(x)
    with np.errstate(all="ignore"):
        x2 = ftz(x * x)
        w = f32(1) / x2
        magnitude = np.abs(x)
        tail = np.where(magnitude < f32(2), _horner_fma(w, _ERFC_SMALL), _horner_fma(w, _ERFC_LARGE))
        q = ftz((exp(-x2) * (f32(1) / magnitude)) * tail)
        q = np.where(x2 > f32(_ERFC_UNDERFLOW), f32(0), q)
        q = np.where(x < 0, f32(2) - q, q)
        near = fma(-x, _horner_fma(x2, _ERFC_ERF), f32(1))
        return np.where(magnitude < f32(1), near, q).astype(f32)


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
    """XLA:CPU refines the CPU's rsqrt estimate (rsqrt14 on AVX-512) with Newton-Raphson steps; the estimate's
    exact bits are the CPU's. Where this CPU's XLA:CPU was measured (:func:`._xla_cpu_probe.rsqrt_offsets`), its
    bits, for every positive normal float32; otherwise the refinement started from the correctly rounded value
    (equal to XLA:CPU's result for about 4 values in 5 on the Intel Xeon it was written on, one ulp apart
    elsewhere). Zero, infinity and negatives: the correctly rounded value (+-inf, 0, NaN); subnormals are
    flushed to a zero of their sign first, as XLA:CPU does (+-inf)."""
    x = np.asarray(x, f32)
    offsets = _xla_cpu_probe.rsqrt_offsets()
    with np.errstate(divide="ignore", invalid="ignore"):
        flushed = np.where(np.abs(x) < f32(_TINY), np.copysign(f32(0), x), x)
        y = (1 / np.sqrt(flushed.astype(f64))).astype(f32)
        special = (x < f32(_TINY)) | (x == f32(np.inf)) | np.isnan(x)
        if offsets is not None:
            index = (x.view(np.int32) - np.int32(127 << 23)) & np.int32((1 << 24) - 1)
            measured = (y.view(np.int32) + offsets[index]).view(f32)
            return np.where(special, y, measured).astype(f32)
        refined = y
        for _ in range(2):
            refined = fma(refined * f32(-0.5), fma(x * refined, refined, f32(-1)), refined)
    return np.where(special, y, refined).astype(f32)


def _sin_cos(x: np.ndarray, fn) -> np.ndarray:
    """float32 sin/cos as XLA:CPU computes them (:func:`sin`, :func:`cos`); float64 by NumPy."""
    if x.dtype != f32:
        return fn(x)
    return sin(x) if fn is np.sin else cos(x)


# XLA:CPU (jaxlib 0.10.2, 0.11.2, 0.12.0.1) emits float32 ``sine``/``cosine`` as ``llvm.sin``/``llvm.cos``, which
# LLVM scalarises into calls of the C library's ``sinf``/``cosf`` (the object code of a ``jit(jnp.sin)`` kernel:
# sixteen ``call sinf`` per 64-byte block, the symbol resolved in the process: glibc's libm on Linux). glibc's
# sinf/cosf (ARM's optimized-routines algorithm) evaluate in double and round once; their result before that
# rounding is within 0.0607 float32 ulp of sin(x) (measured: every positive normal float32, glibc 2.36 with FMA,
# against the double ``sin``: sinf differs from the float64 value rounded in 14.7 million of 2.1 billion, all
# within 0.0607 ulp of a rounding midpoint).
SIN_COS_WINDOW = 1 / 8  # float32 ulps from a rounding midpoint under which the C library itself is called


@functools.lru_cache(maxsize=None)
def _libm_float32(symbol: str):
    """The C library's ``float symbol(float)`` as a NumPy object ufunc, or None without one."""
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    try:
        fn = getattr(ctypes.CDLL(name), symbol) if name is not None else None
    except (OSError, AttributeError):
        fn = None
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.frompyfunc(fn, 1, 1)


def _libm_screened(x: np.ndarray, symbol: str, wide_fn) -> np.ndarray:
    """``symbol`` (``sinf``/``cosf``) of every element of float32 ``x``: the float64 function rounded to float32
    wherever its value lies at least :data:`SIN_COS_WINDOW` of an ulp from a float32 rounding midpoint (there the
    C library's result, whose error before its one rounding is far smaller, rounds the same way), the C library
    itself elsewhere (about one element in four) and at every infinite or NaN operand. Each element's result
    depends on its value only. Without a C library: the float64 function rounded."""
    x = np.asarray(x, f32)
    with np.errstate(all="ignore"):
        wide = wide_fn(x.astype(f64))
        out = wide.astype(f32)
        narrow = out.astype(f64)
        side = np.where(wide >= narrow, f32(np.inf), f32(-np.inf))
        other = np.nextafter(out, side).astype(f64)
        distance = np.abs(wide - (narrow + other) * 0.5) / np.abs(other - narrow)
    call = ~(distance >= SIN_COS_WINDOW)  # NaN too: infinite or NaN operands
    lib = _libm_float32(symbol)
    if lib is None or not call.any():
        return out
    out = np.array(out, copy=True)
    out[call] = np.asarray(lib(x[call]), dtype=f32)
    return out


@_blockwise
def sin(x: np.ndarray) -> np.ndarray:
    """float32 ``sin`` as XLA:CPU computes it: the C library's ``sinf`` (see :func:`_libm_screened`); a subnormal
    operand is its own result, as sinf returns it (no flush)."""
    return _libm_screened(x, "sinf", np.sin)


@_blockwise
def cos(x: np.ndarray) -> np.ndarray:
    """float32 ``cos`` as XLA:CPU computes it: the C library's ``cosf`` (see :func:`_libm_screened`)."""
    return _libm_screened(x, "cosf", np.cos)
