"""Fresh arrays for large results: aligned as XLA:CPU aligns its buffers, and faulted in by one thread.

- **Aligned to 64 bytes.** JAX makes a ``jax.Array`` of a NumPy array on a CPU device without copying it when
  the data is aligned to 64 bytes (XLA:CPU's minimum buffer alignment); NumPy aligns its allocations to 16. The
  large results of a mapped call (each device's block of a stacked output, a vectorized product or multiply-add)
  are allocated here, so the ``jax.Array`` handed back holds them as they are: 0.1 ms for a (8, 1024, 1024)
  float32 output where XLA's copy took 8.5 ms. Nothing writes into such an array once JAX holds it: it is
  fresh at every call, and a NumPy view of a ``jax.Array`` is read-only.
- **Faulted in by one thread** (``faulted=True``): a large fresh array is a new mapping, and its pages faulted in
  by two threads at once (the parts of :func:`spmdsim.runtime._threads.in_parallel`) cost several times what one thread
  takes to fault them all (the kernel serialises them: a 32 MiB result, 48 ms against 2-3 here).
- **Reused** (from ``_KEPT`` bytes on): a large array freed is unmapped by glibc and the next one of its size
  mapped and faulted in again, page by page (the vectorized MLP's gradients and updated parameters, 120 MB per
  training step: 15-25 ms of a 50-60 ms step in the kernel). XLA's allocator keeps its buffers; so does this
  module, up to ``SPMDSIM_BUFFER_POOL_MB`` (default 256; 0: none) of them, the oldest let go first. A kept
  buffer is handed out again only when nothing refers to it any more (its reference count is the pool's own:
  every NumPy view, and a ``jax.Array`` made of it without a copy, holds a reference). Not below 4 MiB: glibc
  raises its own threshold for keeping freed memory to the size of the largest block freed (up to 32 MiB), and
  keeping every 1-2 MiB array here held that threshold down, so that NumPy's own temporaries were mapped afresh
  (a CNN step with threads: 3,000 -> 16,000 page faults). Vectorized MLP step: 50-53 -> 41-42 ms.
"""
from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np

__all__ = ["ALIGNMENT", "empty", "kept_by_pool"]

ALIGNMENT = 64
_SMALL = 1 << 18  # bytes: smaller arrays are NumPy's own (XLA's copy of them costs little more than aligning)
_PAGE = 4096
_KEPT = 1 << 22  # bytes: larger arrays come from (and go back to) the pool
_POOL_BYTES = int(os.environ.get("SPMDSIM_BUFFER_POOL_MB", "256")) << 20
_pool: list = []  # the kept buffers (uint8 arrays of their size + ALIGNMENT bytes), the least recently used first
_pool_ids: set = set()
_pool_lock = threading.Lock()


def empty(shape, dtype, *, faulted: bool = False) -> np.ndarray:
    """``np.empty(shape, dtype)``, its data aligned to :data:`ALIGNMENT` bytes (from ``_SMALL`` bytes on), a kept
    buffer where one of its size is free (from ``_KEPT`` bytes on); ``faulted``: with one byte of each page written
    now, in the calling thread (from 1 MiB on)."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _SMALL or dtype.hasobject:
        return np.empty(shape, dtype)
    raw = _reused(nbytes + ALIGNMENT) if nbytes >= _KEPT else None
    fresh = raw is None
    if fresh:
        raw = np.empty(nbytes + ALIGNMENT, np.uint8)
        if nbytes >= _KEPT:
            _keep(raw)
    start = -raw.ctypes.data % ALIGNMENT
    data = raw[start:start + nbytes]
    if faulted and fresh and nbytes >= 1 << 20:  # (a kept buffer's pages are in already)
        data[::_PAGE] = 0
    return data.view(dtype).reshape(shape)


def _reused(size: int) -> np.ndarray | None:
    """A kept buffer of ``size`` bytes that nothing refers to, now the caller's (None if there is none)."""
    with _pool_lock:
        for k in range(len(_pool)):
            raw = _pool[k]  # references: the pool's list, this variable and getrefcount's argument: nothing else
            if raw.nbytes == size and sys.getrefcount(raw) == 3:
                del _pool[k]
                _pool.append(raw)  # the most recently used
                return raw  # the caller's reference holds it before the lock is released
    return None


def _keep(raw: np.ndarray) -> None:
    """Keep ``raw`` for reuse (when it fits in the pool at all), letting go of the oldest kept buffers."""
    if raw.nbytes > _POOL_BYTES:
        return
    with _pool_lock:
        held = sum(r.nbytes for r in _pool) + raw.nbytes
        while held > _POOL_BYTES:
            oldest = _pool.pop(0)
            _pool_ids.discard(id(oldest))
            held -= oldest.nbytes
        _pool.append(raw)
        _pool_ids.add(id(raw))


def _after_fork() -> None:  # in a forked child: a thread of the parent may have held the lock
    global _pool_lock
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def kept_by_pool(base: np.ndarray) -> bool:
    """Whether the pool holds a reference to ``base`` (an array of :func:`empty`'s), besides its users'."""
    return id(base) in _pool_ids
