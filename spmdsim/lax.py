"""Collectives over named axes for NumPy programs, with ``jax.lax``'s signatures and keyword names.

Each function is the public half of JAX's ``jax/_src/lax/parallel.py``: it normalises its arguments the way
JAX's wrapper does (axis names to a tuple, ``perm`` to pairs, bool to int32 for sums, ``all_to_all``'s unit
axis, negative axes), folds Python-scalar constants without communicating, and binds the primitive of
:mod:`spmdsim.primitives._primitives` for the leaves of its pytree operand (``None`` stays ``None``); the leaves travel
in one rendezvous. The primitive's checks, rule and rendezvous are shared with the JAX front end.

Values are NumPy arrays. NumPy's dtypes are kept (float64 stays float64; JAX would have canonicalised it to
float32 on input); where JAX's collectives change a dtype, spmdsim does the same: ``psum`` of bool gives
int32, ``pmean`` of an integer or bool gives float32.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from spmdsim.primitives import _primitives

from spmdsim.runtime import _runtime, _tree
from spmdsim.primitives._primitives import AxisError, bind, canonical_axis, split_axis_names
from spmdsim.runtime._values import as_array, is_python_scalar

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute", "pshuffle",
           "pswapaxes", "axis_index", "axis_size", "pbroadcast", "ragged_all_to_all", "psend", "precv", "pcast"]


def _axes_tuple(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _arrays(leaves: list, api: str, bool_as: np.dtype | None = None) -> list[np.ndarray]:
    """The operand leaves as NumPy arrays (numeric arrays as they are, NumPy scalars as 0-d arrays, bool ones
    converted to ``bool_as`` if given); TypeError naming a non-numeric leaf."""
    out = []
    for k, leaf in enumerate(leaves):
        if type(leaf) is not np.ndarray or leaf.dtype.kind not in "iufc":
            if isinstance(leaf, np.generic) and leaf.dtype.kind in "biufc":
                leaf = np.asarray(leaf)
            else:
                leaf = as_array(leaf, f"operand leaf {k}", api)
            if bool_as is not None and leaf.dtype.kind == "b":
                leaf = leaf.astype(bool_as)
        out.append(leaf)
    return out


def _group_size(named: tuple, axis_index_groups, prim: str, api: str) -> int:
    """The size of this device's group: the axes' size, or its own group's with ``axis_index_groups``."""
    chan = _runtime.channel(_runtime.current_lane(), named, api)
    groups = _primitives.check_groups(axis_index_groups, chan.size, _primitives.PRIMITIVES[prim])
    return len(_primitives.own_group(groups, chan.rank, chan.size))


def _bind_per_params(name: str, treedef, arrays: list, params: list[dict], api: str):
    """Bind ``name`` for leaves whose parameters may differ (a negative axis resolves per rank): one rendezvous
    for all leaves when they agree, the usual case, else one per leaf."""
    if not arrays:
        return _tree.unflatten(treedef, arrays)
    if all(p == params[0] for p in params):
        return _tree.unflatten(treedef, bind(name, arrays, api=api, **params[0]))
    return _tree.unflatten(treedef, [bind(name, [a], api=api, **p)[0] for a, p in zip(arrays, params, strict=True)])


# -- reductions -----------------------------------------------------------------------------------------

# (primitive, api, axis names, epilogue) -> its prepared bind (see _primitives.prepare)
_prepared: dict = {}


def _prepared_bind(name: str, api: str, axis_name, epilogue):
    """The prepared bind of reduction ``name`` over ``axis_name`` without groups (None for unhashable names:
    :func:`bind` reports them)."""
    if type(axis_name) is list:
        axis_name = tuple(axis_name)
    try:
        call = _prepared.get((name, api, axis_name, epilogue))
    except TypeError:
        return None
    if call is None:
        if len(_prepared) > 1024:
            _prepared.clear()
        call = _prepared[(name, api, axis_name, epilogue)] = _primitives.prepare(
            name, {"axes": _axes_tuple(axis_name), "axis_index_groups": None}, api=api, epilogue=epilogue)
    return call


_kind = operator.attrgetter("dtype.kind")


