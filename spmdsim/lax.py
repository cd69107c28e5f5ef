"""Collectives over named axes, with ``jax.lax``'s signatures and keyword names.

Each function normalises its arguments the way ``jax/_src/lax/parallel.py`` does (axis names to a tuple,
``perm`` to pairs, bool to int32 for sums), validates them on the calling device (raising JAX's exception
class), then meets the other devices of the axis in a rendezvous that applies the rule from
:mod:`spmdsim._collectives`. Every collective maps over the leaves of a pytree operand (``None`` stays
``None``); the leaves travel in one rendezvous.

Values are NumPy arrays. NumPy's dtypes are kept (float64 stays float64; JAX would have canonicalised it to
float32 on input); where JAX's collectives change a dtype, spmdsim does the same: ``psum`` of bool gives
int32, ``pmean`` of an integer or bool gives float32.
"""
from __future__ import annotations

import functools
import math
import operator

import numpy as np

from spmdsim import _collectives, _runtime, _tree
from spmdsim._pmap import is_python_scalar as _is_python_scalar

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute", "pshuffle",
           "pswapaxes", "axis_index", "axis_size", "pbroadcast"]

_AxisError = np.exceptions.AxisError  # a ValueError and an IndexError, like the errors JAX raises here


# -- argument normalisation -----------------------------------------------------------------------------

def _axis_names(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _split_positional(axes: tuple) -> tuple[tuple, tuple]:
    """Int entries of ``axis_name`` are positional axes of the per-device value, as in ``jax.lax.psum``."""
    named = tuple(a for a in axes if not isinstance(a, int))
    positional = tuple(a for a in axes if isinstance(a, int))
    return named, positional


@functools.lru_cache(maxsize=256, typed=True)
def _split_hashable(axis_name) -> tuple[tuple, tuple]:
    return _split_positional(_axis_names(axis_name))


def _split_axis_name(axis_name) -> tuple[tuple, tuple]:
    """``(named axes, positional axes)`` of an ``axis_name`` argument; remembered when it is hashable (every
    collective call starts here)."""
    try:
        return _split_hashable(axis_name)
    except TypeError:  # a list of names
        return _split_positional(_axis_names(axis_name))


@functools.lru_cache(maxsize=256)
def _check_groups_cached(groups: tuple, size: int, api: str) -> tuple:
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(len(covered))):
        raise ValueError(f"{api}: axis_index_groups must cover all indices exactly once, got {groups}. "
                         f"Give each axis index 0..{size - 1} in exactly one group.")
    if len(covered) != size:
        raise ValueError(f"{api}: axis_index_groups cover {len(covered)} indices, but the axis has size {size} "
                         f"(JAX fails later, in XLA). List every axis index 0..{size - 1} once.")
    return groups


def _check_groups(axis_index_groups, size: int, api: str) -> tuple | None:
    if axis_index_groups is None:
        return None
    try:
        groups = tuple(tuple(operator.index(i) for i in g) for g in axis_index_groups)
    except TypeError:
        raise TypeError(f"{api}: axis_index_groups must be a list of lists of ints, got {axis_index_groups!r}.") \
            from None
    return _check_groups_cached(groups, size, api)


def _own_group(groups: tuple | None, index: int, size: int) -> tuple:
    if groups is None:
        return tuple(range(size))
    return next(g for g in groups if index in g)


def _require_even(groups, api: str) -> None:
    if groups is not None and len({len(g) for g in groups}) > 1:
        raise ValueError(f"{api}: axis_index_groups must all have the same size, got sizes "
                         f"{[len(g) for g in groups]} (JAX fails to lower uneven groups for this collective).")


def _canonical_axis(axis: int, ndim: int, api: str, what: str) -> int:
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise _AxisError(f"{api}: {what}={axis} is out of bounds for an array of dimension {ndim} "
                         f"(valid: {-ndim}..{ndim - 1}).")
    return axis % ndim


class _Call:
    """One collective call as seen from the calling device: its frames, axis size, group and leaves."""

    def __init__(self, api: str, x, axis_name, axis_index_groups=None):
        self.api = api
        self.leaves, self.treedef = _tree.flatten(x)
        self.chan = _runtime.channel(_runtime.current_lane(), _axis_names(axis_name), api)
        self.frames, self.size = self.chan.frames, self.chan.size
        self.groups = _check_groups(axis_index_groups, self.size, api)

    @property
    def group(self) -> tuple:
        """This device's group (its axis indices, in rank order)."""
        return _own_group(self.groups, self.chan.rank, self.size)

    def bind(self, op: str, arrays: list, **params):
        return _tree.unflatten(self.treedef, bind(op, arrays, self.chan, self.groups, **params))


