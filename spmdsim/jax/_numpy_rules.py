"""NumPy rules for JAX's array primitives (``jax.lax``), following XLA's semantics.

Conventions: results keep the dtypes the jaxpr expects (checked by the interpreter); float16 and bfloat16
elementwise functions are computed in float32 and rounded once, as XLA:CPU does; integer arithmetic wraps;
nothing is modified in place (inputs may be read-only views shared between devices).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from spmdsim.jax._interpreter import impl, specialize

_LOW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def _operand_dtype(eqn, i: int = 0) -> np.dtype | None:
    aval = getattr(eqn.invars[i], "aval", None)
    try:
        return np.dtype(aval.dtype)
    except TypeError:  # key types
        return None


def _via_f32(fn):
    """Apply ``fn`` in float32 for float16/bfloat16 inputs, then round back to the input dtype."""
    def rule(x, *rest, **params):
        if x.dtype in _LOW_FLOATS:
            return np.asarray(fn(x.astype(np.float32), *(r.astype(np.float32) for r in rest))).astype(x.dtype)
        return fn(x, *rest)

    @specialize
    def direct(eqn):  # the jaxpr says the dtype: no float32 detour needed, call the NumPy function itself
        dtype = _operand_dtype(eqn)
        return fn if dtype is not None and dtype not in _LOW_FLOATS else None
    return direct(rule)


# -- elementwise -----------------------------------------------------------------------------------------

_UNARY = {
    "neg": np.negative, "sign": np.sign, "floor": np.floor, "ceil": np.ceil, "is_finite": np.isfinite,
    "exp": np.exp, "exp2": np.exp2, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "sqrt": np.sqrt, "cbrt": np.cbrt, "abs": np.abs, "real": np.real, "imag": np.imag, "conj": np.conj,
    "square": np.square,
    "rsqrt": lambda x: np.asarray(1, x.dtype) / np.sqrt(x),
    "logistic": lambda x: np.asarray(1, x.dtype) / (np.asarray(1, x.dtype) + np.exp(-x)),
}
_BINARY = {
    "add": np.add, "add_any": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
    "atan2": np.arctan2, "nextafter": np.nextafter, "rem": np.fmod,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal,
}

for _name, _fn in _UNARY.items():
    impl(_name)(_via_f32(_fn))
for _name, _fn in _BINARY.items():
    impl(_name)(_via_f32(_fn) if _name not in ("eq", "ne", "lt", "le", "gt", "ge") else
                specialize(lambda eqn, fn=_fn: fn)((lambda fn: lambda x, y: fn(x, y))(_fn)))


@impl("not")
def _not(x):
    return np.invert(x)


def _float_divide(eqn):
    dtype = _operand_dtype(eqn)
    return np.true_divide if dtype is not None and dtype.kind in "fc" and dtype not in _LOW_FLOATS else None


@impl("div")
@specialize(_float_divide)
def _div(x, y):
    if x.dtype.kind in "iu":  # C semantics: round toward zero
        q = np.floor_divide(x, np.where(y == 0, 1, y))
        fix = (np.remainder(x, np.where(y == 0, 1, y)) != 0) & ((x < 0) != (y < 0))
        return (q + fix.astype(x.dtype)).astype(x.dtype)
    return _via_f32(np.true_divide)(x, y)


@impl("pow")
def _pow(x, y):
    return _via_f32(np.power)(x, y.astype(x.dtype)).astype(x.dtype)


def _specialize_integer_pow(eqn):
    y, dtype = eqn.params["y"], _operand_dtype(eqn)
    if y == 2 and dtype is not None and dtype not in _LOW_FLOATS:
        return lambda x: x * x  # what the expansion below does for y=2, without the loop
    return None


@impl("integer_pow")
@specialize(_specialize_integer_pow)
def _integer_pow(x, *, y):
    """Binary exponentiation with multiplications in x's dtype, as XLA expands it."""
    def power(a):
        acc, base, n = None, a, abs(y)
        while n:
            if n & 1:
                acc = base if acc is None else acc * base
            n >>= 1
            if n:
                base = base * base
        acc = np.ones_like(a) if acc is None else acc
        return np.asarray(1, a.dtype) / acc if y < 0 else acc
    return _via_f32(power)(x).astype(x.dtype)