def _numeric(leaves: list) -> list[np.ndarray] | None:
    """``leaves`` as arrays when every one is a numeric (not bool) NumPy array or scalar, else None: without
    Python per leaf (a gradient tree's leaves)."""
    types = set(map(type, leaves))
    if not types <= _NUMERIC_TYPES or (np.ndarray in types and not set(map(_kind, leaves)) <= _NUMERIC_KINDS):
        return None
    return list(leaves) if len(types) == 1 and np.ndarray in types else list(map(np.asarray, leaves))


_NUMERIC_KINDS = set("iufc")
_NUMERIC_TYPES = {np.ndarray} | {t for t in np.sctypeDict.values()
                                 if issubclass(t, np.number) and np.dtype(t).kind in _NUMERIC_KINDS}


def _reduction(name: str, api: str, x, axis_name, axis_index_groups, epilogue=None):
    """One reduction primitive over the leaves of ``x``, in one rendezvous; returns the result tree. Python-scalar
    leaves only: a constant, folded without communicating (as JAX does)."""
    call = _prepared_bind(name, api, axis_name, epilogue) if axis_index_groups is None else None
    if call is not None:
        if type(x) is np.ndarray and x.dtype.kind in "iufc":  # one array
            return call([x])[0]
        leaves, treedef = _tree.flatten(x)
        arrays = _numeric(leaves) if leaves else None
        if arrays is not None:  # numeric arrays and NumPy scalars: nothing to convert
            return _tree.unflatten(treedef, call(arrays))
    named, positional = split_axis_names(axis_name)
    if positional and axis_index_groups is not None:
        raise ValueError(f"{api}: axis_index_groups only supported for sums over just named axes, got "
                         f"axis_name={axis_name!r}.")
    leaves, treedef = _tree.flatten(x)
    if leaves and all(map(is_python_scalar, leaves)):
        n = _group_size(named, axis_index_groups, name, api) if named else 1
        factor = n if name == "psum" else 1
        return _tree.unflatten(treedef, [(leaf * factor) / n if api == "pmean" else leaf * factor
                                         for leaf in leaves])
    if not leaves:
        _runtime.channel(_runtime.current_lane(), named, api)  # an unbound name is still an error
        return x
    arrays = _arrays(leaves, api, np.int32 if name == "psum" else None)
    if call is not None:
        return _tree.unflatten(treedef, call(arrays))
    out = bind(name, arrays, axes=_axes_tuple(axis_name), axis_index_groups=axis_index_groups, api=api,
               epilogue=epilogue)
    return _tree.unflatten(treedef, out)


def psum(x, axis_name, *, axis_index_groups=None):
    """All-reduce sum over the named axis (or axes) ``axis_name``; mirrors ``jax.lax.psum``.

    Reference: every device of a group receives ``x_0 + x_1 + ...`` summed in rank order (bit-exact with
    XLA:CPU; bfloat16 accumulated in float32 and rounded once, as XLA:CPU does). If ``x`` is a pytree the sum
    is taken leaf by leaf, in one rendezvous.

    Args:
      x: array(s) of any shape; every device of the group must pass the same shapes and dtypes.
      axis_name: an axis name, or a tuple of names (the product axis, row-major) and ints (positional axes of
        ``x``, summed on each device first, as in JAX).
      axis_index_groups: optional list of lists of axis indices; each group is summed separately.

    Returns:
      Same shapes as ``x``. Same dtypes, except bool, which becomes int32 (as in JAX). int8/uint8 wrap. A
      Python scalar operand is a constant: the result is ``group_size * x`` as a Python scalar, with no
      communication (JAX does the same).

    Raises:
      NameError: an axis name not bound by an enclosing pmap/vmap/shard_map.
      ValueError: repeated axis names; groups that do not cover the axis exactly once; groups with
        positional axes. TypeError: a non-numeric operand (strings, objects).

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.psum(v, 'i'), axis_name='i')(np.arange(4))
    array([6, 6, 6, 6])
    """
    return _reduction("psum", "psum", x, axis_name, axis_index_groups)


