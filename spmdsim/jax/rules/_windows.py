"""Windowed primitives: convolutions, reduce_window (pooling, cumulative sums on XLA:CPU), select_and_scatter
(the gradient of max-pooling) and select_and_gather_add (its forward-mode derivative), in both rule tables.

Every window is walked as XLA:CPU walks it: the window's positions in row-major order, an accumulator that
starts at the init value and takes ``reducer(accumulator, element)`` for each position inside the (padded,
dilated) operand; padding positions are skipped. The fold runs over all windows at once: one NumPy operation
per window position, on a strided view of every window's element at that position. The vectorized twins add
the device axis as a leading window dimension of size 1, so they fold in the same order bit for bit. Where
the order cannot show, the fold is shortened, with the same bits: max/min pooling is NumPy's maximum/minimum
in place (the sign of zero maxima from the elements' bits; with a NaN, the fold itself), max-pooling's
gradient selects by an in-place maximum of window positions (issue 27).

Convolutions are im2col products: the (dilated, padded) input's patches as a ``(M, K)`` matrix per feature
group, the kernel as ``(K, N)``, one ``np.matmul`` slice per group (and per device, in the vectorized twin).
The patches are one strided view of the padded input copied into the C-order matrices (by kernel offset, in
blocks of rows that stay in the cache), so a slice's layout, and BLAS's result, depends on shapes only.
Where spmdsim knows XLA:CPU's own order for a float32 convolution on this CPU (jaxlib 0.10's YNNPACK dot kernels,
measured on AMD Zen 4 and Zen 3: :func:`spmdsim.jax.numerics._xla_cpu_dot.conv_tile`), the patches are laid out as
``(M, window..., C)`` and multiplied in that order instead (:func:`_conv_xla_order`; products over
``CONV_DEFAULT_WORK`` multiply-adds per device only under ``SPMDSIM_EXACT=1``); elsewhere float results agree
with XLA:CPU's within a few ulps.
"""
from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from spmdsim.runtime import _blas, _buffers, _threads
from spmdsim.jax.evaluation._registry import PER_DEVICE, per_device, vectorized
from spmdsim.jax.numerics import _xla_cpu_dot, _xla_cpu_isa
from spmdsim.jax.rules._dot import matmul_slices, product_dtypes
from spmdsim.jax.rules._elementwise import LOW_FLOATS, is_float
from spmdsim.jax.rules._reductions import by_devices, eval_elementwise_jaxpr
from spmdsim.jax.rules._structural import pad_array


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


def _no_padding(padding, base_dilation) -> bool:
    return all(lo == 0 and hi == 0 for lo, hi in padding) and all(d == 1 for d in base_dilation)


def _fold_windows(operands, inits, reducer, window_dimensions, window_strides, padding, base_dilation,
                  window_dilation):
    """acc = inits; for each window position (row-major), where the position is real:
    acc = reducer(acc, elements). ``reducer`` maps lists of arrays to lists of arrays."""
    if _no_padding(padding, base_dilation):  # every position real: no mask needed
        padded, real = operands, None
    else:
        padded, real = zip(*(_padded(x, i, padding, base_dilation) for x, i in zip(operands, inits, strict=True)))
        real = real[0]
        if real.all():
            real = None
    out_shape, positions = _window_positions(padded[0].shape, window_dimensions, window_strides, window_dilation)
    acc = [np.full(out_shape, i, dtype=p.dtype) for i, p in zip(inits, padded, strict=True)]
    for position in positions:
        new = reducer(acc, [p[position] for p in padded])
        if real is None:
            acc = [np.asarray(n, a.dtype) for n, a in zip(new, acc, strict=True)]
            continue
        mask = real[position]
        acc = [np.where(mask, n, a).astype(a.dtype) for n, a in zip(new, acc, strict=True)]
    return acc


def _sum_windows(x, window_dimensions, window_strides, padding, base_dilation, window_dilation):
    """The fold of :func:`_fold_windows` for ``add`` from 0 without padding: the same additions in the same
    order, without the reducer's wrapping. (Not in place: NumPy's in-place addition propagates another NaN's
    payload where both operands are NaNs.)"""
    out_shape, positions = _window_positions(x.shape, window_dimensions, window_strides, window_dilation)
    acc = np.zeros(out_shape, x.dtype)
    for position in positions:
        acc = np.add(acc, x[position])
    return acc


