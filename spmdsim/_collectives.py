"""The collective rules: what each device of one group receives, given every device's block.

This module is the specification. Each rule is pure NumPy (no threads, no axis names) with the shape
``rule(blocks, **params) -> results``: ``blocks[r]`` is the block of the device of rank ``r`` in its group
(the position in the listed ``axis_index_groups`` group, or the axis index without groups), and
``results[r]`` is what that device receives. Rule names and parameter names are those of JAX's primitives
(``psum``, ``all_gather`` with ``all_gather_dimension``, ``reduce_scatter`` with ``scatter_dimension``, ...)
so a jaxpr equation's parameters flow straight in. Compare JAX's reference semantics for collectives in
the shard_map docs (``collective_ref(i, blocks)``).

Conventions shared by all rules:

- dtypes are preserved exactly (``functools.reduce(np.add, ...)``, never ``np.sum``, which widens int32);
  the public wrappers in :mod:`spmdsim.lax` do JAX's conversions (bool -> int32 for psum) before the rule.
- Reductions fold in rank order, left to right: ``((b0 + b1) + b2) + ...``. XLA:CPU folds the same way,
  so float results agree with it bit for bit. :func:`set_reduction_order` selects other orders (pairwise
  tree, NCCL-style ring) and an accumulation dtype, to measure a program's sensitivity to the order.
- Results are fresh arrays, marked read-only, and shared between the devices that receive the same value
  (JAX arrays are immutable, so no program can tell).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["COLLECTIVE_RULES", "collective_rule", "apply_grouped", "ReductionOrder", "set_reduction_order",
           "current_reduction_order"]

Rule = Callable[..., list]
COLLECTIVE_RULES: dict[str, Rule] = {}


def collective_rule(name: str):
    def register(rule: Rule) -> Rule:
        assert name not in COLLECTIVE_RULES, f"duplicate collective rule {name!r}"
        COLLECTIVE_RULES[name] = rule
        return rule
    return register


def _frozen(a) -> np.ndarray:
    a = np.asarray(a)
    a.flags.writeable = False
    return a


def _fresh(a: np.ndarray, block: np.ndarray) -> np.ndarray:
    """``a`` as a read-only array that shares no memory with ``block`` (a device's own, mutable array)."""
    if np.shares_memory(a, block):
        a = a.copy()
    return _frozen(a)


# -- reduction orders --------------------------------------------------------------------------------------

REDUCTION_ORDERS = ("sequential", "pairwise", "ring")


@dataclasses.dataclass(frozen=True)
class ReductionOrder:
    """How sums over a group are folded. ``order``:

    - ``"sequential"`` (default): ``((b0 + b1) + b2) + ...`` in rank order: bit-exact with XLA:CPU.
    - ``"pairwise"``: a balanced tree, ``(b0 + b1) + (b2 + b3)``, odd leftovers carried up (tree all-reduce).
    - ``"ring"``: the flattened block is cut into n chunks (``np.array_split``); chunk c is folded starting at
      rank ``(c + 1) % n`` and going round the ring, ending at rank c, as in NCCL's ring reduce-scatter.

    ``accumulation_dtype`` (e.g. ``np.float32`` for bfloat16 operands) casts the blocks before folding and
    the sum back after it. Max and min are exact in any order and ignore this setting.
    """

    order: str = "sequential"
    accumulation_dtype: Any = None

    def fold(self, ufunc: np.ufunc, blocks: Sequence[np.ndarray]) -> np.ndarray:
        dtype = blocks[0].dtype
        if self.accumulation_dtype is not None and ufunc is np.add:
            blocks = [b.astype(self.accumulation_dtype) for b in blocks]
        if ufunc is not np.add or self.order == "sequential" or len(blocks) < 3:
            out = np.asarray(ufunc(blocks[0], blocks[1]))  # then in place: the same left-to-right fold
            for b in blocks[2:]:
                ufunc(out, b, out=out)
        elif self.order == "pairwise":
            level = list(blocks)
            while len(level) > 1:
                level = [ufunc(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                         for i in range(0, len(level), 2)]
            out = level[0]
        else:
            n = len(blocks)
            flat = [np.ravel(b) for b in blocks]
            bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.empty(flat[0].size), n)])
            out = np.empty_like(flat[0])
            for c in range(n):
                lo, hi = bounds[c], bounds[c + 1]
                out[lo:hi] = functools.reduce(ufunc, [flat[(c + 1 + k) % n][lo:hi] for k in range(n)])
            out = out.reshape(blocks[0].shape)
        return np.asarray(out).astype(dtype, copy=False)


_reduction_order = ReductionOrder()


def current_reduction_order() -> ReductionOrder:
    return _reduction_order


class set_reduction_order:
    """Choose how sums are folded (see :class:`ReductionOrder`); a statement, or a context manager that
    restores the previous setting.

    >>> import numpy as np, spmdsim
    >>> with spmdsim.set_reduction_order("pairwise", accumulation_dtype=np.float32):
    ...     spmdsim.current_reduction_order().order
    'pairwise'
    """

    def __init__(self, order: str = "sequential", *, accumulation_dtype=None):
        global _reduction_order
        if order not in REDUCTION_ORDERS:
            raise ValueError(f"reduction order must be one of {REDUCTION_ORDERS}, got {order!r}.")
        self.previous = _reduction_order
        _reduction_order = ReductionOrder(order, None if accumulation_dtype is None else np.dtype(accumulation_dtype))

    def __enter__(self) -> "set_reduction_order":
        return self

    def __exit__(self, *exc) -> None:
        global _reduction_order
        _reduction_order = self.previous