def pmax(x, axis_name, *, axis_index_groups=None):
    """All-reduce elementwise maximum; mirrors ``jax.lax.pmax``.

    Args and errors as :func:`psum`. Returns the same shapes and dtypes as ``x`` (bool stays bool); NaN
    propagates. A Python scalar is returned unchanged.

    Difference from JAX 0.10: complex operands give the lexicographic maximum (real part, then imaginary), as
    ``lax.max`` does; XLA:CPU fails with UNIMPLEMENTED at run time.

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.pmax(v, 'i'), axis_name='i')(np.array([3, 1, 2]))
    array([3, 3, 3])
    """
    return _reduction("pmax", "pmax", x, axis_name, axis_index_groups)


def pmin(x, axis_name, *, axis_index_groups=None):
    """All-reduce elementwise minimum; mirrors ``jax.lax.pmin``. See :func:`pmax`.

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.pmin(v, 'i'), axis_name='i')(np.array([3, 1, 2]))
    array([1, 1, 1])
    """
    return _reduction("pmin", "pmin", x, axis_name, axis_index_groups)


def _mean_of(total: np.ndarray, count: int) -> np.ndarray:
    """``total / count`` with JAX's dtypes (integer and bool sums give float32, floats keep theirs), read-only
    so that the devices can share it. A floating sum is divided in place (it is the psum's own fresh result,
    not yet given to any device): no second array of the operand's size."""
    if total.dtype.kind in "biu":
        out = np.asarray(total.astype(np.float32) / np.float32(count))
    elif total.ndim == 0 and total.dtype.kind == "f" and total.dtype.isbuiltin == 1:  # a scalar: scalar arithmetic
        out = np.asarray(total[()] / total.dtype.type(count))
    elif total.flags.owndata:
        total.flags.writeable = True
        out = np.divide(total, np.asarray(count, total.dtype), out=total)
    else:
        out = np.asarray(total / np.asarray(count, total.dtype))
    out.flags.writeable = False
    return out


def pmean(x, axis_name, *, axis_index_groups=None):
    """All-reduce mean: ``psum(x) / n``; mirrors ``jax.lax.pmean`` (not a primitive in JAX either: the devices
    meet in a ``psum``).

    ``n`` is the size of the device's own group (the axes' size without groups) times the sizes of any
    positional axes. Integer and bool inputs give float32, as in JAX (the sum is converted to float32, then
    divided); float16, float32, float64 and complex keep their dtype. The divided result is computed once per
    group and shared by its devices.

    Difference from JAX 0.10: with uneven ``axis_index_groups`` JAX divides every group's sum by
    ``len(axis_index_groups[0])``; spmdsim divides by the device's own group size (a true mean).

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.pmean(v, 'i'), axis_name='i')(np.arange(4, dtype=np.int32))
    array([1.5, 1.5, 1.5, 1.5], dtype=float32)
    """
    named, positional = split_axis_names(axis_name)
    if not positional:
        return _reduction("psum", "pmean", x, axis_name, axis_index_groups, epilogue=_mean_of)
    leaves, _ = _tree.flatten(x)
    counts = [math.prod(np.shape(leaf)[a] for a in positional) for leaf in leaves]
    totals, treedef = _tree.flatten(_reduction("psum", "pmean", x, axis_name, axis_index_groups))
    n = _group_size(named, axis_index_groups, "psum", "pmean") if named else 1
    return _tree.unflatten(treedef, [t / (n * c) if is_python_scalar(t) else _mean_of(np.asarray(t), n * c)
                                     for t, c in zip(totals, counts, strict=True)])


# -- gathers and scatters -------------------------------------------------------------------------------