_BITS = {2: np.int16, 4: np.int32, 8: np.int64}


def _extremum_windows(x, greater: bool, window_dimensions, window_strides, padding, base_dilation,
                      window_dilation):
    """The fold of :func:`_fold_windows` for max (``greater``) or min from the identity (-inf / +inf, the
    lowest / highest integer) on float, integer or bool ``x``, or None where it would differ (NaNs, complex).

    Without NaNs XLA's max (min) is the maximum (minimum) in the order that puts -0.0 below +0.0, whatever the
    order of the fold: NumPy's maximum over the window positions in place (padding and dilation holes hold the
    identity, which changes no maximum), then, where ``x`` holds a -0.0, the windows whose maximum is zero
    take the sign from the integer maximum of the elements' bits (+0.0: 0, -0.0 and negatives: negative);
    minimum: from the integer minimum (-0.0: the lowest integer, +0.0 0, positives positive). A NaN anywhere:
    None (the fold keeps the first NaN it meets; its payload is the fold's to choose)."""
    if x.dtype.kind not in "fiub":
        return None
    init = _lowest(x.dtype) if greater else _highest(x.dtype)
    padded = x if _no_padding(padding, base_dilation) else _padded(x, init, padding, base_dilation)[0]
    out_shape, positions = _window_positions(padded.shape, window_dimensions, window_strides, window_dilation)
    if not positions or not math.prod(out_shape):
        return np.full(out_shape, init, x.dtype)
    pick = np.maximum if greater else np.minimum
    out = np.array(padded[positions[0]])
    for position in positions[1:]:
        pick(out, padded[position], out=out)
    if x.dtype.kind != "f":
        return out
    if np.isnan(out).any():
        return None
    zero = out == 0
    bits = padded.view(_BITS[x.dtype.itemsize])
    low = np.asarray(np.iinfo(bits.dtype).min, bits.dtype)  # the bits of -0.0
    if zero.any() and (bits == low).any():  # without -0.0, every zero is +0.0 and so is every zero maximum
        sign = np.array(bits[positions[0]])
        for position in positions[1:]:
            pick(sign, bits[position], out=sign)
        out_bits = out.view(sign.dtype)
        out_bits[zero] = np.where(sign[zero] == 0, 0, low) if greater else sign[zero]
    return out


def _wide(x):
    return x.astype(np.float32) if x.dtype in LOW_FLOATS else x


def _reduce_window_monoid(ufunc, name, identity):
    def rule(x, *, window_dimensions, window_strides, padding, base_dilation, window_dilation):
        wide = _wide(x)
        windows = (window_dimensions, window_strides, padding, base_dilation, window_dilation)
        out = None
        if ufunc is np.add and _no_padding(padding, base_dilation):
            out = _sum_windows(wide, *windows)
        elif ufunc is not np.add:
            out = _extremum_windows(wide, ufunc is np.maximum, *windows)
        if out is not None:
            return out.astype(x.dtype, copy=False)
        init = identity(wide.dtype)
        if ufunc in (np.maximum, np.minimum) and is_float(wide.dtype):
            pick = PER_DEVICE["max" if ufunc is np.maximum else "min"]

            def combine(acc, xs):  # a NaN met first is kept, its payload too, as XLA's fold keeps it (NumPy's
                return np.where(np.isnan(acc), acc, pick(acc, xs))  # SIMD and scalar loops pick either NaN)
        else:
            combine = ufunc
        out, = _fold_windows([wide], [init], lambda acc, xs: [combine(acc[0], xs[0])], *windows)
        return out.astype(x.dtype)

    per_device(name)(rule)
    vectorized(name)(lambda x, **params: by_devices(functools.partial(rule, **_device_window(params)), x))


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

_STRICT = {"ge": np.less, "gt": np.less_equal, "le": np.greater, "lt": np.greater_equal}  # not select(a, b)