@impl("round")
def _round(x, *, rounding_method):
    if int(rounding_method) == 1:  # TO_NEAREST_EVEN
        return np.round(x)
    return _via_f32(lambda a: np.sign(a) * np.floor(np.abs(a) + np.asarray(0.5, a.dtype)))(x).astype(x.dtype)


def _vectorize(fn):
    return lambda x: np.vectorize(fn, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


impl("erf")(_via_f32(_vectorize(math.erf)))
impl("erfc")(_via_f32(_vectorize(math.erfc)))
impl("lgamma")(_via_f32(_vectorize(math.lgamma)))


@impl("erf_inv")
def _erf_inv(x):
    """Giles' single-precision approximation of erfinv, the polynomial XLA uses for float32."""
    def f32(a):
        a = a.astype(np.float32)
        w = -np.log1p(-a * a)
        small = w < np.float32(5.0)
        ws = w - np.float32(2.5)
        wl = np.sqrt(w) - np.float32(3.0)
        p_small = np.float32(2.81022636e-08)
        for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941):
            p_small = np.float32(c) + p_small * ws
        p_large = np.float32(-0.000200214257)
        for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                  0.00943887047, 1.00167406, 2.83297682):
            p_large = np.float32(c) + p_large * wl
        out = np.where(small, p_small, p_large) * a
        return np.where(np.abs(a) == 1, a * np.float32(np.inf), out).astype(np.float32)
    if x.dtype == np.float64:
        return _vectorize(_erfinv64)(x)
    return f32(x).astype(x.dtype)


def _erfinv64(y: float) -> float:
    if abs(y) >= 1:
        return math.copysign(math.inf, y) if abs(y) == 1 else math.nan
    x = math.copysign(math.sqrt(-math.log((1 - abs(y)) / 2)), y) if abs(y) > 0.7 else y
    for _ in range(60):  # Newton on erf(x) - y
        x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


@impl("population_count")
def _popcount(x):
    bits = np.unpackbits(x.view(np.uint8).reshape(*x.shape, x.dtype.itemsize), axis=-1)
    return bits.sum(axis=-1).astype(x.dtype)


def _shift_amount_ok(y, bits):
    return (y >= 0) & (y < bits)


@impl("shift_left")
def _shift_left(x, y):
    bits = x.dtype.itemsize * 8
    ok = _shift_amount_ok(y, bits)
    return np.where(ok, np.left_shift(x, np.where(ok, y, 0).astype(x.dtype)), 0).astype(x.dtype)


@impl("shift_right_logical")
def _shift_right_logical(x, y):
    bits = x.dtype.itemsize * 8
    unsigned = np.dtype(f"u{x.dtype.itemsize}")
    ok = _shift_amount_ok(y, bits)
    shifted = np.right_shift(x.view(unsigned), np.where(ok, y, 0).astype(unsigned))
    return np.where(ok, shifted, 0).astype(unsigned).view(x.dtype)


@impl("shift_right_arithmetic")
def _shift_right_arithmetic(x, y):
    bits = x.dtype.itemsize * 8
    signed = np.dtype(f"i{x.dtype.itemsize}")
    xs = x.view(signed)
    amount = np.clip(y, 0, bits - 1).astype(signed)
    return np.right_shift(xs, amount).astype(signed).view(x.dtype)


@impl("complex")
def _complex(x, y):
    dtype = np.complex64 if x.dtype == np.float32 else np.complex128
    return (x + 1j * y).astype(dtype)


@impl("select_n")
def _select_n(which, *cases):
    if len(cases) == 1:
        return cases[0]
    shape = np.broadcast_shapes(*(c.shape for c in cases))
    return np.choose(np.broadcast_to(which, shape).astype(np.intp), [np.broadcast_to(c, shape) for c in cases])


@impl("clamp")
def _clamp(lo, x, hi):
    return np.minimum(np.maximum(x, lo), hi).astype(x.dtype)