_ALL_GATHER_TO = {"varying", "invarying", "reduced"}
_PCAST_TO = {"varying", "reduced", "unreduced"}


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying"):
    """Gather every device's block; mirrors ``jax.lax.all_gather``.

    Reference: ``stack([x_k for k in group], axis=axis)``, ranks in group order (the listed order of
    ``axis_index_groups``); with ``tiled=True``, ``concatenate`` instead.

    Args:
      x: array(s) of shape ``s``.
      axis_name: a name or a tuple of names (row-major product axis).
      axis_index_groups: groups of equal size (JAX cannot lower uneven ones for this collective).
      axis: where the gathered axis goes; non-tiled it indexes the result (``-1`` is a new last axis), tiled
        it indexes ``s``.
      tiled: concatenate instead of stacking.
      to: accepted for signature compatibility (JAX's varying-manual-axes types); no effect on values.

    Returns:
      Non-tiled: shape ``s`` with ``n`` inserted at ``axis``; tiled: ``s[axis]`` multiplied by ``n``. dtypes
      kept (bool and ints included).

    Raises:
      NameError: an unbound axis name.
      ValueError: an axis out of bounds or a tiled scalar (``numpy.exceptions.AxisError``, also an
        IndexError); uneven groups.

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.all_gather(v, 'i'), axis_name='i')(np.arange(3))
    array([[0, 1, 2],
           [0, 1, 2],
           [0, 1, 2]])
    """
    if to not in _ALL_GATHER_TO:
        raise ValueError(f"Got unexpected `to` value for `all_gather`: {to!r}. Allowed `to` values are: "
                         f"{sorted(_ALL_GATHER_TO)}.")
    leaves, treedef = _tree.flatten(x)
    arrays = _arrays(leaves, "all_gather")
    names = _axes_tuple(axis_name)
    params = []
    for a in arrays:
        if tiled and a.ndim == 0:
            raise AxisError("all_gather: tiled=True needs operands of rank >= 1 (it concatenates along `axis`).")
        params.append({"axis_name": names, "axis_index_groups": axis_index_groups, "tiled": bool(tiled),
                       "all_gather_dimension": canonical_axis(axis, a.ndim + (0 if tiled else 1), "all_gather", "axis")})
    if not arrays:
        _runtime.channel(_runtime.current_lane(), split_axis_names(axis_name)[0], "all_gather")
    return _bind_per_params("all_gather", treedef, arrays, params, "all_gather")


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Sum, then scatter slices of the sum; mirrors ``jax.lax.psum_scatter`` (primitive ``reduce_scatter``).

    Reference: with ``S = sum of the group's blocks`` (rank order), rank r receives ``take(S, r,
    axis=scatter_dimension)`` (non-tiled: that dimension must have size n and is removed) or the r-th of n
    equal chunks along it (tiled: its size must be divisible by n).

    Args:
      x: array(s) of rank >= 1, not bool.
      axis_name: a name or a tuple of names.
      scatter_dimension: the dimension to split (negative counts from the end).
      axis_index_groups: groups of equal size.
      tiled: keep the dimension, split it n ways.

    Returns:
      dtype kept; shape as described.

    Raises:
      TypeError: a bool operand (JAX: "add does not accept dtype bool").
      ValueError: sizes that do not fit; a rank-0 operand or a dimension out of bounds
        (``numpy.exceptions.AxisError``, also an IndexError).

    Difference from JAX 0.10: a negative ``scatter_dimension`` works (JAX 0.10 crashes in lowering; fixed in
    0.11).
    """
    leaves, treedef = _tree.flatten(x)
    arrays = _arrays(leaves, "psum_scatter")
    names = _axes_tuple(axis_name)
    params = []
    for a in arrays:
        if a.ndim == 0:
            raise AxisError("psum_scatter: the operand must have rank >= 1 (it is split along scatter_dimension), "
                            "got a scalar.")
        params.append({"axis_name": names, "axis_index_groups": axis_index_groups, "tiled": bool(tiled),
                       "scatter_dimension": canonical_axis(scatter_dimension, a.ndim, "psum_scatter",
                                                       "scatter_dimension")})
    return _bind_per_params("reduce_scatter", treedef, arrays, params, "psum_scatter")


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Exchange chunks between all devices; mirrors ``jax.lax.all_to_all``.

    Reference: rank r receives ``stack([take(x_k, r, axis=split_axis) for k in group], axis=concat_axis)``
    (non-tiled: ``x.shape[split_axis]`` must equal n; it is removed and a new axis of size n appears at
    ``concat_axis`` of the result), or with ``tiled=True`` chunk r of ``split(x_k, n, split_axis)``
    concatenated along ``concat_axis``. Globally ``pmap(all_to_all(., s, c))(X) == moveaxis(X, (0, s+1),
    (c+1, 0))``. As in JAX, the non-tiled form binds the primitive on ``x`` with a unit axis added at
    ``concat_axis`` and removes ``split_axis`` afterwards.

    Args:
      x: array(s) of rank >= 1.
      axis_name: a name or a tuple of names.
      split_axis: the axis of ``x`` to split (negative counts from the end).
      concat_axis: the axis to concatenate along (negative counts from the end).
      axis_index_groups: groups of equal size.
      tiled: split into n chunks instead of n slices.

    Returns:
      Non-tiled: ``x``'s shape with ``split_axis`` removed and ``n`` inserted at ``concat_axis``; tiled:
      ``shape[split_axis] // n`` and ``shape[concat_axis] * n``. dtypes kept.

    Raises:
      ValueError: ``x.shape[split_axis]`` not equal to n (non-tiled) or not divisible by n (tiled); uneven
        groups; an axis out of bounds or a scalar (``numpy.exceptions.AxisError``).

    Difference from JAX 0.10: negative axes work (JAX 0.10 crashes on them; fixed in 0.11); uneven groups
    are a ValueError in every case (JAX 0.10 silently returns ``x`` when the first group has one member).
    """
    leaves, treedef = _tree.flatten(x)
    arrays = _arrays(leaves, "all_to_all")
    names = _axes_tuple(axis_name)
    named = split_axis_names(axis_name)[0]
    n = _group_size(named, axis_index_groups, "all_to_all", "all_to_all")
    out = []
    for a in arrays:
        if a.ndim == 0:
            raise AxisError("all_to_all: the operand must have rank >= 1, got a scalar.")
        s = canonical_axis(split_axis, a.ndim, "all_to_all", "split_axis")
        c = canonical_axis(concat_axis, a.ndim, "all_to_all", "concat_axis")
        if tiled and a.shape[s] % n:
            raise ValueError(f"The size of all_to_all split_axis ({a.shape[s]}) has to be divisible by the size "
                             f"of the named axis {axis_name} ({n}).")
        if not tiled and a.shape[s] != n:
            raise ValueError(f"all_to_all requires the size of the mapped axis axis_name to equal "
                             f"x.shape[split_axis], but they are {n} and {a.shape[s]} respectively (shape "
                             f"{a.shape}, split_axis={split_axis}). Reshape x, or use tiled=True.")
        if not tiled and s != c:  # JAX's wrapper: a unit axis at concat_axis, split_axis removed after
            if s < c:
                c += 1
            else:
                s += 1
            a = np.expand_dims(a, c)
        params = {"axis_name": names, "axis_index_groups": axis_index_groups, "split_axis": s, "concat_axis": c,
                  "tiled": bool(tiled)}
        result = bind("all_to_all", [a], api="all_to_all", **params)[0]
        out.append(np.squeeze(result, s) if not tiled and s != c else result)
    return _tree.unflatten(treedef, out)


