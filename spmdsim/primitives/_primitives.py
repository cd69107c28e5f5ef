"""The collective primitives, each defined once, and :func:`bind`, the one way to call them.

This module is the specification. It has one stanza per JAX primitive (``psum``, ``pmax``, ``pmin``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``ppermute``, ``pbroadcast``), in the manner of JAX's
``jax/_src/lax/parallel.py``, each with three parts, all under JAX's own parameter names:

- ``check(avals, n, groups, **params)``: the checks JAX makes (in abstract evaluation or when lowering) with
  JAX's exception classes, returning the rule's parameters. ``avals`` are the operands' (shape, dtype) on one
  device, ``n`` the size of a group (the communicator's size without groups; the first group's size with
  them, which for the collectives that need even groups is every group's), ``groups`` the validated
  ``axis_index_groups`` (or None).
- ``rule(blocks, **rule_params) -> results``: pure NumPy, no threads, no axis names. ``blocks[r]`` is the block
  of rank ``r`` in one group (the position in the listed ``axis_index_groups`` group, or the row-major index
  over the named axes without groups), ``results[r]`` what that rank receives. Compare JAX's reference
  semantics for collectives in the shard_map docs (``collective_ref(i, blocks)``).
- ``vectorized(x, **rule_params) -> y``: the same for many groups at once: ``x`` has shape ``(G, n, *block)``,
  G independent groups of n ranks; ``y[g, r]`` equals ``rule(list(x[g]))[r]`` bit for bit (the same
  operations in the same order).

:func:`bind` is what every front end and executor calls: ``spmdsim.lax`` (NumPy programs), the JAX front
end's thread executor (a jaxpr equation's ``params`` as they are) and its vectorized executor. It resolves the
axis names to a communicator, validates the groups, runs ``check`` and then either meets the other lanes in a
rendezvous (threads: :mod:`spmdsim.runtime._rendezvous`) or applies ``vectorized`` along the device axis of the
vectorized executor's current :class:`Batch`. So the front ends cannot disagree.

Conventions: dtypes are preserved exactly (``np.add`` folds, never ``np.sum``, which widens int32); results are
fresh arrays, read-only, shared between the devices that receive the same value (JAX arrays are immutable,
so no program can tell); reductions fold in rank order (see :mod:`spmdsim.primitives._reduction`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
import threading
from typing import Callable, Sequence

import numpy as np

from spmdsim.runtime import _runtime
from spmdsim.runtime._axes import resolve_axes
from spmdsim.primitives._reduction import fold, fold_stacked
from spmdsim.runtime._reports import Signature
from spmdsim.runtime._values import broadcast_view, dtype_of, shape_of

__all__ = ["PRIMITIVES", "Collective", "bind", "prepare", "axis_index", "axis_size", "psend", "precv", "TOKEN", "apply_grouped",
           "split_axis_names", "canonical_axis", "check_groups", "AxisError"]

AxisError = np.exceptions.AxisError  # a ValueError and an IndexError, like the errors JAX raises here


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective primitive: its name, the parameter holding its axis names, the kind of
    ``axis_index_groups`` it accepts, and its check, rule and vectorized form (see the module docstring)."""

    name: str
    axes_param: str        # "axes" (reductions: names and positional ints) or "axis_name"
    groups: str            # "any", "even" (every group of one size) or "none"
    check: Callable
    rule: Callable
    vectorized: Callable
    joint: bool = False    # the operands of one call form one block (ragged_all_to_all), not one block each


PRIMITIVES: dict[str, Collective] = {}


def _define(name: str, *, axes_param: str = "axis_name", groups: str = "even", check: Callable, rule: Callable,
            vectorized: Callable, joint: bool = False) -> None:
    assert name not in PRIMITIVES, f"duplicate collective primitive {name!r}"
    PRIMITIVES[name] = Collective(name, axes_param, groups, check, rule, vectorized, joint)


def _frozen(a) -> np.ndarray:
    a = np.asarray(a)
    a.flags.writeable = False
    return a


def _fresh(a: np.ndarray, block: np.ndarray) -> np.ndarray:
    """``a`` as a read-only array that shares no memory with ``block`` (a device's own, mutable array)."""
    if np.shares_memory(a, block):
        a = a.copy()
    return _frozen(a)