@impl("convert_element_type")
def _convert_element_type(x, *, new_dtype, weak_type=False, sharding=None):
    new_dtype = np.dtype(new_dtype)
    if x.dtype.kind == "c" and new_dtype.kind != "c":
        x = np.real(x)
    if x.dtype.kind == "f" or x.dtype in _LOW_FLOATS:
        if new_dtype.kind in "iu":  # XLA saturates, NaN becomes 0
            info = np.iinfo(new_dtype)
            y = np.trunc(x.astype(np.float64))
            y = np.where(np.isnan(y), 0, np.clip(y, info.min, info.max))
            return y.astype(new_dtype)
        if new_dtype == np.bool_:
            return x != 0
    return x.astype(new_dtype)


@impl("bitcast_convert_type")
def _bitcast_convert_type(x, *, new_dtype):
    new_dtype = np.dtype(new_dtype)
    if new_dtype.itemsize == x.dtype.itemsize:
        return np.ascontiguousarray(x).view(new_dtype)
    if new_dtype.itemsize < x.dtype.itemsize:
        return np.ascontiguousarray(x).view(new_dtype).reshape(*x.shape, x.dtype.itemsize // new_dtype.itemsize)
    return np.ascontiguousarray(x).view(new_dtype).reshape(x.shape[:-1])


@impl("reduce_precision")
def _reduce_precision(x, *, exponent_bits, mantissa_bits):
    target = {(8, 7): ml_dtypes.bfloat16, (5, 10): np.float16, (8, 23): np.float32, (11, 52): np.float64}.get(
        (exponent_bits, mantissa_bits))
    if target is None:
        raise NotImplementedError(f"reduce_precision to {exponent_bits} exponent / {mantissa_bits} mantissa bits")
    return x.astype(target).astype(x.dtype)


@impl("copy", "copy_p", "pvary", "sharding_constraint", "pcast", "stop_gradient")
def _identity(x, **_):
    return x


@impl("optimization_barrier")
def _optimization_barrier(*xs, **_):
    return list(xs)


# -- shapes ----------------------------------------------------------------------------------------------

def _expanded_shape(operand_shape, shape, broadcast_dimensions) -> tuple:
    """The operand's shape with size-1 axes inserted, so that it broadcasts to ``shape``."""
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = operand_shape[src]
    return tuple(expanded)


def _static_broadcast(eqn):
    """broadcast_in_dim with a static shape: the operand's shape is known, so is the reshape before it."""
    if len(eqn.invars) != 1:
        return None
    shape = tuple(eqn.params["shape"])
    expanded = _expanded_shape(eqn.invars[0].aval.shape, shape, eqn.params["broadcast_dimensions"])
    return lambda x: np.broadcast_to(x.reshape(expanded), shape)


@impl("broadcast_in_dim")
@specialize(_static_broadcast)
def _broadcast_in_dim(x, *dyn_shape, shape, broadcast_dimensions, sharding=None):
    return np.broadcast_to(x.reshape(_expanded_shape(x.shape, shape, broadcast_dimensions)), shape)


@impl("reshape")
def _reshape(x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dimensions is not None:
        x = np.transpose(x, dimensions)
    return np.reshape(x, new_sizes)


@impl("squeeze")
def _squeeze(x, *, dimensions):
    return np.squeeze(x, axis=tuple(dimensions))


@impl("expand_dims")
def _expand_dims(x, *, dimensions):
    return np.expand_dims(x, tuple(dimensions))


@impl("transpose")
def _transpose(x, *, permutation):
    return np.transpose(x, permutation)


@impl("rev")
def _rev(x, *, dimensions):
    return np.flip(x, tuple(dimensions)) if dimensions else x


@impl("pad")
def _pad(x, padding_value, *, padding_config):
    out = x
    for axis, (lo, hi, interior) in enumerate(padding_config):
        if interior:
            n = out.shape[axis]
            shape = list(out.shape)
            shape[axis] = n + (n - 1) * interior if n else 0
            spaced = np.full(shape, padding_value, dtype=x.dtype)
            index = [slice(None)] * out.ndim
            index[axis] = slice(None, None, interior + 1)
            spaced[tuple(index)] = out
            out = spaced
        pad_width = [(0, 0)] * out.ndim
        pad_width[axis] = (max(lo, 0), max(hi, 0))
        out = np.pad(out, pad_width, constant_values=padding_value)
        index = [slice(None)] * out.ndim
        index[axis] = slice(max(-lo, 0), out.shape[axis] - max(-hi, 0))
        out = out[tuple(index)]
    return out


@impl("concatenate")
def _concatenate(*xs, dimension):
    return np.concatenate(xs, axis=dimension)


@impl("stack")
def _stack(*xs, axis):
    return np.stack(xs, axis=axis)


@impl("split")
def _split(x, *, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


@impl("slice")
def _slice(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * x.ndim
    return x[tuple(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides))]


def _clamped_starts(shape, starts, sizes):
    return [int(np.clip(int(s), 0, d - n)) for s, d, n in zip(starts, shape, sizes)]


@impl("dynamic_slice")
def _dynamic_slice(x, *starts_and_dyn, slice_sizes):
    starts = _clamped_starts(x.shape, starts_and_dyn[:x.ndim], slice_sizes)
    return x[tuple(slice(s, s + n) for s, n in zip(starts, slice_sizes))]


@impl("dynamic_update_slice")
def _dynamic_update_slice(x, update, *starts):
    starts = _clamped_starts(x.shape, starts, update.shape)
    out = x.copy()
    out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape))] = update
    return out