def pswapaxes(x, axis_name, axis, *, axis_index_groups=None):
    """Swap the mapped axis with positional axis ``axis``; mirrors ``jax.lax.pswapaxes``.

    Exactly ``all_to_all(x, axis_name, axis, axis, axis_index_groups=...)``: ``x.shape[axis]`` must equal
    the axis size. Globally ``pmap(pswapaxes(., 'i', a))(X) == np.swapaxes(X, 0, a + 1)``.
    """
    return all_to_all(x, axis_name, axis, axis, axis_index_groups=axis_index_groups)


# -- permutations and broadcast -------------------------------------------------------------------------

def _pairs(perm) -> tuple:
    return _primitives.perm_pairs(perm)  # JAX's classes: ValueError for a pair of other than 2, else TypeError


def ppermute(x, axis_name, perm):
    """Send each device's block along ``perm``; mirrors ``jax.lax.ppermute``.

    Reference: for each ``(src, dst)`` in ``perm``, device ``dst`` receives ``x_src``; devices that are no
    destination receive zeros of ``x``'s shape and dtype (False for bool). Negative indices count from the
    end, as in JAX. There are no ``axis_index_groups``.

    Args:
      x: array(s).
      axis_name: a name or tuple of names (row-major product axis).
      perm: (source, destination) pairs of indices along it (a zip, lists, an array of pairs are fine).

    Returns:
      Same shapes and dtypes as ``x``.

    Raises:
      ValueError: a repeated source or destination. IndexError: an index outside the axis (as JAX).
      TypeError: ``perm`` is not made of int pairs; ValueError for a pair of other than two values (as JAX).

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.ppermute(v, 'i', [(0, 1), (1, 2)]), axis_name='i')(np.arange(1, 4))
    array([0, 1, 2])
    """
    leaves, treedef = _tree.flatten(x)
    pairs = _pairs(perm)
    if not leaves:
        _runtime.channel(_runtime.current_lane(), split_axis_names(axis_name)[0], "ppermute")
        return x
    return _tree.unflatten(treedef, bind("ppermute", _arrays(leaves, "ppermute"), axis_name=_axes_tuple(axis_name),
                                         perm=pairs, api="ppermute"))


