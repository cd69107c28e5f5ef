"""How many threads BLAS runs while devices compute: set for a mapped call, restored after it.

NumPy's BLAS (OpenBLAS) starts one thread per CPU and, for each product, spins them up and waits for them. With
eight device threads each calling it at once on two CPUs, the pools fight for the same cores: a training step
of eight devices doing 16-row products took 0.45 s with BLAS's default against 0.20 s with one BLAS thread on a
2-core machine, and 0.95 s against 0.20 s with another process busy (issue 27). And a product's bits depend on
BLAS's thread count on some CPUs (:func:`threads`). During a mapped call of the thread executor BLAS
therefore runs one thread, and gets its previous count back when the call returns or raises,
whatever the user set (``OPENBLAS_NUM_THREADS``, threadpoolctl). The count is per call, set by the thread that
made it before any device starts; nested maps keep the outer call's count. The vectorized executor computes in
one thread and splits its large kernels over the CPUs itself (:func:`spmdsim.runtime._threads.in_parallel`): BLAS runs
one thread per part while they run.

The pools are found and set with threadpoolctl (installed with the ``jax`` extra): without it, BLAS is left as
it is. ``SPMDSIM_BLAS_THREADS=N`` fixes the count inside calls; ``SPMDSIM_BLAS_THREADS=0`` leaves BLAS alone.
"""
from __future__ import annotations

import os
import sys
import threading

__all__ = ["threads", "limited"]

_FIXED = os.environ.get("SPMDSIM_BLAS_THREADS")
_lock = threading.Lock()
_state = {"modules": -1, "libraries": ()}  # the BLAS libraries loaded, found again when modules were imported


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads() -> int | None:
    """BLAS's thread count inside spmdsim's calls (:class:`limited`); None: leave BLAS alone.

    One (unless ``SPMDSIM_BLAS_THREADS`` says otherwise), however many devices compute at once: on some CPUs
    OpenBLAS's result depends on how many threads share a product (AMD Zen 3: a float32 ``64x512 @ 512x256``
    differs in 3,228 of 16,384 elements between one and two threads, a ``100x100 @ 100x100`` in 9,308 of
    40,000 over four such products; on Zen 4 the first was the same). With more than one thread a product's bits
    would depend on the CPUs the machine has and on how many devices run at once; spmdsim's large products use
    the CPUs by splitting their slices over threads themselves (:func:`spmdsim.jax.rules._dot.matmul_slices`),
    each a one-thread BLAS call."""
    if _FIXED is not None:
        return int(_FIXED) or None
    return 1


def _libraries() -> tuple:
    """threadpoolctl's controllers of the loaded BLAS libraries (looked for again after new imports: SciPy loads
    its own OpenBLAS)."""
    if len(sys.modules) != _state["modules"]:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            found: tuple = ()
        else:
            found = tuple(ThreadpoolController().select(user_api="blas").lib_controllers)
        _state["modules"], _state["libraries"] = len(sys.modules), found
    return _state["libraries"]


class limited:
    """``with limited():`` BLAS runs :func:`threads` threads (no more than it had) inside the block; each
    library's own count is restored on exit. ``limited(False)`` (a nested call, or BLAS left alone) changes
    nothing. Costs one query per library, and two calls where the count changes (~5 µs)."""

    __slots__ = ("target", "saved")

    def __init__(self, active: bool = True):
        self.target = threads() if active else None
        self.saved: list = []

    def __enter__(self):
        if self.target is None:
            return self
        with _lock:
            for library in _libraries():
                had = library.num_threads
                if had is not None and had > self.target:
                    library.set_num_threads(self.target)
                    self.saved.append((library, had))
        return self

    def __exit__(self, *exc):
        if self.saved:
            with _lock:
                for library, had in self.saved:
                    library.set_num_threads(had)
            self.saved.clear()