def _fold(ufunc: np.ufunc, blocks: Sequence[np.ndarray]) -> np.ndarray:
    if len(blocks) == 1:
        return _frozen(np.array(blocks[0]))
    with np.errstate(over="ignore", invalid="ignore"):  # int8 wraps, inf - inf: exactly what XLA does
        return _frozen(_reduction_order.fold(ufunc, blocks))


def _replicate(value: np.ndarray, n: int) -> list[np.ndarray]:
    return [value] * n


@collective_rule("psum")
def psum(blocks):
    """Every device receives ``b0 + b1 + ... + b_{n-1}`` (folded in rank order)."""
    return _replicate(_fold(np.add, blocks), len(blocks))


@collective_rule("pmax")
def pmax(blocks):
    """Every device receives the elementwise maximum (NaN propagates, as in XLA)."""
    return _replicate(_fold(np.maximum, blocks), len(blocks))


@collective_rule("pmin")
def pmin(blocks):
    """Every device receives the elementwise minimum (NaN propagates, as in XLA)."""
    return _replicate(_fold(np.minimum, blocks), len(blocks))


@collective_rule("all_gather")
def all_gather(blocks, *, all_gather_dimension: int, tiled: bool):
    """Every device receives all blocks in rank order: stacked on a new axis ``all_gather_dimension``
    (non-negative, in the result's rank), or concatenated along it when ``tiled``."""
    join = np.concatenate if tiled else np.stack
    return _replicate(_frozen(join(blocks, axis=all_gather_dimension)), len(blocks))


@collective_rule("reduce_scatter")
def reduce_scatter(blocks, *, scatter_dimension: int, tiled: bool):
    """``S = b0 + ... + b_{n-1}``; rank r receives ``S``'s r-th slice along ``scatter_dimension``:
    the index r (the dimension is removed, its size must be n) or, when ``tiled``, the r-th of n equal
    chunks (the dimension shrinks n-fold)."""
    n = len(blocks)
    total = _fold(np.add, blocks)
    if tiled:
        return [_fresh(c, blocks[0]) for c in np.split(total, n, axis=scatter_dimension)]
    return [_frozen(np.take(total, r, axis=scatter_dimension)) for r in range(n)]


@collective_rule("all_to_all")
def all_to_all(blocks, *, split_axis: int, concat_axis: int, tiled: bool):
    """Rank r receives, from every rank k in order, chunk r of ``b_k`` split n ways along ``split_axis``,
    joined along ``concat_axis``: stacked on a new axis (non-tiled; ``split_axis`` is removed and must have
    size n, ``concat_axis`` indexes the result) or concatenated (tiled)."""
    n = len(blocks)
    if tiled:
        chunks = [np.split(b, n, axis=split_axis) for b in blocks]
        return [_frozen(np.concatenate([c[r] for c in chunks], axis=concat_axis)) for r in range(n)]
    return [_frozen(np.stack([np.take(b, r, axis=split_axis) for b in blocks], axis=concat_axis))
            for r in range(n)]


@collective_rule("ppermute")
def ppermute(blocks, *, perm: Sequence[tuple[int, int]]):
    """For each ``(src, dst)`` pair, device ``dst`` receives ``b_src``; devices that receive nothing get
    zeros (False for bool). ``perm`` is validated by the caller (unique sources and destinations)."""
    zeros = _frozen(np.zeros_like(blocks[0]))
    out = [zeros] * len(blocks)
    for src, dst in perm:
        out[dst] = _fresh(blocks[src], blocks[src])
    return out


@collective_rule("pbroadcast")
def pbroadcast(blocks, *, source: int):
    """Every device receives ``b_source``."""
    return _replicate(_fresh(blocks[source], blocks[source]), len(blocks))


def apply_grouped(name: str, member_blocks: Sequence[Sequence[np.ndarray]],
                  axis_index_groups: Sequence[Sequence[int]] | None = None, **params) -> list[list[np.ndarray]]:
    """Apply rule ``name`` to every group, leaf by leaf.

    ``member_blocks[i]`` holds the operand leaves of the device with axis index ``i``. Without groups the
    whole axis is one group whose ranks are the axis indices; with groups, rank = position in its group.
    Returns the result leaves per axis index.
    """
    rule = COLLECTIVE_RULES[name]
    n = len(member_blocks)
    n_leaves = len(member_blocks[0])
    if axis_index_groups is None and n_leaves == 1:  # the usual call: one array, one group
        return [[result] for result in rule([blocks[0] for blocks in member_blocks], **params)]
    groups = axis_index_groups if axis_index_groups is not None else (tuple(range(n)),)
    out: list[list] = [[None] * n_leaves for _ in range(n)]
    for group in groups:
        for leaf in range(n_leaves):
            results = rule([member_blocks[i][leaf] for i in group], **params)
            for i, result in zip(group, results):
                out[i][leaf] = result
    return out