def pshuffle(x, axis_name, perm):
    """Device ``i`` receives ``x_{perm[i]}``; mirrors ``jax.lax.pshuffle`` (a ppermute with pairs
    ``(perm[i], i)``). As in JAX, only ``set(perm) == set(range(len(perm)))`` is checked, so a shorter ``perm``
    is accepted and the devices it leaves out receive zeros. ValueError when ``perm`` is no permutation."""
    perm = [operator.index(p) for p in perm]
    if set(perm) != set(range(len(perm))):
        raise ValueError(f"`perm` does not represent a permutation: {perm}. Give each index 0..{len(perm) - 1} once.")
    return ppermute(x, axis_name, list(zip(perm, range(len(perm)))))


def pbroadcast(x, axis_name, source):
    """Every device receives ``x_source``; mirrors ``jax.lax.pbroadcast``.

    Returns ``x``'s shapes and dtypes. ValueError when ``source`` is outside the axis.

    Difference from JAX 0.10: JAX implements it on GPU only (on CPU: NotImplementedError); spmdsim
    everywhere.
    """
    leaves, treedef = _tree.flatten(x)
    return _tree.unflatten(treedef, bind("pbroadcast", _arrays(leaves, "pbroadcast"),
                                         axis_name=_axes_tuple(axis_name), source=operator.index(source),
                                         api="pbroadcast"))


# -- shard_map's point-to-point and ragged collectives (GPU-only in XLA; everywhere here) ---------------------

def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name,
                      axis_index_groups=None):
    """Exchange ragged slices between devices; mirrors ``jax.lax.ragged_all_to_all`` (mixture-of-experts
    dispatch).

    With K entries in each of the four index arrays and ``k = K // n`` slices per destination, this device's
    slice i (rows ``input_offsets[i] : + send_sizes[i]`` of ``operand``) goes to device ``i // k``, written at
    rows ``output_offsets[i] : + send_sizes[i]`` of that device's ``output``. Each device returns its ``output``
    with every slice sent to it written in. ``recv_sizes[j]`` must equal what device ``j // k`` sends here.

    Args:
      operand: (N, ...) rows to send.
      output: (M, ...) of the same dtype and trailing shape: the array written into.
      input_offsets: 1-D integers of length K (divisible by the axis size): where each slice starts.
      send_sizes: 1-D integers of length K: the rows of each slice.
      output_offsets: 1-D integers of length K: where each slice is written on its destination.
      recv_sizes: 1-D integers of length K: the rows received from each source slot.
      axis_name: a name or tuple of names.
      axis_index_groups: groups of equal size.

    Returns:
      An array of ``output``'s shape and dtype.

    Raises:
      ValueError: lengths, shapes, sizes that disagree between sender and receiver, slices out of bounds.

    Difference from JAX 0.10: XLA:CPU cannot run it ("HLO opcode ragged-all-to-all is not supported"); spmdsim
    computes JAX's documented semantics on every platform.

    >>> import numpy as np, spmdsim
    >>> f = spmdsim.pmap(lambda op, out, io, ss, oo, rs: spmdsim.lax.ragged_all_to_all(
    ...     op, out, io, ss, oo, rs, axis_name='i'), 'i')
    >>> f(np.array([[1, 2, 2], [3, 4, 0]]), np.zeros((2, 4), int), np.array([[0, 1], [0, 1]]),
    ...   np.array([[1, 2], [1, 1]]), np.array([[0, 0], [1, 2]]), np.array([[1, 1], [2, 1]]))
    array([[1, 3, 0, 0],
           [2, 2, 4, 0]])
    """
    operands = _arrays([operand, output, input_offsets, send_sizes, output_offsets, recv_sizes], "ragged_all_to_all")
    return bind("ragged_all_to_all", operands, axis_name=_axes_tuple(axis_name),
                axis_index_groups=axis_index_groups, api="ragged_all_to_all")[0]


