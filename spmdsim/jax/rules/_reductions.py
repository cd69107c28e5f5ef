"""NumPy rules for JAX's reductions in XLA:CPU's order of additions (``reduce_sum``, ``reduce_max``, ``argmax``,
cumulative sums, the generic ``reduce`` with a reducer jaxpr), and sorting (``sort``, ``top_k``,
``approx_top_k``); and how a large vectorized rule is spread over the CPUs (:func:`by_devices`). The conventions every rule keeps are :mod:`._elementwise`'s.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Iterator, NamedTuple

import numpy as np

from spmdsim.runtime import _blas, _threads
from spmdsim.jax.evaluation import _dtypes
from spmdsim.jax.numerics import _xla_cpu_isa
from spmdsim.jax.evaluation._registry import PER_DEVICE, per_device, vectorized
from spmdsim.jax.rules._elementwise import LOW_FLOATS, both, expand_to, is_float, shift
from spmdsim.jax.rules._arithmetic import _float_max, _float_min, _ordered_key


# -- reductions ------------------------------------------------------------------------------------------

def _canonical(x: np.ndarray, axes) -> np.ndarray:
    """x with the reduced axes moved last and merged: ``(kept..., R)``, contiguous. Reducing its last axis
    sums every output element in the same order whatever the leading (device) axes are."""
    axes = tuple(sorted(int(a) for a in axes))
    first = x.ndim - len(axes)
    if axes == tuple(range(first, x.ndim)) and x.flags.c_contiguous:  # already so: a reshape, no copy
        return x.reshape((*x.shape[:first], math.prod(x.shape[first:])))
    kept = [d for d in range(x.ndim) if d not in axes]
    shape = (*(x.shape[d] for d in kept), math.prod(x.shape[d] for d in axes))
    consecutive = axes and axes == tuple(range(axes[0], axes[0] + len(axes)))
    if consecutive and x.flags.c_contiguous and x.size >= _TILED_ELEMENTS:
        # consecutive axes (a sum over a batch's leading axes): (before, R, after) -> (before, after, R) by tiles
        before, after = math.prod(x.shape[:axes[0]]), math.prod(x.shape[axes[-1] + 1:])
        if after >= _TILE:
            return _transposed(x.reshape(before, shape[-1], after)).reshape(shape)
    moved = np.transpose(x, kept + list(axes))
    return np.asarray(moved, order="C").reshape(shape)


_TILED_ELEMENTS, _TILE = 1 << 16, 64


def _transposed(x: np.ndarray) -> np.ndarray:
    """``x.transpose(0, 2, 1)`` copied tile by tile (64 x 64 elements of each matrix, some matrices at a time):
    NumPy's own copy reads one of the two across pages, 3-6x slower on large matrices. The same values."""
    batch, rows, columns = x.shape
    out = np.empty((batch, columns, rows), x.dtype)
    group = max(1, (1 << 18) // (_TILE * _TILE * x.itemsize))
    for b in range(0, batch, group):
        for r in range(0, rows, _TILE):
            for c in range(0, columns, _TILE):
                out[b:b + group, c:c + _TILE, r:r + _TILE] = x[b:b + group, r:r + _TILE, c:c + _TILE].transpose(0, 2, 1)
    return out


_TREE_WINDOW = 32  # XLA:CPU's TreeReductionRewriter window
SPLIT_ELEMENTS = 1 << 20  # a vectorized rule over this many elements runs on every CPU (by_devices, _compiled._split)


def splits(shape: tuple) -> bool:
    """Whether a vectorized result of ``shape`` (the device axis first) is cut into one part of the devices per
    CPU: at least ``SPLIT_ELEMENTS`` elements, over two devices or more."""
    return len(shape) >= 2 and shape[0] >= 2 and math.prod(shape) >= SPLIT_ELEMENTS


def by_devices(fn: Callable, *stacked: np.ndarray) -> np.ndarray:
    """``fn(*stacked)`` for operands stacked on a device axis of one length, where each device's result depends
    on its own blocks alone (a reduction, a window's pooling or its gradient): from ``SPLIT_ELEMENTS`` elements
    on, one part of the devices per CPU (:func:`spmdsim.runtime._threads.in_parallel`: NumPy releases the GIL in its
    loops), the parts' results joined along the device axis. The same values."""
    n = stacked[0].shape[0] if stacked[0].ndim else 0
    if n < 2 or sum(x.size for x in stacked) < SPLIT_ELEMENTS or any(x.ndim == 0 or x.shape[0] != n
                                                                      for x in stacked):
        return fn(*stacked)
    parts: dict = {}

    def part(lo: int, hi: int) -> None:
        parts[lo] = fn(*(x[lo:hi] for x in stacked))
    _threads.in_parallel(part, n, cpus=_blas.cpus())
    return np.concatenate([parts[lo] for lo in sorted(parts)])


def _tree_levels(dims: list) -> Iterator[tuple[list, list]]:
    """XLA's TreeReductionRewriter over reduced dimensions of sizes ``dims``: ``(windows, counts)`` of each level
    (windows of ``min(n, 32)`` along every reduced dimension of ``n``, ``counts`` windows along it) while one has
    more than 32 elements (``xla/service/tree_reduction_rewriter.cc``)."""
    while any(n > _TREE_WINDOW for n in dims):
        windows = [min(n, _TREE_WINDOW) for n in dims]
        dims = [-(-n // w) for n, w in zip(dims, windows)]
        yield windows, dims


def _outer_lanes(rows: int, cols: int, dtype, table: str = "avx512") -> int:
    """How many lanes LLVM's vectorizer gives the loop nest of a float32 or float64 sum over a ``(rows, cols)``
    block, its last two dimensions (both at most 32: no TreeReductionRewriter windows), in XLA:CPU's code
    (jaxlib 0.10.2): XLA emits the adds with ``reassoc``, the inner loop over a row is unrolled and the loop over
    rows vectorised, each lane summing the rows ``i`` with ``i % lanes == lane`` in order, a row's elements in
    order (:func:`_lanes_fold`). 1: no vectorisation (the sequential fold). ``table`` (:func:`_lane_table`):
    ``"avx512"`` as measured on AMD Zen 4 for every ``rows`` 2-32 and ``cols`` 2-16 (9 or more columns: not
    vectorised); ``"zen3"`` as measured on AMD Zen 3 (AVX2) for every ``rows`` and ``cols`` 2-32."""
    if cols < 2 or rows < 2:
        return 1
    if table == "zen3":
        if np.dtype(dtype) == np.float64:
            return rows if rows in (2, 4) else 4 if rows in (8, 12) or rows >= 16 else 1
        if rows in (2, 4, 8):
            return rows
        if rows < 16:
            return 1
        return 8 if cols == 8 or rows % 8 < 4 else 4
    if cols > 8:
        return 1
    if rows == 2:
        return 2
    if np.dtype(dtype) == np.float64:  # float32's widths halved, and 12 rows vectorised too
        return (2 if cols >= 7 else 4) if rows in (4, 8, 12) or rows >= 16 else 1
    if rows == 4:
        return 4
    if rows < 8 or 9 <= rows <= 15:
        return 1
    if cols >= 7 or 20 <= rows <= 23 or 28 <= rows <= 31 and cols > 2:
        return 4
    return 8


def _lane_table() -> str | None:
    """Which of :func:`_outer_lanes`'s measurements applies to this machine's XLA:CPU: ``"avx512"`` where the ISA
    (or its cap) has AVX-512 (measured on AMD Zen 4), ``"zen3"`` on an AMD Zen 3 (``_xla_cpu_isa.cpu_model``:
    AVX2), None elsewhere (another CPU's vectorisation, e.g. Zen 4 under the AVX2 cap: not measured; the
    sequential fold)."""
    isa = _xla_cpu_isa.current()
    if isa.avx512:
        return "avx512"
    return "zen3" if _xla_cpu_isa.cpu_model() == "amd-zen3" else None


def _lanes_fold(v: np.ndarray, lanes: int) -> np.ndarray:
    """``v`` ``(rows, cols, columns)`` summed over its first two axes as :func:`_outer_lanes`'s vectorised loop
    does: ``lanes`` accumulators from 0, each adding its rows' elements in order, halved pairwise (``acc[:h] +
    acc[h:]``) down to one, then the rows left over (``rows % lanes``) added in order."""
    rows, cols, columns = v.shape
    whole = rows // lanes * lanes
    steps = v[:whole].reshape(whole // lanes, lanes, cols, columns).transpose(0, 2, 1, 3)
    acc = np.add.accumulate(steps.reshape(-1, lanes, columns), axis=0)[-1] + v.dtype.type(0)
    while len(acc) > 1:
        acc = acc[:len(acc) // 2] + acc[len(acc) // 2:]
    total = acc[0]
    for i in range(whole, rows):
        for j in range(cols):
            total = total + v[i, j]
    return total


def _trailing_pair(shape: tuple, axes) -> bool:
    """Whether the reduced ``axes`` of ``shape``, size-1 dimensions dropped (XLA drops them), are its last two."""
    dims = [d in axes for d, n in enumerate(shape) if n != 1]
    return dims[-2:] == [True, True] and sum(dims) == 2


def _low_precision_fold(x: np.ndarray, axes, ufunc, lanes: str | None = None,
                        plan: "_FoldPlan | None" = None) -> np.ndarray:
    """A float16/bfloat16 sum or product as XLA:CPU computes the ``reduce`` (measured bit for bit on every
    single-axis shape tried): in the operand's dtype, rounded after every step, from the identity, in XLA's
    tree order. Where a reduced dimension has more than 32 elements, XLA's TreeReductionRewriter first reduces
    windows of ``min(n, 32)`` elements along each reduced dimension of ``n`` (SAME padding with the identity, so
    the windows at the ends are shorter), then reduces the windows' results the same way, until no reduced
    dimension has more than 32 (``xla/service/tree_reduction_rewriter.cc``); the rest is folded in row-major
    order. The shapes of each step are worked out once per operand shape (:func:`_fold_plan`): a loop's sum of a
    few hundred elements costs a few NumPy calls. ``plan``: that plan, where the caller has it."""
    dtype = x.dtype
    if plan is None:
        plan = _fold_plan(x.shape, tuple(sorted(int(a) for a in axes)), dtype, ufunc, lanes)
    if plan is None:  # nothing reduced: XLA's reduce is the operand
        return x
    work = np.dtype(np.float32) if dtype in LOW_FLOATS else dtype  # float32/float64 sums: in their own dtype
    identity = work.type(1 if ufunc is np.multiply else 0)

    def fold(rows: np.ndarray) -> np.ndarray:  # (groups, R, columns) -> (groups, columns)
        if work == dtype and rows.shape[1]:
            # in the dtype itself: NumPy's accumulate adds in order too, from the first element rather than the
            # identity; the partial sums are the same numbers (the identity changes at most the sign of a zero,
            # and XLA's sum, started from +0, is never -0: adding +0 at the end restores it). One call, not R.
            last = ufunc.accumulate(rows, axis=1)[:, -1]
            return last + identity if ufunc is np.add else last
        acc = np.full((rows.shape[0], rows.shape[2]), identity, work)
        for j in range(rows.shape[1]):
            acc = ufunc(acc, rows[:, j]) if work == dtype else ufunc(acc, rows[:, j]).astype(dtype).astype(work)
        return acc

    v = (x.transpose(plan.order) if plan.order else x).astype(work, copy=False).reshape(plan.start)
    for padded, where, split, order, grouped, after in plan.levels:
        if padded is not None:  # SAME padding with the identity
            full = np.full(padded, identity, work)
            full[where] = v
            v = full
        v = fold(v.reshape(split).transpose(order).reshape(grouped)).reshape(after)
    if plan.lanes > 1:
        return _lanes_fold(v.reshape(plan.final), plan.lanes).reshape(plan.kept)
    return fold(v.reshape(plan.last)).astype(dtype, copy=False).reshape(plan.kept)


class _FoldPlan(NamedTuple):
    """:func:`_low_precision_fold`'s steps for one operand shape: ``order`` (reduced axes first; () when they
    already are), ``start`` (the reduced dimensions, then the kept ones merged), per tree level ``(padded shape or
    None, where the operand goes in it, the windows split out, their order, (groups, window, columns), the
    level's result shape)``, the shape of the final fold (``last``) or, where LLVM vectorises it, its lanes and
    ``final`` shape, and the result's shape (``kept``). ``steps``: the NumPy steps of a sequential fold."""
    order: tuple
    start: tuple
    levels: tuple
    last: tuple
    lanes: int
    final: tuple
    kept: tuple
    steps: int


@functools.lru_cache(maxsize=1024)
def _fold_plan(shape: tuple, axes: tuple, dtype: np.dtype, ufunc, lanes: str | None) -> _FoldPlan | None:
    if not axes:
        return None
    ndim, k = len(shape), len(axes)
    kept = [d for d in range(ndim) if d not in axes]
    kept_shape = tuple(shape[d] for d in kept)
    columns = math.prod(kept_shape)
    order = tuple(axes) + tuple(kept)
    dims, levels, steps = [shape[a] for a in axes], [], 0
    for windows, counts in _tree_levels(dims):
        steps += math.prod(windows)
        pads = [((c * w - n) // 2, c * w - n - (c * w - n) // 2) for c, w, n in zip(counts, windows, dims)]
        padded = (*(c * w for c, w in zip(counts, windows)), columns) if any(lo or hi for lo, hi in pads) else None
        where = (*(slice(lo, lo + n) for (lo, _), n in zip(pads, dims)), slice(None))
        split = (*(d for c, w in zip(counts, windows) for d in (c, w)), columns)
        levels.append((padded, where, split, (*range(0, 2 * k, 2), *range(1, 2 * k, 2), 2 * k),
                       (math.prod(counts), math.prod(windows), columns), (*counts, columns)))
        dims = counts
    steps += math.prod(dims)
    final = tuple(n for n in dims if n != 1)
    ways = 1
    if lanes and dtype in (np.float32, np.float64) and columns and len(final) == 2 and _trailing_pair(shape, axes):
        ways = _outer_lanes(*final, dtype, lanes)
    return _FoldPlan(order=() if order == tuple(range(ndim)) else order, start=(*(shape[a] for a in axes), columns),
                     levels=tuple(levels), last=(1, -1, columns) if columns else (1, 0, 0), lanes=ways,
                     final=(*final, columns), kept=kept_shape, steps=steps)


# -- float32/float64 sums in XLA:CPU's order (jaxlib 0.10.2) ---------------------------------------------------
# XLA:CPU runs a float32 reduce with an add reducer in one of two ways (measured with jax 0.10.2 on an AMD EPYC
# Zen 4 by FPRev probes -- one element M, one -M, ones elsewhere: the result counts the elements outside the
# smallest subtree holding both -- and checked on random data; the choice mirrors
# xla/backends/cpu/ynn_support.cc's IsReduceOpOffloadedToYnn):
#   * an operand of at least _YNN_ELEMENTS elements goes to YNNPACK (a "__ynn_fusion"), whose order is
#     _ynn_rows (reduced axes innermost: its k1 kernel) or _ynn_columns (reduced axes outermost: its kn kernel);
#   * anything smaller is XLA's own loop: TreeReductionRewriter (windows of 32, as _low_precision_fold) and a
#     sequential fold, _tree_sum; so are float64 sums (below 4096 elements: from there YNNPACK's float64 kernels,
#     8 lanes, whose order is not modelled beyond rows of 256: NumPy's pairwise sum).
# The YNNPACK tile sizes come from its scheduler (tiles of _YNN_TILE elements); measured on Zen 4 only.
_YNN_ELEMENTS = 4096
_YNN_TILE = 32768
_YNN_LANES = 16  # an AVX-512 vector of float32
_SEQUENTIAL_STEPS = 4096  # beyond this many NumPy steps a sequential fold is SPMDSIM_EXACT=1's alone
_TREE_ELEMENTS = 1 << 18  # and beyond this many elements (its transposed copies cost 10-100x NumPy's sum)


def _ynn_rows(x: np.ndarray) -> np.ndarray:
    """The sums of ``x``'s rows ``(M, n)`` (float32) as YNNPACK's k1 reduce kernel computes them (its AVX-512
    sum accumulator, ynnpack/kernels/reduce/sum_accumulator.h, under its scheduler's tiling): 16 lanes; a block
    is 64 consecutive elements, its four vectors added in order (the last block zero-padded); four blocks make a
    group of 256, four groups a chunk of 1024, each added in order. The row is the chunks in order, then (its
    own sum) the rest: its whole groups, whole blocks and the padded block in order. The lanes are then halved
    (lane i + lane i+8, i+4, i+2, i+1), and the result added to the init 0."""
    m, n = x.shape
    dtype = x.dtype
    if n == 0:
        return np.zeros(m, dtype)
    lanes = _YNN_LANES

    def blocks(seg):  # (m, k*64) -> (m, k, 16): each block's four vectors added in order
        return _fold(seg.reshape(m, -1, 4, lanes), 2)

    def groups(seg):  # (m, k*256) -> (m, k, 16)
        return _fold(blocks(seg).reshape(m, -1, 4, lanes), 2)

    chunk, group, block = 1024, 256, 64
    whole = n // chunk
    parts = []
    if whole:  # the chunks, each its four groups in order, then the chunks in order
        parts.append(_fold(_fold(groups(x[:, :whole * chunk]).reshape(m, whole, 4, lanes), 2), 1))
    rest = x[:, whole * chunk:]
    r = rest.shape[1]
    if r:  # the rest, its own sum: whole groups, whole blocks, the zero-padded block, in order
        ng = r // group
        nb = (r - ng * group) // block
        units = [groups(rest[:, :ng * group]), blocks(rest[:, ng * group:ng * group + nb * block])]
        tail = rest[:, ng * group + nb * block:]
        if tail.shape[1]:
            padded = np.zeros((m, block), dtype)
            padded[:, :tail.shape[1]] = tail
            units.append(blocks(padded))
        parts.append(_fold(np.concatenate(units, axis=1), 1))
    t = parts[0] if len(parts) == 1 else parts[0] + parts[1]
    while t.shape[-1] > 1:
        h = t.shape[-1] // 2
        t = t[:, :h] + t[:, h:]
    return dtype.type(0) + t[:, 0]


def _fold(a: np.ndarray, axis: int) -> np.ndarray:
    """``a`` summed along ``axis`` in order, from its first element (one NumPy addition per element of the axis,
    each over all the other axes at once)."""
    a = np.moveaxis(a, axis, 0)
    if len(a) == 1:
        return a[0]
    acc = a[0] + a[1]
    for i in range(2, len(a)):
        np.add(acc, a[i], out=acc)
    return acc


def _ynn_tiles(seg: np.ndarray) -> np.ndarray:
    """The sums over axis 2 of ``seg`` ``(B, T, L, N)``: T tiles of L rows each, as one kn tile (see
    :func:`_ynn_columns`); returns ``(B, T, N)``."""
    b, t, rows, n = seg.shape
    units, parts = rows // 256, []
    if units:  # 256 rows: 16 groups of 16 rows, each four blocks of four rows, all in order
        v = seg[:, :, :units * 256].reshape(b, t, units, 16, 4, 4, n)
        parts.append(_fold(_fold(_fold(_fold(v, 5), 4), 3), 2))
    rest = seg[:, :, units * 256:]
    if rest.shape[2]:  # the tile's rest, its own sum: whole groups, whole blocks, the last rows, in order
        r = rest.shape[2]
        g, q = r // 16, (r % 16) // 4
        pieces = []
        if g:
            pieces.append(_fold(_fold(rest[:, :, :16 * g].reshape(b, t, g, 4, 4, n), 4), 3))
        if q:
            pieces.append(_fold(rest[:, :, 16 * g:16 * g + 4 * q].reshape(b, t, q, 4, n), 3))
        if r % 4:
            pieces.append(_fold(rest[:, :, 16 * g + 4 * q:], 2)[:, :, None])
        parts.append(_fold(np.concatenate(pieces, axis=2), 2))
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def _ynn_columns(x: np.ndarray) -> np.ndarray:
    """The sums over axis 1 of ``x`` ``(B, K, N)`` (float32) as YNNPACK's kn reduce kernel computes them (its
    sum_accumulator_k1_1, one accumulator per column, under its scheduler's tiling): the K rows are cut into
    tiles of ``_YNN_TILE // N`` rows added in order; within a tile, units of 256 rows (16 groups of 16 rows, each
    four blocks of four rows, all in order) in order, then (its own sum) the tile's rest: whole groups, whole
    blocks, the last rows, in order. The result is added to the init 0. Each level's additions run over every
    tile, unit, group and block at once."""
    bsz, k, n = x.shape
    dtype = x.dtype
    if k == 0:
        return np.zeros((bsz, n), dtype)
    tile = max(1, _YNN_TILE // max(n, 1))
    whole = k // tile
    sums = []
    if whole:
        sums.append(_fold(_ynn_tiles(x[:, :whole * tile].reshape(bsz, whole, tile, n)), 1))
    if k % tile:
        sums.append(_ynn_tiles(x[:, whole * tile:][:, None])[:, 0])
    return dtype.type(0) + (sums[0] if len(sums) == 1 else sums[0] + sums[1])


def _tree_sum(x: np.ndarray, axes, elements: int) -> np.ndarray | None:
    """A float32/float64 sum as XLA:CPU's own loops compute it: TreeReductionRewriter's windows of 32 where a
    reduced dimension has more than 32 elements (xla/service/tree_reduction_rewriter.cc, as
    :func:`_low_precision_fold`), each window and the final reduce folded in row-major order from the init 0
    (xla/backends/cpu loop emitter), except a final reduce over the last two dimensions that LLVM vectorises
    (:func:`_outer_lanes`, measured with AVX-512 and on AMD Zen 3; under the AVX2 cap of an AVX-512 CPU, and on
    Zen 3, LLVM vectorises other nests too, e.g. a sum over the leading two axes: not modelled, sequential here).
    None where the fold would take more than _SEQUENTIAL_STEPS NumPy steps or the program's operand (``elements``,
    one device's) has more than _TREE_ELEMENTS elements, and SPMDSIM_EXACT is off."""
    lanes = _lane_table()
    plan = _fold_plan(x.shape, tuple(sorted(int(a) for a in axes)), x.dtype, np.add, lanes)
    if plan is None:  # nothing reduced
        return x
    if (plan.steps > _SEQUENTIAL_STEPS or elements > _TREE_ELEMENTS) and not _xla_cpu_isa.exact():
        return None
    return _low_precision_fold(x, axes, np.add, lanes, plan)


def _vector_sum(x: np.ndarray) -> np.ndarray:
    """:func:`_tree_sum` of a float32/float64 vector of 1 to 1024 elements, in its few NumPy calls (the same
    steps as the plan's: windows of 32, zero-padded at both ends, each folded from its first element, +0 added;
    then the windows' sums folded the same way)."""
    n = len(x)
    zero = x.dtype.type(0)
    if n > _TREE_WINDOW:
        count = -(-n // _TREE_WINDOW)
        padded = np.zeros(count * _TREE_WINDOW, x.dtype)
        lo = (count * _TREE_WINDOW - n) // 2
        padded[lo:lo + n] = x
        x = np.add.accumulate(padded.reshape(count, _TREE_WINDOW), axis=1)[:, -1] + zero
    return (np.add.accumulate(x)[-1:] + zero).reshape(())


def _xla_ordered(dtype) -> bool:
    """Whether a sum of ``dtype`` follows XLA:CPU's order (:func:`_xla_sum`): float32 and float64, on the CPU model
    and jaxlib it was measured with (AMD Zen 4, jaxlib 0.10: :func:`_xla_cpu_isa.ynnpack_orders`;
    ``SPMDSIM_XLA_CPU_MODEL=amd-zen4`` pins the model). Elsewhere NumPy's pairwise sum."""
    return dtype in (np.float32, np.float64) and _xla_cpu_isa.ynnpack_orders()


def _xla_sum(x: np.ndarray, axes, batch: int = 0) -> np.ndarray:
    """``reduce_sum`` of a float32/float64 ``x`` over ``axes`` in XLA:CPU's order; ``batch`` leading axes (the
    vectorized rule's device axis) are not part of the program's operand. NumPy's pairwise sum where the order
    is not modelled: a float32 sum offloaded to YNNPACK over axes neither innermost nor outermost."""
    axes = tuple(sorted(int(a) for a in axes))
    if not axes:
        return x
    operand = x.shape[batch:]
    if x.dtype == np.float64 and math.prod(operand) >= _YNN_ELEMENTS:  # YNNPACK's float64 order: not modelled
        return np.add.reduce(_canonical(x, axes), axis=-1, dtype=x.dtype)
    if x.dtype == np.float32 and math.prod(operand) >= _YNN_ELEMENTS:
        k, nd = len(axes), x.ndim
        lead = math.prod(x.shape[:batch])
        kept = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        if axes == tuple(range(nd - k, nd)):
            flat = x.reshape(-1, math.prod(x.shape[nd - k:])) if x.flags.c_contiguous else _canonical(x, axes)
            with _threads.one_at_a_time():  # dozens of short NumPy calls: one device thread at a time
                return _ynn_rows(np.ascontiguousarray(flat).reshape(-1, flat.shape[-1])).reshape(kept)
        if axes == tuple(range(batch, batch + k)):
            rows = math.prod(x.shape[batch:batch + k])
            with _threads.one_at_a_time():
                return _ynn_columns(np.ascontiguousarray(x).reshape(lead, rows, -1)).reshape(kept)
        return np.add.reduce(_canonical(x, axes), axis=-1, dtype=x.dtype)
    if x.ndim == 1 and not batch and 0 < len(x) <= _TREE_WINDOW * _TREE_WINDOW:  # a device's vector (a loop's sum)
        return _vector_sum(x)
    out = _tree_sum(x, axes, math.prod(operand))
    if out is None:
        return np.add.reduce(_canonical(x, axes), axis=-1, dtype=x.dtype)
    return out


def _reduction(ufunc, name):
    accumulate = ufunc in (np.add, np.multiply)

    def rule(x, *, axes, out_sharding=None, batch=0):
        if x.dtype in LOW_FLOATS and accumulate:
            return _low_precision_fold(x, axes, ufunc)
        if ufunc is np.add and _xla_ordered(x.dtype):
            return _xla_sum(x, axes, batch)
        if x.dtype.kind == "f" and ufunc is np.maximum:
            return _reduce_float_extremum(_canonical(x, axes), _float_max)
        if x.dtype.kind == "f" and ufunc is np.minimum:
            return _reduce_float_extremum(_canonical(x, axes), _float_min)
        if x.dtype in LOW_FLOATS and ufunc in (np.maximum, np.minimum):
            return rule(x.astype(np.float32), axes=axes).astype(x.dtype)
        flat = _canonical(x, axes)
        if flat.shape[-1] == 0 and not accumulate:
            return np.full(flat.shape[:-1], _reduction_identity(ufunc, x.dtype), x.dtype)
        return ufunc.reduce(flat, axis=-1, dtype=x.dtype if accumulate else None)

    def specialized(eqn):
        """The rule's last case for this equation, its reduced axes known: when they are the trailing ones, a
        contiguous operand is reshaped to ``(kept..., R)`` without :func:`_canonical`'s steps (the same array)."""
        aval, axes = eqn.invars[0].aval, tuple(sorted(eqn.params["axes"]))
        if _dtypes.is_extended(aval.dtype):
            return None
        dtype, ndim = np.dtype(aval.dtype), len(aval.shape)
        first = ndim - len(axes)
        if dtype in LOW_FLOATS or dtype.kind == "f" and ufunc in (np.maximum, np.minimum) \
                or ufunc is np.add and _xla_ordered(dtype) or axes != tuple(range(first, ndim)):
            return None
        flat_shape = (*aval.shape[:first], math.prod(aval.shape[first:]))
        if flat_shape[-1] == 0 and not accumulate:
            return None
        reduce_dtype = dtype if accumulate else None

        def reduce(x):
            return ufunc.reduce(x.reshape(flat_shape) if x.flags.c_contiguous else _canonical(x, axes), axis=-1,
                                dtype=reduce_dtype)
        return reduce

    rule.specialize = specialized
    per_device(name)(rule)

    vectorized(name)(lambda x, *, axes, out_sharding=None: by_devices(
        functools.partial(rule, axes=shift(axes), batch=1), x))


def _reduction_identity(ufunc, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return ufunc in (np.minimum, np.bitwise_and)
    if ufunc is np.bitwise_and:
        return np.asarray(-1).astype(dtype) if dtype.kind == "i" else np.iinfo(dtype).max
    if ufunc in (np.bitwise_or, np.bitwise_xor):
        return 0
    info = np.iinfo(dtype)
    return info.min if ufunc is np.maximum else info.max


def _reduce_float_extremum(x: np.ndarray, pick) -> np.ndarray:
    """The max (``pick`` = :func:`_float_max`) or min of ``x``'s last axis as XLA computes it: NaN if any
    element is NaN, -0.0 ordered below +0.0. NumPy's reduction where it is the same (not complex; rows whose
    result is NaN are folded again one element at a time, for the NaN's bits); a zero result takes its sign
    from the row's zeros."""
    if x.shape[-1] == 0:
        return np.full(x.shape[:-1], -np.inf if pick is _float_max else np.inf, x.dtype)
    largest = pick is _float_max
    if x.dtype.kind == "c" or x.ndim == 0:
        return _fold_float_extremum(x, pick)
    out = np.asarray((np.maximum if largest else np.minimum).reduce(x, axis=-1))
    nan = np.isnan(out)
    if nan.any():
        out[nan] = _fold_float_extremum(x[nan], pick)
    zero = out == 0
    if zero.any():  # max: +0.0 if the row holds one, else -0.0; min: -0.0 if the row holds one, else +0.0
        rows = x[zero]
        wanted = ((rows == 0) & (np.signbit(rows) != largest)).any(axis=-1)
        out[zero] = np.where(wanted == largest, np.zeros((), x.dtype), -np.zeros((), x.dtype))
    return out


def _fold_float_extremum(x: np.ndarray, pick) -> np.ndarray:
    out = x[..., 0]
    for k in range(1, x.shape[-1]):
        out = pick(out, x[..., k])
    return np.asarray(out, x.dtype)


for _name, _ufunc in (("reduce_sum", np.add), ("reduce_prod", np.multiply), ("reduce_max", np.maximum),
                      ("reduce_min", np.minimum), ("reduce_and", np.bitwise_and), ("reduce_or", np.bitwise_or),
                      ("reduce_xor", np.bitwise_xor)):
    _reduction(_ufunc, _name)


def _argextremum(x, axis, index_dtype, largest: bool):
    if x.dtype.kind == "c":
        raise NotImplementedError("argmax/argmin of complex")
    if is_float(x.dtype):  # NaN wins (the first one); -0.0 and +0.0 tie (the first one)
        x32 = x.astype(np.float32) if x.dtype in LOW_FLOATS else x
        nan = np.isnan(x32)
        best = np.argmax(x32, axis=axis) if largest else np.argmin(x32, axis=axis)
        return np.where(nan.any(axis=axis), np.argmax(nan, axis=axis), best).astype(index_dtype)
    return (np.argmax(x, axis=axis) if largest else np.argmin(x, axis=axis)).astype(index_dtype)


both("argmax", vectorized_rule=lambda x, *, axes, index_dtype: _argextremum(x, axes[0] + 1, index_dtype, True))(
    lambda x, *, axes, index_dtype: _argextremum(x, axes[0], index_dtype, True))
both("argmin", vectorized_rule=lambda x, *, axes, index_dtype: _argextremum(x, axes[0] + 1, index_dtype, False))(
    lambda x, *, axes, index_dtype: _argextremum(x, axes[0], index_dtype, False))


def _cumulative(fn, name):
    def rule(x, *, axis, reverse):
        if x.dtype in LOW_FLOATS:
            return rule(x.astype(np.float32), axis=axis, reverse=reverse).astype(x.dtype)
        y = np.flip(x, axis) if reverse else x
        y = fn(y, axis)
        return (np.flip(y, axis) if reverse else y).astype(x.dtype)

    per_device(name)(rule)
    vectorized(name)(lambda x, *, axis, reverse: rule(x, axis=axis + 1, reverse=reverse))


def _accumulate_extremum(pick):
    def fn(x, axis):
        if x.dtype.kind != "f":
            return (np.maximum if pick is _float_max else np.minimum).accumulate(x, axis=axis)
        out = np.array(x, copy=True)
        moved = np.moveaxis(out, axis, 0)
        for k in range(1, moved.shape[0]):
            moved[k] = pick(moved[k - 1], moved[k])
        return out
    return fn


_cumulative(lambda x, a: np.cumsum(x, axis=a, dtype=x.dtype), "cumsum")
_cumulative(lambda x, a: np.cumprod(x, axis=a, dtype=x.dtype), "cumprod")
_cumulative(_accumulate_extremum(_float_max), "cummax")
_cumulative(_accumulate_extremum(_float_min), "cummin")
_cumulative(lambda x, a: np.logaddexp.accumulate(x, axis=a), "cumlogsumexp")


# -- the generic reduce: a reducer jaxpr, evaluated on whole arrays ---------------------------------------------

def eval_elementwise_jaxpr(jaxpr, consts, *args) -> list[np.ndarray]:
    """Evaluate a scalar jaxpr (a reducer, a selector) on arrays of any shape with the per-device rules: its
    equations are elementwise, so the same rules compute every element at once."""
    env = {}
    for v, a in zip(jaxpr.constvars, consts, strict=True):
        env[v] = np.asarray(a)
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a

    def read(v):
        return np.asarray(v.val, dtype=np.dtype(v.aval.dtype)) if not hasattr(v, "count") and hasattr(v, "val") \
            else env[v]

    for eqn in jaxpr.eqns:
        rule = PER_DEVICE.get(eqn.primitive.name)
        if rule is None:
            raise NotImplementedError(f"spmdsim has no NumPy rule for primitive {eqn.primitive.name!r} inside a "
                                      f"reducer (params {dict(eqn.params)})")
        invals = [read(v) for v in eqn.invars]
        ndim = max((x.ndim for x in invals), default=0)
        out = rule(*(expand_to(x, ndim) if x.ndim else x for x in invals), **eqn.params)
        outs = out if eqn.primitive.multiple_results else [out]
        for v, o in zip(eqn.outvars, outs, strict=True):
            env[v] = np.asarray(o)
    return [read(v) for v in jaxpr.outvars]


def _reduce_generic(*operands_and_inits, computation=None, jaxpr, dimensions):
    """lax.reduce with any reducer: a sequential fold over the reduced axes in row-major order."""
    n = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:n], operands_and_inits[n:]
    inner, consts = (jaxpr.jaxpr, jaxpr.consts) if hasattr(jaxpr, "consts") else (jaxpr, ())
    flat = [_canonical(x, dimensions) for x in operands]
    acc = [np.broadcast_to(np.asarray(i, x.dtype), f.shape[:-1]) for i, x, f in zip(inits, operands, flat,
                                                                                    strict=True)]
    for k in range(flat[0].shape[-1]):
        acc = eval_elementwise_jaxpr(inner, consts, *acc, *(f[..., k] for f in flat))
        acc = [np.asarray(a, x.dtype) for a, x in zip(acc, operands, strict=True)]
    return [np.array(np.broadcast_to(a, f.shape[:-1])) for a, f in zip(acc, flat, strict=True)]


per_device("reduce")(_reduce_generic)


@vectorized("reduce")
def _reduce_generic_v(*operands_and_inits, computation=None, jaxpr, dimensions):
    n = len(operands_and_inits) // 2
    operands, inits = operands_and_inits[:n], [np.asarray(i) for i in operands_and_inits[n:]]
    if all(i.size == 0 or (i == i.reshape(-1)[0]).all() for i in inits):  # the usual case: literal inits
        firsts = [i.reshape(-1)[0] for i in inits]
        return _reduce_generic(*operands, *firsts, jaxpr=jaxpr, dimensions=shift(dimensions))
    per_device = [_reduce_generic(*(x[d] for x in operands), *(i[d] for i in inits), jaxpr=jaxpr,
                                  dimensions=dimensions) for d in range(operands[0].shape[0])]
    return [np.stack(outs) for outs in zip(*per_device, strict=True)]


# -- sorting ---------------------------------------------------------------------------------------------------

def _sort_keys(x: np.ndarray) -> list[np.ndarray]:
    """JAX's sort comparator on one operand, as lexicographic unsigned keys: floats with -0.0 = +0.0 and every
    NaN equal and last; complex numbers by (real, imaginary)."""
    if x.dtype.kind == "c":
        return _sort_keys(np.real(x)) + _sort_keys(np.imag(x))
    if is_float(x.dtype):
        canonical = np.where(x == 0, np.zeros((), x.dtype), x)
        canonical = np.where(np.isnan(canonical), np.asarray(np.nan, x.dtype), canonical).astype(x.dtype)
        return [_ordered_key(canonical)]
    return [_ordered_key(x)]


def sort_order(keys: list[np.ndarray], axis: int) -> np.ndarray:
    """The stable ascending order along ``axis`` of lexicographic keys (first key most significant)."""
    moved = [np.moveaxis(k, axis, -1) for k in keys]
    if len(moved) == 1:
        order = np.argsort(moved[0], axis=-1, kind="stable")
    else:
        order = np.lexsort(tuple(reversed(moved)), axis=-1)
    return np.moveaxis(order, -1, axis)


@per_device("sort")
def _sort(*operands, dimension, is_stable, num_keys):
    keys = [k for x in operands[:num_keys] for k in _sort_keys(x)]
    order = sort_order(keys, dimension)
    return [np.take_along_axis(o, order, axis=dimension) for o in operands]


vectorized("sort")(lambda *operands, dimension, is_stable, num_keys: _sort(
    *operands, dimension=dimension + 1, is_stable=is_stable, num_keys=num_keys))


def _top(x, k, axis, largest: bool):
    """The first k along ``axis`` in XLA's order (total order, descending for top_k; ties: lower index)."""
    key = _ordered_key(x)
    key = ~key if largest else key
    order = np.take(np.argsort(np.moveaxis(key, axis, -1), axis=-1, kind="stable"), np.arange(k), axis=-1)
    order = np.moveaxis(order, -1, axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int32)]


@per_device("top_k")
def _top_k(x, *, k, axis=-1, **_):
    return _top(x, int(k), axis % x.ndim, True)


vectorized("top_k")(lambda x, *, k, axis=-1, **_: _top(x, int(k), axis % (x.ndim - 1) + 1, True))


def _approx_top_k_size(x_shape, k, reduction_dimension, recall_target, aggregate_to_topk,
                       reduction_input_size_override) -> int:
    if aggregate_to_topk:
        return int(k)
    from spmdsim.jax._internals import jaxlib_ext as _jax

    size = x_shape[reduction_dimension]
    return int(_jax.approx_top_k_reduction_output_size(size, len(x_shape), int(k), recall_target, aggregate_to_topk,
                                                       reduction_input_size_override)[0])


@per_device("approx_top_k")
def _approx_top_k(x, *, k, reduction_dimension, recall_target, is_max_k, reduction_input_size_override,
                  aggregate_to_topk):
    """XLA:CPU's fallback: an exact sort along the reduction dimension, the first entries kept."""
    axis = reduction_dimension % x.ndim
    size = _approx_top_k_size(x.shape, k, axis, recall_target, aggregate_to_topk, reduction_input_size_override)
    return _top(x, size, axis, bool(is_max_k))


@vectorized("approx_top_k")
def _approx_top_k_v(x, *, k, reduction_dimension, recall_target, is_max_k, reduction_input_size_override,
                    aggregate_to_topk):
    axis = reduction_dimension % (x.ndim - 1)
    size = _approx_top_k_size(x.shape[1:], k, axis, recall_target, aggregate_to_topk,
                              reduction_input_size_override)
    return _top(x, size, axis + 1, bool(is_max_k))