class Binding:
    """Rule ``op`` of the rule table with its parameters bound, ready to meet the other devices."""

    __slots__ = ("op", "params", "combine")

    def __init__(self, op: str, groups: tuple | None, **params):
        self.op = op
        self.params = (("axis_index_groups", groups), *params.items())  # part of the call's signature
        self.combine = functools.partial(_collectives.apply_grouped, op, axis_index_groups=groups, **params)

    def __call__(self, arrays: list, chan: _runtime.Channel, site: str) -> list:
        """One rendezvous on ``chan``'s communicator; returns this device's result arrays."""
        return _runtime.bind_collective(self.op, arrays, chan, params=self.params, combine=self.combine,
                                        site=site)


@functools.lru_cache(maxsize=512)
def _binding(op: str, groups: tuple | None, params: tuple) -> Binding:
    return Binding(op, groups, **dict(params))


def bind(op: str, arrays: list, chan: _runtime.Channel, groups: tuple | None, *, site: str | None = None,
         **params) -> list:
    """One rendezvous on ``chan``'s communicator applying rule ``op`` of the rule table per group; returns this
    device's result arrays. The JAX front end prepares a :class:`Binding` per equation instead."""
    try:
        binding = _binding(op, groups, tuple(params.items()))
    except TypeError:  # an unhashable parameter
        binding = Binding(op, groups, **params)
    return binding(arrays, chan, site or _runtime.user_site(3))


def _bind_leafwise(call: _Call, op: str, arrays: list, params: list[dict]):
    """Bind ``op`` for leaves whose rule parameters may differ (a negative axis resolves per rank): one
    rendezvous when they agree, the usual case, else one per leaf."""
    if not call.frames or not arrays:
        return _tree.unflatten(call.treedef, arrays)
    if all(p == params[0] for p in params):
        return call.bind(op, arrays, **params[0])
    return _tree.unflatten(call.treedef, [bind(op, [a], call.chan, call.groups, **p)[0]
                                          for a, p in zip(arrays, params)])


def _reduce_positional(x: np.ndarray, positional: tuple, ufunc: np.ufunc) -> np.ndarray:
    if not positional:
        return x
    axes = tuple(_canonical_axis(a, x.ndim, "psum", "axis") for a in positional)
    return ufunc.reduce(x, axis=axes, dtype=x.dtype if ufunc is np.add else None)


def _reduction(op: str, ufunc: np.ufunc, api: str, x, axis_name, axis_index_groups, to_int32: bool):
    if type(x) is np.ndarray and axis_index_groups is None:
        named, positional = _split_axis_name(axis_name)
        if named and not positional:  # the usual call, one array over named axes: _reduce without the pytree
            if to_int32 and x.dtype == np.bool_:
                x = x.astype(np.int32)
            return bind(op, [x], _runtime.channel(_runtime.current_lane(), named, api), None)[0]
    call, out = _reduce(op, ufunc, api, x, axis_name, axis_index_groups, to_int32)
    return _tree.unflatten(call.treedef, out)


def _reduce(op: str, ufunc: np.ufunc, api: str, x, axis_name, axis_index_groups, to_int32: bool):
    """The reduction's call (frames, groups, the operand's leaves) and this device's result leaves."""
    named, positional = _split_axis_name(axis_name)
    if positional and axis_index_groups is not None:
        raise ValueError(f"{api}: axis_index_groups only supported for sums over just named axes, got "
                         f"axis_name={axis_name!r}.")
    call = _Call(api, x, named, axis_index_groups)
    if call.leaves and _is_python_scalar(call.leaves[0]) and all(map(_is_python_scalar, call.leaves)):
        # JAX folds constants without communicating: psum(c) is size * c, pmax(c) is c.
        factor = len(call.group) if op == "psum" else 1
        return call, [factor * leaf for leaf in call.leaves]
    arrays = [np.asarray(leaf) for leaf in call.leaves]
    if to_int32:
        arrays = [a.astype(np.int32) if a.dtype == np.bool_ else a for a in arrays]
    if positional:
        arrays = [_reduce_positional(a, positional, ufunc) for a in arrays]
    if not call.frames:
        return call, arrays
    return call, bind(op, arrays, call.chan, call.groups)


# -- reductions -----------------------------------------------------------------------------------------