def psend(x, axis_name, perm):
    """Send ``x`` along ``perm`` to be received by :func:`precv`; mirrors ``jax.lax.psend``.

    Every device of the axis takes part (a rendezvous, as in ``ppermute``); what reaches a device waits there
    for its ``precv`` with the same ``perm``. Returns a token (one per leaf of a pytree ``x``).

    Difference from JAX 0.10: GPU-only in XLA; spmdsim implements it everywhere.
    """
    leaves, treedef = _tree.flatten(x)
    pairs = _pairs(perm)
    return _tree.unflatten(treedef, [_primitives.psend(a, _axes_tuple(axis_name), pairs)
                                     for a in _arrays(leaves, "psend")])


def precv(token, out_shape, axis_name, perm):
    """Receive what the matching :func:`psend` (same axes and ``perm``) delivered to this device: its block, or
    zeros where this device is no destination; mirrors ``jax.lax.precv``.

    Args:
      token: a token from ``psend`` (ordering only).
      out_shape: anything with ``shape`` and ``dtype`` (e.g. ``jax.ShapeDtypeStruct`` or an array): the
        expected block.
      axis_name: a name or tuple of names.
      perm: the (source, destination) pairs of the matching ``psend``.

    Raises:
      ValueError: no ``psend`` with this ``perm`` came before, or it sent another shape or dtype.
    """
    return _primitives.precv(tuple(out_shape.shape), out_shape.dtype, _axes_tuple(axis_name), _pairs(perm))


def pcast(x, axis_name, *, to):
    """Change the varying-manual-axes type of ``x``; mirrors ``jax.lax.pcast`` (JAX 0.10's replacement of
    ``pvary``). Values are unchanged: the NumPy front end tracks no types (an output's replication is checked
    by value, see :func:`spmdsim.shard_map`), so this checks its arguments and returns ``x``.

    Raises:
      NameError: an axis name no enclosing map binds.
      ValueError: ``to`` is not one of ``'varying'``, ``'reduced'``, ``'unreduced'``.
      TypeError: ``axis_name`` is neither a name nor a tuple.
    """
    if to not in _PCAST_TO:
        raise ValueError(f"pcast: got unexpected `to` value {to!r}; allowed: {sorted(_PCAST_TO)}.")
    if isinstance(axis_name, (set, frozenset, list, dict)):
        raise TypeError(f"pcast: axis_name={axis_name!r} must be a tuple or a str.")
    _runtime.channel(_runtime.current_lane(), split_axis_names(axis_name)[0], "pcast")
    return x


# -- axis queries ---------------------------------------------------------------------------------------

def axis_index(axis_name):
    """This device's position along ``axis_name`` as an int32 scalar array; mirrors ``jax.lax.axis_index``.

    For a tuple of names the position is row-major in the order given: ``('i', 'j')`` gives
    ``index(i) * size(j) + index(j)``. No communication. NameError for an unbound name.

    >>> import numpy as np, spmdsim
    >>> spmdsim.pmap(lambda v: spmdsim.lax.axis_index('i'), axis_name='i')(np.zeros(3))
    array([0, 1, 2], dtype=int32)
    """
    return _primitives.axis_index(axis_name)


def axis_size(axis_name) -> int:
    """The size of ``axis_name`` (product over a tuple) as a Python int; mirrors ``jax.lax.axis_size``.
    NameError for an unbound name."""
    return _primitives.axis_size(axis_name)
