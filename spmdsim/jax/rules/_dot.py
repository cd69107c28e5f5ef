"""The NumPy rule for ``dot_general``: one canonical batched matmul for both twins, each slice the same BLAS call
on every device, spread over the CPUs when large (:func:`matmul_slices`). The conventions every rule keeps are :mod:`._elementwise`'s.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from spmdsim.runtime import _blas, _buffers, _threads
from spmdsim.jax.numerics import _xla_cpu_dot
from spmdsim.jax.evaluation._registry import per_device, specialize, vectorized
from spmdsim.jax.rules._elementwise import LOW_FLOATS, _convert_element_type, bit_width, is_float


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
# OpenBLAS computes a product of fewer multiply-adds than this in one thread whatever its count (its gemm
# interface: 65536 x GEMM_MULTITHREAD_THRESHOLD, 4 by default); larger slices run with BLAS held to one thread
BLAS_THREADED = 1 << 16


def matmul_slices(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(..., M, K) @ (..., K, N)`` as one BLAS call per ``(M, K) @ (K, N)`` slice, read in place where BLAS can
    (a transposed view, a broadcast batch axis) and from a C-order copy where it cannot. The kernel BLAS picks
    for a slice depends on the slice's layout (small products' results differ in the last bits between a
    transposed and a copied operand), so callers hand in views of :func:`c_slices` operands: a slice's result
    then never depends on how many slices there are or on which executor made the operands.

    A large product (``SPREAD_FLOPS``) of several slices uses every CPU (:func:`spmdsim.runtime._threads.in_parallel`):
    outside a device thread (the vectorized executor), the slices are split over the CPUs, each part one
    thread's BLAS calls. BLAS itself always runs one thread (:func:`spmdsim.runtime._blas.threads`: its
    threads would change a product's bits on some CPUs, and its pools spin and stall when a CPU is busy), so a
    single large slice runs on one CPU."""
    a, b = _blas_readable(np.asarray(a)), _blas_readable(np.asarray(b))
    if a.shape[-1] == 0:
        return np.zeros((*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]),
                        np.result_type(a, b))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if 2 * math.prod(batch) * a.shape[-2] * a.shape[-1] * b.shape[-1] < SPREAD_FLOPS:
        if a.shape[-2] * a.shape[-1] * b.shape[-1] < BLAS_THREADED:
            return np.matmul(a, b)
        with _blas.limited():  # (outside a device thread BLAS may have its own threads: see _blas.threads)
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


def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(..., M, K) @ (..., K, N)``: in XLA:CPU's own order of additions where spmdsim knows it for this CPU
    (float32, :mod:`spmdsim.jax.numerics._xla_cpu_dot`: small products by default, all known ones under
    ``SPMDSIM_EXACT=1``), else :func:`matmul_slices`. Each slice's order depends on its shape only, so a
    device axis in front (the vectorized executor) gives the per-device bits."""
    out = _xla_cpu_dot.matmul(a, b)
    return matmul_slices(a, b) if out is None else out


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
        return product(a, b).reshape((*n, *out_shape)).astype(out_dtype, copy=False)
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
        out = product(_shaped(c_slices(a), lt, lc, ls), _shaped(c_slices(b), rt, rc, rs))
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