@impl("iota")
def _iota(*dyn, dtype, shape, dimension, sharding=None):
    ramp = np.arange(shape[dimension], dtype=dtype)
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    return np.broadcast_to(ramp.reshape(expanded), shape)


# -- gather and scatter (XLA semantics, vectorised with advanced indexing) --------------------------------

def _mode_name(mode) -> str:
    return getattr(mode, "name", str(mode)).upper()


def _window_index(operand_shape, indices, dnums, slice_sizes, *, start_index_map, collapsed, operand_batching,
                  indices_batching):
    """For every batch position and window offset, the operand coordinate, as arrays for fancy indexing.

    Returns (index tuple, batch shape, window dims kept, in-bounds mask before clamping)."""
    batch_shape = indices.shape[:-1]
    nb = len(batch_shape)
    starts = [np.zeros(batch_shape, dtype=np.int64) for _ in operand_shape]
    for k, d in enumerate(start_index_map):
        starts[d] = indices[..., k].astype(np.int64)
    for od, idim in zip(operand_batching, indices_batching):
        ramp = np.arange(batch_shape[idim]).reshape([-1 if a == idim else 1 for a in range(nb)])
        starts[od] = np.broadcast_to(ramp, batch_shape).astype(np.int64)
    in_bounds = np.ones(batch_shape, dtype=bool)
    for d, size in enumerate(slice_sizes):
        in_bounds &= (starts[d] >= 0) & (starts[d] <= operand_shape[d] - size)
        starts[d] = np.clip(starts[d], 0, operand_shape[d] - size)
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


@impl("gather")
def _gather(operand, indices, *, dimension_numbers, slice_sizes, mode, fill_value=None, indices_are_sorted=False,
            unique_indices=False):
    dn = dimension_numbers
    index, batch_shape, window_dims, in_bounds = _window_index(
        operand.shape, indices, dn, slice_sizes, start_index_map=dn.start_index_map,
        collapsed=dn.collapsed_slice_dims, operand_batching=dn.operand_batching_dims,
        indices_batching=dn.start_indices_batching_dims)
    out = operand[index]  # shape: batch_shape + window dims (in operand order)
    if _mode_name(mode).endswith("FILL_OR_DROP"):
        if fill_value is None:
            fill_value = np.nan if operand.dtype.kind in "fc" or operand.dtype in _LOW_FLOATS else (
                np.iinfo(operand.dtype).min if operand.dtype.kind == "i" else
                np.iinfo(operand.dtype).max if operand.dtype.kind == "u" else True)
        mask = in_bounds.reshape(batch_shape + (1,) * len(window_dims))
        out = np.where(mask, out, np.asarray(fill_value).astype(operand.dtype))
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