def _selection(operand, select, window_dimensions, window_strides, padding, select_name=None):
    """For every window, the window position (row-major number) of the element ``select`` picks: the first
    element, replaced by each later one unless ``select(current, later)``; -1 where a window holds no element.
    Also the padded operand's shape, the output shape and the positions' strided slices.

    ``select_name`` (a comparison: ge, gt, le, lt) allows the fast form on NaN-free float or integer operands:
    the element kept is the maximum (ge, gt) or minimum (le, lt) so far, whichever equal one is kept (equal
    elements, -0.0 and +0.0 included, compare alike), and positions only grow, so the choice is an in-place
    maximum of ``(k + 1) * replaced``."""
    ones = (1,) * operand.ndim
    if _no_padding(padding, ones):
        padded, real = operand, None
    else:
        padded, real = _padded(operand, np.zeros((), operand.dtype), padding, ones)
    out_shape, positions = _window_positions(padded.shape, window_dimensions, window_strides, ones)
    if not positions or not math.prod(out_shape):
        return np.full(out_shape, -1, np.int8), padded.shape, out_shape, positions
    best = np.array(padded[positions[0]])
    fast = (select_name in _STRICT and operand.dtype.kind in "fiu" and len(positions) < 255
            and not (operand.dtype.kind == "f" and real is not None and np.isnan(padded).any()))
    if fast:
        replaced = _STRICT[select_name]
        keep = np.maximum if select_name in ("ge", "gt") else np.minimum
        chosen = np.ones(out_shape, np.uint8) if real is None else real[positions[0]].view(np.uint8).copy()
        for k, position in enumerate(positions[1:], 2):  # chosen: the position + 1, 0 for none
            candidate = padded[position]
            take = replaced(best, candidate)
            if real is not None:
                valid = real[position]
                take = valid & ((chosen == 0) | take)
                np.copyto(best, candidate, where=take)  # a padding zero is no candidate
            else:
                keep(best, candidate, out=best)
            np.maximum(chosen, take.view(np.uint8) * np.uint8(k), out=chosen)
        if real is not None or operand.dtype.kind != "f" or not np.isnan(best).any():  # a NaN stays in best
            return chosen.astype(np.int16) - 1, padded.shape, out_shape, positions
        best = np.array(padded[positions[0]])
    choice = np.full(out_shape, -1, np.int8 if len(positions) < 128 else np.int64)
    if real is None:
        choice[...] = 0
    else:
        np.copyto(choice, 0, where=real[positions[0]])
    for k, position in enumerate(positions[1:], 1):
        candidate = padded[position]
        take = ~np.asarray(select(best, candidate), bool)
        if real is not None:
            valid = real[position]
            take = valid & ((choice < 0) | take)
        np.copyto(best, candidate, where=take)
        np.copyto(choice, k, where=take)
    return choice, padded.shape, out_shape, positions


def _flat_targets(choice, padded_shape, out_shape, window_dimensions, window_strides):
    """The flat index into the padded operand of every window's chosen element (-1: none)."""
    strides = [math.prod(padded_shape[d + 1:]) for d in range(len(padded_shape))]
    base = np.zeros(out_shape, np.int64)
    for d, (n, s, t) in enumerate(zip(out_shape, window_strides, strides, strict=True)):
        base = base + (np.arange(n, dtype=np.int64) * (s * t)).reshape((n,) + (1,) * (len(out_shape) - d - 1))
    offsets = np.array([sum(o * t for o, t in zip(offset, strides, strict=True))
                        for offset in itertools.product(*(range(w) for w in window_dimensions))] or [0], np.int64)
    return np.where(choice >= 0, base + offsets[np.maximum(choice, 0)], -1)


def _selected_positions(operand, select, window_dimensions, window_strides, padding):
    """For every window, the flat index (into the padded operand) of the element ``select`` picks: the first
    element, replaced by each later one unless ``select(current, later)``. -1 where a window holds no element."""
    choice, padded_shape, out_shape, _ = _selection(operand, select, window_dimensions, window_strides, padding)
    return _flat_targets(choice, padded_shape, out_shape, window_dimensions, window_strides), padded_shape