def _replicated(x: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``value`` (shape ``(G, *out)``) given to all n ranks of every group: ``(G, n, *out)``, a read-only view
    (no copies)."""
    return broadcast_view(value[:, None], (value.shape[0], x.shape[1], *value.shape[1:]))


def canonical_axis(axis, ndim: int, api: str, what: str) -> int:
    """``axis`` counted from the front of a rank-``ndim`` array; AxisError (a ValueError and an IndexError)
    naming ``api`` and the argument ``what`` when it is out of bounds."""
    axis = operator.index(axis)
    if not -ndim <= axis < ndim:
        raise AxisError(f"{api}: {what}={axis} is out of bounds for an array of dimension {ndim} "
                        f"(valid: {-ndim}..{ndim - 1}).")
    return axis % ndim


def _one(values: set, given):
    """The one canonical axis that a (possibly negative) axis parameter means for every operand of a bind;
    operands of different ranks need one bind each (spmdsim.lax does that)."""
    if len(values) > 1:
        raise ValueError(f"the axis {given} means different axes {sorted(values)} for operands of different ranks "
                         f"bound together; bind them one at a time.")
    return values.pop() if values else operator.index(given)


def _no_check(avals, n, groups, **params) -> dict:
    return {}


# -- psum, pmax, pmin -------------------------------------------------------------------------------------

def _reduction(ufunc: np.ufunc, doc: str):
    def rule(blocks):
        return [fold(ufunc, blocks)] * len(blocks)

    def vectorized(x):
        return _replicated(x, fold_stacked(ufunc, x))

    rule.__doc__ = doc
    return rule, vectorized


for _name, _ufunc, _doc in [
        ("psum", np.add, "Every rank receives ``b0 + b1 + ... + b_{n-1}``, folded in rank order."),
        ("pmax", np.maximum, "Every rank receives the elementwise maximum (NaN propagates, as in XLA; complex "
                             "numbers compare lexicographically, as lax.max does)."),
        ("pmin", np.minimum, "Every rank receives the elementwise minimum (see pmax).")]:
    _rule, _vec = _reduction(_ufunc, _doc)
    _define(_name, axes_param="axes", groups="any", check=_no_check, rule=_rule, vectorized=_vec)


# -- all_gather -------------------------------------------------------------------------------------------

def _all_gather_check(avals, n, groups, *, all_gather_dimension, tiled, axis_size=None, **_) -> dict:
    dims = set()
    for shape, _dtype in avals:
        if tiled and len(shape) == 0:
            raise AxisError("all_gather: tiled=True needs operands of rank >= 1 (it concatenates along `axis`).")
        dims.add(canonical_axis(all_gather_dimension, len(shape) + (0 if tiled else 1), "all_gather", "axis"))
    return {"all_gather_dimension": _one(dims, all_gather_dimension), "tiled": bool(tiled)}


def _all_gather(blocks, *, all_gather_dimension: int, tiled: bool):
    """Every rank receives all blocks in rank order: stacked on a new axis ``all_gather_dimension`` (in the
    result's rank), or concatenated along it when ``tiled``."""
    join = np.concatenate if tiled else np.stack
    return [_frozen(join(blocks, axis=all_gather_dimension))] * len(blocks)


def _all_gather_vectorized(x, *, all_gather_dimension: int, tiled: bool):
    gathered = np.moveaxis(x, 1, all_gather_dimension + 1)  # (G, ..., n, ...): the stack, as a view
    if tiled:
        shape = list(x.shape[2:])
        shape[all_gather_dimension] *= x.shape[1]
        gathered = gathered.reshape(x.shape[0], *shape)
    return _replicated(x, np.ascontiguousarray(gathered))


_define("all_gather", check=_all_gather_check, rule=_all_gather, vectorized=_all_gather_vectorized)


# -- reduce_scatter (jax.lax.psum_scatter) ----------------------------------------------------------------

def _reduce_scatter_check(avals, n, groups, *, scatter_dimension, tiled, axis_size=None, **_) -> dict:
    dims = set()
    for shape, dtype in avals:
        if np.dtype(dtype) == np.bool_:
            raise TypeError("psum_scatter: add does not accept dtype bool at position 0. Convert first, e.g. "
                            "x.astype(np.int32).")
        if len(shape) == 0:
            raise AxisError("psum_scatter: the operand must have rank >= 1 (it is split along scatter_dimension), "
                            "got a scalar.")
        d = canonical_axis(scatter_dimension, len(shape), "psum_scatter", "scatter_dimension")
        dims.add(d)
        if not tiled and shape[d] != n:
            raise ValueError(f"psum_scatter: reduce_scatter operand scatter dimension size {shape[d]} must match "
                             f"shard count {n} (shape {tuple(shape)}, scatter_dimension={scatter_dimension}). Use "
                             f"tiled=True to split a dimension whose size is a multiple of {n}.")
        if tiled and shape[d] % n:
            raise ValueError(f"psum_scatter: tiled reduce_scatter operand scatter dimension size {shape[d]} must "
                             f"be divisible by shard_count {n} (shape {tuple(shape)}).")
    return {"scatter_dimension": _one(dims, scatter_dimension), "tiled": bool(tiled)}


def _reduce_scatter(blocks, *, scatter_dimension: int, tiled: bool):
    """``S = b0 + ... + b_{n-1}``; rank r receives ``S``'s r-th slice along ``scatter_dimension``: the index r
    (the dimension is removed; its size is n) or, when ``tiled``, the r-th of n equal chunks."""
    n = len(blocks)
    total = fold(np.add, blocks)
    if tiled:
        return [_fresh(c, blocks[0]) for c in np.split(total, n, axis=scatter_dimension)]
    return [_frozen(np.take(total, r, axis=scatter_dimension)) for r in range(n)]


def _reduce_scatter_vectorized(x, *, scatter_dimension: int, tiled: bool):
    G, n = x.shape[:2]
    total = fold_stacked(np.add, x)  # (G, *block)
    d = scatter_dimension + 1
    if tiled:
        shape = total.shape
        total = total.reshape(*shape[:d], n, shape[d] // n, *shape[d + 1:])
    return np.moveaxis(total, d, 1)


_define("reduce_scatter", check=_reduce_scatter_check, rule=_reduce_scatter, vectorized=_reduce_scatter_vectorized)


# -- all_to_all -------------------------------------------------------------------------------------------

def _all_to_all_check(avals, n, groups, *, split_axis, concat_axis, tiled=False, **_) -> dict:
    splits, concats = set(), set()
    for shape, _dtype in avals:
        if len(shape) == 0:
            raise AxisError("all_to_all: the operand must have rank >= 1, got a scalar.")
        s = canonical_axis(split_axis, len(shape), "all_to_all", "split_axis")
        splits.add(s)
        concats.add(canonical_axis(concat_axis, len(shape), "all_to_all", "concat_axis"))
        if shape[s] % n:
            raise ValueError(f"The size of all_to_all split_axis ({shape[s]}) has to be divisible by the size of "
                             f"the named axis ({n}).")
    return {"split_axis": _one(splits, split_axis), "concat_axis": _one(concats, concat_axis)}


def _all_to_all(blocks, *, split_axis: int, concat_axis: int):
    """Rank r receives, from every rank k in rank order, chunk r of ``b_k`` split n ways along
    ``split_axis``, concatenated along ``concat_axis``. (The primitive's semantics: ``jax.lax.all_to_all``
    with ``tiled=False`` adds and removes a unit axis around it, see :func:`spmdsim.lax.all_to_all`.)"""
    n = len(blocks)
    chunks = [np.split(b, n, axis=split_axis) for b in blocks]
    return [_frozen(np.concatenate([c[r] for c in chunks], axis=concat_axis)) for r in range(n)]


def _all_to_all_vectorized(x, *, split_axis: int, concat_axis: int):
    G, n = x.shape[:2]
    block = x.shape[2:]
    s, c = split_axis, concat_axis
    # Split the split axis into (n chunks, chunk size): axes 0=G, 1=source rank, then the block's axes with
    # axis s replaced by (chunk index at 2+s, chunk at 3+s).
    y = x.reshape(G, n, *block[:s], n, block[s] // n, *block[s + 1:])
    position = [2 + j if j < s else 3 + j for j in range(len(block))]
    order = [0, 2 + s]  # G, then the chunk index: the receiving rank
    for j in range(len(block)):
        if j == c:
            order.append(1)  # the source ranks, concatenated along the concat axis in rank order
        order.append(position[j])
    out_block = [block[j] if j != s else block[s] // n for j in range(len(block))]
    out_block[c] *= n
    return np.transpose(y, order).reshape(G, n, *out_block)


_define("all_to_all", check=_all_to_all_check, rule=_all_to_all, vectorized=_all_to_all_vectorized)


# -- ppermute ---------------------------------------------------------------------------------------------

def perm_pairs(perm) -> tuple:
    """``perm`` as a tuple of (source, destination) int pairs, checked as JAX does: ValueError for a pair that is
    not two values (JAX's unpacking error), TypeError for anything else that is not int pairs."""
    try:
        given = [tuple(pair) for pair in perm]
    except TypeError:
        raise TypeError(f"ppermute: perm must be an iterable of (source, destination) int pairs, got {perm!r}.") \
            from None
    for pair in given:
        if len(pair) != 2:
            raise ValueError(f"ppermute: perm must be (source, destination) pairs, got {pair!r} ({len(pair)} "
                             f"value{'' if len(pair) == 1 else 's'}) in perm={perm!r}.")
    try:
        return tuple((operator.index(s), operator.index(d)) for s, d in given)
    except TypeError:
        raise TypeError(f"ppermute: perm must be an iterable of (source, destination) int pairs, got {perm!r}.") \
            from None


def check_perm(perm, n: int) -> tuple:
    """``perm`` as unique (source, destination) pairs within the axis; negative indices count from the end
    (as in JAX). ValueError for a repeated source or destination or a pair that is not two values, IndexError out
    of range, TypeError for anything but int pairs (JAX's classes; see :func:`perm_pairs`)."""
    pairs = perm_pairs(perm)
    for s, d in pairs:
        if not (-n <= s < n and -n <= d < n):
            raise IndexError(f"ppermute: perm pair {(s, d)} is out of range for an axis of size {n} "
                             f"(valid indices: {-n}..{n - 1}).")
    sources = [s % n for s, _ in pairs]
    destinations = [d % n for _, d in pairs]
    if len(set(sources)) != len(sources) or len(set(destinations)) != len(destinations):
        raise ValueError(f"ppermute sources and destinations must be unique, got {pairs}. Each device may send "
                         f"at most once and receive at most once per ppermute.")
    return tuple(zip(sources, destinations))


def _ppermute_check(avals, n, groups, *, perm, **_) -> dict:
    return {"perm": check_perm(perm, n)}


def _ppermute(blocks, *, perm: Sequence[tuple[int, int]]):
    """For each ``(src, dst)`` pair rank ``dst`` receives ``b_src``; ranks that receive nothing get zeros
    (False for bool)."""
    zeros = _frozen(np.zeros_like(blocks[0]))
    out = [zeros] * len(blocks)
    for src, dst in perm:
        out[dst] = _fresh(blocks[src], blocks[src])
    return out


def _ppermute_vectorized(x, *, perm):
    out = np.zeros_like(x)
    if perm:
        sources, destinations = zip(*perm)
        out[:, list(destinations)] = x[:, list(sources)]
    return out


_define("ppermute", groups="none", check=_ppermute_check, rule=_ppermute, vectorized=_ppermute_vectorized)


# -- pbroadcast -------------------------------------------------------------------------------------------

def _pbroadcast_check(avals, n, groups, *, source, **_) -> dict:
    source = operator.index(source)
    if not 0 <= source < n:
        raise ValueError(f"pbroadcast: source={source} is outside the axis of size {n}.")
    return {"source": source}


def _pbroadcast(blocks, *, source: int):
    """Every rank receives ``b_source``."""
    return [_fresh(blocks[source], blocks[source])] * len(blocks)


_define("pbroadcast", groups="none", check=_pbroadcast_check, rule=_pbroadcast,
        vectorized=lambda x, *, source: _replicated(x, x[:, source].copy()))


# -- ragged_all_to_all ------------------------------------------------------------------------------------

def _ragged_check(avals, n, groups, **_params) -> dict:
    if len(avals) != 6:
        raise TypeError(f"ragged_all_to_all takes 6 operands (operand, output, input_offsets, send_sizes, "
                        f"output_offsets, recv_sizes), got {len(avals)}.")
    (op_shape, op_dtype), (out_shape, out_dtype), *index_avals = avals
    if np.dtype(op_dtype) != np.dtype(out_dtype) or tuple(op_shape[1:]) != tuple(out_shape[1:]) or not op_shape:
        raise ValueError(f"ragged_all_to_all: operand {op_dtype}{list(op_shape)} and output "
                         f"{out_dtype}{list(out_shape)} must have one dtype and equal shapes after the leading axis.")
    lengths = {shape for shape, _ in index_avals}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise ValueError(f"ragged_all_to_all: input_offsets, send_sizes, output_offsets and recv_sizes must be 1-D "
                         f"of one length, got shapes {[list(s) for s, _ in index_avals]}.")
    if next(iter(lengths))[0] % n:
        raise ValueError(f"ragged_all_to_all: the offset and size arrays have length {next(iter(lengths))[0]}, which "
                         f"is not divisible by the axis size {n}.")
    for what, (_, d) in zip(("input_offsets", "send_sizes", "output_offsets", "recv_sizes"), index_avals):
        if np.dtype(d).kind not in "iu":
            raise ValueError(f"ragged_all_to_all {what} must be integer type.")
    return {}


def _ragged_all_to_all(blocks):
    """``blocks[r] = (operand, output, input_offsets, send_sizes, output_offsets, recv_sizes)`` of rank r. With
    K offsets per rank and ``k = K // n`` slices per destination, rank r's slice i (rows
    ``input_offsets[i] : + send_sizes[i]`` of its operand) goes to rank ``i // k``, written at rows
    ``output_offsets[i] : + send_sizes[i]`` of that rank's ``output``; every rank receives its ``output`` with
    the slices sent to it written in. ``recv_sizes`` must agree with the senders' ``send_sizes`` (JAX: that
    ``send_sizes == all_to_all(recv_sizes, tiled=True)``); JAX's documented semantics, which XLA:CPU cannot run."""
    n = len(blocks)
    results = [np.array(b[1]) for b in blocks]
    for src, (operand, _, input_offsets, send_sizes, output_offsets, _) in enumerate(blocks):
        per_destination = len(input_offsets) // n
        for i in range(len(input_offsets)):
            dst, slot = divmod(i, per_destination)
            size = int(send_sizes[i])
            expected = int(blocks[dst][5][src * per_destination + slot])
            if size != expected:
                raise ValueError(f"ragged_all_to_all: rank {src} sends {size} rows to rank {dst} (send_sizes[{i}]), "
                                 f"but rank {dst} expects {expected} (recv_sizes[{src * per_destination + slot}]).")
            start, at = int(input_offsets[i]), int(output_offsets[i])
            if size < 0 or start < 0 or at < 0 or start + size > len(operand) or at + size > len(results[dst]):
                raise ValueError(f"ragged_all_to_all: rank {src}'s slice {i} (rows {start}:{start + size} of an "
                                 f"operand of {len(operand)}, written at {at}:{at + size} of an output of "
                                 f"{len(results[dst])} on rank {dst}) is out of bounds.")
            results[dst][at:at + size] = operand[start:start + size]
    for r in results:
        r.flags.writeable = False
    return results


_ragged_all_to_all.joint = True


def _ragged_vectorized(*xs):
    G, n = xs[0].shape[:2]
    out = np.empty_like(xs[1])
    for g in range(G):
        out[g] = _ragged_all_to_all([[x[g, r] for x in xs] for r in range(n)])
    return out


_define("ragged_all_to_all", check=_ragged_check, rule=_ragged_all_to_all, vectorized=_ragged_vectorized,
        joint=True)


# -- psend (and precv, its local half) --------------------------------------------------------------------

_define("psend", groups="none", check=_ppermute_check, rule=_ppermute, vectorized=_ppermute_vectorized)


# -- groups -----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=256)
def _check_groups_cached(groups: tuple, n: int, name: str, kind: str) -> tuple:
    if any(not g for g in groups):
        raise _empty_group_class()(
            f"{name}: axis_index_groups must cover all indices exactly once (in non-empty groups), got {groups}. Give "
            f"each axis index 0..{n - 1} in exactly one group (an empty group: JAX fails in XLA, JaxRuntimeError or "
            f"ValueError).")
    covered = sorted(i for g in groups for i in g)
    if covered != list(range(len(covered))):
        raise ValueError(f"{name}: axis_index_groups must cover all indices exactly once (in non-empty groups), "
                         f"got {groups}. Give each axis index 0..{n - 1} in exactly one group.")
    if len(covered) != n:
        raise ValueError(f"{name}: axis_index_groups cover {len(covered)} indices, but the axis has size {n} "
                         f"(JAX fails later, in XLA). List every axis index 0..{n - 1} once.")
    if kind == "even" and len({len(g) for g in groups}) > 1:
        raise ValueError(f"{name}: axis_index_groups must all have the same size, got sizes "
                         f"{[len(g) for g in groups]} (JAX fails to lower uneven groups for this collective).")
    return groups


class EmptyGroupError(ValueError, RuntimeError):
    """An empty group in ``axis_index_groups``. JAX 0.10 fails in XLA: a ValueError for some collectives
    (``all_gather``'s lowering), a ``JaxRuntimeError`` (a RuntimeError) for others (``psum``'s HLO verifier); this is
    both, and also ``jax.errors.JaxRuntimeError`` once JAX is imported (see :func:`_empty_group_class`)."""


@functools.lru_cache(maxsize=2)
def _with_jax_runtime_error(runtime: type) -> type:
    try:
        # BaseException's own methods: those of JAX's class (nanobind's) expect an error made by XLA
        return type("EmptyGroupError", (EmptyGroupError, runtime),
                    {"__module__": __name__, "__doc__": EmptyGroupError.__doc__, "__init__": BaseException.__init__,
                     "__str__": BaseException.__str__, "__repr__": BaseException.__repr__})
    except TypeError:  # a layout that cannot be combined
        return EmptyGroupError


def _empty_group_class() -> type:
    """:class:`EmptyGroupError`, also JAX's ``JaxRuntimeError`` when JAX is imported (never importing it here:
    the NumPy front end runs without JAX)."""
    import sys
    runtime = getattr(sys.modules.get("jax.errors"), "JaxRuntimeError", None)
    return EmptyGroupError if not isinstance(runtime, type) else _with_jax_runtime_error(runtime)


def check_groups(axis_index_groups, n: int, prim: Collective) -> tuple | None:
    """``axis_index_groups`` as a tuple of tuples of ints, validated for an axis of size ``n``."""
    if axis_index_groups is None:
        return None
    if prim.groups == "none":
        raise ValueError(f"{prim.name} does not take axis_index_groups.")
    try:
        groups = tuple(tuple(operator.index(i) for i in g) for g in axis_index_groups)
    except TypeError:
        raise TypeError(f"{prim.name}: axis_index_groups must be a list of lists of ints, got "
                        f"{axis_index_groups!r}.") from None
    return _check_groups_cached(groups, n, prim.name, prim.groups)


def own_group(groups: tuple | None, rank: int, n: int) -> tuple:
    """The group (its ranks, in rank order within the group) that ``rank`` belongs to."""
    if groups is None:
        return tuple(range(n))
    return next(g for g in groups if rank in g)


def apply_grouped(rule: Callable, member_blocks: Sequence[Sequence[np.ndarray]], groups: tuple | None,
                  params: dict, epilogue: Callable | None = None) -> list[list[np.ndarray]]:
    """Apply ``rule`` to every group, operand by operand. ``member_blocks[i]`` holds the operands of the member
    of index ``i`` in the communicator; without groups the whole communicator is one group. ``epilogue(result,
    group_size)``, if given, is applied once to every distinct result (so devices keep sharing it). Returns the
    results per member."""
    n, n_operands = len(member_blocks), len(member_blocks[0])
    if getattr(rule, "joint", False):  # one block of several operands per member, one result each
        out = [None] * n
        for group in groups if groups is not None else (range(n),):
            for i, result in zip(group, rule([member_blocks[i] for i in group], **params), strict=True):
                out[i] = [result]
        return out
    if groups is None:  # one group: the operands' columns, their results transposed back (no Python per block)
        columns = [rule(list(blocks), **params) for blocks in zip(*member_blocks)]
        if epilogue is not None:
            columns = [_once_each(epilogue, results, n) for results in columns]
        return [list(results) for results in zip(*columns, strict=True)]
    out: list[list] = [[None] * n_operands for _ in range(n)]
    for group in groups:
        for k in range(n_operands):
            results = rule([member_blocks[i][k] for i in group], **params)
            if epilogue is not None:
                results = _once_each(epilogue, results, len(group))
            for i, result in zip(group, results, strict=True):
                out[i][k] = result
    return out


def _once_each(epilogue: Callable, results: list, group_size: int) -> list:
    """``epilogue(result, group_size)`` of each result, computed once per distinct result object."""
    if len(set(map(id, results))) == 1:  # one result shared by the group (a reduction's): one epilogue
        return [epilogue(results[0], group_size)] * len(results)
    done: dict = {}
    return [done[id(r)] if id(r) in done else done.setdefault(id(r), epilogue(r, group_size)) for r in results]


# -- axis names -------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=512, typed=True)
def _split_hashable(axis_name) -> tuple[tuple, tuple]:
    names = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    return tuple(a for a in names if not isinstance(a, int)), tuple(a for a in names if isinstance(a, int))


def split_axis_names(axis_name) -> tuple[tuple, tuple]:
    """``(named axes, positional axes)`` of an axis-name argument (a name, or a tuple of names and, for
    reductions, ints: positional axes of the operand, as in ``jax.lax.psum``)."""
    try:
        return _split_hashable(axis_name)
    except TypeError:  # a list
        return _split_hashable(tuple(axis_name))


REDUCERS = {"psum": np.add, "pmax": np.maximum, "pmin": np.minimum}


def _reduce_positional(name: str, x: np.ndarray, positional: tuple, lead: int = 0) -> np.ndarray:
    axes = tuple(canonical_axis(a, x.ndim - lead, name, "axis") + lead for a in positional)
    ufunc = REDUCERS[name]
    return ufunc.reduce(x, axis=axes, dtype=x.dtype if ufunc is np.add else None)


# -- bind -------------------------------------------------------------------------------------------------

# Point-to-point collectives rank the devices of a tuple of axes in mesh order (outer axes major), whatever
# order the names are given in (XLA's lowering sorts the group by device); the others in the order given.
_MESH_ORDER = {"ppermute", "psend"}


def _in_mesh_order(named: tuple, batch, api: str) -> tuple:
    if batch is not None:
        return tuple(sorted(named, key=lambda n: batch.position(n, api)))
    lane = _runtime.current_lane()
    frames = list(lane.frames) if lane is not None else []
    resolved = resolve_axes(frames, named, api)
    return tuple(f.name for f in sorted(resolved, key=frames.index))


def bind(name: str, operands: Sequence[np.ndarray], *, api: str | None = None, site: str | Callable | None = None,
         epilogue: Callable | None = None, **params) -> list[np.ndarray]:
    """Apply collective primitive ``name`` to this device's ``operands`` (one rendezvous for all of them) and
    return this device's results, one per operand.

    Args:
      name: the JAX primitive's name (``"psum"``, ``"all_gather"``, ...; see ``PRIMITIVES``).
      operands: NumPy arrays, all under the same parameters. Under the vectorized executor each carries the
        leading device axis of the current :class:`Batch`.
      api: the public function the user called, for reports (``"pmean"`` binds ``"psum"``).
      site: the user's ``file:line`` (found on the stack when not given), or a function returning it (called
        only when needed: the vectorized executor needs it only for an error).
      epilogue: ``epilogue(result, group_size)`` applied once to each distinct result (pmean's division).
      **params: the primitive's parameters under JAX's names, e.g. ``axes`` and ``axis_index_groups`` for
        ``psum``, ``axis_name``, ``all_gather_dimension``, ``tiled`` for ``all_gather``.

    Raises:
      NameError: an axis name no enclosing map binds. ValueError, TypeError, IndexError: what JAX raises for
        the same call. CollectiveMismatchError / CollectiveDeadlockError: when the devices' calls cannot meet.
    """
    prim = PRIMITIVES[name]
    named, positional = split_axis_names(params[prim.axes_param])
    batch = _local.batch
    if positional:
        operands = [_reduce_positional(name, x, positional, 0 if batch is None else 1) for x in operands]
    if not named:
        return list(operands)
    if name in _MESH_ORDER and len(named) > 1:
        named = _in_mesh_order(named, batch, api or name)
    if batch is not None:
        return batch.collective(prim, named, operands, params, api or name, site, epilogue)
    lane = _runtime.current_lane()
    chan = lane.channels.get(named) if lane is not None else None
    if chan is None:
        chan = _runtime.channel(lane, named, api or name)
    avals = _avals(operands)
    try:
        key = (name, chan.names, chan.sizes, avals, tuple(params.items()), epilogue)
        bound = _bound.get(key)
    except TypeError:  # an unhashable parameter value (a list of groups)
        key = bound = None
    if bound is None:
        bound = _checked_call(prim, chan, avals, params, epilogue)
        if key is not None:
            if len(_bound) > 4096:
                _bound.clear()
            _bound[key] = bound
    if callable(site):
        site = site()
    return lane.world.rendezvous(lane, chan, bound[0], site or _runtime.user_site(2), api, operands, bound[1])


# (primitive, axis names and sizes, operand avals, parameters, epilogue) of a bind seen before -> its checked
# Signature and combine step (the rule with the group structure and checked parameters bound): the checks
# depend on nothing else.
_bound: dict = {}


def _avals(operands: Sequence[np.ndarray]) -> tuple:
    """The operands' ((shape, dtype), ...): what a collective's checks depend on."""
    if len(operands) == 1:
        return ((operands[0].shape, operands[0].dtype),)
    return tuple(zip(map(shape_of, operands), map(dtype_of, operands)))


def _checked_call(prim: Collective, chan, avals: tuple, params: dict, epilogue) -> tuple:
    """The checks of a collective over ``chan``'s axes on operands of ``avals``: its Signature and its combine
    step (the rule with the group structure and checked parameters bound)."""
    groups = check_groups(params.get("axis_index_groups"), chan.size, prim)
    rule_params = prim.check(avals, chan.size if groups is None else len(groups[0]), groups, **params)
    return (Signature(prim.name, chan.names, chan.sizes, (("axis_index_groups", groups), *sorted(rule_params.items())),
                      avals),
            functools.partial(apply_grouped, prim.rule, groups=groups, params=rule_params, epilogue=epilogue))


def prepare(name: str, params: dict, *, site: str | None = None, api: str | None = None,
            epilogue: Callable | None = None) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
    """``call(operands)``, the same as ``bind(name, operands, site=site, api=api, epilogue=epilogue, **params)``
    for arguments fixed in advance (a compiled jaxpr's collective equation, a ``spmdsim.lax`` call): what
    depends only on them (the axis names, the parameters) is worked out once, and on a lane each checked call is
    kept per axis sizes and operand avals. Anything else (positional axes, no names, several names of a
    point-to-point collective, unhashable parameters, the vectorized executor, a lane's first call over these
    names, outside any map) goes through :func:`bind`, with its checks and errors."""
    def generic(operands):
        return bind(name, operands, site=site, api=api, epilogue=epilogue, **params)

    prim = PRIMITIVES[name]
    named, positional = split_axis_names(params[prim.axes_param])
    try:
        hash(tuple(params.values()))
    except TypeError:
        return generic
    if positional or not named or (name in _MESH_ORDER and len(named) > 1):
        return generic
    checked: dict = {}  # (axis sizes, avals) -> (Signature, combine)
    local = _runtime.lane_local()

    def call(operands):
        lane = local.lane
        chan = lane.channels.get(named) if lane is not None and _local.batch is None else None
        if chan is None:
            return generic(operands)
        avals = _avals(operands)
        key = (chan.sizes, avals)
        bound = checked.get(key)
        if bound is None:
            if len(checked) > 64:
                checked.clear()
            bound = checked[key] = _checked_call(prim, chan, avals, params, epilogue)
        return lane.world.rendezvous(lane, chan, bound[0], site or _runtime.user_site(2), api, operands, bound[1])
    return call


class Token:
    """The value of a JAX token (``psend``'s result, ``lax.create_token()``): it orders effects, carries no
    data."""

    def __repr__(self) -> str:
        return "Token"


TOKEN = Token()


def _mailbox(names: tuple, api: str) -> dict:
    """This device's (or the vectorized batch's) mailbox for point-to-point transfers over ``names``."""
    batch = _local.batch
    if batch is not None:
        return batch.mailboxes.setdefault(names, {})
    return _runtime.channel(_runtime.current_lane(), names, api).mailbox


def psend(x: np.ndarray, axis_name, perm, *, site: str | None = None) -> Token:
    """``jax.lax.psend``: every device of the axis sends ``x`` along ``perm`` (a rendezvous, as ``ppermute``);
    what reaches a device waits in its mailbox for the matching :func:`precv`. Returns a token."""
    names = split_axis_names(axis_name)[0]
    received = bind("psend", [x], axis_name=names, perm=perm, site=site)[0]
    _mailbox(names, "psend").setdefault(_perm_key(perm), []).append(received)
    return TOKEN


def precv(shape: tuple, dtype, axis_name, perm) -> np.ndarray:
    """``jax.lax.precv``: what the matching :func:`psend` (same axes and ``perm``, in order) delivered to this
    device (zeros where it is no destination). ValueError when no psend delivered anything, or a different
    shape or dtype than asked for."""
    names = split_axis_names(axis_name)[0]
    waiting = _mailbox(names, "precv").get(_perm_key(perm))
    if not waiting:
        raise ValueError(f"precv over {names} with perm {tuple(map(tuple, perm))}: no psend with that perm came "
                         f"before it on this device. Call lax.psend(x, axis_name, perm) first.")
    value = waiting.pop(0)
    batch = _local.batch
    block = value.shape[1:] if batch is not None else value.shape
    if tuple(block) != tuple(shape) or value.dtype != np.dtype(dtype):
        raise ValueError(f"precv asked for {np.dtype(dtype)}{list(shape)}, but the matching psend sent "
                         f"{value.dtype}{list(block)}.")
    return value


def _perm_key(perm) -> tuple:
    return tuple((int(s), int(d)) for s, d in perm)


def axis_index(axis_name, api: str = "axis_index"):
    """This device's index along ``axis_name`` (row-major over a tuple of names, in the order given) as an
    int32 array: a scalar on a lane, one entry per device under the vectorized executor."""
    names = split_axis_names(axis_name)[0]
    batch = _local.batch
    if batch is not None:
        return batch.axis_index(names, api)
    return np.asarray(_runtime.channel(_runtime.current_lane(), names, api).rank, dtype=np.int32)


def axis_size(axis_name, api: str = "axis_size") -> int:
    """The size of ``axis_name`` (the product over a tuple of names) as a Python int."""
    names = split_axis_names(axis_name)[0]
    batch = _local.batch
    if batch is not None:
        return math.prod(batch.sizes[batch.position(n, api)] for n in names)
    return _runtime.channel(_runtime.current_lane(), names, api).size


# -- the vectorized executor's devices --------------------------------------------------------------------

class _Local(threading.local):
    # The vectorized executor's Batch being evaluated in this thread; a class default: no exception to catch
    # when unset.
    batch = None


_local = _Local()
