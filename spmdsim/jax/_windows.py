"""Windowed primitives: convolutions, reduce_window (pooling, cumulative sums on XLA:CPU), select_and_scatter
(the gradient of max-pooling) and select_and_gather_add (its forward-mode derivative), in both rule tables.

Every window is walked as XLA:CPU walks it: the window's positions in row-major order, an accumulator that
starts at the init value and takes ``reducer(accumulator, element)`` for each position inside the (padded,
dilated) operand; padding positions are skipped. The fold runs over all windows at once: one NumPy operation
per window position, on a strided view of every window's element at that position. The vectorized twins add
the device axis as a leading window dimension of size 1, so they fold in the same order bit for bit.

Convolutions are im2col products: the (dilated, padded) input's patches as a ``(M, K)`` matrix per feature
group, the kernel as ``(K, N)``, one ``np.matmul`` slice per group (and per device, in the vectorized twin).
XLA:CPU convolves with Eigen, in another summation order: float results agree within a few ulps.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from spmdsim.jax._numpy_rules import LOW_FLOATS, PER_DEVICE, eval_elementwise_jaxpr, is_float, matmul_slices, \
    pad_array, per_device, product_dtypes, vectorized


def _padded(x: np.ndarray, fill, padding, base_dilation) -> tuple[np.ndarray, np.ndarray]:
    """x with base dilation and padding applied, filled with ``fill``, and the mask of real elements."""
    config = [(lo, hi, d - 1) for (lo, hi), d in zip(padding, base_dilation, strict=True)]
    real = pad_array(np.ones(x.shape, bool), np.asarray(False), config)
    return pad_array(x, np.asarray(fill, x.dtype), config), real


def _window_positions(padded_shape, window_dimensions, window_strides, window_dilation):
    """The output shape, and for every window position the strided slice picking that position of every
    window, positions in row-major order."""
    out_shape = tuple(max(0, (p - ((w - 1) * d + 1)) // s + 1) for p, w, s, d in
                      zip(padded_shape, window_dimensions, window_strides, window_dilation, strict=True))
    positions = []
    for offset in itertools.product(*(range(w) for w in window_dimensions)):
        positions.append(tuple(slice(o * d, o * d + (n - 1) * s + 1, s) if n else slice(0, 0)
                               for o, d, n, s in zip(offset, window_dilation, out_shape, window_strides, strict=True)))
    return out_shape, positions


def _fold_windows(operands, inits, reducer, window_dimensions, window_strides, padding, base_dilation,
                  window_dilation):
    """acc = inits; for each window position (row-major), where the position is real:
    acc = reducer(acc, elements). ``reducer`` maps lists of arrays to lists of arrays."""
    padded, real = zip(*(_padded(x, i, padding, base_dilation) for x, i in zip(operands, inits, strict=True)))
    real = real[0]
    out_shape, positions = _window_positions(real.shape, window_dimensions, window_strides, window_dilation)
    acc = [np.full(out_shape, i, dtype=p.dtype) for i, p in zip(inits, padded, strict=True)]
    every_position_real = bool(real.all())  # no padding or dilation holes: no mask needed
    for position in positions:
        new = reducer(acc, [p[position] for p in padded])
        if every_position_real:
            acc = [np.asarray(n, a.dtype) for n, a in zip(new, acc, strict=True)]
            continue
        mask = real[position]
        acc = [np.where(mask, n, a).astype(a.dtype) for n, a in zip(new, acc, strict=True)]
    return acc


def _wide(x):
    return x.astype(np.float32) if x.dtype in LOW_FLOATS else x


def _reduce_window_monoid(ufunc, name, identity):
    def rule(x, *, window_dimensions, window_strides, padding, base_dilation, window_dilation):
        wide = _wide(x)
        init = identity(wide.dtype)
        if ufunc is np.maximum and is_float(wide.dtype):
            combine = PER_DEVICE["max"]
        elif ufunc is np.minimum and is_float(wide.dtype):
            combine = PER_DEVICE["min"]
        else:
            combine = ufunc
        out, = _fold_windows([wide], [init], lambda acc, xs: [combine(acc[0], xs[0])], window_dimensions,
                             window_strides, padding, base_dilation, window_dilation)
        return out.astype(x.dtype)

    per_device(name)(rule)
    vectorized(name)(lambda x, *, window_dimensions, window_strides, padding, base_dilation, window_dilation: rule(
        x, window_dimensions=(1, *window_dimensions), window_strides=(1, *window_strides),
        padding=((0, 0), *padding), base_dilation=(1, *base_dilation), window_dilation=(1, *window_dilation)))


def _lowest(dtype):
    dtype = np.dtype(dtype)
    return np.asarray(-np.inf, dtype) if is_float(dtype) else np.asarray(np.iinfo(dtype).min if dtype.kind in "iu"
                                                                         else False, dtype)


def _highest(dtype):
    dtype = np.dtype(dtype)
    return np.asarray(np.inf, dtype) if is_float(dtype) else np.asarray(np.iinfo(dtype).max if dtype.kind in "iu"
                                                                        else True, dtype)


_reduce_window_monoid(np.add, "reduce_window_sum", lambda dtype: np.zeros((), dtype))
_reduce_window_monoid(np.maximum, "reduce_window_max", _lowest)
_reduce_window_monoid(np.minimum, "reduce_window_min", _highest)


def _device_window(params: dict) -> dict:
    """Window parameters with the device axis in front as a window of one."""
    out = dict(params)
    for key, first in (("window_dimensions", 1), ("window_strides", 1), ("base_dilation", 1),
                       ("window_dilation", 1)):
        if key in out:
            out[key] = (first, *out[key])
    if "padding" in out:
        out["padding"] = ((0, 0), *out["padding"])
    return out


@per_device("reduce_window")
def _reduce_window(*operands_and_inits, jaxpr, consts, window_dimensions, window_strides, padding, base_dilation,
                   window_dilation):
    """lax.reduce_window with any reducer jaxpr."""
    n = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:n], [np.asarray(i) for i in operands_and_inits[n:]]
    inner = getattr(jaxpr, "jaxpr", jaxpr)

    def reducer(acc, xs):
        outs = eval_elementwise_jaxpr(inner, consts, *acc, *xs)
        return [np.asarray(o, a.dtype) for o, a in zip(outs, acc, strict=True)]
    return _fold_windows(list(operands), inits, reducer, window_dimensions, window_strides, padding, base_dilation,
                         window_dilation)


@vectorized("reduce_window")
def _reduce_window_v(*operands_and_inits, **params):
    n = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:n], operands_and_inits[n:]
    first = [np.asarray(i).reshape(-1)[0] if np.asarray(i).size else i for i in inits]
    if all((np.asarray(i) == f).all() for i, f in zip(inits, first, strict=True)):  # the usual case: a literal
        return _reduce_window(*operands, *first, **_device_window(params))
    return [np.stack(outs) for outs in zip(*(_reduce_window(*(x[d] for x in operands), *(i[d] for i in inits),
                                                            **params) for d in range(operands[0].shape[0])),
                                           strict=True)]


# -- select_and_scatter: the gradient of max/min pooling ------------------------------------------------------

def _selected_positions(operand, select, window_dimensions, window_strides, padding):
    """For every window, the flat index (into the padded operand) of the element ``select`` picks: the first
    element, replaced by each later one unless ``select(current, later)``. -1 where a window holds no element."""
    padded, real = _padded(operand, np.zeros((), operand.dtype), padding, (1,) * operand.ndim)
    flat_index = np.arange(padded.size).reshape(padded.shape)
    out_shape, positions = _window_positions(padded.shape, window_dimensions, window_strides,
                                             (1,) * operand.ndim)
    best = np.zeros(out_shape, operand.dtype)
    where = np.full(out_shape, -1, np.int64)
    for position in positions:
        candidate, valid = padded[position], real[position]
        take = valid & ((where < 0) | ~np.asarray(select(best, candidate), bool))
        best = np.where(take, candidate, best).astype(operand.dtype)
        where = np.where(take, flat_index[position], where)
    return where, padded.shape


def _crop(padded: np.ndarray, padding) -> np.ndarray:
    return padded[tuple(slice(lo, padded.shape[d] - hi) for d, (lo, hi) in enumerate(padding))]


@per_device("select_and_scatter_add")
def _select_and_scatter_add(source, operand, *, select_prim, window_dimensions, window_strides, padding):
    where, padded_shape = _selected_positions(operand, PER_DEVICE[select_prim.name], window_dimensions,
                                              window_strides, padding)
    out = np.zeros(math.prod(padded_shape), source.dtype)
    keep = where >= 0
    targets, values = where[keep], source[keep]
    if all(s >= w for s, w in zip(window_strides, window_dimensions, strict=True)):  # windows do not overlap:
        out[targets] = out[targets] + values  # every element receives one source at most (0 + x, as XLA adds)
    else:
        np.add.at(out, targets, values)  # in the source's row-major order, rounded after every addition
    return _crop(out.reshape(padded_shape), padding)


@vectorized("select_and_scatter_add")
def _select_and_scatter_add_v(source, operand, **params):
    return _select_and_scatter_add(source, operand, **_device_window(params))


@per_device("select_and_scatter")
def _select_and_scatter(operand, source, init_value, *, select_jaxpr, select_consts, scatter_jaxpr, scatter_consts,
                        window_dimensions, window_strides, padding):
    """The generic form: selection by ``select_jaxpr``, accumulation by ``scatter_jaxpr``, starting from
    ``init_value`` everywhere; sources that land on the same element are combined in row-major order."""
    select = lambda a, b: eval_elementwise_jaxpr(getattr(select_jaxpr, "jaxpr", select_jaxpr),  # noqa: E731
                                                 select_consts, a, b)[0]
    where, padded_shape = _selected_positions(operand, select, window_dimensions, window_strides, padding)
    out = np.full(math.prod(padded_shape), init_value, operand.dtype)
    targets, values = where.reshape(-1), source.reshape(-1)
    keep = targets >= 0
    targets, values = targets[keep], values[keep]
    # occurrence number of each target among the sources before it: round k combines the k-th occurrences
    order = np.argsort(targets, kind="stable")
    sorted_targets = targets[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_targets)) + 1] if len(order) else np.zeros(0, np.int64)
    occurrence = np.empty(len(order), np.int64)
    occurrence[order] = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    inner = getattr(scatter_jaxpr, "jaxpr", scatter_jaxpr)
    for k in range(int(occurrence.max(initial=-1)) + 1):
        pick = occurrence == k
        t = targets[pick]
        out[t] = np.asarray(eval_elementwise_jaxpr(inner, scatter_consts, out[t], values[pick])[0], operand.dtype)
    return _crop(out.reshape(padded_shape), padding)


@vectorized("select_and_scatter")
def _select_and_scatter_v(operand, source, init_value, **params):
    return np.stack([_select_and_scatter(operand[d], source[d], init_value[d], **params)
                     for d in range(operand.shape[0])]) if np.ndim(init_value) and not (
        np.asarray(init_value) == np.asarray(init_value).reshape(-1)[0]).all() else _select_and_scatter(
        operand, source, np.asarray(init_value).reshape(-1)[0], **_device_window(params))


@per_device("select_and_gather_add")
def _select_and_gather_add(tangents, operand, *, select_prim, window_dimensions, window_strides, padding,
                           base_dilation, window_dilation):
    """Per window, the tangent of the element ``select_prim`` picks, by XLA:CPU's variadic reduce_window: the
    accumulator starts at (the identity of max or min, 0) and keeps itself where ``select_prim(acc, x)``."""
    select = PER_DEVICE[select_prim.name]
    init = _lowest(operand.dtype) if select_prim.name in ("ge", "gt") else _highest(operand.dtype)

    def reducer(acc, xs):
        keep = np.asarray(select(acc[0], xs[0]), bool)
        return [np.where(keep, acc[0], xs[0]), np.where(keep, acc[1], xs[1])]
    return _fold_windows([operand, tangents], [init, np.zeros((), tangents.dtype)], reducer, window_dimensions,
                         window_strides, padding, base_dilation, window_dilation)[1]


@vectorized("select_and_gather_add")
def _select_and_gather_add_v(tangents, operand, **params):
    return _select_and_gather_add(tangents, operand, **_device_window(params))


# -- convolution -----------------------------------------------------------------------------------------------

def _conv_operands(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                   feature_group_count, batch_group_count, compute, leading: int):
    """The im2col matrices of a convolution: patches ``(..., G, M, K)`` and kernel ``(..., G, K, Og)``, and
    the output's shape (N, O, spatial...) and layout. ``leading`` axes in front (the device axis) are carried
    through as batch axes of the product."""
    lead = tuple(range(leading))
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    x = np.transpose(lhs, lead + tuple(d + leading for d in lhs_spec)).astype(compute, copy=False)
    w = np.transpose(rhs, lead + tuple(d + leading for d in rhs_spec)).astype(compute, copy=False)
    front = x.shape[:leading]
    n, c, *spatial = x.shape[leading:]
    o, i, *kernel = w.shape[leading:]
    config = [(0, 0, 0)] * (leading + 2) + [(lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_dilation,
                                                                                  strict=True)]
    x = pad_array(x, np.zeros((), compute), config)
    padded = x.shape[leading + 2:]
    out_spatial = tuple(max(0, (p - ((k - 1) * d + 1)) // s + 1) for p, k, d, s in
                        zip(padded, kernel, rhs_dilation, window_strides, strict=True))
    g, b = feature_group_count, batch_group_count
    kernel_size = math.prod(kernel)
    out_size = math.prod(out_spatial)
    if b > 1:  # batch groups: output feature block j uses input batch block j
        groups, per_group, rows, depth = b, o // b, n // b, c

        def arrange(v):  # a window position of every window, (..., N, C, out...) -> (..., b, N/b, out..., C)
            return np.moveaxis(v.reshape(front + (b, n // b, c) + out_spatial), leading + 2, -1)
    else:  # feature groups: output feature block j uses input feature block j
        groups, per_group, rows, depth = g, o // g, n, c // g

        def arrange(v):  # (..., N, C, out...) -> (..., g, N, out..., C/g)
            v = np.moveaxis(v.reshape(front + (n, g, c // g) + out_spatial), leading + 1, leading)
            return np.moveaxis(v, leading + 2, -1)
    # the patches, written once in the layout of the product: (..., groups, rows, out..., depth, kernel)
    patches = np.empty(front + (groups, rows) + out_spatial + (depth, kernel_size), compute)
    for k, offset in enumerate(itertools.product(*(range(size) for size in kernel))):
        index = tuple(slice(q * d, q * d + (m - 1) * s + 1, s) if m else slice(0, 0)
                      for q, d, m, s in zip(offset, rhs_dilation, out_spatial, window_strides, strict=True))
        patches[..., k] = arrange(x[(Ellipsis,) + index])
    a = patches.reshape(front + (groups, rows * out_size, depth * kernel_size))
    wk = np.swapaxes(w.reshape(front + (groups, per_group, i * kernel_size)), -1, -2)  # (..., groups, K, Og)
    return a, wk, front, groups, per_group, out_spatial, out_spec, rows


def _conv(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
          batch_group_count, precision=None, preferred_element_type=None, out_sharding=None, leading: int = 0):
    compute, out_dtype = product_dtypes(lhs.dtype, rhs.dtype, preferred_element_type)
    if compute.kind == "b":
        compute = np.dtype(np.int32)
    a, wk, front, groups, per_group, out_spatial, out_spec, n_out = _conv_operands(
        lhs, rhs, window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        batch_group_count=batch_group_count, compute=compute, leading=leading)
    product = matmul_slices(a, wk)  # (..., groups, n_out * out..., per_group)
    y = product.reshape(front + (groups, n_out) + out_spatial + (per_group,))
    y = np.moveaxis(y, leading, leading + 1 + len(out_spatial))  # (..., n_out, out..., groups, per_group)
    y = y.reshape(front + (n_out,) + out_spatial + (groups * per_group,))
    y = np.moveaxis(y, -1, leading + 1)  # (..., N, O, out...)
    # to the output layout: out_spec[k] is the output dimension holding canonical dimension k
    perm = [0] * (2 + len(out_spatial))
    for k, dim in enumerate(out_spec):
        perm[dim] = k
    y = np.transpose(y, tuple(range(leading)) + tuple(p + leading for p in perm))
    return np.ascontiguousarray(y).astype(out_dtype, copy=False)


per_device("conv_general_dilated")(_conv)


@vectorized("conv_general_dilated")
def _conv_v(lhs, rhs, **params):
    """The device axis as an outer batch axis of the per-group matmul slices (never merged into M)."""
    n = max(lhs.shape[0], rhs.shape[0])
    return _conv(np.broadcast_to(lhs, (n, *lhs.shape[1:])), np.broadcast_to(rhs, (n, *rhs.shape[1:])), leading=1,
                 **params)