def psum(x, axis_name, *, axis_index_groups=None):
    """All-reduce sum over the named axis (or axes) ``axis_name``; mirrors ``jax.lax.psum``.

    Reference: every device of a group receives ``x_0 + x_1 + ... `` summed in rank order (bit-exact with
    XLA:CPU). If ``x`` is a pytree the sum is taken leaf by leaf.

    Args:
      x: array(s) of any shape; every device of the group must pass the same shapes and dtypes.
      axis_name: an axis name, or a tuple of names (the product axis) and ints (positional axes of ``x``,
        summed on each device first, as in JAX).
      axis_index_groups: optional list of lists of axis indices; each group is summed separately.

    Returns:
      Same shapes as ``x``. Same dtypes, except bool, which becomes int32 (as in JAX). int8/uint8 wrap. A
      Python scalar operand is a constant: the result is ``size * x`` as a Python scalar, with no
      communication (JAX does the same).

    Raises:
      NameError: an axis name not bound by an enclosing pmap/vmap.
      ValueError: repeated axis names; groups that do not cover the axis exactly once; groups with
        positional axes.

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), axis_name='i')(np.arange(4))
    array([6, 6, 6, 6])
    """
    return _reduction("psum", np.add, "psum", x, axis_name, axis_index_groups, to_int32=True)


def pmax(x, axis_name, *, axis_index_groups=None):
    """All-reduce elementwise maximum; mirrors ``jax.lax.pmax``. Shapes and dtypes are kept (bool stays
    bool); NaN propagates. A Python scalar is returned unchanged. Errors as :func:`psum`.

    Difference from JAX: none in value; JAX has no derivative rule for pmax (irrelevant in NumPy mode).
    """
    return _reduction("pmax", np.maximum, "pmax", x, axis_name, axis_index_groups, to_int32=False)


def pmin(x, axis_name, *, axis_index_groups=None):
    """All-reduce elementwise minimum; mirrors ``jax.lax.pmin``. See :func:`pmax`."""
    return _reduction("pmin", np.minimum, "pmin", x, axis_name, axis_index_groups, to_int32=False)


def pmean(x, axis_name, *, axis_index_groups=None):
    """All-reduce mean: ``psum(x) / n``; mirrors ``jax.lax.pmean``.

    ``n`` is the size of the device's own group (the axis size without groups). Integer and bool inputs
    give float32, as in JAX (the sum is converted to float32, then divided); float16, float32, float64 and
    complex keep their dtype.

    Difference from JAX 0.10: with uneven ``axis_index_groups`` JAX divides every group's sum by
    ``len(axis_index_groups[0])``; spmdsim divides by the device's own group size (a true mean).

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.pmean(v, 'i'), axis_name='i')(np.arange(4, dtype=np.int32))
    array([1.5, 1.5, 1.5, 1.5], dtype=float32)
    """
    named, positional = _split_axis_name(axis_name)
    call, totals = _reduce("psum", np.add, "pmean", x, axis_name, axis_index_groups, to_int32=True)
    n = len(call.group)
    return _tree.unflatten(call.treedef, [_divide(total, n * math.prod(np.shape(leaf)[a] for a in positional))
                                          for leaf, total in zip(call.leaves, totals)])


def _divide(total, count: int):
    """``total / count`` with JAX's dtypes: integer and bool sums give float32, floats keep theirs."""
    if _is_python_scalar(total):
        return total / count
    total = np.asarray(total)
    if total.dtype.kind in "biu":
        return total.astype(np.float32) / np.float32(count)
    return total / count


# -- gathers and scatters -------------------------------------------------------------------------------