def _scatter(combine):
    def rule(operand, indices, updates, *, dimension_numbers, mode, update_jaxpr=None, update_consts=(),
             indices_are_sorted=False, unique_indices=False):
        dn = dimension_numbers
        window_sizes = []
        uw = list(dn.update_window_dims)
        update_window_shape = [updates.shape[d] for d in uw]
        it = iter(update_window_shape)
        for d in range(operand.ndim):
            if d in dn.inserted_window_dims or d in dn.operand_batching_dims:
                window_sizes.append(1)
            else:
                window_sizes.append(next(it))
        index, batch_shape, window_dims, in_bounds = _window_index(
            operand.shape, indices, dn, window_sizes, start_index_map=dn.scatter_dims_to_operand_dims,
            collapsed=dn.inserted_window_dims, operand_batching=dn.operand_batching_dims,
            indices_batching=dn.scatter_indices_batching_dims)
        # updates: put scatter (batch) dims first, window dims after, like the gathered layout
        batch_axes = [d for d in range(updates.ndim) if d not in uw]
        upd = np.transpose(updates, batch_axes + uw)
        keep = in_bounds.reshape(batch_shape + (1,) * len(window_dims))
        keep = np.broadcast_to(keep, upd.shape)
        out = operand.copy()
        full_index = tuple(np.broadcast_to(i, upd.shape)[keep] for i in index)
        combine(out, full_index, upd[keep])
        return out
    return rule


def _assign(out, index, values):
    out[index] = values


impl("scatter")(_scatter(_assign))
impl("scatter-add", "scatter_add")(_scatter(lambda o, i, v: np.add.at(o, i, v)))
impl("scatter-mul", "scatter_mul")(_scatter(lambda o, i, v: np.multiply.at(o, i, v)))
impl("scatter-min", "scatter_min")(_scatter(lambda o, i, v: np.minimum.at(o, i, v)))
impl("scatter-max", "scatter_max")(_scatter(lambda o, i, v: np.maximum.at(o, i, v)))


# -- reductions ------------------------------------------------------------------------------------------

def _reduction(ufunc):
    def rule(x, *, axes, out_sharding=None):
        if x.dtype in _LOW_FLOATS and ufunc in (np.add, np.multiply):
            return ufunc.reduce(x.astype(np.float32), axis=tuple(axes)).astype(x.dtype)
        return ufunc.reduce(x, axis=tuple(axes), dtype=x.dtype if ufunc in (np.add, np.multiply) else None)

    @specialize
    def direct(eqn):
        dtype = _operand_dtype(eqn)
        if dtype is None or dtype in _LOW_FLOATS:
            return None
        axis, acc = tuple(eqn.params["axes"]), dtype if ufunc in (np.add, np.multiply) else None
        return lambda x: ufunc.reduce(x, axis=axis, dtype=acc)
    return direct(rule)


impl("reduce_sum")(_reduction(np.add))
impl("reduce_prod")(_reduction(np.multiply))
impl("reduce_max")(_reduction(np.maximum))
impl("reduce_min")(_reduction(np.minimum))
impl("reduce_and")(_reduction(np.bitwise_and))
impl("reduce_or")(_reduction(np.bitwise_or))
impl("reduce_xor")(_reduction(np.bitwise_xor))


@impl("argmax")
def _argmax(x, *, axes, index_dtype):
    return np.argmax(x, axis=axes[0]).astype(index_dtype)


@impl("argmin")
def _argmin(x, *, axes, index_dtype):
    return np.argmin(x, axis=axes[0]).astype(index_dtype)


def _cumulative(fn):
    def rule(x, *, axis, reverse):
        y = np.flip(x, axis) if reverse else x
        y = fn(y, axis)
        return (np.flip(y, axis) if reverse else y).astype(x.dtype)
    return rule


impl("cumsum")(_cumulative(lambda x, a: np.cumsum(x, axis=a, dtype=x.dtype)))
impl("cumprod")(_cumulative(lambda x, a: np.cumprod(x, axis=a, dtype=x.dtype)))
impl("cummax")(_cumulative(lambda x, a: np.maximum.accumulate(x, axis=a)))
impl("cummin")(_cumulative(lambda x, a: np.minimum.accumulate(x, axis=a)))
impl("cumlogsumexp")(_cumulative(lambda x, a: np.logaddexp.accumulate(x, axis=a)))


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


