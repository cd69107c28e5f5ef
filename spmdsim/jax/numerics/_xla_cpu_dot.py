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

A fused multiply-add is computed through float64 (the float32 product is exact there; the sum is rounded
twice, which differs from one rounding in about one case in 2**29), as in :mod:`._xla_cpu_math`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from spmdsim.jax.numerics import _xla_cpu_isa

__all__ = ["Plan", "plan", "ynn_matmul", "matmul", "DEFAULT_WORK"]

f32, f64 = np.float32, np.float64

# products whose (M, K) @ (K, N) slices are at most this large (M * N * K) use the exact order by default, larger
# ones only under SPMDSIM_EXACT=1 (the exact order costs a NumPy pass over an (M, N) plane per k: far slower than
# BLAS). Per slice, never per batch: a device axis batched in front (the vectorized executor) must not change it.
DEFAULT_WORK = 1 << 16


@dataclasses.dataclass(frozen=True)
class Plan:
    """How YNNPACK orders one ``(M, K) @ (K, N)`` product: ``tile_k`` interleaved chains per call, and ``k``
    cut in calls of ``chunk`` (None: one call for all of ``k``)."""

    tile_k: int
    chunk: int | None


def _plan_amd_zen4(m: int, n: int, k: int) -> Plan | None:
    """The orders measured on AMD Zen 4 (jaxlib 0.10.2); None where not measured or not understood (M or N of
    1 take another path; 16 < N < 64 switches kernels with M; chunks for K > 256 depend on N and M)."""
    if m < 2 or n < 2 or k < 1:
        return None
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


def plan(m: int, n: int, k: int) -> Plan | None:
    """The order of a float32 ``(m, k) @ (k, n)`` on this machine's CPU model (:func:`_xla_cpu_isa.cpu_model`),
    or None where spmdsim does not know it. Only AMD Zen 4 with jaxlib 0.10 is measured
    (:func:`_xla_cpu_isa.ynnpack_orders`); elsewhere None."""
    if not _xla_cpu_isa.ynnpack_orders() or not _xla_cpu_isa.current().fma:
        return None
    return _plan_amd_zen4(m, n, k)


def _chains(a: np.ndarray, b: np.ndarray, lo: int, hi: int, tile_k: int) -> np.ndarray:
    """One kernel call over ``k`` in ``[lo, hi)``: ``tile_k`` fused multiply-add chains from zero, each over
    ``k = lo + lane (mod tile_k)``, then the lanes' reduction (``(l0 + l1) + (l2 + l3)``)."""
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    lanes = [np.zeros(shape, f64) for _ in range(tile_k)]
    for kk in range(lo, hi):
        acc = lanes[(kk - lo) % tile_k]
        np.add(np.multiply(a[..., :, kk:kk + 1], b[..., kk:kk + 1, :], dtype=f64), acc, out=acc)
        acc[...] = acc.astype(f32)  # the chain's float32 rounding at every step
    if tile_k == 1:
        return lanes[0].astype(f32)
    lanes = [x.astype(f32) for x in lanes]
    if tile_k == 2:
        return lanes[0] + lanes[1]
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def ynn_matmul(a: np.ndarray, b: np.ndarray, p: Plan) -> np.ndarray:
    """``(..., M, K) @ (..., K, N)`` in float32 in YNNPACK's order ``p`` (see the module docstring): the calls
    over ``k``'s chunks and its remainder, each added to the sum of the calls before it."""
    a, b = np.asarray(a, f32), np.asarray(b, f32)
    k = a.shape[-1]
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
    product's slices are small (``DEFAULT_WORK``) or ``SPMDSIM_EXACT=1`` is set; None otherwise (the caller's BLAS
    product then applies)."""
    if a.dtype != f32 or b.dtype != f32 or a.ndim < 2 or b.ndim < 2:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if k == 0:
        return None
    if m * n * k > DEFAULT_WORK and not _xla_cpu_isa.exact():
        return None
    p = plan(m, n, k)
    return None if p is None else ynn_matmul(a, b, p)