def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying"):
    """Gather every device's block; mirrors ``jax.lax.all_gather``.

    Reference: ``stack([x_k for k in group], axis=axis)``, ranks in group order (the listed order of
    ``axis_index_groups``); with ``tiled=True``, ``concatenate`` instead.

    Args:
      x: array(s) of shape ``s``.
      axis: where the gathered axis goes; non-tiled it indexes the result (``-1`` is a new last axis),
        tiled it indexes ``s``.
      tiled: concatenate instead of stacking.
      to: accepted for signature compatibility (JAX's varying-manual-axes type system); ignored.

    Returns:
      Non-tiled: shape ``s`` with ``n`` inserted at ``axis``; tiled: ``s[axis]`` multiplied by ``n``.
      dtypes kept (bool and ints included).

    Raises:
      NameError (unbound name); ValueError/IndexError (``numpy.exceptions.AxisError``) for an axis out of
      bounds, ValueError for uneven groups (JAX fails to lower them).
    """
    call = _Call("all_gather", x, axis_name, axis_index_groups)
    _require_even(call.groups, "all_gather")
    arrays = [np.asarray(leaf) for leaf in call.leaves]
    if tiled and any(a.ndim == 0 for a in arrays):
        raise _AxisError("all_gather: tiled=True needs operands of rank >= 1 (it concatenates along `axis`).")
    params = [{"all_gather_dimension": _canonical_axis(axis, a.ndim + (0 if tiled else 1), "all_gather", "axis"),
               "tiled": bool(tiled)} for a in arrays]
    return _bind_leafwise(call, "all_gather", arrays, params)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Sum, then scatter slices of the sum; mirrors ``jax.lax.psum_scatter`` (primitive ``reduce_scatter``).

    Reference: with ``S = sum of the group's blocks`` (rank order), rank r receives ``take(S, r,
    axis=scatter_dimension)`` (non-tiled: that dimension must have size n and is removed) or the r-th of n
    equal chunks along it (tiled: its size must be divisible by n).

    Returns:
      dtype kept; shape as described. Raises TypeError for bool (JAX: "add does not accept dtype bool"),
      ValueError for sizes, AxisError for a rank-0 operand or an axis out of bounds.

    Difference from JAX 0.10: a negative ``scatter_dimension`` works (JAX 0.10 crashes in lowering; fixed
    in 0.11).
    """
    call = _Call("psum_scatter", x, axis_name, axis_index_groups)
    _require_even(call.groups, "psum_scatter")
    n = len(call.group)
    arrays = [np.asarray(leaf) for leaf in call.leaves]
    params = []
    for a in arrays:
        if a.dtype == np.bool_:
            raise TypeError("psum_scatter: add does not accept dtype bool. Convert first, e.g. x.astype(np.int32).")
        if a.ndim == 0:
            raise _AxisError("psum_scatter: the operand must have rank >= 1 (it is split along "
                             "scatter_dimension), got a scalar.")
        d = _canonical_axis(scatter_dimension, a.ndim, "psum_scatter", "scatter_dimension")
        params.append({"scatter_dimension": d, "tiled": bool(tiled)})
        if not tiled and a.shape[d] != n:
            raise ValueError(f"psum_scatter: reduce_scatter operand scatter dimension size {a.shape[d]} must match "
                             f"shard count {n} (shape {a.shape}, scatter_dimension={scatter_dimension}). Use "
                             f"tiled=True to split a dimension whose size is a multiple of {n}.")
        if tiled and a.shape[d] % n:
            raise ValueError(f"psum_scatter: tiled reduce_scatter operand scatter dimension size {a.shape[d]} must "
                             f"be divisible by shard_count {n} (shape {a.shape}).")
    return _bind_leafwise(call, "reduce_scatter", arrays, params)


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Exchange chunks between all devices; mirrors ``jax.lax.all_to_all``.

    Reference: rank r receives ``stack([take(x_k, r, axis=split_axis) for k in group], axis=concat_axis)``
    (non-tiled: ``x.shape[split_axis]`` must equal n; it is removed and a new axis of size n appears at
    ``concat_axis`` of the result), or with ``tiled=True`` chunk r of ``split(x_k, n, split_axis)``
    concatenated along ``concat_axis``. Globally ``pmap(all_to_all(., s, c))(X) == moveaxis(X, (0, s+1),
    (c+1, 0))``.

    Difference from JAX 0.10: negative axes work (JAX 0.10 crashes on them; fixed in 0.11).
    """
    call = _Call("all_to_all", x, axis_name, axis_index_groups)
    _require_even(call.groups, "all_to_all")
    n = len(call.group)
    arrays = [np.asarray(leaf) for leaf in call.leaves]
    params = []
    for a in arrays:
        if a.ndim == 0:
            raise _AxisError("all_to_all: the operand must have rank >= 1, got a scalar.")
        s = _canonical_axis(split_axis, a.ndim, "all_to_all", "split_axis")
        c = _canonical_axis(concat_axis, a.ndim, "all_to_all", "concat_axis")
        params.append({"split_axis": s, "concat_axis": c, "tiled": bool(tiled)})
        if not tiled and a.shape[s] != n:
            raise ValueError(f"all_to_all requires the size of the mapped axis axis_name to equal "
                             f"x.shape[split_axis], but they are {n} and {a.shape[s]} respectively (shape "
                             f"{a.shape}, split_axis={split_axis}). Reshape x, or use tiled=True.")
        if tiled and a.shape[s] % n:
            raise ValueError(f"The size of all_to_all split_axis ({a.shape[s]}) has to be divisible by the size "
                             f"of the named axis {axis_name} ({n}).")
    return _bind_leafwise(call, "all_to_all", arrays, params)


