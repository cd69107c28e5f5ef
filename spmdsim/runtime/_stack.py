"""A thread's Python frames in one large stack chunk (CPython 3.11-3.13), so that loops of calls do not map and
unmap memory at every iteration.

CPython keeps a thread's frames in chunks (16 KiB by default) and frees a chunk (``munmap``) as soon as the
frame at its base returns. A loop whose calls go back and forth across the end of a chunk -- a ``while``
body's program calling sub-programs, each a frame of up to a few KiB -- maps a new chunk, faults its pages in
and unmaps it at every crossing: numpyro's NUTS with 4 chains under the thread executor made ~20,000
``mmap``/``munmap`` pairs of 16 KiB and ~80,000 page faults per 100 + 100 iterations (about a tenth of its
time on this VM), and which calls cross depends on the depth where the loop starts (a change of frame sizes
anywhere moved it).

:func:`run_deep` calls ``f`` from a frame of ~130 KiB of unused locals: it does not fit in what is left of the
current chunk, so CPython gives it a chunk of its own, 256 KiB, and ``f``'s frames fill the ~120 KiB after it,
in a chunk that lives as long as the call. It is used where a thread starts its long work -- a device thread's
serving loop, the program ``spmdsim run`` runs -- never per call: each use maps the chunk and initialises the
frame once (~33 page faults). Elsewhere (another Python's frames) it is a plain call.
"""
from __future__ import annotations

import types
from typing import Callable

__all__ = ["run_deep"]

_LOCALS = 16_500  # 8 bytes each: a frame of ~130 KiB, placed at the base of a 256 KiB chunk

_deep: Callable | None = None


def run_deep(f: Callable, *args):
    """``f(*args)``, its frames and those it calls in a stack chunk of their own (see the module docstring)."""
    global _deep
    if _deep is None:
        _deep = _make()
    return _deep(f, args)


def _frame(f, args):
    return f(*args)


def _make() -> Callable:
    """:func:`_frame` with ``_LOCALS`` more (never bound) locals: its frame is that much larger."""
    code = _frame.__code__
    try:
        code = code.replace(co_varnames=code.co_varnames + tuple(f"_{i}" for i in range(_LOCALS)),
                            co_nlocals=code.co_nlocals + _LOCALS)
    except (TypeError, ValueError):  # a Python whose code objects are made otherwise: a plain call
        return _frame
    return types.FunctionType(code, _frame.__globals__, "run_deep")
