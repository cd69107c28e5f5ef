"""Fresh arrays for large results: aligned as XLA:CPU aligns its buffers, and faulted in by one thread.

- **Aligned to 64 bytes.** JAX makes a ``jax.Array`` of a NumPy array on a CPU device without copying it when
  the data is aligned to 64 bytes (XLA:CPU's minimum buffer alignment); NumPy aligns its allocations to 16. The
  large results of a mapped call (each device's block of a stacked output, a vectorized product or multiply-add)
  are allocated here, so the ``jax.Array`` handed back holds them as they are: 0.1 ms for a (8, 1024, 1024)
  float32 output where XLA's copy took 8.5 ms. Nothing writes into such an array once JAX holds it: it is
  fresh at every call, and a NumPy view of a ``jax.Array`` is read-only.
- **Faulted in by one thread** (``faulted=True``): a large fresh array is a new mapping, and its pages faulted in
  by two threads at once (the parts of :func:`spmdsim._threads.in_parallel`) cost several times what one thread
  takes to fault them all (the kernel serialises them: a 32 MiB result, 48 ms against 2-3 here).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["ALIGNMENT", "empty"]

ALIGNMENT = 64
_SMALL = 1 << 18  # bytes: smaller arrays are NumPy's own (XLA's copy of them costs little more than aligning)
_PAGE = 4096


def empty(shape, dtype, *, faulted: bool = False) -> np.ndarray:
    """``np.empty(shape, dtype)``, its data aligned to :data:`ALIGNMENT` bytes (from ``_SMALL`` bytes on);
    ``faulted``: with one byte of each page written now, in the calling thread (from 1 MiB on)."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _SMALL or dtype.hasobject:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    data = raw[start:start + nbytes]
    if faulted and nbytes >= 1 << 20:
        data[::_PAGE] = 0
    return data.view(dtype).reshape(shape)
