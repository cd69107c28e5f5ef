"""NumPy rules for JAX's structural primitives: shapes (broadcast, reshape, transpose, pad, concatenate, slices,
dynamic slices, iota), gather and scatter in XLA's semantics, and these primitives on PRNG keys' key data.
The conventions every rule keeps are :mod:`._elementwise`'s.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from spmdsim.primitives._batch import Batch
from spmdsim.runtime._values import broadcast_view
from spmdsim.jax.evaluation import _dtypes
from spmdsim.jax.evaluation._interpreter import Vectorized
from spmdsim.jax.evaluation._registry import IN_PLACE, PER_DEVICE, VECTORIZED, per_device, specialize, vectorized
from spmdsim.jax.rules import _arithmetic  # noqa: F401  (select_n, eq, ne: registered before their key-data forms below)
from spmdsim.jax.rules._elementwise import both, expand_to, is_float, shift


# -- shapes ----------------------------------------------------------------------------------------------

def _expanded_shape(operand_shape, shape, broadcast_dimensions) -> tuple:
    """The operand's shape with size-1 axes inserted, so that it broadcasts to ``shape``."""
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = operand_shape[src]
    return tuple(expanded)


def _reshape_to(shape: tuple, vectorized: bool = False) -> Callable:
    """``x.reshape(shape)``; vectorized, the leading device axis kept in front of ``shape``."""
    if vectorized:
        return lambda x: x.reshape((x.shape[0], *shape))
    return lambda x: x.reshape(shape)


def _static_broadcast(eqn):
    """broadcast_in_dim with a static shape: the operand's shape is known, so is the reshape before it."""
    if len(eqn.invars) != 1:
        return None
    shape = tuple(eqn.params["shape"])
    expanded = _expanded_shape(eqn.invars[0].aval.shape, shape, eqn.params["broadcast_dimensions"])
    if expanded == shape:  # only unit axes added (pmap's expanded output): a reshape
        return _reshape_to(shape)
    if math.prod(shape) <= _SMALL_BROADCAST and not _dtypes.is_extended(eqn.outvars[0].aval.dtype):
        def small(x):  # a copy: cheaper than a view of a few elements (~0.4 against ~1.3 µs)
            out = np.empty(shape, x.dtype)
            out[...] = x.reshape(expanded)
            return out
        return small
    return lambda x: broadcast_view(x.reshape(expanded), shape)


_SMALL_BROADCAST = 1024  # elements: up to this many, a broadcast result is made as a new array


@per_device("broadcast_in_dim")
@specialize(_static_broadcast)
def _broadcast_in_dim(x, *dyn_shape, shape, broadcast_dimensions, sharding=None):
    expanded = _expanded_shape(x.shape, shape, broadcast_dimensions)
    return x.reshape(expanded) if expanded == tuple(shape) else broadcast_view(x.reshape(expanded), tuple(shape))


def _static_broadcast_v(eqn):
    """The vectorized broadcast_in_dim that only adds unit axes (pmap's expanded output): a reshape that keeps
    the device axis."""
    shape = tuple(eqn.params["shape"])
    if len(eqn.invars) != 1 or _dtypes.is_extended(eqn.outvars[0].aval.dtype) or \
            _expanded_shape(eqn.invars[0].aval.shape, shape, eqn.params["broadcast_dimensions"]) != shape:
        return None
    return _reshape_to(shape, vectorized=True)


@vectorized("broadcast_in_dim")
@specialize(_static_broadcast_v)
def _broadcast_in_dim_v(x, *dyn_shape, shape, broadcast_dimensions, sharding=None):
    return _broadcast_in_dim(x, shape=(x.shape[0], *shape), broadcast_dimensions=(0, *shift(broadcast_dimensions)))