def _crop(padded: np.ndarray, padding) -> np.ndarray:
    return padded[tuple(slice(lo, padded.shape[d] - hi) for d, (lo, hi) in enumerate(padding))]


@per_device("select_and_scatter_add")
def _select_and_scatter_add(source, operand, *, select_prim, window_dimensions, window_strides, padding):
    choice, padded_shape, out_shape, positions = _selection(operand, PER_DEVICE[select_prim.name],
                                                            window_dimensions, window_strides, padding,
                                                            select_prim.name)
    disjoint = all(s >= w for s, w in zip(window_strides, window_dimensions, strict=True))
    if disjoint and _no_padding(padding, (1,) * operand.ndim):
        # windows do not overlap: every element receives one source at most (0 + x, as XLA adds), written
        # position by position through the strided views
        added = np.zeros((), source.dtype) + source
        zero = np.zeros((), source.dtype)
        tiled = all(s == w and n * s == p for s, w, n, p in zip(window_strides, window_dimensions, out_shape,
                                                                padded_shape, strict=True))
        out = np.empty(padded_shape, source.dtype) if tiled else np.zeros(padded_shape, source.dtype)
        for k, position in enumerate(positions):
            out[position] = np.where(choice == k, added, zero)
        return out
    where = _flat_targets(choice, padded_shape, out_shape, window_dimensions, window_strides)
    out = np.zeros(math.prod(padded_shape), source.dtype)
    keep = where >= 0
    targets, values = where[keep], source[keep]
    if disjoint:
        out[targets] = out[targets] + values  # every element receives one source at most (0 + x, as XLA adds)
    else:
        np.add.at(out, targets, values)  # in the source's row-major order, rounded after every addition
    return _crop(out.reshape(padded_shape), padding)


@vectorized("select_and_scatter_add")
def _select_and_scatter_add_v(source, operand, **params):
    return by_devices(functools.partial(_select_and_scatter_add, **_device_window(params)), source, operand)


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

def _zero_padded(x: np.ndarray, config) -> np.ndarray:
    """lax.pad with zeros (``config``: per axis (low, high, interior)) in one allocation where nothing is
    cropped: a C-order array in ``x``'s own axis order, the same values as :func:`pad_array`."""
    if all(lo == 0 and hi == 0 and interior == 0 for lo, hi, interior in config):
        return x
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):
        return pad_array(x, np.zeros((), x.dtype), config)
    shape = tuple(lo + (n + (n - 1) * interior if n else 0) + hi for n, (lo, hi, interior) in zip(x.shape, config,
                                                                                                   strict=True))
    out = np.zeros(shape, x.dtype)
    out[tuple(slice(lo, lo + (n - 1) * (interior + 1) + 1, interior + 1) if n else slice(0, 0)
              for n, (lo, _, interior) in zip(x.shape, config, strict=True))] = x
    return out


_GATHER_BLOCK = 1 << 19  # bytes of patches written per block: the block stays in the CPU's cache
_GATHER_COPIES = 1024  # at most this many NumPy copies per gather
_SMALL_KERNEL = 64  # kernels of at most this many positions are gathered one position at a time
_PARALLEL_BYTES = 1 << 22  # patches this large are copied by every CPU (see spmdsim.runtime._threads.in_parallel)


