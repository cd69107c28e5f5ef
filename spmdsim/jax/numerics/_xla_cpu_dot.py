"""XLA:CPU's float32 ``dot_general`` order of additions, as jaxlib 0.10.2 computes it on the CPU models measured.

jaxlib 0.10.2's XLA:CPU hands float32 dots to YNNPACK (its optimized HLO wraps each dot in a ``__ynn_fusion``,
seen with ``XLA_FLAGS=--xla_dump_to``). YNNPACK (``ynnpack/kernels/dot``, ``ynnpack/subgraph/dot.cc`` and
``ynnpack/kernels/dot/schedule.cc`` in google/XNNPACK) computes ``C = A @ B`` with generated micro-kernels that

- start each call's accumulators at zero and, per output element, chain fused multiply-adds over the call's
  range of ``k`` -- one chain for the ``tile_k = 1`` kernels; ``tile_k`` interleaved chains (``k mod tile_k``,
  one SIMD lane each) for the ``tile_k = 4`` kernels, reduced at the end as ``(l0 + l1) + (l2 + l3)``
  (``x86_fp32_k4.py``'s odd-to-even adds);
- add the call's result to what earlier calls left in ``C`` (``C_out = acc + C_in``): ``k`` is cut in chunks
  (``schedule_dot``: a loop over ``k`` sized by a cache budget), each a call of its own, and a remainder of
  ``k`` that is not a multiple of ``tile_k`` is one more call on a zero-padded tile.

The kernel (and with it ``tile_k``) is picked per shape by a cost model over the kernels built for the CPU, and
the ``k`` chunk depends on the chosen kernel's block; the version of YNNPACK in jaxlib 0.10.2 is not the one
whose source could be read here, so the choices below are *measured* (FPRev probes -- one large value, its
negation and ones, which reveal each addition tree -- and random operands compared bit for bit with
``jax.jit``) on an AMD EPYC Zen 4 (family 25 model 17, AVX-512 without FP16). :func:`plan` names the shapes
whose order is known and returns None for the rest, where spmdsim keeps its BLAS product.

A fused multiply-add is computed through float64 (the float32 product is exact there): by default its sum is
rounded twice, to float64 then float32, which differs from one rounding in about one case in 2**29 (as in
:mod:`._xla_cpu_math`); under ``SPMDSIM_EXACT=1`` the chains round each step once
(:func:`._xla_cpu_math.fma32_step`: 1.7x the time), which turned the last misses below (single elements of
products of millions of steps) into XLA's values.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from spmdsim.jax.numerics import _xla_cpu_isa, _xla_cpu_math

__all__ = ["Plan", "plan", "ynn_matmul", "matmul", "DEFAULT_WORK", "DEFAULT_STEPS", "exact_by_default", "conv_tile",
           "conv_lanes", "ynn_conv", "CONV_DEFAULT_WORK"]

f32, f64 = np.float32, np.float64

# products whose (M, K) @ (K, N) slices are at most this large (M * N * K) use the exact order by default, larger
# ones only under SPMDSIM_EXACT=1 (the exact order costs a NumPy pass over an (M, N) plane per k: far slower than
# BLAS). Per slice, never per batch: a device axis batched in front (the vectorized executor) must not change it.
DEFAULT_WORK = 1 << 16
# the same for a convolution's (M, K) @ (K, O) product (its chains are vectorized over M * O outputs, so the cost
# per multiply-add is lower than a dot's): larger ones only under SPMDSIM_EXACT=1
CONV_DEFAULT_WORK = 1 << 20
# and whose chains take at most this many steps (k / tile_k): each step is a NumPy call, and in loops of small
# products they cost more than the whole product (numpyro's NUTS: 28 s with BLAS's order, 50 s with XLA's for
# k = 200; a training step's gradient, (1, 64) @ (64, 16) on 8 devices: 2.4 ms a step against 0.65 with BLAS's)
DEFAULT_STEPS = 16


@dataclasses.dataclass(frozen=True)
class Plan:
    """How YNNPACK orders one ``(M, K) @ (K, N)`` product: ``tile_k`` interleaved chains per call, and ``k``
    cut in calls of ``chunk`` (None: one call for all of ``k``). With ``split_n``, the columns are cut in tasks
    of ``split_n`` (the last one narrower), each cutting ``k`` by its own width (:func:`_l2_chunk`; ``chunk``
    is then None)."""

    tile_k: int
    chunk: int | None
    split_n: int | None = None


# YNNPACK's cache budget for a k chunk of an unpacked B (``cache_size_l2`` in ynnpack/subgraph/dot.cc: 128 KiB in
# the jaxlib 0.10.2 build): a (chunk x width) float32 stripe of B fits in it (``schedule_dot``'s k loop)
_L2_FLOATS = 128 * 1024 // 4


def _l2_chunk(width: int, k: int) -> int | None:
    """The ``k`` chunk of a task ``width`` columns wide (None: all of ``k`` in one call)."""
    chunk = _L2_FLOATS // width
    return chunk if chunk < k else None


def _split_n(m: int, n: int, k: int, block_n: int = 64) -> int:
    """The columns of one YNNPACK task of an ``(m, k) @ (k, n)`` product (``choose_split_factors`` in
    ynnpack/subgraph/dot.cc; ``block_n`` 64 fits the Zen 3 measurements): a tile of ``min(m, 16)`` rows and
    ``min(n, block_n)`` columns doubled in one
    direction at a time (columns while the tile is at least a quarter as wide as tall, or holds every row) until
    it holds ``min(m, 64) * min(n, 64)`` outputs and ``(rows + columns) * min(k, 1024)`` reaches 65,536 (or its
    area does), or cannot grow."""
    k = min(k, 1024)
    least = min(m, 64) * min(n, 64)
    cols, rows = min(n, block_n), min(m, 16)
    while not (cols * rows >= least and ((rows + cols) * k >= 1 << 16 or rows * cols >= 1 << 16)):
        if (4 * cols <= rows or rows >= m) and cols < n:
            cols *= 2
        elif (rows <= 4 * cols or cols >= n) and rows < m:
            rows *= 2
        else:
            break
    return cols


def exact_by_default(m: int, n: int, k: int, p: Plan) -> bool:
    """Whether an ``(m, k) @ (k, n)`` slice in order ``p`` is computed in XLA's order without ``SPMDSIM_EXACT=1``:
    at most ``DEFAULT_WORK`` multiply-adds in chains of at most ``DEFAULT_STEPS`` steps."""
    return m * n * k <= DEFAULT_WORK and -(-k // p.tile_k) <= DEFAULT_STEPS


def _plan_amd_zen4(m: int, n: int, k: int) -> Plan | None:
    """The orders measured on AMD Zen 4 (jaxlib 0.10.2); None where not measured or not understood (M or N of
    1 take another path; 16 < N < 64 switches kernels with M; chunks for K > 256 depend on N and M).

    A vector times a matrix (M = 1, as in a gradient's or a single query's product) is one chain over all of
    ``k`` (measured for N from 3 to 1000, K up to 2048: one call, no chunks), except a last column alone in its
    16-column tile (N mod 16 = 1: another kernel's order, not modelled) and N = 2 (a kernel for large K). A
    matrix times a vector (N = 1) is not a dot kernel's order: 8 interleaved lanes over ``k`` reduced as a tree,
    the last 8 in another lane order and a tail of K mod 8 chained (FPRev on 16x64 @ 64x1, 16x100 @ 100x1):
    not modelled."""
    if m == 1 and n >= 3 and n % 16 != 1 and 1 <= k <= 2048:
        return Plan(1, None)
    if m < 2 or n < 2 or k < 1:
        return None
    if (m, n, k) == (128, 64, 256):  # the AMD file's dot_128x256_256x64 (M above 64 otherwise not measured)
        return Plan(1, None)
    if n <= 16:
        if k < 4:  # tail only: every kernel adds ((p0 + p1) + p2) for k = 3 as a chain does
            return Plan(1, None)
        if 16 <= k <= 300:
            return Plan(4, None)
        if k < 16 and n <= 4 and m >= 8:
            return Plan(4, None)
        return None
    if n >= 64 and m <= 64:
        if k <= 256:
            return Plan(1, None)
        if n >= 1024 and m <= 16 and k <= 2048:
            return Plan(1, 256 if k < 820 and k > 512 else 512)
        if n == 64 and m <= 16 and k > 512:
            return Plan(1, 512)
    return None


def _plan_amd_zen3(m: int, n: int, k: int) -> Plan | None:
    """The orders measured on AMD Zen 3 (family 25 model 1: AVX2 and FMA3, no AVX-512; jaxlib 0.10.2), by fitting
    plans (``tile_k`` 1-16, chunks 4-512) to ``jax.jit`` on random operands, then checking the rule below bit for
    bit on 4,931 shapes (M 2-128, N 2-1024, K 1-2048) and 1,008 of 61-256 rows, two seeds each: no miss but two
    single elements of 6.5-million-step products, the double rounding of the float64 emulation (module docstring;
    exact mode now rounds each step once, which gives XLA's values there).

    YNNPACK's AVX2 kernels chain over ``k`` one lane wide (``tile_k = 1``) where they fit at all. Up to 60 rows B
    is not packed: YNNPACK cuts the columns in tasks (:func:`_split_n`) and each task cuts ``k`` in chunks whose
    float32 stripe of B fills 128 KiB (:func:`_l2_chunk`; a ``16x784 @ 784x1024`` is tasks of 128 columns and
    chunks of 256). From 61 rows on (more than ten of the kernel's blocks of 6 rows) B is packed in blocks that
    fit that budget, so ``k`` is one call.

    Not modelled: one task of fewer than 64 columns, or not a multiple of 16, whose ``k`` would be cut in chunks
    (``17x48 @ 48x1024`` is one call, ``17x40 @ 40x1024`` and ``33x50 @ 50x784`` fit no chunk); products of a
    few rows (2-7, or beyond a multiple of 8 below 32) and fewer than 16 columns (FPRev on ``4x6 @ 6x4``: two
    interleaved chains, even and odd ``k``, then their sum, a 7th product added last; ``4x8 @ 8x4`` and
    ``4x12 @ 12x4``: one chain of unfused adds -- LLVM's vectorisation of XLA's own loop, per K); a last task
    narrower than 16 columns (``2x129``, ``17x200`` for large K: another kernel's order); from 61 rows, N not a
    multiple of 16 (``tile_k = 2`` kernels, not checked across shapes); N = 1.

    Convolutions (measured 2026-11-30 against ``jax.jit``): with output features a multiple of 16, ``k`` below
    250 and the kernel within 128 KiB, every block of 6 rows (output positions) is one window-major chain,
    ``tile_k = 1``, as these products (:func:`_conv_tile_amd_zen3`); the 1-3 rows past the last block take two
    lanes where there are 16 output features and at most 16 input features (:func:`conv_lanes`), else the same
    chain. Of 947 random convolutions so modelled (1-3 images, 1-23 x 1-23 outputs, strides 1-2, 1-24 input and
    16-256 output features, 1x2 to 5x5 windows; two seeds; one CPU device; ``SPMDSIM_EXACT=1``), 936 bit for
    bit; the other 11 have 16 output features and positions cut in tasks by XLA's threads (:func:`conv_lanes`).
    (A 937th, one element 4 ulps off in a product of 9.8 million multiply-adds, was the double rounding of the
    float64 emulation, module docstring: an exactly rounded chain gives XLA's value, and exact mode now does.)"""
    if m == 1:
        return Plan(1, None) if n >= 3 and n % 16 != 1 and 1 <= k <= 2048 else None
    if n < 2 or k < 1 or m < 32 and m % 8 and n < 16:
        return None
    if m > 60:  # more than ten blocks of 6 rows (the AVX2 kernel's): B is packed
        return Plan(1, None) if n % 16 == 0 else None
    split = _split_n(m, n, k)
    if split >= n:  # one task
        if _l2_chunk(n, k) is None:
            return Plan(1, None)
        return Plan(1, None, split) if n % 16 == 0 and n >= 64 else None
    return Plan(1, None, split) if n % split == 0 or n % split >= 16 else None


_PLANS = {"amd-zen4": _plan_amd_zen4, "amd-zen3": _plan_amd_zen3}


def plan(m: int, n: int, k: int) -> Plan | None:
    """The order of a float32 ``(m, k) @ (k, n)`` on this machine's CPU model (:func:`_xla_cpu_isa.cpu_model`),
    or None where spmdsim does not know it. AMD Zen 4 and Zen 3 with jaxlib 0.10 are measured
    (:func:`_xla_cpu_isa.ynnpack_orders`); elsewhere None."""
    if not _xla_cpu_isa.ynnpack_orders() or not _xla_cpu_isa.current().fma:
        return None
    return _PLANS[_xla_cpu_isa.cpu_model()](m, n, k)


_BLOCK_ELEMENTS = 1 << 14  # outputs per block of rows in a chain's loop: its planes stay in the CPU's cache
_PRODUCT_ELEMENTS = 1 << 16  # float64 products computed ahead, a group of steps at a time (512 KiB)


def _chains(a: np.ndarray, b: np.ndarray, lo: int, hi: int, tile_k: int) -> np.ndarray:
    """One kernel call over ``k`` in ``[lo, hi)``: ``tile_k`` fused multiply-add chains from zero, each over
    ``k = lo + lane (mod tile_k)``, then the lanes' reduction (``(l0 + l1) + (l2 + l3)``).

    The exact products are computed in float64 ahead, a group of steps at a time (one NumPy call); each step is
    then one NumPy call over every lane: its products' sums with the float32 accumulators, computed in float64
    and rounded to float32 on the way out. ``k`` is padded with zero products up to a multiple of ``tile_k`` (a
    zero leaves a lane as it is: the accumulators start at +0 and are never -0). The rows are done in blocks
    whose planes stay in the cache (the order of each output element's chain does not depend on the blocks)."""
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    batch = len(shape) - 2
    a = a.reshape((1,) * (batch + 2 - a.ndim) + a.shape)  # the same batch rank: k's axes lead below
    b = b.reshape((1,) * (batch + 2 - b.ndim) + b.shape)
    steps = -(-(hi - lo) // tile_k)
    # k-major copies of the operands' columns / rows in [lo, hi), zero-padded, as (steps, lane, ...)
    ak = np.zeros((steps * tile_k, *a.shape[:-1], 1), f32)
    ak[:hi - lo] = np.moveaxis(a[..., lo:hi], -1, 0)[..., None]
    bk = np.zeros((steps * tile_k, *b.shape[:-2], 1, b.shape[-1]), f32)
    bk[:hi - lo] = np.moveaxis(b[..., lo:hi, :], -2, 0)[..., None, :]
    ak, bk = ak.reshape(steps, tile_k, *ak.shape[1:]), bk.reshape(steps, tile_k, *bk.shape[1:])
    lanes = np.zeros((tile_k, *shape), f32)
    m, n = shape[-2], shape[-1]
    outer = int(np.prod(shape[:-2], dtype=np.int64))
    rows = max(1, min(m, _BLOCK_ELEMENTS // max(n * outer, 1)))
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        block = lanes[..., r0:r1, :]
        wide = np.empty(block.shape, f64) if _xla_cpu_isa.exact() else None  # _fma_step's scratch
        group = max(1, _PRODUCT_ELEMENTS // max(block.size, 1))
        for s0 in range(0, steps, group):
            for products in np.multiply(ak[s0:s0 + group, ..., r0:r1, :], bk[s0:s0 + group], dtype=f64):
                _fma_step(products, block, wide)
    return _lane_sum(list(lanes))


def _fma_step(products: np.ndarray, acc: np.ndarray, wide: np.ndarray | None = None) -> None:
    """One step of the fused multiply-add chains, in place: ``acc = float32(products + acc)`` (``products``
    float64, exact products of float32 values; ``acc`` float32). Under SPMDSIM_EXACT=1 rounded once
    (:func:`._xla_cpu_math.fma32_step`, ``wide`` its float64 scratch of ``acc``'s shape, made if None); by default
    the float64 sum rounded to float32, twice rounded (another float32 about once in 2**29)."""
    if _xla_cpu_isa.exact():
        _xla_cpu_math.fma32_step(products, acc, np.empty(acc.shape, f64) if wide is None else wide)
    else:
        np.add(products, acc, out=acc, dtype=f64, casting="same_kind")


def ynn_matmul(a: np.ndarray, b: np.ndarray, p: Plan) -> np.ndarray:
    """``(..., M, K) @ (..., K, N)`` in float32 in YNNPACK's order ``p`` (see the module docstring): the calls
    over ``k``'s chunks and its remainder, each added to the sum of the calls before it."""
    a, b = np.asarray(a, f32), np.asarray(b, f32)
    k = a.shape[-1]
    if p.split_n is not None:  # each task of columns with its own k chunk
        n = b.shape[-1]
        return np.concatenate([ynn_matmul(a, b[..., lo:lo + p.split_n],
                                          Plan(p.tile_k, _l2_chunk(min(p.split_n, n - lo), k)))
                               for lo in range(0, n, p.split_n)], axis=-1)
    main = k // p.tile_k * p.tile_k
    step = p.chunk or max(main, 1)
    bounds = [(s, min(s + step, main)) for s in range(0, main, step)]
    if main < k:
        bounds.append((main, k))
    out = None
    for lo, hi in bounds:
        part = _chains(a, b, lo, hi, p.tile_k)
        out = part if out is None else part + out
    return out


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``(..., M, K) @ (..., K, N)`` of float32 operands in XLA:CPU's order where :func:`plan` knows it and the
    product's slices are small (:func:`exact_by_default`) or ``SPMDSIM_EXACT=1`` is set; None otherwise (the caller's BLAS
    product then applies)."""
    if a.dtype != f32 or b.dtype != f32 or a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if k == 0:
        return None
    p = plan(m, n, k)
    if p is None or not exact_by_default(m, n, k, p) and not _xla_cpu_isa.exact():
        return None
    return ynn_matmul(a, b, p)


# -- convolutions ------------------------------------------------------------------------------------------------
#
# jaxlib 0.10.2's XLA:CPU hands a float32 ``conv_general_dilated`` (2-D, no input dilation, one feature group) to
# the same dot kernels: the optimized HLO keeps a plain ``convolution``, but its order of additions is YNNPACK's
# (``ynnpack/kernels/dot/dot.h``: ``C(i, j) += A(i, k3, k2, k1) * B(k3, k2, k1, j)`` with the kernel's window
# positions as ``k3, k2`` and the input features as ``k1``; ``ynnpack/subgraph/stencil_copy.cc`` makes the
# windows). Measured on AMD Zen 4 (FPRev probes and random operands, bit for bit; see test_xla_conv_order.py):
#
# - per output element, ``tile_k`` fused multiply-add chains (lane = input feature mod ``tile_k``) over the
#   window positions in row-major order and, inside each, the features ``[0, C - C mod tile_k)``, reduced as
#   ``(l0 + l1) + (l2 + l3)`` -- one call, never cut in ``k`` chunks within the measured sizes;
# - then, for each window position in row-major order, one more call over that position's remaining
#   ``C mod tile_k`` features (a zero-padded tile: products rounded to float32, the lanes reduced as above),
#   added to the result so far: ``C_out = tail + C_in``;
# - ``tile_k`` is picked per (input features C, output features O) by YNNPACK's cost model; the table below is
#   what was measured (for M = 64, 512 and 3136 output positions, 1x1, 3x3 and 5x5 windows alike), with the
#   largest ``K = window * C`` measured per row (above it the order changes: ``k`` chunks, not modelled).


def _conv_tile_amd_zen4(c: int, o: int, k: int, positions: int) -> int | None:
    """``tile_k`` of a float32 convolution with ``c`` input and ``o`` output features per group and ``k``
    multiply-adds per output element, as measured on AMD Zen 4 (jaxlib 0.10.2); None where not measured. The
    output positions per image do not matter here."""
    if c < 1 or o < 1:
        return None
    if o == 1:
        return 4 if 17 <= c and k <= 2304 else None
    if o <= 16:
        if c <= 16:  # one chain, cut in k chunks above K = 256 (400: two of 200; 512: two of 256; 800: four of
            # 200; 1024: 344, 344, 336), by a rule that depends on the window too: not modelled
            return 1 if k <= 256 else None
        return 4 if k <= (1152 if o > 12 else 2304) else None
    if o in (20, 24):
        if k > 2304:
            return None
        if c == 1:
            return 1
        if c in (2, 6, 17):
            return 2
        return 4 if c == 3 or c % 4 == 0 else None
    if o in (28, 32):
        return (1 if c == 1 else 2) if c <= 96 and k <= 864 else None
    if o in (40, 48):
        if k > 1152:
            return None
        if c in (1, 2, 3, 6):
            return 1
        return 4 if c % 4 == 0 or c == 17 else None
    if o in (56, 64, 128):
        return 1 if c <= 48 and k <= 432 else None
    if o == 96:
        if k > 864:
            return None
        if c in (1, 3):
            return 1
        return 2 if c in (2, 6, 17) or (c % 4 == 0 and c <= 96) else None
    return None


def _conv_tile_amd_zen3(c: int, o: int, k: int, positions: int) -> int | None:
    """``tile_k`` of a float32 convolution on AMD Zen 3 (jaxlib 0.10.2): one window-major chain (``tile_k = 1``)
    where the output features are a multiple of 16, ``k`` is below 250 and the kernel's ``k x o`` float32 values
    fit YNNPACK's 128 KiB budget (the range measured: 1-24 input and 16-256 output features, 1x2 to 5x5 windows);
    None elsewhere (other output features: :func:`conv_lanes`; a larger kernel: another order in every row, not
    found among chunked chains of 1-8 lanes in window- or feature-major order).

    Every block of 6 output positions (the AVX2 kernel's rows) is the chain; the positions past the last block
    are the chain too but for 16 output features (:func:`conv_lanes`). One output position per image: None
    (another order; a matrix times a vector?). Measured: :func:`_plan_amd_zen3`'s docstring."""
    if positions == 1 or c < 1 or o < 16 or o % 16 or not 1 <= k < 250 or k * o > _L2_FLOATS:
        return None
    return 1


_CONV_TILES = {"amd-zen4": _conv_tile_amd_zen4, "amd-zen3": _conv_tile_amd_zen3}


def conv_tile(c: int, o: int, k: int, positions: int) -> int | None:
    """``tile_k`` of a float32 convolution (``c`` input and ``o`` output features per group, ``k`` multiply-adds
    per output element, ``positions`` output positions per image) on this machine's CPU model, or None where
    spmdsim does not know its order (AMD Zen 4 and Zen 3 with jaxlib 0.10 are measured:
    :func:`_xla_cpu_isa.ynnpack_orders`; one output position per image is not, on Zen 3)."""
    tiles = _CONV_TILES.get(_xla_cpu_isa.cpu_model())
    if tiles is None or not _xla_cpu_isa.ynnpack_orders() or not _xla_cpu_isa.current().fma:
        return None
    return tiles(c, o, k, positions)


def _lane_sum(lanes: list[np.ndarray]) -> np.ndarray:
    """A kernel's reduction of its ``tile_k`` lanes: ``l0``, ``l0 + l1`` or ``(l0 + l1) + (l2 + l3)``."""
    if len(lanes) == 1:
        return lanes[0]
    if len(lanes) == 2:
        return lanes[0] + lanes[1]
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def conv_lanes(m: int, c: int, o: int) -> list[tuple[int, bool]]:
    """The positions of a float32 convolution (``m`` output positions, ``c`` input and ``o`` output features) that
    a kernel of two lanes computes on this machine's CPU model: consecutive runs at the end of the ``m`` positions,
    each ``(positions, fused)``, for :func:`ynn_conv`'s ``lanes``; the positions before them take
    :func:`conv_tile`'s chains. Empty where every position does.

    AMD Zen 3 (jaxlib 0.10.2; measured 2026-11-30 against ``jax.jit``, bit for bit): with 16 output features and
    at most 16 input features, the 1-3 positions past the last block of 6 (the AVX2 kernel's rows) take two lanes
    over ``k`` (``k mod 2``), summed, then an odd ``k``'s last product: fused for 3 positions, unfused (each
    product rounded to float32, then added) for 1 or 2 (every ``m`` of 7-72 for ``k`` of 9-144 with 3x3 windows,
    and 1x3, 3x5 and 5x5 windows); 4 or 5 positions the chain, as for 32 output features and more.

    Not modelled (:func:`conv_tile` None): 2-8 output features (two fused lanes for every position, the last 1-2
    unfused, in single columns of 2-49 positions with ``k`` of 15-72; but in 132 of 175 random convolutions, 37
    another order in every position), 12, 20, 24, 40 and 56 (the chain in 6x6 images, other orders in columns
    of 11 positions or more), one position per image (another order). Nor: XLA cuts the positions of 16 output
    features in tasks for its threads, each task with its own last positions, by a rule that depends on the
    number of CPU devices and cores (on 2 cores: ``m`` of 73-93 for ``k`` below 82 in two halves, and some larger
    ``m``; ``2x16x16x8 -> 16`` has the two lanes for its last 2 of 512 positions with one CPU device and the
    chain with eight); and one position past 4, 8 or 16 blocks for ``k`` of 126-240 (another order)."""
    last = m % 6
    if _xla_cpu_isa.cpu_model() != "amd-zen3" or c > 16 or o != 16 or last not in (1, 2, 3):
        return []
    return [(last, last == 3)]


def _two_lanes(a: np.ndarray, b: np.ndarray, fused: bool) -> np.ndarray:
    """``(..., M, K) @ (..., K, N)`` as a kernel of two lanes (``k mod 2``) from zero, ``l0 + l1``, then the last
    product of an odd ``k``: fused multiply-adds (through float64) or float32 products and adds
    (:func:`conv_lanes`)."""
    k = a.shape[-1]
    even = k // 2 * 2
    last = (a[..., k - 1, None], b[..., None, k - 1, :]) if k % 2 else None  # (..., M, 1), (..., 1, N)
    if fused:
        shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        out = _chains(a, b, 0, even, 2) if even else np.zeros(shape, f32)
        if last is not None:  # a fused multiply-add of the result so far, rounded as a chain's step
            product = last[0].astype(f64) * last[1]
            out = np.array(np.broadcast_to(out, product.shape), f32)
            _fma_step(product, out)
        return out
    products = a[..., :even, None] * b[..., None, :even, :]  # (..., M, K, N), each rounded to float32
    # each lane a chain of float32 adds from +0 (accumulate is sequential; + 0 turns a -0 into the chain's +0)
    lanes = [np.add.accumulate(products[..., j::2, :], axis=-2)[..., -1, :] + f32(0) if even else 0 for j in (0, 1)]
    out = np.asarray(lanes[0] + lanes[1], f32)
    return out + last[0] * last[1] if last is not None else out


def ynn_conv(a: np.ndarray, b: np.ndarray, tile_k: int, lanes: list[tuple[int, bool]] = ()) -> np.ndarray:
    """A convolution's product in YNNPACK's order (see the comment above :func:`conv_tile`): patches ``a``
    ``(..., M, R, C)`` (R window positions in row-major order, C input features) times the kernel ``b``
    ``(..., R, C, O)``, in float32, to ``(..., M, O)``. The leading axes are batch axes (a device axis in front
    gives each device's bits). ``lanes``: runs of positions at the end that a kernel of two lanes computes,
    fused or not (:func:`conv_lanes`)."""
    a, b = np.asarray(a, f32), np.asarray(b, f32)
    *_, m, r, c = a.shape
    o = b.shape[-1]
    if lanes:
        start = m - sum(rows for rows, _ in lanes)
        parts = [ynn_conv(a[..., :start, :, :], b, tile_k)] if start else []
        flat = b.reshape((*b.shape[:-3], r * c, o))
        for rows, fused in lanes:
            parts.append(_two_lanes(a[..., start:start + rows, :, :].reshape((*a.shape[:-3], rows, r * c)), flat,
                                    fused))
            start += rows
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-2)
    main = c // tile_k * tile_k
    out = None
    if main:
        out = ynn_matmul(a[..., :main].reshape((*a.shape[:-3], m, r * main)),
                         b[..., :main, :].reshape((*b.shape[:-3], r * main, o)), Plan(tile_k, None))
    if main < c:
        lanes = [a[..., :, :, j, None] * b[..., None, :, j, :] for j in range(main, c)]  # (..., M, R, O) each
        lanes += [np.zeros_like(lanes[0]) for _ in range(tile_k - len(lanes))]
        tails = _lane_sum(lanes)
        for pos in range(r):
            out = tails[..., pos, :] if out is None else tails[..., pos, :] + out
    return out