@per_device("reshape")
def _reshape(x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dimensions is not None:
        x = np.transpose(x, dimensions)
    return np.reshape(x, new_sizes)


@vectorized("reshape")
def _reshape_v(x, *dyn, new_sizes, dimensions=None, sharding=None):
    if dimensions is not None:
        x = np.transpose(x, (0, *shift(dimensions)))
    return x.reshape((x.shape[0], *new_sizes))


def _static_squeeze(eqn, vectorized: bool = False):
    """squeeze, its result's shape known from the jaxpr: a reshape (not for extended dtypes such as PRNG keys,
    whose NumPy form has trailing axes more)."""
    aval = eqn.outvars[0].aval
    if _dtypes.is_extended(aval.dtype):
        return None
    return _reshape_to(tuple(aval.shape), vectorized)


@both("squeeze", vectorized_rule=specialize(functools.partial(_static_squeeze, vectorized=True))(
    lambda x, *, dimensions: np.squeeze(x, axis=shift(dimensions))))
@specialize(_static_squeeze)
def _squeeze(x, *, dimensions):
    return np.squeeze(x, axis=tuple(dimensions))


@both("expand_dims", vectorized_rule=lambda x, *, dimensions: np.expand_dims(x, shift(dimensions)))
def _expand_dims(x, *, dimensions):
    return np.expand_dims(x, tuple(dimensions))


@both("transpose", vectorized_rule=lambda x, *, permutation: np.transpose(x, (0, *shift(permutation))))
def _transpose(x, *, permutation):
    return np.transpose(x, permutation)


@both("rev", vectorized_rule=lambda x, *, dimensions: np.flip(x, shift(dimensions)) if dimensions else x)
def _rev(x, *, dimensions):
    return np.flip(x, tuple(dimensions)) if dimensions else x


def pad_array(x: np.ndarray, padding_value, padding_config) -> np.ndarray:
    """lax.pad: per axis (low, high, interior); negative low/high crop. ``padding_value`` broadcasts."""
    out = x
    for axis, (lo, hi, interior) in enumerate(padding_config):
        if interior:
            n = out.shape[axis]
            shape = list(out.shape)
            shape[axis] = n + (n - 1) * interior if n else 0
            spaced = np.empty(shape, dtype=x.dtype)
            spaced[...] = padding_value
            index = [slice(None)] * out.ndim
            index[axis] = slice(None, None, interior + 1)
            spaced[tuple(index)] = out
            out = spaced
        if lo > 0 or hi > 0:
            shape = list(out.shape)
            shape[axis] += max(lo, 0) + max(hi, 0)
            grown = np.empty(shape, dtype=x.dtype)
            grown[...] = padding_value
            index = [slice(None)] * out.ndim
            index[axis] = slice(max(lo, 0), max(lo, 0) + out.shape[axis])
            grown[tuple(index)] = out
            out = grown
        if lo < 0 or hi < 0:
            index = [slice(None)] * out.ndim
            index[axis] = slice(max(-lo, 0), out.shape[axis] - max(-hi, 0))
            out = out[tuple(index)]
    return out


@per_device("pad")
def _pad(x, padding_value, *, padding_config):
    return pad_array(x, padding_value, padding_config)


@vectorized("pad")
def _pad_v(x, padding_value, *, padding_config):
    return pad_array(x, expand_to(padding_value, x.ndim), ((0, 0, 0), *padding_config))


@both("concatenate", vectorized_rule=lambda *xs, dimension: np.concatenate(xs, axis=dimension + 1))
def _concatenate(*xs, dimension):
    return np.concatenate(xs, axis=dimension)


@both("stack", vectorized_rule=lambda *xs, axis: np.stack(xs, axis=axis + 1))
def _stack(*xs, axis):
    return np.stack(xs, axis=axis)


@both("unstack", vectorized_rule=lambda x, *, axis: [np.take(x, i, axis=axis + 1) for i in range(x.shape[axis + 1])])
def _unstack(x, *, axis):
    return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


@both("split", vectorized_rule=lambda x, *, sizes, axis: np.split(x, np.cumsum(sizes)[:-1], axis=axis + 1))
def _split(x, *, sizes, axis):
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


@per_device("tile")
def _tile(x, *, reps):
    return np.tile(x, tuple(reps))


@vectorized("tile")
def _tile_v(x, *, reps):
    return np.tile(x, (1, *reps))


@per_device("slice")
def _slice(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * x.ndim
    return x[tuple(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides, strict=True))]


@vectorized("slice")
def _slice_v(x, *, start_indices, limit_indices, strides):
    strides = strides or (1,) * (x.ndim - 1)
    return x[(slice(None), *(slice(s, l, st) for s, l, st in zip(start_indices, limit_indices, strides,
                                                                  strict=True)))]


def _clamped_starts(shape, starts, sizes) -> np.ndarray:
    """Start indices clamped so the slice fits, per device: shape ``(n, rank)`` (XLA's dynamic-slice rule)."""
    starts = np.stack([np.asarray(s).astype(np.int64).reshape(-1) for s in starts], axis=-1) if starts else \
        np.zeros((1, 0), np.int64)
    return np.clip(starts, 0, np.maximum(np.asarray(shape, np.int64) - np.asarray(sizes, np.int64), 0))


def _window_indices(starts: np.ndarray, sizes) -> tuple:
    """Fancy indices of a ``sizes`` window at per-device ``starts`` (shape (n, rank)): device axis first."""
    n, rank = starts.shape
    index = [np.arange(n).reshape((n,) + (1,) * rank)]
    for d, size in enumerate(sizes):
        shape = [n] + [1] * rank
        shape[d + 1] = size
        index.append((starts[:, d].reshape((n,) + (1,) * rank) + np.arange(size).reshape(shape[1:]).reshape(
            [1] + shape[1:])))
    return tuple(index)


@per_device("dynamic_slice")
def _dynamic_slice(x, *starts_and_dyn, slice_sizes):
    starts = _clamped_starts(x.shape, starts_and_dyn[:x.ndim], slice_sizes)[0]
    return x[tuple(slice(int(s), int(s) + n) for s, n in zip(starts, slice_sizes, strict=True))]


@vectorized("dynamic_slice")
def _dynamic_slice_v(x, *starts_and_dyn, slice_sizes):
    starts = _clamped_starts(x.shape[1:], starts_and_dyn[:x.ndim - 1], slice_sizes)
    starts = np.broadcast_to(starts, (x.shape[0], x.ndim - 1))
    return x[_window_indices(starts, slice_sizes)]


@per_device("dynamic_update_slice")
def _dynamic_update_slice(x, update, *starts, in_place: bool = False):
    """``in_place``: ``x`` itself updated (an operand nothing else holds, see ``_registry.IN_PLACE``)."""
    starts = _clamped_starts(x.shape, starts, update.shape)[0]
    out = x if in_place else x.copy()
    out[tuple(slice(int(s), int(s) + n) for s, n in zip(starts, update.shape, strict=True))] = update
    return out


@vectorized("dynamic_update_slice")
def _dynamic_update_slice_v(x, update, *starts, in_place: bool = False):
    starts = np.broadcast_to(_clamped_starts(x.shape[1:], starts, update.shape[1:]), (x.shape[0], x.ndim - 1))
    out = x if in_place else x.copy()
    out[_window_indices(starts, update.shape[1:])] = update
    return out


@per_device("iota")
def _iota(*dyn, dtype, shape, dimension, sharding=None):
    ramp = np.arange(shape[dimension], dtype=dtype)
    expanded = [1] * len(shape)
    expanded[dimension] = shape[dimension]
    return np.broadcast_to(ramp.reshape(expanded), shape)


@vectorized("iota")
def _iota_v(*dyn, dtype, shape, dimension, sharding=None):
    """Without operands: a leading axis of size 1, broadcast to the devices by the executor."""
    return _iota(dtype=dtype, shape=shape, dimension=dimension)[np.newaxis]


# -- gather and scatter (XLA semantics, vectorised with advanced indexing) --------------------------------

def _mode_name(mode) -> str:
    return getattr(mode, "name", str(mode)).upper()


def _window_index(operand_shape, indices, slice_sizes, *, start_index_map, collapsed, operand_batching,
                  indices_batching):
    """For every batch position and window offset, the operand coordinate, as arrays for fancy indexing.

    Returns (index tuple, batch shape, window dims kept, in-bounds mask before clamping)."""
    batch_shape = indices.shape[:-1]
    nb = len(batch_shape)
    starts = [np.zeros(batch_shape, dtype=np.int64) for _ in operand_shape]
    for k, d in enumerate(start_index_map):
        starts[d] = indices[..., k].astype(np.int64)
    for od, idim in zip(operand_batching, indices_batching, strict=True):
        ramp = np.arange(batch_shape[idim]).reshape([-1 if a == idim else 1 for a in range(nb)])
        starts[od] = np.broadcast_to(ramp, batch_shape).astype(np.int64)
    in_bounds = np.ones(batch_shape, dtype=bool)
    for d, size in enumerate(slice_sizes):
        in_bounds &= (starts[d] >= 0) & (starts[d] <= operand_shape[d] - size)
        starts[d] = np.clip(starts[d], 0, max(operand_shape[d] - size, 0))
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


def _default_fill(dtype):
    if is_float(dtype) or np.dtype(dtype).kind == "c":
        return np.nan
    if np.dtype(dtype).kind == "i":
        return np.iinfo(dtype).min
    if np.dtype(dtype).kind == "u":
        return np.iinfo(dtype).max
    return True


@per_device("gather")
def _gather(operand, indices, *, dimension_numbers, slice_sizes, mode, fill_value=None, indices_are_sorted=False,
            unique_indices=False):
    dn = dimension_numbers
    index, batch_shape, window_dims, in_bounds = _window_index(
        operand.shape, indices, slice_sizes, start_index_map=dn.start_index_map,
        collapsed=dn.collapsed_slice_dims, operand_batching=dn.operand_batching_dims,
        indices_batching=dn.start_indices_batching_dims)
    if operand.size == 0:
        out = np.zeros(tuple(np.broadcast_shapes(*(i.shape for i in index))), operand.dtype)
    else:
        out = operand[index]  # shape: batch_shape + window dims (in operand order)
    if _mode_name(mode).endswith("FILL_OR_DROP"):
        fill = _default_fill(operand.dtype) if fill_value is None else fill_value
        mask = in_bounds.reshape(batch_shape + (1,) * len(window_dims))
        out = np.where(mask, out, np.asarray(fill).astype(operand.dtype))
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


def _device_batched_gather_dnums(dn):
    return type(dn)(offset_dims=shift(dn.offset_dims), collapsed_slice_dims=shift(dn.collapsed_slice_dims),
                    start_index_map=shift(dn.start_index_map),
                    operand_batching_dims=(0, *shift(dn.operand_batching_dims)),
                    start_indices_batching_dims=(0, *shift(dn.start_indices_batching_dims)))


@vectorized("gather")
def _gather_v(operand, indices, *, dimension_numbers, slice_sizes, **params):
    """The device axis as a batching dimension of the operand and of the indices."""
    indices = np.broadcast_to(indices, (operand.shape[0], *indices.shape[1:]))
    return _gather(operand, indices, dimension_numbers=_device_batched_gather_dnums(dimension_numbers),
                   slice_sizes=(1, *slice_sizes), **params)


def _scatter(combine):
    def rule(operand, indices, updates, *, dimension_numbers, mode, update_jaxpr=None, update_consts=(),
             indices_are_sorted=False, unique_indices=False, in_place: bool = False):
        """``in_place``: ``operand`` itself updated (one nothing else holds, C-contiguous: see
        ``_registry.IN_PLACE``)."""
        if operand.size == 0:  # nothing to update (XLA: every index out of bounds, also when clamped)
            return operand if in_place else operand.copy()
        dn = dimension_numbers
        uw = list(dn.update_window_dims)
        update_window_shape = [updates.shape[d] for d in uw]
        it = iter(update_window_shape)
        window_sizes = [1 if d in dn.inserted_window_dims or d in dn.operand_batching_dims else next(it)
                        for d in range(operand.ndim)]
        apply = combine if update_jaxpr is None or combine is not _assign else _update_computation(update_jaxpr,
                                                                                                   update_consts)
        if apply is _assign and indices.ndim == 1 and indices.dtype.kind == "i" and not dn.operand_batching_dims \
                and uw == list(range(updates.ndim)):  # one window (``x.at[i].set(row)``): a slice, the same writes
            return _scatter_one_window(operand, indices, updates, window_sizes, dn.scatter_dims_to_operand_dims,
                                       _mode_name(mode).endswith("CLIP"), in_place)
        index, batch_shape, window_dims, in_bounds = _window_index(
            operand.shape, indices, window_sizes, start_index_map=dn.scatter_dims_to_operand_dims,
            collapsed=dn.inserted_window_dims, operand_batching=dn.operand_batching_dims,
            indices_batching=dn.scatter_indices_batching_dims)
        # updates: scatter (batch) dims first, window dims after, like the gathered layout
        batch_axes = [d for d in range(updates.ndim) if d not in uw]
        upd = np.transpose(updates, batch_axes + uw)
        if _mode_name(mode).endswith("CLIP"):
            in_bounds = np.ones_like(in_bounds)
        keep = np.broadcast_to(in_bounds.reshape(batch_shape + (1,) * len(window_dims)), upd.shape)
        out = operand if in_place else operand.copy()
        full_index = tuple(np.broadcast_to(i, upd.shape)[keep] for i in index)
        apply(out, full_index, upd[keep])  # float16/bfloat16: rounded after every update, as XLA:CPU does
        return out

    def stacked(operand, indices, updates, *, dimension_numbers, **params):
        """The device axis as a batching dimension of the operand and of the indices."""
        dn = dimension_numbers
        n = operand.shape[0]
        dnums = type(dn)(update_window_dims=shift(dn.update_window_dims),
                         inserted_window_dims=shift(dn.inserted_window_dims),
                         scatter_dims_to_operand_dims=shift(dn.scatter_dims_to_operand_dims),
                         operand_batching_dims=(0, *shift(dn.operand_batching_dims)),
                         scatter_indices_batching_dims=(0, *shift(dn.scatter_indices_batching_dims)))
        return rule(operand, np.broadcast_to(indices, (n, *indices.shape[1:])),
                    np.broadcast_to(updates, (n, *updates.shape[1:])), dimension_numbers=dnums, **params)
    return rule, stacked


def _assign(out, index, values):
    out[index] = values


def _scatter_one_window(operand, indices, updates, window_sizes, start_index_map, clip: bool, in_place: bool):
    """A ``scatter`` of one update window (indices of shape ``(k,)``) that assigns: the window's start as
    :func:`_window_index` computes it (clamped into the operand; out of bounds, dropped unless ``clip``), written
    as one slice."""
    starts = [0] * operand.ndim
    for k, d in enumerate(start_index_map):
        starts[d] = int(indices[k])
    inside = all(0 <= start <= dim - size for start, dim, size in zip(starts, operand.shape, window_sizes))
    out = operand if in_place else operand.copy()
    if inside or clip:
        window = tuple(slice(min(max(start, 0), max(dim - size, 0)), None)
                       for start, dim, size in zip(starts, operand.shape, window_sizes))
        window = tuple(slice(w.start, w.start + size) for w, size in zip(window, window_sizes))
        out[window] = updates.reshape(window_sizes)
    return out


def _update_computation(update_jaxpr, update_consts):
    """A ``scatter`` with an update computation (``lax.scatter_apply``, ``x.at[i].apply(f)``): XLA:CPU applies it
    to each update in turn, ``out[i] = update(out[i], u)``, in the updates' row-major order. ``combine(out,
    index, values)`` does the same in rounds: round ``r`` applies every target's ``r``-th update at once (the
    targets of a round are distinct, and each target sees its updates in order), the update jaxpr evaluated
    on the round's elements stacked on one axis (the vectorized rules, elementwise, so that the result of an
    element does not depend on how many are evaluated together)."""
    jaxpr, consts = (update_jaxpr.jaxpr, update_jaxpr.consts) if hasattr(update_jaxpr, "consts") else \
        (update_jaxpr, update_consts)
    if not jaxpr.eqns and not consts and jaxpr.outvars == jaxpr.invars[1:]:  # (x, y) -> y: lax.scatter's own
        return _assign

    def combine(out, index, values):
        if values.size == 0:
            return
        flat = np.ravel_multi_index(index, out.shape) if out.ndim else np.zeros(values.size, np.intp)
        order = np.argsort(flat, kind="stable")
        ordered = flat[order]
        first = np.r_[True, ordered[1:] != ordered[:-1]]
        positions = np.arange(len(flat))
        rank = np.empty(len(flat), np.intp)
        rank[order] = positions - np.maximum.accumulate(np.where(first, positions, 0))
        target = out.reshape(-1)  # a view: out is C-contiguous (a fresh copy, or an operand updated in place)
        for r in range(int(rank.max()) + 1):
            now = rank == r
            where = flat[now]
            evaluator = Vectorized(Batch((("scatter update", int(where.size)),)))
            evaluator.compiled = False  # one program per element count otherwise
            target[where] = evaluator.eval_jaxpr(jaxpr, consts, [target[where], values[now]])[0]
    return combine


for _names, _combine in ((("scatter",), _assign),
                         (("scatter-add", "scatter_add"), lambda o, i, v: np.add.at(o, i, v)),
                         (("scatter-sub", "scatter_sub"), lambda o, i, v: np.subtract.at(o, i, v)),
                         (("scatter-mul", "scatter_mul"), lambda o, i, v: np.multiply.at(o, i, v)),
                         (("scatter-min", "scatter_min"), lambda o, i, v: np.minimum.at(o, i, v)),
                         (("scatter-max", "scatter_max"), lambda o, i, v: np.maximum.at(o, i, v))):
    _rule, _stacked = _scatter(_combine)
    per_device(*_names)(_rule)
    vectorized(*_names)(_stacked)
    IN_PLACE.update(_names)
IN_PLACE.add("dynamic_update_slice")


# -- PRNG keys in the shape rules ---------------------------------------------------------------------------
# A typed key array's NumPy form is its key data: its shape followed by its impl's key shape (uint32; see
# ._dtypes). As JAX lowers these primitives on keys, their rules apply to the key data with their parameters
# extended over the trailing key-data axes (never moved, split or broadcast); eq/ne compare every word of a
# key. The extension is worked out from the equation: once per equation through ``specialize`` (what both
# executors' compiled form calls), or from the equation being evaluated (the reference loop).

def _trailing(start: int, key_shape: tuple) -> tuple:
    return tuple(range(start, start + len(key_shape)))


def _rank(var) -> int:
    return len(var.aval.shape)


def _zero_starts(starts, count: int) -> list:
    return [np.zeros_like(starts[0] if starts else np.int32(0))] * count


def _key_params(eqn, ks, vect):
    """``(operands -> operands or None, physical params, result -> result or None)`` of ``eqn`` on key data."""
    p, kn, name = eqn.params, len(ks), eqn.primitive.name
    if name == "broadcast_in_dim":
        shape = tuple(p["shape"])
        return None, {**p, "shape": (*shape, *ks),
                      "broadcast_dimensions": (*p["broadcast_dimensions"], *_trailing(len(shape), ks))}, None
    if name == "reshape":
        dims = p.get("dimensions")
        return None, {**p, "new_sizes": (*p["new_sizes"], *ks), "dimensions": None if dims is None else
                      (*dims, *_trailing(_rank(eqn.invars[0]), ks))}, None
    if name == "transpose":
        return None, {**p, "permutation": (*p["permutation"], *_trailing(len(p["permutation"]), ks))}, None
    if name == "tile":
        return None, {**p, "reps": (*p["reps"], *(1,) * kn)}, None
    if name == "slice":
        return None, {**p, "start_indices": (*p["start_indices"], *(0,) * kn), "limit_indices": (
            *p["limit_indices"], *ks), "strides": None if p["strides"] is None else (*p["strides"], *(1,) * kn)}, None
    if name in ("dynamic_slice", "dynamic_update_slice"):
        first, r = (1 if name == "dynamic_slice" else 2), _rank(eqn.invars[0])

        def operands(xs):
            starts = list(xs[first:first + r])
            return (*xs[:first + r], *_zero_starts(starts, kn), *xs[first + r:])
        params = {**p, "slice_sizes": (*p["slice_sizes"], *ks)} if name == "dynamic_slice" else p
        return operands, params, None
    if name == "gather":
        dn = p["dimension_numbers"]
        return None, {**p, "dimension_numbers": dn._replace(offset_dims=(
            *dn.offset_dims, *_trailing(_rank(eqn.outvars[0]), ks))), "slice_sizes": (*p["slice_sizes"], *ks)}, None
    if name == "scatter":
        dn = p["dimension_numbers"]
        return None, {**p, "dimension_numbers": dn._replace(update_window_dims=(
            *dn.update_window_dims, *_trailing(_rank(eqn.invars[2]), ks)))}, None
    if name == "select_n":
        def operands(xs):
            which = xs[0]
            return (which.reshape(which.shape + (1,) * kn) if vect or which.ndim else which, *xs[1:])
        return operands, p, None
    if name in ("eq", "ne"):
        axes, lead, rank = tuple(range(-kn, 0)), int(vect), max(_rank(v) for v in eqn.invars)

        def operands(xs):  # a rank-0 operand against an array (lax broadcasts it): unit axes before its key data
            return tuple(x.reshape((*x.shape[:lead], *(1,) * (rank + kn + lead - x.ndim), *x.shape[lead:]))
                         for x in xs)
        return operands, p, (lambda out: out.all(axis=axes)) if name == "eq" else (lambda out: out.any(axis=axes))
    raise AssertionError(name)


def _on_key_data(rule, name: str, vect: bool):
    """``rule`` (of primitive ``name``), also computing equations on PRNG keys (see above)."""
    inner = getattr(rule, "specialize", None)

    def on_keys(eqn):
        ks = _dtypes.key_data_shape_of(eqn)
        if ks is None:
            return None
        operands, params, finish = _key_params(eqn, ks, vect)

        def call(*xs):
            out = rule(*(operands(xs) if operands is not None else xs), **params)
            return finish(out) if finish is not None else out
        return call

    def specialized(eqn):
        call = on_keys(eqn)
        if call is None and inner is not None:
            call = inner(eqn)
        if call is None:
            call = functools.partial(rule, **eqn.params) if eqn.params else rule
        return call

    def key_aware(*xs, **params):
        if any(getattr(x, "dtype", None) == np.uint32 for x in xs):  # key data is uint32
            eqn = _dtypes.equation_being_evaluated(name)
            call = on_keys(eqn) if eqn is not None else None
            if call is not None:
                return call(*xs)
        return rule(*xs, **params)
    key_aware.specialize = specialized
    key_aware.__wrapped__ = rule
    return key_aware


for _name in ("broadcast_in_dim", "reshape", "transpose", "tile", "slice", "dynamic_slice", "dynamic_update_slice",
              "gather", "scatter", "select_n", "eq", "ne"):
    PER_DEVICE[_name] = _on_key_data(PER_DEVICE[_name], _name, False)
    VECTORIZED[_name] = _on_key_data(VECTORIZED[_name], _name, True)
