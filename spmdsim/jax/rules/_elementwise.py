"""NumPy rules for JAX's array primitives (``jax.lax``), following XLA:CPU's semantics, in both rule tables: the
helpers every family of rules uses, and the elementwise primitives that are conversions and identities.

Each primitive has a per-device rule (one device's arrays) and, beside it, its vectorized twin (every operand
and result with a leading device axis; see :mod:`spmdsim.jax.evaluation._registry`). The twins compute the same thing
the same way, so that ``VECTORIZED[p](*xs)[d]`` equals ``PER_DEVICE[p](*(x[d] for x in xs))`` bit for bit:

- elementwise rules run unchanged on the stacked operands (a per-device scalar becomes ``(n, 1, ..., 1)``:
  :func:`elementwise`, :func:`both`);
- rules with axis parameters get the axes shifted by one (:mod:`._structural`, :mod:`._reductions`);
- gather, scatter and the dynamic slices treat the device axis as a batching dimension of the operation;
- matrix products (``dot_general`` in :mod:`._dot`, convolutions in :mod:`._windows`) are batched ``np.matmul``
  calls whose every slice is the same ``(M, K) @ (K, N)`` product for both twins (BLAS results depend on the
  shape of the call, so the device axis is only ever an outer batch axis, never folded into M or N).

Conventions: results keep the dtypes the jaxpr expects (checked by the interpreter); float16 and bfloat16
are computed in float32 and rounded once, as XLA:CPU does (:func:`via_f32`); integer arithmetic wraps; integer
division by zero gives -1 (all bits set) and remainder by zero the dividend, as on XLA:CPU; nothing is modified
in place (inputs may be read-only views shared between devices).
"""
from __future__ import annotations

from typing import Callable

import ml_dtypes
import numpy as np

from spmdsim.jax.numerics import _xla_cpu_isa
from spmdsim.jax.evaluation._registry import per_device, specialize, vectorized


LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


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


def _float_to_int(x: np.ndarray, new_dtype: np.dtype) -> np.ndarray:
    """XLA's float-to-integer conversion: truncate toward zero, saturate, NaN to 0."""
    info = np.iinfo(new_dtype)
    if x.ndim == 0 and x.dtype in (np.float32, np.float64):  # one value (a loop counter): the same, in Python
        v = float(x)
        return np.asarray(0 if v != v else info.max if v >= float(info.max) else info.min if v <= float(info.min)
                          else int(v), new_dtype)
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