def pswapaxes(x, axis_name, axis, *, axis_index_groups=None):
    """Swap the mapped axis with positional axis ``axis``; mirrors ``jax.lax.pswapaxes``.

    Exactly ``all_to_all(x, axis_name, axis, axis, axis_index_groups=...)``: ``x.shape[axis]`` must equal
    the axis size. Globally ``pmap(pswapaxes(., 'i', a))(X) == np.swapaxes(X, 0, a + 1)``.
    """
    return all_to_all(x, axis_name, axis, axis, axis_index_groups=axis_index_groups)


# -- permutations and broadcast -------------------------------------------------------------------------

def _check_perm(perm, size: int) -> tuple:
    try:
        pairs = tuple((operator.index(s), operator.index(d)) for s, d in perm)
    except (TypeError, ValueError):
        raise TypeError(f"ppermute: perm must be an iterable of (source, destination) int pairs, got {perm!r}.") \
            from None
    for s, d in pairs:
        if not (-size <= s < size and -size <= d < size):
            raise IndexError(f"ppermute: perm pair {(s, d)} is out of range for an axis of size {size} "
                             f"(valid indices: {-size}..{size - 1}).")
    srcs = [s % size for s, _ in pairs]
    dsts = [d % size for _, d in pairs]
    if len(set(srcs)) != len(srcs) or len(set(dsts)) != len(dsts):
        raise ValueError(f"ppermute sources and destinations must be unique, got {pairs}. Each device may "
                         f"send at most once and receive at most once per ppermute.")
    return tuple(zip(srcs, dsts))


def ppermute(x, axis_name, perm):
    """Send each device's block along ``perm``; mirrors ``jax.lax.ppermute``.

    Reference: for each ``(src, dst)`` in ``perm``, device ``dst`` receives ``x_src``; devices that are no
    destination receive zeros of ``x``'s shape and dtype (False for bool). Negative indices count from the
    end, as in JAX. There are no ``axis_index_groups``.

    Raises:
      ValueError: a repeated source or destination. IndexError: an index outside the axis (as JAX).
      TypeError: ``perm`` is not made of int pairs.
    """
    call = _Call("ppermute", x, axis_name)
    pairs = _check_perm(perm, call.size)
    arrays = [np.asarray(leaf) for leaf in call.leaves]
    return call.bind("ppermute", arrays, perm=pairs)


def pshuffle(x, axis_name, perm):
    """Device ``i`` receives ``x_{perm[i]}``; mirrors ``jax.lax.pshuffle`` (a ppermute with pairs
    ``(perm[i], i)``). As in JAX, only ``set(perm) == set(range(len(perm)))`` is checked, so a shorter
    ``perm`` is accepted and the devices it leaves out receive zeros."""
    perm = [operator.index(p) for p in perm]
    if set(perm) != set(range(len(perm))):
        raise ValueError(f"`perm` does not represent a permutation: {perm}. Give each index 0..{len(perm) - 1} once.")
    return ppermute(x, axis_name, list(zip(perm, range(len(perm)))))


def pbroadcast(x, axis_name, source):
    """Every device receives ``x_source``; mirrors ``jax.lax.pbroadcast``.

    Difference from JAX 0.10: JAX implements it on GPU only (on CPU: NotImplementedError); spmdsim
    everywhere.
    """
    call = _Call("pbroadcast", x, axis_name)
    source = operator.index(source)
    if not 0 <= source < call.size:
        raise ValueError(f"pbroadcast: source={source} is outside the axis of size {call.size}.")
    return call.bind("pbroadcast", [np.asarray(leaf) for leaf in call.leaves], source=source)


# -- axis queries ---------------------------------------------------------------------------------------

def axis_index(axis_name):
    """This device's position along ``axis_name`` as an int32 scalar array; mirrors ``jax.lax.axis_index``.

    For a tuple of names the position is row-major in the order given: ``('i', 'j')`` gives
    ``index(i) * size(j) + index(j)``. No communication. NameError for an unbound name.
    """
    return np.asarray(_runtime.channel(_runtime.current_lane(), _axis_names(axis_name), "axis_index").rank,
                      dtype=np.int32)


def axis_size(axis_name) -> int:
    """The size of ``axis_name`` (product over a tuple) as a Python int; mirrors ``jax.lax.axis_size``."""
    return _runtime.channel(_runtime.current_lane(), _axis_names(axis_name), "axis_size").size