def _gather(windows: np.ndarray, dtype, kernel: tuple) -> np.ndarray:
    """``windows`` (a view ``(lead..., rows, out..., depth, kernel...)``) copied into a new C-order array. A
    copy of the whole view runs NumPy's inner loop along the last kernel dimension (a few elements for small
    kernels); small kernels are therefore copied one kernel position at a time (the inner loop along depth, or
    along out[-1] where depth is 1), over blocks of rows whose patches fit in the cache."""
    patches = _buffers.empty(windows.shape, dtype, faulted=True)
    kernel_size = math.prod(kernel)
    if not patches.size or kernel_size <= 1 or kernel_size > _SMALL_KERNEL:
        np.copyto(patches, windows)
        return patches
    rank = len(kernel)
    lead = windows.ndim - 2 * rank - 2
    rows = windows.shape[lead]
    per_row = math.prod(windows.shape[lead + 1:]) * patches.itemsize
    block = max(1, _GATHER_BLOCK // per_row)
    blocks = math.prod(windows.shape[:lead]) * -(-rows // block)
    offsets = list(itertools.product(*(range(size) for size in kernel)))
    if blocks * kernel_size > _GATHER_COPIES:
        if windows.shape[-rank - 1] != 1:
            np.copyto(patches, windows)
            return patches
        blocks, block = 1, rows
    at = [index + (slice(start, start + block),) for index in np.ndindex(windows.shape[:lead])
          for start in range(0, rows, block)] if blocks > 1 else [(Ellipsis,)]

    def copy(lo: int, hi: int) -> None:  # blocks lo..hi-1: NumPy's copies release the GIL
        for where in at[lo:hi]:
            dst, src = patches[where], windows[where]
            for offset in offsets:
                dst[(Ellipsis,) + offset] = src[(Ellipsis,) + offset]
    if patches.nbytes >= _PARALLEL_BYTES:
        _threads.in_parallel(copy, len(at), cpus=_blas.cpus())
    else:
        copy(0, len(at))
    return patches


def _conv_operands(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                   feature_group_count, batch_group_count, compute, leading: int):
    """The im2col matrices of a convolution: patches ``(..., G, M, K)`` and kernel ``(..., G, K, Og)``, and
    the output's shape (N, O, spatial...) and layout. ``leading`` axes in front (the device axis) are carried
    through as batch axes of the product.

    The patches are one copy of a strided view of the padded input (every window position of every window,
    ``(..., N, C, out..., kernel...)``), written in the layout of the product: a C-order ``(M, K)`` matrix per
    group, rows (batch, out...), columns (feature, kernel...) in row-major order. For small kernels the input
    is padded in its own memory order (one allocation, no transposing copy; the copies run along the features)
    and viewed in the canonical order (N, C, spatial); for large ones (a kernel's gradient: the kernel is the
    output's cotangent) it is padded in the canonical order, so that the copy runs along the last spatial axis."""
    lead = tuple(range(leading))
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    lhs_perm = lead + tuple(d + leading for d in lhs_spec)
    w = np.transpose(rhs, lead + tuple(d + leading for d in rhs_spec)).astype(compute, copy=False)
    config = [(0, 0, 0)] * lhs.ndim
    for axis, (lo, hi), d in zip(lhs_perm[leading + 2:], padding, lhs_dilation, strict=True):
        config[axis] = (lo, hi, d - 1)
    front = lhs.shape[:leading]
    # an input replicated over the devices (a broadcast device axis): its patches made once, read by every slice
    shared = leading == 1 and front[0] > 1 and lhs.strides[0] == 0
    x = (lhs[:1] if shared else lhs).astype(compute, copy=False)
    if math.prod(w.shape[leading + 2:]) > _SMALL_KERNEL:  # copied whole (see _gather): the spatial axes last
        view = np.transpose(x, lhs_perm)
        x = _zero_padded(view, [config[a] for a in lhs_perm])  # one copy, transposing
        x = np.ascontiguousarray(x) if x is view else x
    else:  # copied by kernel offset: padded in the input's own memory order, viewed in the canonical order
        x = np.transpose(_zero_padded(x, config), lhs_perm)
    n, c, *padded = x.shape[leading:]
    o, i, *kernel = w.shape[leading:]
    out_spatial = tuple(max(0, (p - ((k - 1) * d + 1)) // s + 1) for p, k, d, s in
                        zip(padded, kernel, rhs_dilation, window_strides, strict=True))
    g, b = feature_group_count, batch_group_count
    kernel_size = math.prod(kernel)
    out_size = math.prod(out_spatial)
    # every window position of every window: (..., N, C, out..., kernel...), a view
    spatial_strides = x.strides[leading + 2:]
    windows = np.lib.stride_tricks.as_strided(
        x, x.shape[:leading] + (n, c) + out_spatial + tuple(kernel),
        x.strides[:leading + 2] + tuple(t * s for t, s in zip(spatial_strides, window_strides, strict=True))
        + tuple(t * d for t, d in zip(spatial_strides, rhs_dilation, strict=True)), writeable=False)
    rank = len(out_spatial)
    outs = tuple(range(leading + 3, leading + 3 + rank))
    kernels = tuple(range(leading + 3 + rank, leading + 3 + 2 * rank))
    if b > 1:  # batch groups: output feature block j uses input batch block j
        groups, per_group, rows, depth = b, o // b, n // b, c
        # (..., b, N/b, C, out..., kernel...) -> (..., b, N/b, out..., C, kernel...)
        windows = windows.reshape(x.shape[:leading] + (b, n // b, c) + out_spatial + tuple(kernel))
        order = lead + (leading, leading + 1) + outs + (leading + 2,) + kernels
    else:  # feature groups: output feature block j uses input feature block j
        groups, per_group, rows, depth = g, o // g, n, c // g
        # (..., N, g, C/g, out..., kernel...) -> (..., g, N, out..., C/g, kernel...)
        windows = windows.reshape(x.shape[:leading] + (n, g, c // g) + out_spatial + tuple(kernel))
        order = lead + (leading + 1, leading) + outs + (leading + 2,) + kernels
    patches = _gather(np.transpose(windows, order), compute, tuple(kernel))
    a = patches.reshape(x.shape[:leading] + (groups, rows * out_size, depth * kernel_size))
    if shared:
        a = np.broadcast_to(a, front + a.shape[leading:])
    wk = np.swapaxes(w.reshape(front + (groups, per_group, i * kernel_size)), -1, -2)  # (..., groups, K, Og)
    return a, wk, front, groups, per_group, out_spatial, out_spec, rows


def _xla_order_tile(lhs, rhs, compute, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
                    feature_group_count, batch_group_count, leading: int) -> int | None:
    """``tile_k`` of XLA:CPU's own order for this convolution (:func:`_xla_cpu_dot.conv_tile`), or None where
    spmdsim keeps its BLAS product: not float32, not 2-D, input dilation (XLA's transposed-convolution
    algorithm), feature or batch groups, an order not measured on this CPU, or a product over
    ``CONV_DEFAULT_WORK`` multiply-adds per device without ``SPMDSIM_EXACT=1``."""
    if compute != np.float32 or lhs.dtype != np.float32 or rhs.dtype != np.float32:
        return None
    if len(window_strides) != 2 or feature_group_count != 1 or batch_group_count != 1 or \
            any(d != 1 for d in lhs_dilation):
        return None
    lhs_spec, rhs_spec, _ = dimension_numbers
    c = lhs.shape[leading + lhs_spec[1]]
    o = rhs.shape[leading + rhs_spec[0]]
    window = math.prod(rhs.shape[leading + d] for d in rhs_spec[2:])
    if rhs.shape[leading + rhs_spec[1]] != c or not window or not c:
        return None
    spatial = [lhs.shape[leading + d] for d in lhs_spec[2:]]
    out = [max(0, (n + lo + hi - ((k - 1) * dil + 1)) // s + 1) for n, (lo, hi), k, dil, s in
           zip(spatial, padding, (rhs.shape[leading + d] for d in rhs_spec[2:]), rhs_dilation, window_strides)]
    work = lhs.shape[leading + lhs_spec[0]] * math.prod(out) * o * window * c
    if work > _xla_cpu_dot.CONV_DEFAULT_WORK and not _xla_cpu_isa.exact():
        return None
    return _xla_cpu_dot.conv_tile(c, o, window * c, math.prod(out))


def _conv_xla_order(lhs, rhs, tile_k, *, window_strides, padding, rhs_dilation, dimension_numbers, leading: int):
    """A float32 convolution in XLA:CPU's order (YNNPACK's dot kernels, :func:`_xla_cpu_dot.ynn_conv`): the
    patches ``(..., N * out..., window..., C)`` (window positions row-major, then the input features), the kernel
    ``(..., window..., C, O)``; the result in the canonical layout ``(..., N, O, out...)``."""
    lead = tuple(range(leading))
    lhs_spec, rhs_spec, _ = dimension_numbers
    x = np.transpose(lhs, lead + tuple(d + leading for d in lhs_spec))  # (..., N, C, spatial...)
    w = np.transpose(rhs, lead + tuple(d + leading for d in rhs_spec))  # (..., O, C, window...)
    config = [(0, 0, 0)] * leading + [(0, 0, 0), (0, 0, 0)] + [(lo, hi, 0) for lo, hi in padding]
    x = _zero_padded(np.ascontiguousarray(x), config)
    n, c, *padded = x.shape[leading:]
    o, _, *kernel = w.shape[leading:]
    out_spatial = tuple(max(0, (p - ((k - 1) * d + 1)) // s + 1) for p, k, d, s in
                        zip(padded, kernel, rhs_dilation, window_strides, strict=True))
    spatial_strides = x.strides[leading + 2:]
    windows = np.lib.stride_tricks.as_strided(  # (..., N, out..., window..., C): a view
        x, x.shape[:leading] + (n,) + out_spatial + tuple(kernel) + (c,),
        x.strides[:leading + 1] + tuple(t * s for t, s in zip(spatial_strides, window_strides, strict=True))
        + tuple(t * d for t, d in zip(spatial_strides, rhs_dilation, strict=True)) + (x.strides[leading + 1],),
        writeable=False)
    window = math.prod(kernel)
    a = np.ascontiguousarray(windows).reshape(x.shape[:leading] + (n * math.prod(out_spatial), window, c))
    rank = len(kernel)
    wk = np.transpose(w, lead + tuple(range(leading + 2, leading + 2 + rank)) + (leading + 1, leading))
    wk = np.ascontiguousarray(wk).reshape(w.shape[:leading] + (window, c, o))
    y = _xla_cpu_dot.ynn_conv(a, wk, tile_k, _xla_cpu_dot.conv_lanes(a.shape[-3], c, o))  # (..., N * out..., O)
    y = y.reshape(x.shape[:leading] + (n,) + out_spatial + (o,))
    return np.moveaxis(y, -1, leading + 1)


def _conv(lhs, rhs, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
          batch_group_count, precision=None, preferred_element_type=None, out_sharding=None, leading: int = 0):
    compute, out_dtype = product_dtypes(lhs.dtype, rhs.dtype, preferred_element_type)
    if compute.kind == "b":
        compute = np.dtype(np.int32)
    tile_k = _xla_order_tile(lhs, rhs, compute, window_strides=window_strides, padding=padding,
                             lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
                             dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
                             batch_group_count=batch_group_count, leading=leading)
    if tile_k is not None:
        y = _conv_xla_order(lhs, rhs, tile_k, window_strides=window_strides, padding=padding,
                            rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers, leading=leading)
        return _to_output_layout(y, dimension_numbers[2], leading, out_dtype)
    a, wk, front, groups, per_group, out_spatial, out_spec, n_out = _conv_operands(
        lhs, rhs, window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
        rhs_dilation=rhs_dilation, dimension_numbers=dimension_numbers, feature_group_count=feature_group_count,
        batch_group_count=batch_group_count, compute=compute, leading=leading)
    product = matmul_slices(a, wk)  # (..., groups, n_out * out..., per_group)
    y = product.reshape(front + (groups, n_out) + out_spatial + (per_group,))
    y = np.moveaxis(y, leading, leading + 1 + len(out_spatial))  # (..., n_out, out..., groups, per_group)
    y = y.reshape(front + (n_out,) + out_spatial + (groups * per_group,))
    y = np.moveaxis(y, -1, leading + 1)  # (..., N, O, out...)
    return _to_output_layout(y, out_spec, leading, out_dtype)


def _to_output_layout(y: np.ndarray, out_spec, leading: int, out_dtype) -> np.ndarray:
    """``y`` in the canonical layout ``(..., N, O, out...)`` to the output's: ``out_spec[k]`` is the output
    dimension holding canonical dimension k."""
    perm = [0] * len(out_spec)
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
