"""How sums over a group are folded: the order (XLA:CPU's by default) and the accumulation dtype.

XLA:CPU folds an all-reduce left to right in rank order, ``((b0 + b1) + b2) + ...``, so spmdsim does too and
float results agree with it bit for bit. bfloat16 sums are accumulated in float32 and rounded once at the end,
as XLA:CPU does (float16 sums round after every addition, also as XLA:CPU does). :func:`set_reduction_order`
selects other orders (a pairwise tree, an NCCL-style ring) and accumulation dtypes, to measure a program's
sensitivity to the all-reduce algorithm of a real machine.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np

from spmdsim.runtime import _blas, _buffers, _threads
from spmdsim.runtime._values import error_state_switch

try:  # bfloat16 comes with jax (ml_dtypes); without it there are no bfloat16 arrays to sum
    import ml_dtypes
    _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - the jax-free installation
    _BFLOAT16 = None

__all__ = ["ReductionOrder", "set_reduction_order", "current_reduction_order", "fold", "fold_stacked"]

REDUCTION_ORDERS = ("sequential", "pairwise", "ring")


@dataclasses.dataclass(frozen=True)
class ReductionOrder:
    """How sums over a group are folded. ``order``:

    - ``"sequential"`` (default): ``((b0 + b1) + b2) + ...`` in rank order: bit-exact with XLA:CPU.
    - ``"pairwise"``: a balanced tree, ``(b0 + b1) + (b2 + b3)``, odd leftovers carried up (tree all-reduce).
    - ``"ring"``: each block is cut into n chunks (``np.array_split`` of the flattened block); chunk c is folded
      starting at rank ``(c + 1) % n`` and going round the ring, ending at rank c, as in NCCL's ring
      reduce-scatter.

    ``accumulation_dtype`` (e.g. ``np.float64``) casts the blocks before folding and the sum back after it;
    None (the default) accumulates bfloat16 in float32, as XLA:CPU does, and every other dtype in itself. Max
    and min are exact in any order and ignore this setting.
    """

    order: str = "sequential"
    accumulation_dtype: Any = None

    def accumulation(self, ufunc: np.ufunc, dtype: np.dtype) -> np.dtype | None:
        """The dtype ``ufunc``'s blocks of ``dtype`` are folded in, or None for ``dtype`` itself: sums are
        accumulated in ``accumulation_dtype``, by default bfloat16 in float32; max and min in their own dtype."""
        if ufunc is not np.add:
            return None
        return self.accumulation_dtype or (np.dtype(np.float32) if dtype == _BFLOAT16 else None)

    def fold(self, ufunc: np.ufunc, blocks: Sequence[np.ndarray], lead: int = 0) -> np.ndarray:
        """Fold ``blocks`` (all of one shape and dtype) with ``ufunc``; the first ``lead`` axes of each block
        are independent groups folded side by side (the vectorized executor's batches)."""
        dtype = blocks[0].dtype
        acc = self.accumulation(ufunc, dtype)
        if acc is not None:
            blocks = [b.astype(acc) for b in blocks]
        if ufunc is np.add and blocks[0].ndim == 0 and blocks[0].dtype.kind in "iuf" and \
                blocks[0].dtype.isbuiltin == 1 and (self.order == "sequential" or len(blocks) < 3):
            # Real scalars (a loss): NumPy's scalar arithmetic, the same IEEE additions in the same order and dtype
            # (integers wrap alike), ~0.8 against ~6.7 µs for 8 blocks through the 0-d array path. (Not complex:
            # complex128 scalars make NaNs of another sign.)
            total = blocks[0][()]
            for b in blocks[1:]:
                total = total + b[()]
            out = np.asarray(total)
        elif ufunc is not np.add or self.order == "sequential" or len(blocks) < 3:
            out = _left_to_right(ufunc, blocks)
        elif self.order == "pairwise":
            level = list(blocks)
            while len(level) > 1:
                level = [ufunc(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                         for i in range(0, len(level), 2)]
            out = level[0]
        else:
            n = len(blocks)
            shape = blocks[0].shape
            flat = [b.reshape(*shape[:lead], -1) for b in blocks]
            size = flat[0].shape[-1]
            bounds = np.cumsum([0] + [len(c) for c in np.array_split(np.empty(size), n)])
            out = np.empty_like(flat[0])
            for c in range(n):
                lo, hi = bounds[c], bounds[c + 1]
                out[..., lo:hi] = functools.reduce(ufunc, [flat[(c + 1 + k) % n][..., lo:hi] for k in range(n)])
            out = out.reshape(shape)
        return np.asarray(out).astype(dtype, copy=False)


_FOLD_CHUNK = 1 << 15  # elements of every block folded together: the partial result stays in cache
_FOLD_LARGE = 1 << 20  # blocks this large are folded chunk by chunk, the chunks spread over the CPUs


def _left_to_right(ufunc: np.ufunc, blocks: Sequence[np.ndarray]) -> np.ndarray:
    """``ufunc(ufunc(b0, b1), b2) ...``. Large C-contiguous blocks of one shape are folded ``_FOLD_CHUNK``
    elements at a time (every block's chunk into the result's chunk while it is in cache), the chunks split over
    the CPUs (:func:`spmdsim.runtime._threads.in_parallel`): the same operations on every element, in the same order,
    where a whole-array fold reads the partial result back from memory for every block."""
    first = blocks[0]
    if first.size < _FOLD_LARGE or len(blocks) < 3 or \
            not all(b.flags.c_contiguous and b.shape == first.shape for b in blocks):
        out = np.asarray(ufunc(blocks[0], blocks[1]))  # then in place: the same left-to-right fold
        for b in blocks[2:]:
            ufunc(out, b, out=out)
        return out
    flat = [b.reshape(-1) for b in blocks]
    out = _buffers.empty(first.shape, ufunc(flat[0][:1], flat[1][:1]).dtype, faulted=True)
    result = out.reshape(-1)

    def work(lo: int, hi: int) -> None:
        for start in range(lo * _FOLD_CHUNK, min(hi * _FOLD_CHUNK, first.size), _FOLD_CHUNK):
            chunk = result[start:start + _FOLD_CHUNK]
            ufunc(flat[0][start:start + _FOLD_CHUNK], flat[1][start:start + _FOLD_CHUNK], out=chunk)
            for b in flat[2:]:
                ufunc(chunk, b[start:start + _FOLD_CHUNK], out=chunk)
    _threads.in_parallel(work, -(-first.size // _FOLD_CHUNK), cpus=_blas.cpus())
    return out


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


def fold(ufunc: np.ufunc, blocks: Sequence[np.ndarray], lead: int = 0) -> np.ndarray:
    """The fold of ``blocks`` in the current reduction order, as a fresh read-only array. One block is copied
    (a group of one still gets its own result). Integer overflow wraps and ``inf - inf`` is NaN, silently,
    exactly as in XLA."""
    if len(blocks) == 1:
        out = np.array(blocks[0])
    else:
        errors = _quiet_sums()
        try:
            out = _reduction_order.fold(ufunc, blocks, lead)
        finally:
            _loud_again(errors)
    out.flags.writeable = False
    return out


_quiet_sums, _loud_again = error_state_switch(over="ignore", invalid="ignore")


def fold_stacked(ufunc: np.ufunc, x: np.ndarray) -> np.ndarray:
    """:func:`fold` of the blocks ``x[:, 0], x[:, 1], ...`` of ``x`` (shape ``(G, n, *block)``: G groups of n
    blocks, folded side by side), shape ``(G, *block)``. For small blocks in the sequential order one
    ``ufunc.accumulate`` along the block axis does the fold (each step ``ufunc(previous, next)``, in ``x``'s
    dtype: the same operations in the same order and precision as the fold of the list, without a Python call
    per block); NumPy runs it element by element, so large blocks are folded as a list."""
    order = _reduction_order
    if order.order != "sequential" or x.shape[1] < 2 or x[:, 0].size > ACCUMULATE_MAX_ELEMENTS:
        return fold(ufunc, [x[:, r] for r in range(x.shape[1])], lead=1)
    dtype = x.dtype
    acc = order.accumulation(ufunc, dtype)
    if acc is not None:
        x = x.astype(acc)
    if x.dtype.kind in "biu":  # integers wrap silently: no floating-point state to set
        out = ufunc.accumulate(x, axis=1, dtype=x.dtype)
    else:
        errors = _quiet_sums()
        try:
            out = ufunc.accumulate(x, axis=1, dtype=x.dtype)
        finally:
            _loud_again(errors)
    out = out[:, -1].astype(dtype)  # a copy: the partial sums are not kept alive
    out.flags.writeable = False
    return out


# Up to this many elements per rank (every group's block together) fold_stacked accumulates; above it the list
# fold is faster (at 8 ranks: 4 elements 1.5 against 6.5 µs, 64: 3.8 against 6.7, 1024: 39 against 7.4).
ACCUMULATE_MAX_ELEMENTS = 64