def _dot_general_with(plan, compute, out_dtype):
    lhs_perm, lhs_shape, rhs_perm, rhs_shape, out_shape = plan

    def dot(lhs, rhs):
        a = np.transpose(lhs, lhs_perm).astype(compute, copy=False).reshape(lhs_shape)
        b = np.transpose(rhs, rhs_perm).astype(compute, copy=False).reshape(rhs_shape)
        return np.matmul(a, b).reshape(out_shape).astype(out_dtype, copy=False)
    return dot


def _dot_general_dtypes(lhs_dtype, rhs_dtype, preferred_element_type):
    out = np.dtype(preferred_element_type) if preferred_element_type is not None else np.result_type(lhs_dtype,
                                                                                                      rhs_dtype)
    return (np.dtype(np.float32) if out in _LOW_FLOATS else out), out


def _specialize_dot_general(eqn):
    lhs, rhs = eqn.invars
    dtypes = _dot_general_dtypes(np.dtype(lhs.aval.dtype), np.dtype(rhs.aval.dtype),
                                 eqn.params.get("preferred_element_type"))
    (lc, rc), (lb, _) = eqn.params["dimension_numbers"]
    lhs_ndim, rhs_ndim = len(lhs.aval.shape), len(rhs.aval.shape)
    if (not lb and tuple(lc) == (lhs_ndim - 1,) and tuple(rc) == (0,) and rhs_ndim <= 2 and lhs_ndim >= 1
            and dtypes[0] == dtypes[1] == lhs.aval.dtype == rhs.aval.dtype and dtypes[1].kind in "fciu"):
        return np.dot  # the last axis of lhs with the first of rhs: matrix-vector, vector-matrix, matrix-matrix
    return _dot_general_with(_dot_general_plan(lhs.aval.shape, rhs.aval.shape, eqn.params["dimension_numbers"]),
                             *dtypes)


@impl("dot_general")
@specialize(_specialize_dot_general)
def _dot_general(lhs, rhs, *, dimension_numbers, precision=None, preferred_element_type=None, out_sharding=None,
                 **_):
    """As a batched matmul: lhs to (batch, free, contracting), rhs to (batch, contracting, free)."""
    plan = _dot_general_plan(lhs.shape, rhs.shape, dimension_numbers)
    return _dot_general_with(plan, *_dot_general_dtypes(lhs.dtype, rhs.dtype, preferred_element_type))(lhs, rhs)


@impl("sort")
def _sort(*operands, dimension, is_stable, num_keys):
    keys = [np.moveaxis(k, dimension, -1) for k in operands[:num_keys]]
    order = np.lexsort(tuple(reversed(keys)), axis=-1) if num_keys > 1 else np.argsort(keys[0], axis=-1, kind="stable")
    return [np.moveaxis(np.take_along_axis(np.moveaxis(o, dimension, -1), order, axis=-1), -1, dimension)
            for o in operands]


@impl("top_k")
def _top_k(x, *, k, **_):
    order = np.argsort(-x.astype(np.float64) if x.dtype.kind != "u" else ~x, axis=-1, kind="stable")[..., :k]
    return [np.take_along_axis(x, order, axis=-1), order.astype(np.int32)]


@impl("clz")
def _clz(x):
    bits = x.dtype.itemsize * 8
    u = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
    out = np.full(x.shape, bits, dtype=np.int64)
    for b in range(bits):
        hit = (u >> np.uint64(bits - 1 - b)) & np.uint64(1)
        out = np.where((out == bits) & (hit == 1), b, out)
    return out.astype(x.dtype)



# -- jax.debug.print and jax.debug.callback: run per device on concrete values -------------------------------
# What they print goes through spmdsim's ordered output: labelled with the device and released in device
# order at each rendezvous.

@impl("debug_print")
def _debug_print(*args, fmt, in_tree, static_args=(), np_printoptions=(), **_):
    import jax

    positional, keywords = jax.tree_util.tree_unflatten(in_tree, list(args))
    positional = list(positional)
    for index, value in static_args:
        positional.insert(index, value)
    with np.printoptions(**dict(np_printoptions)):
        print(fmt.format(*positional, **keywords))
    return []


@impl("debug_callback")
def _debug_callback(*args, callback, **_):
    callback(*args)
    return []
